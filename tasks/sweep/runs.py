"""MLflow logging of a sweep: one parent run per ``reproduce`` call, one child run per method.

* parent run: every flow parameter as a param; tags ``dataset``, ``prefect.flow_run_id``, ``prefect.flow_run_name``,
  ``mlflow.source.git.commit``; figures under ``figures/``; ``tables/per_seed_<experiment>.csv`` and
  ``tables/summary.csv``.
* child run per method, ``<method> · <parent run name>``: per experiment the metric ``<experiment>/mse`` whose
  ``step`` is the swept value when an integer, else in thousandths (:func:`metric_steps`; the tag
  ``labelshift.step.<experiment>`` says which), so a chart against step reads as the curve; ``mse_se``, the x
  value and ``min_eigenvalue`` at the same steps; one ``<experiment>/mse/<x name> <value>`` per setting (the
  overview lists every point); its own figure ``figures/<method>_mse_vs_<experiment>.png``.
* the experiment is tagged as model training (:func:`tasks.tracking.mark_model_training`); runs carry a markdown
  description linking back to the Prefect flow run.

Every function talks to MLflow through an ``MlflowClient`` with explicit ids: MLflow's "active run" is
thread-local and Prefect runs tasks on worker threads, so the fluent API would log to the wrong run or none.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus, RunTag
from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.tracking import (EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND, check_tracking_server, ended_status,
                            experiment_id, log_bytes, mark_model_training, running_runs_of_flow_run)

__all__ = ["X_NAMES", "start_sweep_runs", "log_experiment", "finish_sweep_runs", "fail_sweep_runs", "metric_steps",
           "method_figure_path"]

#: tag with the address of the Prefect flow run that logged a run
PREFECT_URL_TAG = "prefect.flow_run_url"
#: metric name of each experiment's x value
X_NAMES = {"shift": "p_t1", "size": "m", "bins": "n_bins", "alpha": "alpha"}
_MAX_BATCH = 1000     # MLflow accepts at most 1000 metrics per log_batch call
_MAX_PARAM = 6000     # and parameter values up to 6000 characters


def metric_steps(values) -> tuple[list[int], str]:
    """The MLflow ``step`` of each swept value, and what the step means: integer values are their own step;
    fractional ones count in thousandths (0.05 is step 50), or the setting's index when thousandths would collide."""
    floats = [float(v) for v in values]
    if all(v.is_integer() for v in floats):
        return [int(v) for v in floats], "value"
    thousandths = [round(v * 1000) for v in floats]
    if len(set(thousandths)) == len(thousandths) and all(abs(t - v * 1000) < 1e-6 for t, v in
                                                          zip(thousandths, floats)):
        return thousandths, "value x 1000"
    return list(range(len(floats))), "index of the setting"


def _value_text(value) -> str:
    return f"{float(value):g}"


def _note(prefect_url: str | None, text: str) -> dict[str, str]:
    """The run description MLflow shows on a run's overview (markdown), with the link to Prefect."""
    if not prefect_url:
        return {"mlflow.note.content": text}
    return {"mlflow.note.content": f"{text}\n\nPrefect flow run: [{prefect_url}]({prefect_url})",
            PREFECT_URL_TAG: prefect_url}


def _sweep_experiment_id(client: MlflowClient, name: str, artifact_root: str | None) -> str:
    """The experiment of the sweeps (restored when deleted), its artifacts under ``<artifact_root>/<name>``,
    tagged as model training (:func:`mark_model_training`)."""
    location = None
    if artifact_root is not None:
        location = Path(artifact_root, name).resolve().as_uri() if "://" not in artifact_root else \
            f"{artifact_root.rstrip('/')}/{name}"
    found = experiment_id(client, name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND})
    mark_model_training(client, found)
    return found


@task(name="start-mlflow-runs", cache_policy=NO_CACHE, persist_result=False)
def start_sweep_runs(tracking_uri: str, experiment_name: str, artifact_root: str | None, run_name: str,
                     params: dict[str, str], tags: dict[str, str], methods_by_experiment: dict[str, list[str]],
                     prefect_url: str | None = None) -> dict:
    """Create the parent run and one child run per method (``prefect_url`` tagged and linked on each); returns
    ``{"experiment_id", "parent_run_id", "child_run_ids": {method: run_id}}``."""
    check_tracking_server(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id = _sweep_experiment_id(client, experiment_name, artifact_root)
    parent = client.create_run(experiment_id, run_name=run_name, tags={**tags, **_note(
        prefect_url, "Label-shift sweep: the figures are under Artifacts > figures, one child run per method "
                     "holds its MSE curves (metrics) and its own figures.")})
    parent_id = parent.info.run_id
    try:
        client.log_batch(parent_id, params=[Param(k, str(v)[:_MAX_PARAM]) for k, v in params.items()])
        methods: list[str] = []
        for names in methods_by_experiment.values():
            methods += [m for m in names if m not in methods]
        children = {}
        for method in methods:
            experiments = [e for e, names in methods_by_experiment.items() if method in names]
            note = (f"{method} in the sweep {run_name}: metrics `<experiment>/mse` against the swept value "
                    f"(chart x axis: step), one `<experiment>/mse/<x> <value>` per setting, figures under Artifacts.")
            child = client.create_run(experiment_id, run_name=f"{method} · {run_name}", tags={
                "mlflow.parentRunId": parent_id, "method": method, **{k: v for k, v in tags.items()
                                                                       if not k.startswith("mlflow.")},
                **_note(prefect_url, note)})
            children[method] = child.info.run_id
            client.log_batch(child.info.run_id, params=[Param("method", method),
                                                        Param("experiments", ",".join(experiments))])
    except BaseException as exc:
        fail_sweep_runs(tracking_uri, parent_id, f"{type(exc).__name__}: {exc}", status=ended_status(exc))
        raise
    return {"experiment_id": experiment_id, "parent_run_id": parent_id, "child_run_ids": children}


def _finite(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def _curve_metrics(sweep, method: str) -> list[Metric]:
    j = list(sweep.methods).index(method)
    now = int(time.time() * 1000)
    x = X_NAMES.get(sweep.kind, "x")
    x_name = f"{sweep.kind}/{x}"
    steps, _ = metric_steps(sweep.values)
    out = []
    for i, (step, value) in enumerate(zip(steps, sweep.values)):
        row = {x_name: float(value), f"{sweep.kind}/mse": float(sweep.mse_mean[i, j]),
               f"{sweep.kind}/mse_se": float(sweep.mse_se[i, j]),
               f"{sweep.kind}/min_eigenvalue": float(sweep.min_eigenvalue_mean[i, j])}
        out += [Metric(k, v, now, step) for k, v in row.items() if _finite(v)]
        point = float(sweep.mse_mean[i, j])
        if _finite(point):
            out.append(Metric(f"{sweep.kind}/mse/{x} {_value_text(value)}", point, now, 0))
    return out


def method_figure_path(kind: str, method: str) -> str:
    return f"figures/{method}_mse_vs_{kind}.png"


@task(name="log-experiment", task_run_name="log-{sweep.kind}", cache_policy=NO_CACHE, persist_result=False)
def log_experiment(tracking_uri: str, runs: dict, sweep, outputs: dict[str, bytes]) -> dict[str, str]:
    """Log one experiment: each method's curve and figure on its child run; the figure and the per-seed table on
    the parent. Returns the artifact paths written on the parent."""
    client = MlflowClient(tracking_uri=tracking_uri)
    _, step_means = metric_steps(sweep.values)
    for method in sweep.methods:
        child = runs["child_run_ids"][method]
        metrics = _curve_metrics(sweep, method)
        for i in range(0, len(metrics), _MAX_BATCH):
            client.log_batch(child, metrics=metrics[i:i + _MAX_BATCH])
        client.set_tag(child, f"labelshift.step.{sweep.kind}",
                       f"step = {X_NAMES.get(sweep.kind, 'x')} ({step_means})")
        figure = (outputs.get("method_figures") or {}).get(method)
        if figure is not None:
            log_bytes(client, child, figure, method_figure_path(sweep.kind, method))
    parent = runs["parent_run_id"]
    paths = {"figure": f"figures/mse_vs_{sweep.kind}.png", "table": f"tables/per_seed_{sweep.kind}.csv"}
    log_bytes(client, parent, outputs["figure"], paths["figure"])
    log_bytes(client, parent, outputs["per_seed_csv"], paths["table"])
    return paths


@task(name="finish-mlflow-runs", cache_policy=NO_CACHE, persist_result=False)
def finish_sweep_runs(tracking_uri: str, runs: dict, summary_csv: bytes, tags: dict[str, str]) -> None:
    """Log the summary table (CSV) and closing tags on the parent, then mark every run FINISHED."""
    client = MlflowClient(tracking_uri=tracking_uri)
    parent = runs["parent_run_id"]
    log_bytes(client, parent, summary_csv, "tables/summary.csv")
    client.log_batch(parent, tags=[RunTag(k, str(v)) for k, v in tags.items()])
    for run_id in runs["child_run_ids"].values():
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
    client.set_terminated(parent, RunStatus.to_string(RunStatus.FINISHED))


def fail_sweep_runs(tracking_uri: str, parent_run_id: str | None, message: str, *, status: str = "FAILED",
                    flow_run_id: str | None = None) -> list[str]:
    """Mark the parent run and every child still RUNNING as FAILED (or KILLED), with the cause as a tag -- and with
    ``flow_run_id``, every run that flow run wrote (tag :data:`FLOW_RUN_TAG`: those created before their ids were
    returned, or without the parent's id); not a task, so that it works when Prefect itself failed. Returns the ids
    of the runs it terminated."""
    client = MlflowClient(tracking_uri=tracking_uri)
    found = {}
    if parent_run_id:
        parent = client.get_run(parent_run_id)
        children = client.search_runs([parent.info.experiment_id],
                                      filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
                                      max_results=10_000)
        found.update((run.info.run_id, run) for run in [*children, parent])
    found.update((run.info.run_id, run) for run in running_runs_of_flow_run(client, flow_run_id))
    closed = []
    for run_id, run in found.items():
        if run.info.status in ("RUNNING", "SCHEDULED"):
            _while_locked(client.set_tag, run_id, "error", message[:5000])
            _while_locked(client.set_terminated, run_id, status)
            closed.append(run_id)
    return closed


def _while_locked(call, *args, attempts: int = 3, wait_s: float = 0.5):
    """``call(*args)``, tried again while a local SQLite tracking store answers "database is locked": the sweep's
    tasks may still be logging to it on their threads when its error path closes the runs (SQLite lets one writer
    at a time, and waits 5 s for it). At most 3 tries: a stopped command has 10 s to leave."""
    for attempt in range(attempts):
        try:
            return call(*args)
        except Exception as exc:
            if "database is locked" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(wait_s)
