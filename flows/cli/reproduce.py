"""``labelshift reproduce``: the paper's sweeps (the ``reproduce`` flow), options from :class:`ReproduceParameters`."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import textwrap
import time
from contextlib import contextmanager

from runtime import environment as settings_mod
from flows.cli._common import PROG, Opt, add_common, add_field, given, local_path, option_name, prefect_api, \
    problems, setup, validated
from flows.cli.stopping import LOST_HINT, EXIT_SERVER_LOST, EXIT_TERMINATED, lost_reason, sigterm_clock, \
    sigterm_unwinds, stopped_sentence, tell, watched
from flows.params import BINS_METHODS, EXPERIMENTS, METHODS, ReproduceParameters
from labelshift.experiments.images import CALIBRATIONS

__all__ = ["register", "parameters_from_args", "OPTIONS", "QUICK"]

#: how each flow parameter appears on the command line, where it differs from --<name with dashes>
OPTIONS: dict[str, Opt] = {
    "experiments": Opt(extra=f" Choose from {','.join(EXPERIMENTS)}."),
    "bins_values": Opt(option="--bins"),
    "target_size": Opt(metavar="M"),
    "size_shift": Opt(metavar="P"),
    "n_seeds": Opt(option="--seeds", metavar="N"),
    "methods": Opt(extra=f" Choose from {','.join(METHODS)},RLLS-soft,PCC; the bins sweep always runs "
                         f"{','.join(BINS_METHODS)}; calibrations after @: {','.join(CALIBRATIONS)}."),
    "base_seed": Opt(metavar="S"),
    "n_source": Opt(metavar="N"),
    "alpha_values": Opt(option="--alphas"),
    "size_alpha": Opt(metavar="A"),
    "model_seeds": Opt(metavar="N"),
    "network": Opt(metavar="NAME"),
    "epochs": Opt(metavar="N"),
    "train_limit": Opt(metavar="N"),
    "good_accuracy": Opt(metavar="A"),
    "seeds_per_task": Opt(metavar="N"),
    "store": Opt(metavar="URI"),
    "tracking_uri": Opt(metavar="URI"),
    "mlflow_experiment": Opt(option="--experiment-name", metavar="NAME"),
}
#: the parameters in the help's three groups
WHAT_TO_RUN = ("dataset", "experiments", "shift_values", "target_sizes", "bins_values", "target_size", "size_shift",
               "n_seeds", "methods", "base_seed", "mu", "n_source")
IMAGE_DATASETS = ("alpha_values", "size_alpha", "model_seeds", "network", "epochs", "train_limit", "calibrators",
                  "good_accuracy")
WHERE_TO = ("seeds_per_task", "store", "tracking_uri", "mlflow_experiment")

#: a grid that runs in seconds (smoke test of a fresh install)
QUICK = dict(shift_values=[0.05, 0.2, 0.5], target_sizes=[100, 1000], bins_values=[2, 8], n_seeds=10)


def register(sub) -> None:
    p = sub.add_parser(
        "reproduce", help="run the paper's sweeps (two Gaussians; image datasets: MSE vs Dirichlet alpha, size)",
        description=textwrap.fill(
            "Run the label-shift sweeps of the paper (Garg et al. 2020, Section 6) as a Prefect flow and log them to "
            "MLflow: for each setting and seed draw source and target sets, estimate the importance weights with "
            "every method, and report the weight MSE. Without servers configured it uses the embedded defaults "
            f"under --home; with {settings_mod.ENV_PREFECT_API_URL}, {settings_mod.ENV_TRACKING_URI} or "
            f"{settings_mod.ENV_STORE} set (e.g. by `labelshift stack up`) it uses those.", 79),
        epilog="examples:\n"
               "  labelshift reproduce                         # the default sweep, about 2 minutes\n"
               "  labelshift reproduce --quick                 # a tiny grid, a smoke test\n"
               "  labelshift reproduce --experiments shift --shift-values 0.01,0.1,0.5 --seeds 20\n"
               "  labelshift reproduce --store s3://bucket/labelshift --tracking-uri http://127.0.0.1:5000\n"
               "  labelshift reproduce --dataset mnist-5k      # train, calibrate, Dirichlet-shift sweeps\n"
               "  labelshift reproduce --dataset fashion-mnist # 70,000 images; every calibration x estimator\n"
               "Lists are comma-separated. Exit status: 0 done, 1 the sweep failed, 2 bad options, 130 interrupted.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p, top=False)
    g = p.add_argument_group("what to run")
    for field in WHAT_TO_RUN:
        add_field(g, ReproduceParameters, field, OPTIONS.get(field), OPTIONS)
    i = p.add_argument_group("image datasets")
    for field in IMAGE_DATASETS:
        add_field(i, ReproduceParameters, field, OPTIONS.get(field), OPTIONS)
    g.add_argument("--quick", action="store_true",
                   help="a tiny grid that finishes in seconds (" +
                        "; ".join(f"{option_name(k, OPTIONS)} {','.join(map(str, v)) if isinstance(v, list) else v}"
                                  for k, v in QUICK.items()) + "); explicit options still win")
    o = p.add_argument_group("how to run it and where results go")
    for field in WHERE_TO:
        add_field(o, ReproduceParameters, field, OPTIONS.get(field), OPTIONS)
    o.add_argument("--dask", metavar="ADDRESS",
                   help="run the estimation tasks on a Dask cluster: a scheduler address (tcp://host:8786) or "
                        "'local' (one single-threaded worker process per core); needs pip install "
                        f"'labelshift[dask]' (default: ${settings_mod.ENV_DASK}, else threads in this process)")
    o.add_argument("--json", action="store_true", help="print the flow's result (ids, locations, MSE rows) as JSON")
    p.set_defaults(handler=run)


def parameters_from_args(args: argparse.Namespace) -> ReproduceParameters:
    """The flow parameters given on the command line (``--quick`` fills in a tiny grid); raises UsageError."""
    values = dict(QUICK) if getattr(args, "quick", False) else {}
    values.update(given(args, ReproduceParameters))
    return validated(ReproduceParameters, values, _explain)


def _explain(exc) -> str:
    return "invalid option(s):\n  " + "\n  ".join(problems(exc.errors(), ReproduceParameters, OPTIONS))


def run(args) -> int:
    params = parameters_from_args(args)
    env = setup(args, prefect_server=True, store_uri=params.store, tracking_uri=params.tracking_uri,
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
    dask = args.dask or env.dask_address
    if dask:
        print(f"  estimation tasks on Dask: {dask}")
    t0 = time.perf_counter()
    from flows.reproduce import run_in_process     # imports Prefect and MLflow: after the environment is set

    temporary = env.prefect_api_url is None
    # on a lasting Prefect server, Ctrl-C and SIGTERM unwind normally: the flow closes its MLflow runs as KILLED and
    # Prefect records the run as crashed; on the temporary server, see _stop_sweep
    with _stopped_at_once(temporary), prefect_api(env) as api_url, \
            watched(api_url, lambda reason: stopped_sentence("reproduce", reason, hint=LOST_HINT)):
        state = run_in_process(params, temporary_server=temporary, dask=args.dask)
    elapsed = time.perf_counter() - t0
    if not state.is_completed():
        from flows.cli.refusals import failure_text

        print(f"\n{PROG} reproduce: the sweep failed ({state.name}) after {elapsed:.0f} s: {failure_text(state)}",
              file=sys.stderr)
        _print_failure_hints(env, state)
        return 1
    result = state.result()
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    _print_where(env, result, elapsed)
    return 0


@contextmanager
def _stopped_at_once(temporary: bool):
    """Within the block, Ctrl-C and SIGTERM stop the sweep with :func:`_stop_sweep` on the temporary server, and
    SIGTERM unwinds as Ctrl-C does on a lasting one (:func:`flows.cli.stopping.sigterm_unwinds`)."""
    if not temporary:
        with sigterm_unwinds("reproduce"):
            yield
        return
    previous = {sig: signal.signal(sig, _stop_sweep) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with sigterm_clock(lambda: stopped_sentence("reproduce", "stopped by SIGTERM")):
            yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_sweep(signum, frame) -> None:
    """Ctrl-C, SIGTERM or a lost Prefect server during a sweep on the temporary server: close its MLflow runs as
    KILLED, stop the temporary Prefect server, exit 130, 143 or 75 with a sentence saying why.

    Done here rather than by letting KeyboardInterrupt unwind: a terminal's Ctrl-C also stops the temporary
    Prefect server (it is in the same process group), after which Prefect's client spends about a minute retrying
    to report the flow's state and events to it, and worker threads finish their tasks (measured with 3.9.1).
    While the flow runs, Prefect's own SIGTERM handler takes the signal first (the flow closes its runs KILLED)
    and passes it on here after its teardown; a lost server's clock bounds that teardown.
    """
    lost = lost_reason()
    if lost:
        code, why = EXIT_SERVER_LOST, stopped_sentence("reproduce", lost, hint=LOST_HINT)
    elif signum == signal.SIGTERM:
        code, why = EXIT_TERMINATED, stopped_sentence("reproduce", "stopped by SIGTERM")
    else:
        code, why = 130, stopped_sentence("reproduce", "interrupted")
    try:
        from flows.reproduce import active_sweeps
        from tasks.sweep.runs import fail_sweep_runs

        for tracking_uri, parent_id, flow_run_id in active_sweeps():
            for run_id in fail_sweep_runs(tracking_uri, parent_id, f"{signal.Signals(signum).name}: {why.strip()}",
                                          status="KILLED", flow_run_id=flow_run_id):
                print(f"  MLflow run {run_id}: KILLED", file=sys.stderr)
    except Exception as exc:                        # still exit; say what could not be closed
        print(f"  could not close the MLflow runs: {exc}", file=sys.stderr)
    tell(why)                                       # after closing them: what it says has happened
    try:
        from prefect.server.api.server import SubprocessASGIServer

        SubprocessASGIServer().stop()               # the temporary server, if this process started one
    except Exception:
        pass
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(code)


def _print_failure_hints(env: settings_mod.Settings, state) -> None:
    lines = [f"  MLflow runs this sweep created (if any) are marked FAILED; see them with: {env.mlflow_ui_command()}"]
    if not env.prefect_api_url:
        lines.append(f"  Prefect's logs of the run are in {env.prefect_home} (rerun with --verbose to see them here)")
    else:
        lines.append(f"  Prefect's logs of the run: {env.prefect_api_url.removesuffix('/api')}/runs")
    print("\n".join(lines), file=sys.stderr)


def _print_where(env: settings_mod.Settings, result: dict, elapsed: float) -> None:
    ml = result["mlflow"]
    figures = [local_path(u) for u in result["figures"].values()]
    print(f"\nDone in {elapsed:.0f} s (of which {result['seconds']:.0f} s in the flow).")
    print(f"  MLflow run:  {ml['run_id']} in experiment '{ml['experiment_name']}' "
          f"(children: one run per method)")
    if ml.get("ui"):
        print(f"  MLflow UI:   {ml['ui']}")
    else:
        print(f"  MLflow UI:   {ml['ui_command']}   then open http://127.0.0.1:5000")
    print("  figures:     " + "\n               ".join(figures))
    print(f"  results:     {local_path(result['store']['results'])}/  (per_seed_*.csv, summary.json)")
    if not env.prefect_api_url:
        print(f"  Prefect:     run history in {env.prefect_home}; browse it with "
              f"PREFECT_HOME={env.prefect_home} prefect server start")
