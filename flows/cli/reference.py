"""``labelshift reference register``: register a reference for prediction-log mode from a holdout file.

    labelshift reference register --holdout holdout.parquet --label-column label --outputs logits --name fraud-model

The reference (calibrator fit on the holdout's outputs, the holdout, class names, output kind) becomes a model
version in the MLflow registry, addressed as ``models:/NAME@ALIAS`` by ``labelshift estimate``
(:func:`tasks.reestimation.references.register_reference_file`).
"""
from __future__ import annotations

import argparse

from runtime import environment as settings_mod
from flows.cli._common import UsageError, add_common, setup

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("reference", help="register a reference for re-estimating from prediction logs",
                       description="References: what re-estimation from logged model outputs needs.")
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
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])


def run_register(args) -> int:
    import os

    if not os.path.isfile(os.path.expanduser(args.holdout)):
        raise UsageError(f"--holdout {args.holdout}: no such file")
    env = setup(args, tracking_uri=args.tracking_uri)
    from tasks.reestimation.references import register_reference_file

    names = [n.strip() for n in args.class_names.split(",")] if args.class_names else None
    info = register_reference_file(os.path.expanduser(args.holdout), label_column=args.label_column,
                                   output_kind=args.outputs, name=args.name, class_names=names,
                                   output_column=args.output_column, tracking_uri=env.tracking_uri,
                                   alias=args.alias, calibrator=args.calibrator, id_column=args.id_column)
    print(f"registered reference {info['model_uri']} (version {info['version']}, run {info['run_id']})")
    print(f"next: labelshift estimate --model {info['model_uri']} --target s3://bucket/prefix/")
    return 0
