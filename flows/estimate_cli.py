"""``labelshift estimate``: run the ``reestimate`` flow once and print its summary table.

    labelshift estimate --model models:/labelshift-mnist-5k@latest-good --target s3://bucket/target/

The same flow as the scheduled deployment (:mod:`flows.reestimate`): it processes the batches under ``--target``
that the watermark does not list yet, writes corrected predictions beside them, moves the watermark and logs to
MLflow. Registered in the command line by :func:`register` (called from :mod:`flows.cli`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
from contextlib import nullcontext

__all__ = ["register", "format_summary"]

#: exit statuses with --check (0 = no shift; 1 = failed; 2 = bad options, as every command)
EXIT_SHIFTED = 3
EXIT_UNTRUSTWORTHY = 4


def register(sub) -> None:
    from flows.cli import _common

    p = sub.add_parser(
        "estimate", help="re-estimate the target label distribution of new data once (the reestimate flow)",
        description=textwrap.fill(
            "Run the 'reestimate' flow once: take the batches (*.npy arrays of model inputs) under --target that "
            "no earlier run processed, apply the registered model and its calibrator, estimate the target prior "
            "with MLLS (BBSE as a cross-check) with confidence intervals, test for 'no shift', write corrected "
            "predictions beside each batch, move the watermark and log to MLflow. Prints the summary table.", 79),
        epilog="examples:\n"
               "  labelshift estimate --model models:/labelshift-mnist-5k@latest-good --target ./incoming\n"
               "  labelshift estimate --model models:/clf/3 --target s3://bucket/target/ --interval bootstrap\n"
               "  labelshift estimate ... --check     # exit 3 when shifted, 4 when untrustworthy (for cron jobs)\n"
               "Exit status: 0 done, 1 the run failed (the watermark did not move), 2 bad options.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, top=False)
    p.add_argument("--model", metavar="URI",
                   help="registered model: models:/NAME@ALIAS or models:/NAME/VERSION; its run holds the calibrator "
                        "and the source holdout (models registered by `labelshift reproduce` do) (default: "
                        "$LABELSHIFT_MODEL, else models:/labelshift-mnist-5k@latest-good)")
    p.add_argument("--target", metavar="URI",
                   help="where the new data is: s3://bucket/prefix/ or a folder (default: $LABELSHIFT_TARGET, else "
                        "<store>/target)")
    p.add_argument("--calibrator", default="BCTS", help="calibrator logged beside the model (default: BCTS)")
    p.add_argument("--estimator", default="MLLS", choices=["MLLS", "BBSE-soft", "BBSE-hard"],
                   help="estimator of the target prior (default: MLLS)")
    p.add_argument("--cross-check", default="BBSE-soft", metavar="LIST",
                   help="comma-separated estimators run alongside ('' for none; default: BBSE-soft)")
    p.add_argument("--interval", default="fisher", choices=["fisher", "bootstrap"],
                   help="confidence intervals from the Fisher information (default) or a bootstrap")
    p.add_argument("--level", type=float, default=0.95, help="confidence level (default: 0.95)")
    p.add_argument("--significance", type=float, default=0.05,
                   help="level of the no-shift test; shifted when p < this (default: 0.05)")
    p.add_argument("--bootstrap", dest="n_bootstrap", type=int, default=200, metavar="N",
                   help="bootstrap resamples (default: 200)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: 0)")
    p.add_argument("--max-interval-width", type=float, default=None, metavar="W",
                   help="also call the estimate untrustworthy when the interval on some weight w_y is wider than W "
                        "(1.0 = as wide as the no-shift weight itself; default: no width check)")
    p.add_argument("--tracking-uri", metavar="URI", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI or "
                                                         "the local SQLite store under --home)")
    p.add_argument("--experiment-name", default="reestimation", metavar="NAME",
                   help="MLflow experiment (default: reestimation)")
    p.add_argument("--store", metavar="URI", help="object store whose 'target' folder is the default --target")
    p.add_argument("--reprocess-changed", action="store_true",
                   help="count a batch whose content changed after it was counted again, with its new content "
                        "(default: such a batch fails the run, naming it)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of the table")
    p.add_argument("--check", action="store_true",
                   help=f"exit {EXIT_SHIFTED} when the shift is significant, {EXIT_UNTRUSTWORTHY} when the estimate "
                        "is not trustworthy")
    p.set_defaults(handler=_cmd_estimate)


def format_summary(summary: dict) -> str:
    """The summary as a plain-text table for the terminal."""
    from flows.reestimate import format_p
    from labelshift.report import ShiftReport, finite

    if summary.get("verdict") == "No new data":
        return f"No new data under {summary['target']} (run sequence {summary.get('sequence')})."
    res = ShiftReport.from_dict(summary["result"])
    ci, test, ident = res.interval, res.no_shift_test, res.identifiability
    interval_label = f"{ci.level:.0%} interval"
    lines = [f"{summary['verdict']}: {summary['headline']}",
             f"  model {summary['model']['uri']} (version {summary['model']['version']}), "
             f"{len(summary['batches'])} new batch(es), {res.n_target} rows, run {summary['sequence']}",
             "", f"  {'class':>5}  {'source':>8}  {'target':>8}  {interval_label:>19}  {'w':>7}"]
    for c in range(res.n_classes):
        lines.append(f"  {c:>5}  {res.source_prior[c]:8.4f}  {res.target_prior[c]:8.4f}  "
                     f"[{ci.lower[c]:.4f}, {ci.upper[c]:.4f}]  {res.weights[c]:7.3f}")
    lines += ["", f"  no-shift test: statistic {test.statistic:.2f} on {test.dof} dof, "
                  f"p {format_p(test.p_value)}",
              f"  identifiability: min Hessian eigenvalue {ident.min_hessian_eigenvalue:.3g}"
              + (f", confusion condition {ident.confusion_condition:.3g}"
                 if finite(ident.confusion_condition) else "")
              + ("" if res.trustworthy else "  NOT TRUSTWORTHY: " + "; ".join(ident.reasons))]
    for method, check in res.cross_check.items():
        if check.ok:
            lines.append(f"  cross-check {method}: " + " ".join(f"{v:.4f}" for v in check.target_prior))
    for warning in summary.get("warnings", []):
        lines.append(f"  warning: {warning}")
    ml = summary.get("mlflow", {})
    lines += ["", f"  MLflow run: {ml.get('ui') or ml.get('run_id')}",
              f"  outputs:    {len(summary.get('outputs', []))} corrected arrays beside the batches under "
              f"{summary['target']}"]
    return "\n".join(lines)


def _cmd_estimate(args) -> int:
    from flows.cli import PROG, UsageError, _setup

    cross = [m.strip() for m in args.cross_check.split(",") if m.strip()]
    bad = [m for m in cross if m not in ("MLLS", "BBSE-soft", "BBSE-hard")]
    if bad:
        raise UsageError(f"--cross-check: unknown estimator(s) {bad}; choose from MLLS, BBSE-soft, BBSE-hard")
    if not 0.5 < args.level < 1:
        raise UsageError(f"--level must be in (0.5, 1), got {args.level}")
    if args.max_interval_width is not None and args.max_interval_width <= 0:
        raise UsageError(f"--max-interval-width must be positive, got {args.max_interval_width}")
    if args.interval == "fisher" and args.estimator != "MLLS":
        raise UsageError(f"--interval fisher comes from the MLLS likelihood; with --estimator {args.estimator} use "
                         "--interval bootstrap")
    if not 0 < args.significance < 0.5:
        raise UsageError(f"--significance must be in (0, 0.5), got {args.significance}")
    env = _setup(args, store_uri=args.store, tracking_uri=args.tracking_uri, experiment_name=args.experiment_name)
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.reestimate import DEFAULT_MODEL, reestimate, target_uri_for

    args.model = args.model or os.environ.get("LABELSHIFT_MODEL") or DEFAULT_MODEL
    target = target_uri_for(args.target or os.environ.get("LABELSHIFT_TARGET"), env.store_uri)
    print(f"{PROG} estimate: {args.model} on {target}"
          + ("" if env.prefect_api_url else " (starting a temporary Prefect server, 10-30 s)"), file=sys.stderr)
    t0 = time.perf_counter()
    quiet = temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}) \
        if env.prefect_api_url is None else nullcontext()
    with quiet:
        state = reestimate(model=args.model, target=target, calibrator=args.calibrator, estimator=args.estimator,
                           cross_check=cross, interval=args.interval, level=args.level,
                           significance=args.significance, n_bootstrap=args.n_bootstrap, seed=args.seed,
                           max_interval_width=args.max_interval_width,
                           on_changed="reprocess" if args.reprocess_changed else "error",
                           tracking_uri=env.tracking_uri, mlflow_experiment=env.experiment_name,
                           return_state=True)
    if not state.is_completed():
        print(f"{PROG} estimate: failed after {time.perf_counter() - t0:.0f} s: {state.message}\n"
              "  The watermark did not move: fix the cause and rerun, and the same batches are taken again (any "
              "outputs\n  this run wrote beside them are rewritten then).", file=sys.stderr)
        return 1
    summary = state.result()
    print(json.dumps(summary, indent=2, default=str) if args.json else format_summary(summary))
    if args.check:
        if summary.get("verdict") == "Untrustworthy":
            return EXIT_UNTRUSTWORTHY
        if summary.get("verdict") == "Shifted":
            return EXIT_SHIFTED
    return 0


# -- labelshift data simulate-target -------------------------------------------------------------------------------
def register_simulate(dsub) -> None:
    """``labelshift data simulate-target``: shifted batches of a dataset's test pool, to try re-estimation."""
    from flows.cli import _common, _csv

    p = dsub.add_parser(
        "simulate-target", help="write label-shifted batches of a dataset's test images (to try `estimate`)",
        description=textwrap.fill(
            "Draw batches of model inputs (float32 in [0, 1], shape (n, C, H, W)) from the test pool of a dataset in "
            "the object store with a chosen label distribution -- --prior, or one drawn from Dirichlet(--alpha) -- "
            "and write them as NAME.npy under --to, where `labelshift estimate` or the scheduled reestimate "
            "deployment picks them up. The true prior is printed and written beside them as "
            "<prefix>-truth.json. The offline datasets (mnist-5k, digits) are pushed to the store on first use.",
            79),
        epilog="example:\n"
               "  labelshift data simulate-target mnist-5k --to .labelshift/store/target --alpha 0.5 --batches 2\n"
               "  labelshift estimate --model models:/labelshift-mnist-5k@latest-good",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, top=False)
    p.add_argument("name", choices=["mnist-5k", "digits", "mnist", "cifar10"], help="dataset")
    p.add_argument("--to", metavar="URI", help="target location (default: $LABELSHIFT_TARGET, else <store>/target)")
    p.add_argument("--store", metavar="URI", help="object store holding datasets/<name> (default: as reproduce)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prior", type=_csv(float), metavar="LIST", help="the target label distribution, k values")
    g.add_argument("--alpha", type=float, default=None,
                   help="draw the target prior from a symmetric Dirichlet with this concentration (default: 1.0)")
    p.add_argument("--batches", type=int, default=2, help="number of batches (default: 2)")
    p.add_argument("--rows", type=int, default=1000, help="rows per batch (default: 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    p.add_argument("--prefix", default=None, help="file name prefix of the batches (default: sim-<seed>)")
    p.set_defaults(handler=_cmd_simulate)


def _cmd_simulate(args) -> int:
    from flows.cli import UsageError, _local_path, _setup

    if args.batches < 1 or args.rows < 1:
        raise UsageError("--batches and --rows must be positive")
    if args.alpha is not None and args.alpha <= 0:
        raise UsageError(f"--alpha must be positive, got {args.alpha}")
    env = _setup(args, store_uri=args.store)
    import numpy as np

    from flows.reestimate import target_uri_for
    from labelshift.datasets import DATASETS, load_dataset, push_dataset, read_manifest
    from labelshift.datasets.simulate import simulate_target_batches
    from labelshift.errors import ObjectNotFoundError
    from labelshift.storage import open_store

    store = open_store(env.store_uri)
    prefix = f"datasets/{args.name}"
    try:
        read_manifest(store, prefix, expected_name=args.name)
    except ObjectNotFoundError:
        if not DATASETS[args.name].offline:
            raise
        push_dataset(args.name, store, prefix)
    ds = load_dataset(store, prefix, expected_name=args.name, splits=("test",))
    alpha = args.alpha if args.prior is None and args.alpha is not None else (1.0 if args.prior is None else None)
    xs, ys, prior = simulate_target_batches(ds.test.x, ds.test.y, ds.n_classes, rows=args.rows,
                                            n_batches=args.batches, target_prior=args.prior, alpha=alpha,
                                            seed=args.seed)
    target = open_store(target_uri_for(args.to or os.environ.get("LABELSHIFT_TARGET"), env.store_uri))
    name = args.prefix or f"sim-{args.seed}"
    for i, x in enumerate(xs):
        target.put_array(f"{name}-{i}.npy", x)
    counts = np.bincount(np.concatenate(ys), minlength=ds.n_classes)
    target.put_json(f"{name}-truth.json", {"dataset": args.name, "target_prior": prior.tolist(),
                                           "label_frequencies": (counts / counts.sum()).tolist(),
                                           "batches": [f"{name}-{i}.npy" for i in range(len(xs))]})
    print(f"wrote {len(xs)} batch(es) of {args.rows} {args.name} test images to {_local_path(target.uri)}/"
          f"{name}-*.npy")
    print("true target prior: " + " ".join(f"{v:.3f}" for v in prior))
    return 0
