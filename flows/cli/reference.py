"""``labelshift reference register``: register a reference for prediction-log mode from a holdout file; ``labelshift
reference trust``: record the digest of a reviewed model version (docs/serving.md, "A trusted registry").

    labelshift reference register --holdout holdout.parquet --label-column label --outputs logits --name fraud-model
    labelshift reference trust models:/fraud-model/3

The reference (calibrator fit on the holdout's outputs, the holdout, class names, output kind) becomes a model
version in the MLflow registry, addressed as ``models:/NAME@ALIAS`` by ``labelshift estimate``
(:func:`labelshift_mlflow.references.register_reference_file`).
"""
from __future__ import annotations

import argparse

from runtime import environment as settings_mod
from flows.cli._common import UsageError, add_common, setup

__all__ = ["register", "run_register", "run_trust"]


def register(sub) -> None:
    p = sub.add_parser("reference", help="register a reference for re-estimating from prediction logs; trust "
                                            "a reviewed model version",
                       description="References: what re-estimation from logged model outputs needs; and the digest "
                                   "that makes a model version trusted (docs/serving.md).")
    add_common(p, top=False)
    rsub = p.add_subparsers(dest="reference_command", metavar="<action>")
    r = rsub.add_parser(
        "register", help="register a reference from a labelled holdout's outputs (Parquet)",
        description="Fit the calibrator on a labelled holdout's outputs and register it, with the holdout, the "
                    "class names and the kind of output, as a model version; `labelshift estimate --model "
                    "models:/NAME@ALIAS` then re-estimates from batches of the model's logged outputs.",
        epilog="examples:\n"
               "  labelshift reference register --holdout holdout.parquet --label-column label --outputs logits "
               "--name fraud-model\n"
               "  labelshift reference register --holdout h.parquet --label-column y --outputs probabilities "
               "--class-names legit,fraud --name fraud-model --alias staging\n"
               "The holdout holds one float column per class (named as the class) or one list column "
               "(then --class-names), and the label column (class names or indices).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(r, top=False)
    r.add_argument("--holdout", required=True, metavar="FILE", help="Parquet file of the labelled holdout's outputs")
    r.add_argument("--label-column", required=True, metavar="NAME", help="its label column")
    r.add_argument("--outputs", required=True, choices=("logits", "probabilities"),
                   help="what the model logs: logits (scores before softmax) or probabilities")
    r.add_argument("--name", required=True, help="registered model name of the reference")
    r.add_argument("--alias", default="production", help="alias set on the new version (default: production)")
    r.add_argument("--class-names", metavar="A,B,...", help="class names in output order (default: the output "
                                                            "columns' names)")
    r.add_argument("--output-column", metavar="NAME", help="the list column holding the outputs, if several")
    r.add_argument("--id-column", default="id", metavar="NAME",
                   help="batch column carried into the corrected outputs when present (default: id)")
    r.add_argument("--calibrator", default="BCTS", choices=("BCTS", "TS", "VS", "NBVS"),
                   help="calibrator fit on the holdout (default: BCTS)")
    r.add_argument("--tracking-uri", metavar="URI", help=f"MLflow tracking URI (default: ${settings_mod.ENV_TRACKING_URI}"
                                                         " or the embedded store)")
    r.set_defaults(handler=run_register)
    t = rsub.add_parser(
        "trust", help="record the digest of a reviewed model version, so that loads check it",
        description="Record the digest of a model version's files (its model artifacts, the calibrators, holdout "
                    "and class names beside it) as its tag labelshift.digest. `labelshift estimate` and the "
                    "reestimate flow then refuse the version if any of those files changes. Run it after reviewing "
                    "a version registered by other means than labelshift (a model is code); versions labelshift "
                    "registers carry their digest already. With LABELSHIFT_REQUIRE_TRUSTED_MODELS=1, versions without "
                    "a digest are refused.",
        epilog="examples:\n"
               "  labelshift reference trust models:/fraud-model/3\n"
               "  labelshift reference trust models:/labelshift-mnist-5k@latest-good --tracking-uri "
               "http://127.0.0.1:5000",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(t, top=False)
    t.add_argument("model", metavar="MODEL_URI", help="models:/NAME/VERSION or models:/NAME@ALIAS (the version it "
                                                      "points at now)")
    t.add_argument("--tracking-uri", metavar="URI", help=f"MLflow tracking URI (default: ${settings_mod.ENV_TRACKING_URI}"
                                                         " or the embedded store)")
    t.set_defaults(handler=run_trust)
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])


def run_register(args) -> int:
    import os

    if not os.path.isfile(os.path.expanduser(args.holdout)):
        raise UsageError(f"--holdout {args.holdout}: no such file")
    env = setup(args, tracking_uri=args.tracking_uri)
    from labelshift_mlflow import register_reference_file

    names = [n.strip() for n in args.class_names.split(",")] if args.class_names else None
    info = register_reference_file(os.path.expanduser(args.holdout), label_column=args.label_column,
                                   output_kind=args.outputs, name=args.name, class_names=names,
                                   output_column=args.output_column, tracking_uri=env.tracking_uri,
                                   alias=args.alias, calibrator=args.calibrator, id_column=args.id_column)
    print(f"registered reference {info['model_uri']} (version {info['version']}, run {info['run_id']}, digest "
          f"{info['digest']})")
    print(f"next: labelshift estimate --model {info['model_uri']} --target s3://bucket/prefix/")
    return 0


def run_trust(args) -> int:
    """Record the digest of the version ``args.model`` names (:func:`labelshift_mlflow.trusted.trust_version`)."""
    env = setup(args, tracking_uri=args.tracking_uri)
    from mlflow import MlflowClient

    from labelshift_mlflow.registry import resolve_version
    from labelshift_mlflow.trusted import trust_version

    client = MlflowClient(tracking_uri=env.tracking_uri)
    name, _, version = resolve_version(client, args.model, env.tracking_uri)
    info = trust_version(client, name, version)
    uri = f"models:/{info['name']}/{info['version']}"
    if info["previous"] == info["digest"]:
        print(f"{uri} was already trusted with this digest: {info['digest']}")
    elif info["previous"]:
        print(f"trusted {uri}: digest {info['digest']} (replaces {info['previous']}: its files changed since)")
    else:
        print(f"trusted {uri}: digest {info['digest']}")
    print(f"next: labelshift estimate --model {uri} checks its files against it at every load")
    return 0
