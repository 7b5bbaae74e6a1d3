"""``labelshift data``: image datasets in the object store (``push``; ``simulate-target`` lives with estimate)."""
from __future__ import annotations

import argparse
import os
import time

from runtime import environment as settings_mod
from flows.cli import estimate
from flows.cli._common import UsageError, add_common, local_path

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("data", help="image datasets in the object store (labelshift data push NAME)",
                       description="Manage the image datasets the reproduce flow reads from the object store.")
    add_common(p, top=False)
    dsub = p.add_subparsers(dest="data_command", metavar="<action>")
    push = dsub.add_parser(
        "push", help="build a dataset and write it to the store",
        description="Build dataset NAME in the canonical layout (train/valid/test arrays plus a manifest with "
                    "checksums) and write it under --to. mnist-5k and digits ship inside installed packages, "
                    "fashion-mnist inside Debian's dataset-fashion-mnist (or --from DIR with its idx files); "
                    "mnist and cifar10 need --from DIR (MNIST's idx files, CIFAR-10's python batches) or "
                    f"--download (internet; the files are kept under ${settings_mod.ENV_CACHE} or "
                    "~/.cache/labelshift).",
        epilog="examples:\n  labelshift data push mnist-5k\n"
               "  labelshift data push mnist --from ~/data/mnist --to s3://bucket/labelshift/datasets/mnist\n"
               "The reproduce flow reads <store>/datasets/NAME, the default of --to.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(push, top=False)
    push.add_argument("name", metavar="NAME", help="mnist, fashion-mnist, cifar10, mnist-5k or digits")
    push.add_argument("--to", metavar="URI", help="destination prefix: s3://bucket/prefix or a folder "
                                                  "(default: <store>/datasets/NAME, where reproduce reads it)")
    push.add_argument("--from", dest="source_dir", metavar="DIR", help="folder with the standard source files")
    push.add_argument("--download", action="store_true", help="download the source files (needs internet)")
    push.add_argument("--seed", type=int, default=0, help="seed of the stratified splits (default: 0)")
    push.set_defaults(handler=run_push)
    estimate.register_simulate(dsub)
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])


def run_push(args) -> int:
    from labelshift.experiments.datasets import DATASETS, push_dataset
    from labelshift.storage import open_store

    if args.name not in DATASETS:
        raise UsageError(f"unknown dataset {args.name!r}; choose from {', '.join(sorted(DATASETS))}")
    if args.source_dir and args.download:
        raise UsageError("give either --from DIR or --download, not both")
    if args.source_dir and not os.path.isdir(os.path.expanduser(args.source_dir)):
        raise UsageError(f"--from {args.source_dir}: no such folder")
    env = settings_mod.resolve(getattr(args, "home", None))
    to = args.to or f"{env.store_uri.rstrip('/')}/datasets/{args.name}"
    store = open_store(to)
    t0 = time.perf_counter()
    manifest = push_dataset(args.name, store, "", source_dir=args.source_dir and os.path.expanduser(args.source_dir),
                            download=args.download, seed=args.seed, cache_dir=env.cache_dir)
    counts = {s: sum(c) for s, c in manifest["class_counts"].items()}
    print(f"pushed {args.name} to {local_path(store.uri)} in {time.perf_counter() - t0:.1f} s: "
          + ", ".join(f"{s} {n}" for s, n in counts.items()))
    return 0
