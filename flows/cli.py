"""The ``labelshift`` command: run the paper's sweeps, serve them as a Prefect deployment, manage the local stack.

    labelshift reproduce [options]   run the sweep on the embedded defaults (or the servers the env names)
    labelshift serve [options]       serve reproduce (sweeps from the Prefect UI) and reestimate (on a cron schedule)
    labelshift stack up|down|status  the local no-Docker stack (SeaweedFS S3, MLflow, Prefect) when installed
    labelshift where                 print where state, results and tracking go, and how to open the UIs
    labelshift data push NAME        build an image dataset and write it to the object store
    labelshift data simulate-target  write label-shifted batches of a dataset's test images (to try `estimate`)
    labelshift report [--out DIR]    a markdown results page (tables, figures, the paper's claims) from MLflow
    labelshift estimate --model M    re-estimate the target label distribution of new data once (reestimate flow)

Prefect and MLflow are imported only after the environment is set up (:mod:`flows.settings`), because Prefect
reads its settings once, at import; ``--help`` and parameter errors therefore answer without importing them.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import textwrap
import time

from pydantic import ValidationError

from flows import settings as settings_mod
from flows.params import BINS_METHODS, EXPERIMENTS, METHODS, ReproduceParameters

__all__ = ["main", "build_parser"]

PROG = "labelshift"

#: option name of each flow parameter (where it differs from --<name with dashes>)
OPTION_OF = {"n_seeds": "--seeds", "bins_values": "--bins", "mlflow_experiment": "--experiment-name",
             "alpha_values": "--alphas"}

#: a grid that runs in seconds (smoke test of a fresh install)
QUICK = dict(shift_values=[0.05, 0.2, 0.5], target_sizes=[100, 1000], bins_values=[2, 8], n_seeds=10)


class UsageError(Exception):
    """A mistake in the command line, reported as ``labelshift <cmd>: error: ...`` with exit status 2."""


def _option(field: str) -> str:
    return OPTION_OF.get(field, "--" + field.replace("_", "-"))


def _csv(kind):
    """argparse type for comma-separated lists (spaces allowed): ``0.1,0.2`` -> [0.1, 0.2]."""
    def parse(text: str) -> list:
        items = [t.strip() for t in text.replace(" ", ",").split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list, got an empty value")
        try:
            return [kind(t) for t in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values, got {text!r}") \
                from None
    parse.__name__ = f"list of {kind.__name__}"
    return parse


def _help(field: str, extra: str = "") -> str:
    info = ReproduceParameters.model_fields[field]
    default = info.default
    if isinstance(default, list):
        default = ",".join(str(v) for v in default)
    shown = "" if default is None else f" (default: {default})"
    return f"{info.description}{extra}{shown}".replace("%", "%%")


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """--home and --verbose, accepted before or after the subcommand."""
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--home", metavar="DIR", default=default,
                        help="state folder for the embedded defaults: Prefect's temporary server, the MLflow "
                             f"SQLite store and artifacts, the object store (default: ${settings_mod.ENV_HOME} "
                             f"or ./{settings_mod.DEFAULT_HOME})")
    parser.add_argument("-v", "--verbose", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="show Prefect's and MLflow's logs on the console (quiet by default)")


def _add_reproduce(sub) -> None:
    p = sub.add_parser(
        "reproduce", help="run the paper's sweeps (two Gaussians; image datasets: MSE vs Dirichlet alpha, size)",
        description=textwrap.fill(
            "Run the label-shift sweeps of the paper (Garg et al. 2020, Section 6) as a Prefect flow and log them to "
            "MLflow: for each setting and seed draw source and target sets, estimate the importance weights with "
            "every method, and report the weight MSE. Without servers configured it uses the embedded defaults "
            "under --home; with PREFECT_API_URL, MLFLOW_TRACKING_URI or "
            f"{settings_mod.ENV_STORE} set (e.g. by `labelshift stack up`) it uses those.", 79),
        epilog="examples:\n"
               "  labelshift reproduce                         # the default sweep, about 2 minutes\n"
               "  labelshift reproduce --quick                 # a tiny grid, a smoke test\n"
               "  labelshift reproduce --experiments shift --shift-values 0.01,0.1,0.5 --seeds 20\n"
               "  labelshift reproduce --store s3://bucket/labelshift --tracking-uri http://127.0.0.1:5000\n"
               "  labelshift reproduce --dataset mnist-5k      # train, calibrate, Dirichlet-shift sweeps\n"
               "Lists are comma-separated. Exit status: 0 done, 1 the sweep failed, 2 bad options, 130 interrupted.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, top=False)
    g = p.add_argument_group("what to run")
    g.add_argument("--dataset", choices=["gaussian", "mnist-5k", "digits", "mnist", "cifar10"], help=_help("dataset"))
    g.add_argument("--experiments", type=_csv(str), metavar="LIST",
                   help=_help("experiments", f" Choose from {','.join(EXPERIMENTS)}."))
    g.add_argument("--shift-values", type=_csv(float), metavar="LIST", help=_help("shift_values"))
    g.add_argument("--target-sizes", type=_csv(int), metavar="LIST", help=_help("target_sizes"))
    g.add_argument("--bins", dest="bins_values", type=_csv(int), metavar="LIST", help=_help("bins_values"))
    g.add_argument("--target-size", type=int, metavar="M", help=_help("target_size"))
    g.add_argument("--size-shift", type=float, metavar="P", help=_help("size_shift"))
    g.add_argument("--seeds", dest="n_seeds", type=int, metavar="N", help=_help("n_seeds"))
    g.add_argument("--methods", type=_csv(str), metavar="LIST",
                   help=_help("methods", f" Choose from {','.join(METHODS)},RLLS-soft,PCC; the bins sweep always "
                                         f"runs {','.join(BINS_METHODS)}."))
    g.add_argument("--base-seed", type=int, metavar="S", help=_help("base_seed"))
    g.add_argument("--mu", type=float, help=_help("mu"))
    g.add_argument("--n-source", type=int, metavar="N", help=_help("n_source"))
    i = p.add_argument_group("image datasets")
    i.add_argument("--alphas", dest="alpha_values", type=_csv(float), metavar="LIST", help=_help("alpha_values"))
    i.add_argument("--size-alpha", type=float, metavar="A", help=_help("size_alpha"))
    i.add_argument("--model-seeds", type=int, metavar="N", help=_help("model_seeds"))
    i.add_argument("--epochs", type=int, metavar="N", help=_help("epochs"))
    i.add_argument("--train-limit", type=int, metavar="N", help=_help("train_limit"))
    i.add_argument("--calibrators", type=_csv(str), metavar="LIST", help=_help("calibrators"))
    i.add_argument("--good-accuracy", type=float, metavar="A", help=_help("good_accuracy"))
    g.add_argument("--quick", action="store_true",
                   help="a tiny grid that finishes in seconds (" +
                        "; ".join(f"{_option(k)} {','.join(map(str, v)) if isinstance(v, list) else v}"
                                  for k, v in QUICK.items()) + "); explicit options still win")
    o = p.add_argument_group("how to run it and where results go")
    o.add_argument("--seeds-per-task", type=int, metavar="N", help=_help("seeds_per_task"))
    o.add_argument("--store", metavar="URI", help=_help("store"))
    o.add_argument("--tracking-uri", metavar="URI", help=_help("tracking_uri"))
    o.add_argument("--experiment-name", dest="mlflow_experiment", metavar="NAME", help=_help("mlflow_experiment"))
    o.add_argument("--dask", metavar="ADDRESS",
                   help="run the estimation tasks on a Dask cluster: a scheduler address (tcp://host:8786) or "
                        "'local' (one single-threaded worker process per core); needs pip install "
                        "'labelshift[dask]' (default: $LABELSHIFT_DASK_ADDRESS, else threads in this process)")
    o.add_argument("--json", action="store_true", help="print the flow's result (ids, locations, MSE rows) as JSON")
    p.set_defaults(handler=_cmd_reproduce)


def _add_serve(sub) -> None:
    from flows.serve import ENV_CRON, ENV_MODEL, ENV_TARGET, ENV_TIMEZONE

    p = sub.add_parser(
        "serve", help="serve the reproduce and reestimate flows as deployments (UI launches, cron schedule)",
        description=textwrap.fill(
            "Register two Prefect deployments and run the flow runs they are asked for, until stopped (Ctrl-C or "
            "SIGTERM): 'reproduce/reproduce', the paper's sweeps, whose parameters appear as a form in the Prefect "
            "UI (Deployments > reproduce/reproduce > Run > Custom run); and 'reestimate/reestimate', the "
            "re-estimation of the target label distribution on new batches, on the cron schedule of --cron (or "
            f"${ENV_CRON}) if given, else unscheduled (Run > Quick run in the UI, or `prefect deployment run "
            "reestimate/reestimate`), one run at a time. With PREFECT_API_URL set the deployments go to that "
            "server; without it a Prefect server with its UI is started for as long as this command runs (state "
            "under --home). Stopping pauses the schedule; the next serve resumes it.", 79),
        epilog="examples:\n"
               "  labelshift serve                              # both deployments, reestimate unscheduled\n"
               "  labelshift serve --cron '0 6 * * *'           # reestimate daily at 06:00 UTC\n"
               "  labelshift serve --cron '30 5 * * mon-fri' --timezone Europe/Paris \\\n"
               "      --model models:/labelshift-mnist-5k@latest-good --target s3://labelshift/store/target\n"
               "A flag wins over its environment variable. Exit status: 0 stopped, 1 a server or the deployments "
               "failed,\n2 bad options (e.g. a malformed cron string: nothing is registered).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, top=False)
    d = p.add_argument_group("the deployments")
    d.add_argument("--name", default="reproduce", help="name of the reproduce deployment (default: reproduce)")
    d.add_argument("--reestimate-name", default="reestimate", metavar="NAME",
                   help="name of the reestimate deployment (default: reestimate)")
    d.add_argument("--limit", type=int, default=1, metavar="N",
                   help="flow runs this process executes at the same time, both deployments together (default: 1)")
    d.add_argument("--port", type=int, default=4200,
                   help="port of the Prefect server started when PREFECT_API_URL is not set (default: 4200)")
    r = p.add_argument_group("re-estimation schedule and defaults")
    r.add_argument("--cron", metavar="'M H DOM MON DOW'",
                   help="cron schedule of reestimate: five fields minute hour day-of-month month day-of-week, e.g. "
                        f"'0 6 * * *' for daily at 06:00 (default: ${ENV_CRON}; neither: no schedule). Checked "
                        "before anything is registered")
    r.add_argument("--timezone", metavar="ZONE",
                   help=f"IANA time zone the cron hours are read in, e.g. Europe/Paris (default: ${ENV_TIMEZONE} "
                        "or UTC)")
    r.add_argument("--model", metavar="URI",
                   help="default model of reestimate runs, models:/NAME@ALIAS in the MLflow registry (its "
                        f"calibrator is logged beside it) (default: ${ENV_MODEL} or the flow's own default, "
                        "models:/labelshift-mnist-5k@latest-good)")
    r.add_argument("--target", metavar="URI",
                   help="default target location of reestimate runs, where new batches arrive: s3://bucket/prefix "
                        f"or a folder (default: ${ENV_TARGET} or the flow's own default, <store>/target)")
    o = p.add_argument_group("where runs put results (inherited by every run)")
    o.add_argument("--store", metavar="URI", help="object store of the runs (default: $LABELSHIFT_STORE or "
                                                  "<home>/store)")
    o.add_argument("--tracking-uri", metavar="URI", help="MLflow tracking URI of the runs (default: "
                                                         "$MLFLOW_TRACKING_URI or sqlite:///<home>/mlflow.db)")
    p.set_defaults(handler=_cmd_serve)


def _add_where(sub) -> None:
    p = sub.add_parser("where", help="print where state, results and tracking go (resolved settings)",
                       description="Print the resolved locations: state folder, object store, MLflow tracking URI "
                                   "and the command that opens its UI, and the Prefect API in use.")
    _common(p, top=False)
    p.set_defaults(handler=_cmd_where)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Label shift estimation after Garg et al., 'A Unified View of Label Shift Estimation' "
                    "(NeurIPS 2020): the paper's experiments as Prefect flows, tracked in MLflow.",
        epilog=f"Run '{PROG} <command> --help' for a command's options. State goes under ./.labelshift "
               f"(or ${settings_mod.ENV_HOME}, or --home) unless PREFECT_API_URL, MLFLOW_TRACKING_URI or "
               f"{settings_mod.ENV_STORE} point elsewhere.")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    _add_reproduce(sub)
    _add_serve(sub)
    _add_where(sub)
    _add_data(sub)
    _add_report(sub)
    from flows import estimate_cli

    estimate_cli.register(sub)
    try:
        from flows import stack      # written separately; the command is optional until it exists
    except ImportError:
        stack = None
    if stack is not None and hasattr(stack, "register"):
        stack.register(sub)
    return parser


# -- reproduce -----------------------------------------------------------------------------------------------------
def parameters_from_args(args: argparse.Namespace) -> ReproduceParameters:
    """The flow parameters given on the command line (``--quick`` fills in a tiny grid); raises UsageError."""
    values = dict(QUICK) if getattr(args, "quick", False) else {}
    for name in ReproduceParameters.model_fields:
        v = getattr(args, name, None)
        if v is not None:
            values[name] = v
    try:
        return ReproduceParameters(**values)
    except ValidationError as exc:
        raise UsageError(_explain(exc)) from None


def _explain(exc: ValidationError) -> str:
    """One line per problem, naming the command-line option."""
    lines = []
    for err in exc.errors():
        loc = err.get("loc", ())
        field = str(loc[0]) if loc else ""
        where = _option(field) if field in ReproduceParameters.model_fields else "options"
        if len(loc) > 1 and isinstance(loc[1], int):
            where += f" (item {loc[1] + 1})"
        msg = err.get("msg", "invalid value").removeprefix("Value error, ")
        got = err.get("input")
        if field and not isinstance(got, dict):
            msg += f"; got {got!r}"
        lines.append(f"{where}: {msg}")
    return "invalid option(s):\n  " + "\n  ".join(lines)


def _local_path(uri: str) -> str:
    """``file:///x`` as ``/x`` (local paths print better); other URIs unchanged."""
    return uri[len("file://"):] if uri.startswith("file://") else uri


def _setup(args, **overrides) -> settings_mod.Settings:
    env = settings_mod.resolve(getattr(args, "home", None), **overrides)
    settings_mod.apply(env, verbose=args.verbose)
    # one line per finished experiment on stdout (with --verbose, Prefect's run logger prints them already)
    progress = logging.getLogger("labelshift.progress")
    for old in list(progress.handlers):
        progress.removeHandler(old)
    if not args.verbose:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("  %(message)s"))
        progress.addHandler(handler)
    progress.setLevel(logging.INFO)
    progress.propagate = False
    return env


def _cmd_reproduce(args) -> int:
    params = parameters_from_args(args)
    env = _setup(args, store_uri=params.store, tracking_uri=params.tracking_uri,
                 experiment_name=params.mlflow_experiment)
    from flows.plan import plan

    n_settings = sum(len(params.grid_values(e)) for e in params.experiments)
    n_tasks = sum(len(tasks) for tasks in plan(params).values())
    print(f"labelshift reproduce: {', '.join(params.experiments)} on '{params.dataset}', {n_settings} settings x "
          f"{params.n_seeds} seeds ({n_tasks} estimation task{'s' if n_tasks != 1 else ''})")
    if env.prefect_api_url:
        print(f"  Prefect: {env.prefect_api_url}")
    else:
        print("  Prefect: starting a temporary local server (10-30 s) ...")
    dask = args.dask or os.environ.get("LABELSHIFT_DASK_ADDRESS", "").strip()
    if dask:
        print(f"  estimation tasks on Dask: {dask}")
    t0 = time.perf_counter()
    from flows.reproduce import run_in_process     # imports Prefect and MLflow: after the environment is set

    temporary = env.prefect_api_url is None
    # on a lasting Prefect server, Ctrl-C unwinds normally: the flow closes its MLflow runs as KILLED and Prefect
    # records the run as crashed; on the temporary server, see _interrupt_handler
    previous = signal.signal(signal.SIGINT, _interrupt_handler) if temporary else None
    try:
        state = run_in_process(params, temporary_server=temporary, dask=args.dask)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    elapsed = time.perf_counter() - t0
    if not state.is_completed():
        print(f"\n{PROG} reproduce: the sweep failed ({state.name}) after {elapsed:.0f} s: {state.message}",
              file=sys.stderr)
        _print_failure_hints(env, state)
        return 1
    result = state.result()
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    _print_where(env, result, elapsed)
    return 0


def _interrupt_handler(signum, frame) -> None:
    """Ctrl-C during a sweep: close its MLflow runs as KILLED, stop the temporary Prefect server, exit 130.

    Done here rather than by letting KeyboardInterrupt unwind: a terminal's Ctrl-C also stops the temporary
    Prefect server (it is in the same process group), after which Prefect's client spends about a minute retrying
    to report the flow's state and events to it, and worker threads finish their tasks (measured with 3.9.1).
    """
    print(f"\n{PROG} reproduce: interrupted; closing the sweep's MLflow runs as KILLED", file=sys.stderr)
    try:
        from flows.reproduce import active_sweeps
        from tasks.tracking import fail_sweep_runs

        for tracking_uri, run_id in active_sweeps():
            fail_sweep_runs(tracking_uri, run_id, "KeyboardInterrupt: interrupted by the user", status="KILLED")
            print(f"  MLflow run {run_id}: KILLED", file=sys.stderr)
    except Exception as exc:                        # still exit; say what could not be closed
        print(f"  could not close the MLflow runs: {exc}", file=sys.stderr)
    try:
        from prefect.server.api.server import SubprocessASGIServer

        SubprocessASGIServer().stop()               # the temporary server, if this process started one
    except Exception:
        pass
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(130)


def _print_failure_hints(env: settings_mod.Settings, state) -> None:
    lines = [f"  MLflow runs this sweep created (if any) are marked FAILED; see them with: {env.mlflow_ui_command()}"]
    if not env.prefect_api_url:
        lines.append(f"  Prefect's logs of the run are in {env.prefect_home} (rerun with --verbose to see them here)")
    else:
        lines.append(f"  Prefect's logs of the run: {env.prefect_api_url.removesuffix('/api')}/runs")
    print("\n".join(lines), file=sys.stderr)


def _print_where(env: settings_mod.Settings, result: dict, elapsed: float) -> None:
    ml = result["mlflow"]
    figures = [_local_path(u) for u in result["figures"].values()]
    print(f"\nDone in {elapsed:.0f} s (of which {result['seconds']:.0f} s in the flow).")
    print(f"  MLflow run:  {ml['run_id']} in experiment '{ml['experiment_name']}' "
          f"(children: one run per method)")
    if ml.get("ui"):
        print(f"  MLflow UI:   {ml['ui']}")
    else:
        print(f"  MLflow UI:   {ml['ui_command']}   then open http://127.0.0.1:5000")
    print("  figures:     " + "\n               ".join(figures))
    print(f"  results:     {_local_path(result['store']['results'])}/  (per_seed_*.csv, summary.json)")
    if not env.prefect_api_url:
        print(f"  Prefect:     run history in {env.prefect_home}; browse it with "
              f"PREFECT_HOME={env.prefect_home} prefect server start")


# -- serve ---------------------------------------------------------------------------------------------------------
def _cmd_serve(args) -> int:
    from flows import serve as serve_mod

    if args.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {args.limit}")
    # flags and variables resolved before anything starts; the schedule itself is checked by Prefect's own
    # validator in serve_deployments, before a server is started or a deployment registered
    options = serve_mod.reestimate_options(cron=args.cron, timezone=args.timezone, model=args.model,
                                           target=args.target)
    env = _setup(args, store_uri=args.store, tracking_uri=args.tracking_uri)
    try:
        return serve_mod.serve_deployments(env, name=args.name, reestimate_name=args.reestimate_name,
                                           port=args.port, limit=args.limit, reestimate=options)
    except serve_mod.ScheduleError as exc:
        raise UsageError(str(exc)) from None


# -- data push -----------------------------------------------------------------------------------------------------
def _add_data(sub) -> None:
    p = sub.add_parser("data", help="image datasets in the object store (labelshift data push NAME)",
                       description="Manage the image datasets the reproduce flow reads from the object store.")
    _common(p, top=False)
    dsub = p.add_subparsers(dest="data_command", metavar="<action>")
    push = dsub.add_parser(
        "push", help="build a dataset and write it to the store",
        description="Build dataset NAME in the canonical layout (train/valid/test arrays plus a manifest with "
                    "checksums) and write it under --to. mnist-5k and digits ship inside installed packages; "
                    "mnist and cifar10 need --from DIR (MNIST's idx files, CIFAR-10's python batches) or "
                    "--download (internet).",
        epilog="examples:\n  labelshift data push mnist-5k\n"
               "  labelshift data push mnist --from ~/data/mnist --to s3://bucket/labelshift/datasets/mnist\n"
               "The reproduce flow reads <store>/datasets/NAME, the default of --to.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(push, top=False)
    push.add_argument("name", metavar="NAME", help="mnist, cifar10, mnist-5k or digits")
    push.add_argument("--to", metavar="URI", help="destination prefix: s3://bucket/prefix or a folder "
                                                  "(default: <store>/datasets/NAME, where reproduce reads it)")
    push.add_argument("--from", dest="source_dir", metavar="DIR", help="folder with the standard source files")
    push.add_argument("--download", action="store_true", help="download the source files (needs internet)")
    push.add_argument("--seed", type=int, default=0, help="seed of the stratified splits (default: 0)")
    push.set_defaults(handler=_cmd_data_push)
    from flows import estimate_cli

    estimate_cli.register_simulate(dsub)
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])


def _cmd_data_push(args) -> int:
    from labelshift.datasets import DATASETS
    from labelshift.datasets import push_dataset
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
                            download=args.download, seed=args.seed)
    counts = {s: sum(c) for s, c in manifest["class_counts"].items()}
    print(f"pushed {args.name} to {_local_path(store.uri)} in {time.perf_counter() - t0:.1f} s: "
          + ", ".join(f"{s} {n}" for s, n in counts.items()))
    return 0


# -- report --------------------------------------------------------------------------------------------------------
def _add_report(sub) -> None:
    p = sub.add_parser(
        "report", help="write a markdown results page from the MLflow runs",
        description="Query the MLflow experiment for the latest finished sweep of each dataset and write "
                    "results.md (one table per dataset and experiment: MSE per method and setting with standard "
                    "errors; how the claims of the paper's Section 6 fare, computed from the numbers) with the "
                    "figures beside it.")
    _common(p, top=False)
    p.add_argument("--out", metavar="DIR", default=None, help="output folder (default: <home>/report)")
    p.add_argument("--tracking-uri", metavar="URI", help="MLflow tracking URI (default: as for reproduce)")
    p.add_argument("--experiment-name", metavar="NAME", help="MLflow experiment (default: as for reproduce)")
    p.set_defaults(handler=_cmd_report)


def _cmd_report(args) -> int:
    env = _setup(args, tracking_uri=args.tracking_uri, experiment_name=args.experiment_name)
    from tasks.results_page import write_report

    out = args.out or str(env.home / "report")
    page = write_report(env.tracking_uri, env.experiment_name, out)
    print(f"report: {page}")
    return 0


# -- where ---------------------------------------------------------------------------------------------------------
def _cmd_where(args) -> int:
    env = settings_mod.resolve(getattr(args, "home", None))
    print(f"state folder:    {env.home}")
    print(f"object store:    {env.store_uri}")
    print(f"MLflow tracking: {env.tracking_uri}")
    print(f"MLflow UI:       {env.mlflow_ui_command()}")
    temporary = f"a temporary server per command (PREFECT_HOME={env.prefect_home})"
    print(f"Prefect API:     {env.prefect_api_url or temporary}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    handler = getattr(args, "handler", None) or getattr(args, "func", None)
    if handler is None:
        parser.parse_args([args.command, "--help"])
        return 2
    try:
        return int(handler(args) or 0)
    except UsageError as exc:
        sub = f"{PROG} {args.command}"
        print(f"{sub}: error: {exc}\nRun '{sub} --help' for the options.", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from labelshift.errors import LabelShiftError

        if isinstance(exc, LabelShiftError) and not getattr(args, "verbose", False):
            print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":      # pragma: no cover
    sys.exit(main())
