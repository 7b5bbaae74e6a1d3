"""The ``reproduce`` flow: the paper's label-shift sweeps (Section 6), fanned out over Prefect tasks.

Per experiment (MSE vs shift, vs target size, vs number of bins) the flow follows Algorithm 1 of the paper: for
every setting and every seed draw a source and a target set, estimate the weights with each method, score
them; then aggregate over seeds and log. The estimation tasks (sized by :mod:`flows.plan`) of all experiments are
submitted at once. Results go to MLflow (a parent run, a child run per method), the object store
(``results/<mlflow run id>/``) and a Prefect markdown artifact; on any failure the MLflow runs end FAILED.

The tasks run on a thread pool of the flow's process, or on a Dask cluster (``pip install 'labelshift[dask]'``)
named by ``LABELSHIFT_DASK_ADDRESS`` (``tcp://host:8786`` or ``local``), read when this module is imported so that
deployments' runs follow it, or by ``labelshift reproduce --dask ADDRESS``; the results do not depend on the runner.
"""
from __future__ import annotations

import os
import time
import uuid
from contextlib import nullcontext

from prefect import flow, unmapped
from prefect.task_runners import ThreadPoolTaskRunner

from runtime import environment as settings_mod
from runtime.signals import stops_outside
from flows.links import flow_run_info, mlflow_links, prefect_flow_run_url
from flows.plan import plan as plan_tasks
from flows.params import (AlphaValuesParam, BaseSeedParam, BinsValuesParam, CalibratorsParam, DatasetParam,
                          EpochsParam, ExperimentsParam, GoodAccuracyParam, MethodsParam, MlflowExperimentParam,
                          ModelSeedsParam, MuParam, NetworkParam, NSeedsParam, NSourceParam, ReproduceParameters,
                          SeedsPerTaskParam, ShiftValuesParam, SizeAlphaParam, SizeShiftParam, StoreParam,
                          TargetSizeParam, TargetSizesParam, TrackingUriParam, TrainLimitParam, documented)
from labelshift.errors import InputError, LabelShiftError
from tasks.sweep.estimation import aggregate_sweep, estimate_settings
from tasks.sweep.images import (calibrate, ensure_dataset, ensure_gpu_limit, estimate_image_settings, predict_pools,
                                report_progress as _report, train_model)
from tasks.sweep.outputs import records_csv, render_outputs
from tasks.sweep.report import publish_summary, summary_markdown
from tasks.sweep.storage import check_store_uri, results_url, save_experiment, save_summary
from tasks.sweep.runs import fail_sweep_runs, finish_sweep_runs, log_experiment, start_sweep_runs
from tasks.tracking import FLOW_RUN_TAG, ended_status, git_commit_tag, run_url
from flows.user_errors import install as _log_user_errors_once

_log_user_errors_once()

__all__ = ["reproduce", "run_in_process", "active_sweeps", "DEFAULTS", "dask_task_runner", "with_task_runner",
           "ENV_DASK", "MissingExtraError"]

#: scheduler address of a Dask cluster ("tcp://host:8786"), or "local", for the estimation tasks (see the docstring)
ENV_DASK = settings_mod.ENV_DASK

#: the defaults of every parameter (also those of ``labelshift reproduce`` and ``make run``)
DEFAULTS = ReproduceParameters()

#: the sweeps running in this process: a key of each -> [tracking URI, MLflow parent run id once created, flow run
#: id ("" outside a Prefect flow run)]
_ACTIVE: dict[str, list] = {}


def active_sweeps() -> list[tuple[str, str | None, str]]:
    """``(tracking_uri, parent_run_id or None, flow_run_id)`` of the sweeps running in this process, for an interrupt
    handler that must close their MLflow runs itself (:func:`~tasks.sweep.runs.fail_sweep_runs`)."""
    return [(uri, parent, flow_run_id) for uri, parent, flow_run_id in list(_ACTIVE.values())]


def _workers() -> int:
    """Estimation tasks running at once: one per core (numpy releases the GIL in the heavy loops)."""
    return max(1, os.cpu_count() or 1)


class MissingExtraError(LabelShiftError, ImportError):
    """An optional feature was asked for whose packages are not installed (the message says which extra)."""


def dask_task_runner(address: str, **cluster_kwargs):
    """A ``prefect_dask.DaskTaskRunner`` for a scheduler address (``tcp://host:port``, ``host:port``, ``tls://...``),
    or with ``"local"`` for a ``LocalCluster`` per flow run (``cluster_kwargs``; by default one single-threaded
    worker process per core). MissingExtraError without prefect-dask; InputError for a bad address."""
    address = (address or "").strip()
    if not address:
        raise InputError(f"the Dask address is empty; give a scheduler address such as tcp://host:8786, or 'local' "
                         f"(--dask or ${ENV_DASK})")
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError as exc:
        raise MissingExtraError(
            f"the Dask task runner ({ENV_DASK}={address!r} or --dask) needs prefect-dask, which is not installed "
            f"({exc}); install it with: pip install 'labelshift[dask]'") from None
    if address.lower() == "local":
        kwargs = {"n_workers": _workers(), "threads_per_worker": 1, **cluster_kwargs}
        return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=kwargs)
    if cluster_kwargs:
        raise InputError("cluster options apply to the 'local' Dask cluster only; a scheduler at "
                         f"{address} has its own workers")
    return DaskTaskRunner(address=settings_mod.dask_scheduler_address(address))


@stops_outside()                                    # it writes to MLflow's store
def _start_runs(p: ReproduceParameters, env, plan: dict, flow_run_id: str, flow_run_name: str,
                prefect_url: str | None) -> dict:
    """The MLflow parent run of the sweep and a child run per method (an unreachable server fails before any work)."""
    tags = {"dataset": p.dataset, FLOW_RUN_TAG: flow_run_id, "prefect.flow_run_name": flow_run_name,
            "labelshift.store": env.store_uri, **git_commit_tag()}
    run_name = f"{p.dataset}-{flow_run_name or time.strftime('%Y%m%d-%H%M%S')}"
    return start_sweep_runs(env.tracking_uri, env.experiment_name, env.artifact_root, run_name=run_name,
                            params=p.as_mlflow_params(), tags=tags,
                            methods_by_experiment={e: list(p.methods_for(e)) for e in plan}, prefect_url=prefect_url)


def _submit_estimations(p: ReproduceParameters, env, runs: dict, plan: dict) -> tuple[dict, list[dict]]:
    """Every method on every (setting, seed), all experiments submitted at once (image datasets: after the models
    are trained and calibrated). Returns the futures per experiment and the models' meta."""
    pending, models = {}, []
    if p.is_image:
        pools, models = _prepare_models(p, env, runs)
        for experiment, batches in plan.items():
            pending[experiment] = estimate_image_settings.map(
                [group for group, _ in batches], [seeds for _, seeds in batches],
                methods=unmapped(list(p.methods_for(experiment))), pools=unmapped(pools),
                base_seed=p.base_seed)
    for experiment, batches in ({} if p.is_image else plan).items():
        pending[experiment] = estimate_settings.map(
            [group for group, _ in batches], [seeds for _, seeds in batches],
            methods=unmapped(list(p.methods_for(experiment))), mu=p.mu, n_source=p.n_source,
            base_seed=p.base_seed)
    return pending, models


def _collect_experiments(p: ReproduceParameters, env, runs: dict, pending: dict, t_start: float) -> tuple[list, dict]:
    """Per experiment, as it finishes: join the seed chunks, aggregate, draw, log, store. Returns the sweeps and
    the files stored."""
    sweeps, files = [], {}
    for experiment, futures in pending.items():
        chunk_results = [r for f in futures for r in f.result()]   # raises the first task error, if any
        sweep = aggregate_sweep(experiment, chunk_results)
        outputs = render_outputs(sweep, p.dataset)
        with stops_outside():
            log_experiment(env.tracking_uri, runs, sweep, outputs)
        files.update(save_experiment(env.store_uri, runs["parent_run_id"], experiment, outputs))
        sweeps.append(sweep)
        best = sweep.methods[int(sweep.mse_mean.mean(axis=0).argmin())]
        _report(f"{experiment}: {len(sweep.values)} settings x {p.n_seeds} seeds x {len(sweep.methods)} "
                f"methods done ({time.perf_counter() - t_start:.1f} s); lowest mean MSE: {best}")
    return sweeps, files


def _links(env, runs: dict, sweeps: list, files: dict, prefect_url: str | None) -> dict[str, str]:
    """The artifact's links: the MLflow run and its figures (or where to find them without a server), the results
    in the object store and this flow run."""
    parent_id = runs["parent_run_id"]
    links = mlflow_links(env.tracking_uri, runs["experiment_id"], parent_id,
                         [f"figures/mse_vs_{s.kind}.png" for s in sweeps])
    if not links:
        links = {"MLflow run": f"run {parent_id} in experiment '{env.experiment_name}' "
                               f"(`{env.mlflow_ui_command()}`)"}
        links.update({f"figure {k.rsplit('/', 1)[-1]}": v["url"] for k, v in files.items() if k.endswith(".png")})
    links["results in the object store"] = results_url(env.store_uri, parent_id)
    if prefect_url:
        links["this flow run"] = prefect_url
    return links


@stops_outside()                                    # it writes to MLflow's store
def _publish(p: ReproduceParameters, env, runs: dict, sweeps: list, files: dict, models: list, summary_rows: list,
             flow_run_id: str, prefect_url: str | None, t_start: float) -> dict:
    """The summary: in the store, as the Prefect artifact and in MLflow (whose runs then end FINISHED). Returns
    where the store holds it."""
    parent_id = runs["parent_run_id"]
    stored = save_summary(env.store_uri, parent_id, {
        "parameters": p.model_dump(), "mlflow": {"tracking_uri": env.tracking_uri, "run_id": parent_id,
                                                 "experiment_id": runs["experiment_id"]},
        "prefect_flow_run_id": flow_run_id, "rows": summary_rows, "files": files, "models": models})
    publish_summary(summary_markdown(f"Label shift sweep on '{p.dataset}'", sweeps,
                                     _links(env, runs, sweeps, files, prefect_url)), key=f"reproduce-{p.dataset}")
    finish_sweep_runs(env.tracking_uri, runs, records_csv(summary_rows),
                      tags={"labelshift.results": results_url(env.store_uri, parent_id),
                            "labelshift.seconds": f"{time.perf_counter() - t_start:.1f}"})
    return stored


def _say_where(env, runs: dict) -> str | None:
    """Print where the sweep's MLflow run is (its UI link, else its id and how to see it); return the link."""
    ui = run_url(env.tracking_uri, runs["experiment_id"], runs["parent_run_id"])
    _report(f"MLflow run: {ui}" if ui else f"MLflow run {runs['parent_run_id']} in experiment "
                                           f"'{env.experiment_name}' ({env.mlflow_ui_command()})")
    return ui


def _fail_runs(exc: BaseException, env, runs: dict | None, flow_run_id: str) -> None:
    """Close the MLflow runs FAILED (KILLED when interrupted: any BaseException that is no Exception) -- those of
    this flow run by their tag when it stopped before it had their ids; a failure to do so is reported, and the
    original error stays the run's."""
    cause = f"{type(exc).__name__}: {exc}"
    status = ended_status(exc)
    try:
        fail_sweep_runs(env.tracking_uri, runs and runs["parent_run_id"], cause, status=status,
                        flow_run_id=flow_run_id)
    except Exception as close_exc:          # keep the original error; say that MLflow could not be updated
        _report(f"could not mark the sweep's MLflow runs {status}: {close_exc}")


def _result(env, runs: dict, ui: str | None, stored: dict, files: dict, summary_rows: list, models: list,
            t_start: float) -> dict:
    """What the flow returns: the MLflow ids and URIs, the store folder, the figures, the summary rows."""
    parent_id = runs["parent_run_id"]
    return {
        "mlflow": {"tracking_uri": env.tracking_uri, "experiment_id": runs["experiment_id"],
                   "experiment_name": env.experiment_name, "run_id": parent_id,
                   "child_run_ids": runs["child_run_ids"], "ui": ui, "ui_command": env.mlflow_ui_command()},
        "store": {"uri": env.store_uri, "results": results_url(env.store_uri, parent_id),
                  "summary": stored["url"]},
        "figures": {k.rsplit("/", 1)[-1]: v["url"] for k, v in files.items() if k.endswith(".png")},
        "rows": summary_rows,
        "models": models,
        "seconds": time.perf_counter() - t_start,
    }


@flow(name="reproduce", task_runner=ThreadPoolTaskRunner(max_workers=_workers()), validate_parameters=True)
@documented(ReproduceParameters)
def reproduce(
    dataset: DatasetParam = DEFAULTS.dataset,
    experiments: ExperimentsParam = DEFAULTS.experiments,
    shift_values: ShiftValuesParam = DEFAULTS.shift_values,
    target_sizes: TargetSizesParam = DEFAULTS.target_sizes,
    bins_values: BinsValuesParam = DEFAULTS.bins_values,
    target_size: TargetSizeParam = DEFAULTS.target_size,
    size_shift: SizeShiftParam = DEFAULTS.size_shift,
    n_seeds: NSeedsParam = DEFAULTS.n_seeds,
    methods: MethodsParam = DEFAULTS.methods,
    base_seed: BaseSeedParam = DEFAULTS.base_seed,
    seeds_per_task: SeedsPerTaskParam = DEFAULTS.seeds_per_task,
    mu: MuParam = DEFAULTS.mu,
    n_source: NSourceParam = DEFAULTS.n_source,
    store: StoreParam = DEFAULTS.store,
    tracking_uri: TrackingUriParam = DEFAULTS.tracking_uri,
    mlflow_experiment: MlflowExperimentParam = DEFAULTS.mlflow_experiment,
    alpha_values: AlphaValuesParam = DEFAULTS.alpha_values,
    size_alpha: SizeAlphaParam = DEFAULTS.size_alpha,
    model_seeds: ModelSeedsParam = DEFAULTS.model_seeds,
    network: NetworkParam = DEFAULTS.network,
    epochs: EpochsParam = DEFAULTS.epochs,
    train_limit: TrainLimitParam = DEFAULTS.train_limit,
    calibrators: CalibratorsParam = DEFAULTS.calibrators,
    good_accuracy: GoodAccuracyParam = DEFAULTS.good_accuracy,
) -> dict:
    """Reproduce the paper's label-shift experiments: weight MSE of each estimator vs shift, target size, bins.

    Returns:
        A dict with the MLflow ids and URIs, the store folder, the figures written and the summary rows.
    """
    p = ReproduceParameters(**{name: value for name, value in locals().items()
                               if name in ReproduceParameters.model_fields})
    env = settings_mod.resolve(store_uri=p.store, tracking_uri=p.tracking_uri, experiment_name=p.mlflow_experiment)
    check_store_uri(env.store_uri)
    flow_run_id, flow_run_name = (value or "" for value in flow_run_info())
    prefect_url, t_start = prefect_flow_run_url(flow_run_id), time.perf_counter()

    # 1. the settings of each experiment (Section 6: the x values with the fixed m or p_t(y=1) filled in), cut
    #    into estimation tasks of a few tenths of a second (groups of settings x chunks of seeds)
    plan = plan_tasks(p)
    runs, key = None, flow_run_id or uuid.uuid4().hex
    _ACTIVE[key] = [env.tracking_uri, None, flow_run_id]
    try:
        # 2. MLflow first: parent run for the sweep, a child run per method; their ids go explicitly to every task
        runs = _start_runs(p, env, plan, flow_run_id, flow_run_name, prefect_url)
        _ACTIVE[key][1] = runs["parent_run_id"]
        ui = _say_where(env, runs)
        # 3. fan-out: estimate every method on every (setting, seed), all experiments submitted at once
        pending, models = _submit_estimations(p, env, runs, plan)
        # 4. per experiment, as it finishes: join the seed chunks, aggregate, draw, log, store
        sweeps, files = _collect_experiments(p, env, runs, pending, t_start)
        # 5. the summary: store, Prefect artifact, MLflow (runs end FINISHED)
        summary_rows = [dict(row, experiment=s.kind) for s in sweeps for row in s.to_records()]
        stored = _publish(p, env, runs, sweeps, files, models, summary_rows, flow_run_id, prefect_url, t_start)
    except BaseException as exc:
        _fail_runs(exc, env, runs, flow_run_id)       # never left RUNNING
        raise
    finally:
        _ACTIVE.pop(key, None)
    return _result(env, runs, ui, stored, files, summary_rows, models, t_start)


def with_task_runner(dask: str | None = None):
    """The ``reproduce`` flow on the Dask cluster ``dask`` names (:func:`dask_task_runner`), else as imported."""
    return reproduce.with_options(task_runner=dask_task_runner(dask)) if dask else reproduce


# deployments (served or on workers) load `reproduce` from this module: the variable chooses their task runner
_address = settings_mod.resolve().dask_address
if _address:
    reproduce = with_task_runner(_address)


def _prepare_models(p: ReproduceParameters, env, runs: dict) -> tuple[list, list[dict]]:
    """Image datasets: the dataset in the store, one network per model seed trained (or cached) and calibrated.
    Returns (one Pools per model, their meta dicts)."""
    import torch
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    ensure_dataset(env.store_uri, p.dataset)
    train = train_model
    if torch.cuda.is_available():
        # one training per GPU: a tag concurrency limit 'gpu' with a slot per visible GPU
        ensure_gpu_limit(torch.cuda.device_count())
        train = train_model.with_options(tags=["gpu"])
    futures = [train.submit(env.store_uri, p.dataset, seed, tracking_uri=env.tracking_uri,
                            experiment_id=runs["experiment_id"], parent_run_id=runs["parent_run_id"],
                            network=p.network, epochs=p.epochs, train_limit=p.train_limit,
                            good_accuracy=p.good_accuracy)
               for seed in range(p.model_seeds)]
    pools, metas = [], []
    for future in futures:
        meta = future.result()
        how = "found in the store" if meta["cached"] else \
            f"trained on {meta['device']} in {meta['train_seconds']:.0f} s"
        _report(f"model {p.dataset} seed {meta['model_seed']}: {how}; test accuracy {meta['test_accuracy']:.4f}")
        outputs = predict_pools(env.store_uri, meta)
        pools.append(calibrate(env.store_uri, meta, outputs, list(p.calibrators), tracking_uri=env.tracking_uri))
        metas.append(meta)
    acc = [m["test_accuracy"] for m in metas]
    now = int(time.time() * 1000)
    with stops_outside():
        MlflowClient(env.tracking_uri).log_batch(runs["parent_run_id"], metrics=[
            Metric("model/test_accuracy_mean", float(sum(acc) / len(acc)), now, 0),
            Metric("model/test_accuracy_min", float(min(acc)), now, 0)])
    return pools, metas


def run_in_process(params: ReproduceParameters, *, temporary_server: bool, dask: str | None = None):
    """Run the flow in this process (as ``labelshift reproduce`` does) and return its final Prefect state.

    With ``temporary_server`` (no PREFECT_API_URL) flow-run heartbeats are off: a temporary server cannot outlive
    the process to mark it Crashed, and in Prefect 3.9 joining their thread adds up to a second per run. With
    ``dask`` the temporary server is started up front and its address put in the settings, or each Dask worker
    process would start a temporary server of its own.
    """
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    runner_flow = with_task_runner(dask)
    updates = {}
    if temporary_server:
        updates[PREFECT_FLOWS_HEARTBEAT_FREQUENCY] = None
        if _is_dask(runner_flow) and not PREFECT_API_URL.value():
            from prefect.server.api.server import SubprocessASGIServer

            server = SubprocessASGIServer()          # the one Prefect's client would start; stopped at exit
            server.start()
            updates[PREFECT_API_URL] = server.api_url
    with temporary_settings(updates=updates) if updates else nullcontext():
        return runner_flow(**params.model_dump(), return_state=True)


def _is_dask(flow_) -> bool:
    return type(flow_.task_runner).__module__.startswith("prefect_dask")
