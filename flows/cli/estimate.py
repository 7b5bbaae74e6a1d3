"""``labelshift estimate`` (the ``reestimate`` flow once, options from :class:`ReestimateParameters`) and
``labelshift data simulate-target`` (label-shifted batches to try it on).

    labelshift data simulate-target mnist-5k --to .labelshift/store/target --alpha 5
    labelshift estimate --model models:/labelshift-mnist-5k@latest-good --target .labelshift/store/target

The same flow as the scheduled deployment (:mod:`flows.reestimate`): it processes the batches under ``--target``
that the watermark does not list yet, writes corrected predictions beside them, moves the watermark and logs to
MLflow.
"""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time

from pydantic import ValidationError

from runtime import environment as settings_mod
from flows.cli._common import PROG, Opt, UsageError, add_common, add_field, bounds, csv, given, local_path, \
    option_name, prefect_api, problems, setup, validated
from flows.cli.stopping import LOST_HINT, sigterm_unwinds, stopped_sentence, watched
from flows.params import DEFAULT_MODEL, INTERVAL_ERROR, ReestimateParameters
from flows.summary import format_summary
from labelshift.inference.report import Verdict

__all__ = ["register", "register_simulate", "format_summary", "OPTIONS", "EXIT_SHIFTED", "EXIT_UNTRUSTWORTHY",
           "EXIT_NOT_LABEL_SHIFT"]

#: exit statuses with --check (0 = no shift; 1 = failed; 2 = bad options, as every command)
EXIT_SHIFTED = 3
EXIT_UNTRUSTWORTHY = 4
EXIT_NOT_LABEL_SHIFT = 5
#: the exit status of each verdict with --check (any other: 0)
CHECK_EXITS = {Verdict.NOT_LABEL_SHIFT: EXIT_NOT_LABEL_SHIFT, Verdict.UNTRUSTWORTHY: EXIT_UNTRUSTWORTHY,
               Verdict.SHIFTED: EXIT_SHIFTED}

#: how each flow parameter appears on the command line, where it differs from --<name with dashes>
OPTIONS: dict[str, Opt] = {
    "model": Opt(metavar="URI", default=f"${settings_mod.ENV_MODEL}, else {DEFAULT_MODEL}"),
    "target": Opt(metavar="URI", default=f"${settings_mod.ENV_TARGET}, else <store>/target"),
    "cross_check": Opt(parse=csv(str, allow_empty=True), extra=" Comma-separated; '' for none."),
    "n_bootstrap": Opt(option="--bootstrap", metavar="N"),
    "tracking_uri": Opt(metavar="URI"),
    "mlflow_experiment": Opt(option="--experiment-name", metavar="NAME"),
    "batch_size": Opt(metavar="N"),
    "max_interval_width": Opt(metavar="W", default=""),
    "label_shift_significance": Opt(metavar="P", default=""),
    "label_shift_holdout_inflation": Opt(metavar="KAPPA"),
    "on_changed": Opt(option="--reprocess-changed", const="reprocess",
                      help="count a batch whose content changed after it was counted again, with its new content",
                      default="such a batch fails the run, naming it"),
    "on_invalid": Opt(option="--fail-on-invalid", const="error",
                      help="fail the run, counting nothing, when a new batch fails its checks (every bad batch is "
                           "named)",
                      default="such a batch is rejected: recorded in the watermark with its reason, not counted, "
                              "and the run goes on with the good ones"),
    "register_corrected": Opt(const=True, default="nothing is registered"),
    "corrected_model_name": Opt(metavar="NAME", default="<model name>-shift-corrected"),
    "segment_column": Opt(metavar="COLUMN", default="no estimates per segment"),
    "min_segment_size": Opt(metavar="N"),
    "segment_processes": Opt(metavar="N"),
    "dask": Opt(metavar="ADDRESS", default="one process"),
}


def register(sub) -> None:
    p = sub.add_parser(
        "estimate", help="re-estimate the target label distribution of new data once (the reestimate flow)",
        description=textwrap.fill(
            "Run the 'reestimate' flow once: take the batches (*.npy or *.parquet: model inputs, or a reference's "
            "prediction logs) under --target that "
            "no earlier run processed, apply the registered model and its calibrator, test that the new data are "
            "label-shifted source data at all, estimate the target prior with MLLS (BBSE as a cross-check) with "
            "confidence intervals (source-aware by default: they include the labelled holdout's error), test for "
            "'no shift', write corrected predictions beside each batch (not under 'Not label shift'), move the "
            "watermark and log to MLflow. Prints the summary table.", 79),
        epilog="examples:\n"
               "  labelshift estimate --model models:/labelshift-mnist-5k@latest-good --target ./incoming\n"
               "  labelshift estimate --model models:/clf/3 --target s3://bucket/target/ --interval bootstrap\n"
               "  labelshift estimate ... --check     # exit 3 shifted, 4 untrustworthy, 5 not label shift\n"
               "Exit status: 0 done, 1 the run failed (the watermark did not move), 2 bad options, 75 the Prefect "
               "server stopped answering (LABELSHIFT_SERVER_LOST_S), 130 Ctrl-C, 143 SIGTERM.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p, top=False)
    for field in ReestimateParameters.model_fields:
        add_field(p, ReestimateParameters, field, OPTIONS.get(field), OPTIONS)
    p.add_argument("--store", metavar="URI", help="object store whose 'target' folder is the default --target "
                                                  f"(default: ${settings_mod.ENV_STORE}, else <home>/store)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of the table")
    p.add_argument("--check", action="store_true",
                   help=f"exit {EXIT_SHIFTED} when the shift is significant, {EXIT_UNTRUSTWORTHY} when the estimate "
                        f"is not trustworthy, {EXIT_NOT_LABEL_SHIFT} when the new data are not label shift (the "
                        "label-shift test rejects: no estimate to act on, no corrected outputs)")
    p.set_defaults(handler=run)


#: the fix a value out of range calls for, where the range alone does not say it
_RANGE_HINTS = {
    "level": "; pass a confidence level such as 0.95 for 95% intervals",
    "label_shift_significance": "; pass a level such as 0.01, or leave the option out to judge the label-shift "
                                "test at --significance",
}


def _explain(exc: ValidationError) -> str:
    """The problems of the options, one line each, in the command's words."""
    lines, unknown = [], {}
    for err in exc.errors():
        loc = err.get("loc", ())
        field = str(loc[0]) if loc else ""
        option = option_name(field, OPTIONS)
        if err["type"] == INTERVAL_ERROR:
            ctx = err["ctx"]
            lines.append(f"--interval {ctx['interval']} comes from the MLLS likelihood; with --estimator "
                         f"{ctx['estimator']} use --interval bootstrap")
        elif err["type"] == "literal_error" and len(loc) == 2:
            unknown.setdefault(option, []).append(err["input"])
        elif err["type"] in ("greater_than", "greater_than_equal", "less_than", "less_than_equal") \
                and len(loc) == 1 and bounds(ReestimateParameters, field):
            lines.append(f"{option} {bounds(ReestimateParameters, field)}, got {err['input']}"
                         + _RANGE_HINTS.get(field, ""))
        else:
            lines.extend(problems([err], ReestimateParameters, OPTIONS))
    from labelshift.estimation.registry import REESTIMATION_ESTIMATORS

    for option, bad in unknown.items():
        lines.insert(0, f"{option}: unknown estimator(s) {bad}; choose from {', '.join(REESTIMATION_ESTIMATORS)}")
    return "\n  ".join(lines)


def parameters_from_args(args: argparse.Namespace) -> ReestimateParameters:
    """The flow parameters given on the command line, validated; raises UsageError."""
    return validated(ReestimateParameters, given(args, ReestimateParameters), _explain)


def _committed_since(before: int | None):
    """A function saying the sequence number this run committed, or None (``before``: the last sequence committed
    in this process before the run)."""
    def committed() -> int | None:
        from flows.reestimate import last_committed_sequence

        now = last_committed_sequence()
        return now if now != before else None
    return committed


def _model_uri(args, params: ReestimateParameters, env) -> str:
    """The model to re-estimate with (--model, else $LABELSHIFT_MODEL, else the default), checked to be a
    registered-model URI; UsageError (exit 2) otherwise."""
    from labelshift.errors import InputError
    from labelshift_mlflow.registry import parse_model_uri

    model = args.model or env.model or params.model
    try:
        parse_model_uri(model)
    except InputError as exc:
        raise UsageError(f"--model: {exc}") from None
    return model


def run(args) -> int:
    params = parameters_from_args(args)
    env = setup(args, prefect_server=True, store_uri=args.store, tracking_uri=params.tracking_uri,
                experiment_name=params.mlflow_experiment, check=lambda env: _model_uri(args, params, env))
    from flows.reestimate import last_committed_sequence, reestimate, target_uri_for

    model = _model_uri(args, params, env)
    target = target_uri_for(params.target or env.target, env.store_uri)
    print(f"{PROG} estimate: {model} on {target}"
          + ("" if env.prefect_api_url else " (starting a temporary Prefect server, 10-30 s)"), file=sys.stderr)
    t0 = time.perf_counter()
    call = params.model_dump() | dict(model=model, target=target, tracking_uri=env.tracking_uri,
                                      mlflow_experiment=env.experiment_name, dask=params.dask)
    committed = _committed_since(last_committed_sequence())
    with sigterm_unwinds("estimate", committed), prefect_api(env) as api_url, \
            watched(api_url, lambda reason: stopped_sentence("estimate", reason, committed(), LOST_HINT)):
        state = reestimate(**call, return_state=True)
    if not state.is_completed():
        from flows.cli.refusals import failure_text

        message = failure_text(state)
        print(f"{PROG} estimate: failed after {time.perf_counter() - t0:.0f} s: {message}", file=sys.stderr)
        if "did not move" not in message:           # an error that says it already is not told twice
            print("  The watermark did not move: fix the cause and rerun, and the same batches are taken again (any "
                  "outputs\n  this run wrote beside them are rewritten then).", file=sys.stderr)
        return 1
    summary = state.result()
    print(json.dumps(summary, indent=2, default=str) if args.json else format_summary(summary))
    if args.check:
        return CHECK_EXITS.get(summary.get("verdict"), 0)
    return 0


# -- labelshift data simulate-target -------------------------------------------------------------------------------
def register_simulate(dsub) -> None:
    """``labelshift data simulate-target``: shifted batches of a dataset's test pool, to try re-estimation."""
    p = dsub.add_parser(
        "simulate-target", help="write label-shifted batches of a dataset's test images (to try `estimate`)",
        description=textwrap.fill(
            "Draw batches of model inputs (float32 in [0, 1], shape (n, C, H, W)) from the test pool of a dataset in "
            "the object store with a chosen label distribution -- --prior, or one drawn from Dirichlet(--alpha) -- "
            "and write them as NAME.npy under --to, where `labelshift estimate` or the scheduled reestimate "
            "deployment picks them up. The true prior is printed and written beside them as "
            "<prefix>-truth.json. The offline datasets (mnist-5k, digits, fashion-mnist) are pushed to the store on "
            "first use. "
            "Images are drawn without replacement while the pool has enough of a class (repeated rows are not "
            "independent draws, which the label-shift test of `estimate` assumes); a note says when some repeat.",
            79),
        epilog="example:\n"
               "  labelshift data simulate-target mnist-5k --to .labelshift/store/target --alpha 5 --batches 2\n"
               "  labelshift estimate --model models:/labelshift-mnist-5k@latest-good",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p, top=False)
    p.add_argument("name", choices=["mnist-5k", "digits", "fashion-mnist", "mnist", "cifar10"], help="dataset")
    p.add_argument("--to", metavar="URI",
                   help=f"target location (default: ${settings_mod.ENV_TARGET}, else <store>/target)")
    p.add_argument("--store", metavar="URI", help="object store holding datasets/<name> (default: as reproduce)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prior", type=csv(float), metavar="LIST", help="the target label distribution, k values")
    g.add_argument("--alpha", type=float, default=None,
                   help="draw the target prior from a symmetric Dirichlet with this concentration (default: 1.0)")
    p.add_argument("--batches", type=int, default=2, help="number of batches (default: 2)")
    p.add_argument("--rows", type=int, default=200,
                   help="rows per batch (default: 200; the mnist-5k test pool holds 100 images per class)")
    p.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    p.add_argument("--prefix", default=None, help="file name prefix of the batches (default: sim-<seed>)")
    p.set_defaults(handler=run_simulate)


def run_simulate(args) -> int:
    if args.batches < 1 or args.rows < 1:
        raise UsageError("--batches and --rows must be positive")
    if args.alpha is not None and args.alpha <= 0:
        raise UsageError(f"--alpha must be positive, got {args.alpha}")
    env = setup(args, store_uri=args.store)
    import numpy as np

    from flows.reestimate import target_uri_for
    from labelshift.experiments.datasets import DATASETS, load_dataset, push_dataset, read_manifest
    from labelshift.experiments.datasets.simulate import repeated_classes, simulate_target_batches
    from labelshift.errors import ObjectNotFoundError
    from labelshift.storage import open_store

    store = open_store(env.store_uri)
    prefix = f"datasets/{args.name}"
    try:
        read_manifest(store, prefix, expected_name=args.name)
    except ObjectNotFoundError:
        if not DATASETS[args.name].offline:
            raise
        push_dataset(args.name, store, prefix, cache_dir=env.cache_dir)
    ds = load_dataset(store, prefix, expected_name=args.name, splits=("test",))
    alpha = args.alpha if args.prior is None and args.alpha is not None else (1.0 if args.prior is None else None)
    xs, ys, prior = simulate_target_batches(ds.test.x, ds.test.y, ds.n_classes, rows=args.rows,
                                            n_batches=args.batches, target_prior=args.prior, alpha=alpha,
                                            seed=args.seed)
    target = open_store(target_uri_for(args.to or env.target, env.store_uri))
    name = args.prefix or f"sim-{args.seed}"
    for i, x in enumerate(xs):
        target.put_array(f"{name}-{i}.npy", x)
    counts = np.bincount(np.concatenate(ys), minlength=ds.n_classes)
    target.put_json(f"{name}-truth.json", {"dataset": args.name, "target_prior": prior.tolist(),
                                           "label_frequencies": (counts / counts.sum()).tolist(),
                                           "batches": [f"{name}-{i}.npy" for i in range(len(xs))]})
    print(f"wrote {len(xs)} batch(es) of {args.rows} {args.name} test images to {local_path(target.uri)}/"
          f"{name}-*.npy")
    print("true target prior: " + " ".join(f"{v:.3f}" for v in prior))
    repeated = repeated_classes(ds.test.y, ys)
    if repeated:
        print(f"note: the test pool holds too few images of class(es) {repeated} for {args.batches} x {args.rows} "
              "rows, so some of their rows repeat; repeated rows are not independent draws, and the label-shift "
              "test of `estimate` may then answer 'Not label shift'. Fewer --rows or a milder shift (larger "
              "--alpha) avoid it.", file=sys.stderr)
    return 0
