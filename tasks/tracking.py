"""MLflow logging of a sweep: one parent run per ``reproduce`` call, one child run per method.

Layout of what lands in MLflow:

* parent run (``run_name`` from the Prefect flow run): every flow parameter as an MLflow param; tags ``dataset``,
  ``prefect.flow_run_id``, ``prefect.flow_run_name`` and ``mlflow.source.git.commit`` (when the code is a git
  checkout); the figures under ``figures/`` (PNG); the per-seed estimates as ``tables/per_seed_<experiment>.csv``
  and the per-setting summary as ``tables/summary.csv`` (the MLflow UI previews CSV artifacts as tables).
* child run per method (tag ``mlflow.parentRunId``, so the UI nests it): for each experiment the MSE curve as
  metric ``<experiment>/mse`` with ``step`` = index of the setting, its standard error ``<experiment>/mse_se``,
  the x value ``<experiment>/<x name>`` at the same step (so a chart of either metric against step reads as the
  curve), and ``<experiment>/min_eigenvalue`` for the MLLS family.

Every function takes the tracking URI and run ids explicitly and talks to MLflow through an ``MlflowClient``:
MLflow's "active run" is thread-local and Prefect runs tasks on worker threads, so the fluent API
(``mlflow.log_metric``) would log to the wrong run or none.
"""
from __future__ import annotations

import math
import os
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus, RunTag
from prefect import task
from prefect.cache_policies import NO_CACHE

from labelshift.errors import ServiceUnavailableError

__all__ = ["X_NAMES", "check_tracking_server", "start_sweep_runs", "log_experiment", "finish_sweep_runs",
           "fail_sweep_runs", "run_url", "git_commit"]

#: metric name of each experiment's x value
X_NAMES = {"shift": "p_t1", "size": "m", "bins": "n_bins", "alpha": "alpha"}

_MAX_BATCH = 1000     # MLflow accepts at most 1000 metrics per log_batch call
_MAX_PARAM = 6000     # and parameter values up to 6000 characters


def git_commit(start: str | os.PathLike | None = None) -> str | None:
    """The commit of the git checkout holding ``start`` (default: this package), or None outside one."""
    folder = Path(start) if start is not None else Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """The MLflow UI address of a run when the tracking URI is a server, else None."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return None


def check_tracking_server(tracking_uri: str, timeout_s: float = 10.0) -> None:
    """Fail fast, with a message that says what to do, when an MLflow tracking *server* does not answer.

    (MLflow's own client retries an unreachable server with backoff for minutes before giving up.) Local
    tracking stores need no check.
    """
    if not tracking_uri.startswith(("http://", "https://")):
        return
    try:
        response = httpx.get(f"{tracking_uri.rstrip('/')}/health", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ServiceUnavailableError(
            f"the MLflow tracking server at {tracking_uri} is not reachable ({type(exc).__name__}: {exc}). Start it "
            "(e.g. `labelshift stack up`), fix MLFLOW_TRACKING_URI / --tracking-uri, or unset them to track in the "
            "local SQLite store.") from None
    if response.status_code >= 500:
        raise ServiceUnavailableError(f"the MLflow tracking server at {tracking_uri} answers /health with HTTP "
                                      f"{response.status_code}; check its log.")


def _experiment_id(client: MlflowClient, name: str, artifact_root: str | None) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    location = None
    if artifact_root is not None:
        location = Path(artifact_root, name).resolve().as_uri() if "://" not in artifact_root else \
            f"{artifact_root.rstrip('/')}/{name}"
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:                       # created concurrently by another run: use that one
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


@task(name="start-mlflow-runs", cache_policy=NO_CACHE, persist_result=False)
def start_sweep_runs(tracking_uri: str, experiment_name: str, artifact_root: str | None, run_name: str,
                     params: dict[str, str], tags: dict[str, str], methods_by_experiment: dict[str, list[str]]
                     ) -> dict:
    """Create the parent run and one child run per method; returns their ids.

    Returns:
        ``{"experiment_id", "parent_run_id", "child_run_ids": {method: run_id}}``.
    """
    check_tracking_server(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id = _experiment_id(client, experiment_name, artifact_root)
    parent = client.create_run(experiment_id, run_name=run_name, tags=tags)
    parent_id = parent.info.run_id
    try:
        client.log_batch(parent_id, params=[Param(k, str(v)[:_MAX_PARAM]) for k, v in params.items()])
        methods: list[str] = []
        for names in methods_by_experiment.values():
            methods += [m for m in names if m not in methods]
        children = {}
        for method in methods:
            experiments = [e for e, names in methods_by_experiment.items() if method in names]
            child = client.create_run(experiment_id, run_name=f"{run_name}/{method}", tags={
                "mlflow.parentRunId": parent_id, "method": method, **{k: v for k, v in tags.items()
                                                                       if not k.startswith("mlflow.")}})
            children[method] = child.info.run_id
            client.log_batch(child.info.run_id, params=[Param("method", method),
                                                        Param("experiments", ",".join(experiments))])
    except BaseException as exc:
        fail_sweep_runs(tracking_uri, parent_id, f"{type(exc).__name__}: {exc}")
        raise
    return {"experiment_id": experiment_id, "parent_run_id": parent_id, "child_run_ids": children}


def _finite(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def _curve_metrics(sweep, method: str) -> list[Metric]:
    j = list(sweep.methods).index(method)
    now = int(time.time() * 1000)
    x_name = f"{sweep.kind}/{X_NAMES.get(sweep.kind, 'x')}"
    out = []
    for step, value in enumerate(sweep.values):
        row = {x_name: float(value), f"{sweep.kind}/mse": float(sweep.mse_mean[step, j]),
               f"{sweep.kind}/mse_se": float(sweep.mse_se[step, j]),
               f"{sweep.kind}/min_eigenvalue": float(sweep.min_eigenvalue_mean[step, j])}
        out += [Metric(k, v, now, step) for k, v in row.items() if _finite(v)]
    return out


def _log_bytes(client: MlflowClient, run_id: str, data: bytes, artifact_file: str) -> None:
    """Log ``data`` as the artifact ``artifact_file`` (``folder/name``) of a run."""
    folder, _, name = artifact_file.rpartition("/")
    with tempfile.TemporaryDirectory(prefix="labelshift-mlflow-") as tmp:
        path = Path(tmp, name)
        path.write_bytes(data)
        client.log_artifact(run_id, str(path), artifact_path=folder or None)


@task(name="log-experiment", task_run_name="log-{sweep.kind}", cache_policy=NO_CACHE, persist_result=False)
def log_experiment(tracking_uri: str, runs: dict, sweep, outputs: dict[str, bytes]) -> dict[str, str]:
    """Log one experiment: each method's curve on its child run; the figure and the per-seed table (from
    :func:`tasks.outputs.render_outputs`) on the parent. Returns the artifact paths written on the parent."""
    client = MlflowClient(tracking_uri=tracking_uri)
    for method in sweep.methods:
        metrics = _curve_metrics(sweep, method)
        for i in range(0, len(metrics), _MAX_BATCH):
            client.log_batch(runs["child_run_ids"][method], metrics=metrics[i:i + _MAX_BATCH])
    parent = runs["parent_run_id"]
    paths = {"figure": f"figures/mse_vs_{sweep.kind}.png", "table": f"tables/per_seed_{sweep.kind}.csv"}
    _log_bytes(client, parent, outputs["figure"], paths["figure"])
    _log_bytes(client, parent, outputs["per_seed_csv"], paths["table"])
    return paths


@task(name="finish-mlflow-runs", cache_policy=NO_CACHE, persist_result=False)
def finish_sweep_runs(tracking_uri: str, runs: dict, summary_csv: bytes, tags: dict[str, str]) -> None:
    """Log the summary table (CSV) and closing tags on the parent, then mark every run FINISHED."""
    client = MlflowClient(tracking_uri=tracking_uri)
    parent = runs["parent_run_id"]
    _log_bytes(client, parent, summary_csv, "tables/summary.csv")
    client.log_batch(parent, tags=[RunTag(k, str(v)) for k, v in tags.items()])
    for run_id in runs["child_run_ids"].values():
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
    client.set_terminated(parent, RunStatus.to_string(RunStatus.FINISHED))


def fail_sweep_runs(tracking_uri: str, parent_run_id: str, message: str, *, status: str = "FAILED") -> list[str]:
    """Mark the parent run and every child still RUNNING as FAILED (or KILLED), with the cause as a tag.

    Called from the flow's error path, not as a task: it must work even when Prefect itself is what failed.
    Children are found by their ``mlflow.parentRunId`` tag, so runs created by a task that died half-way are
    closed too. Returns the ids of the runs it terminated.
    """
    client = MlflowClient(tracking_uri=tracking_uri)
    parent = client.get_run(parent_run_id)
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
                                  max_results=10_000)
    closed = []
    for run in [*children, parent]:
        if run.info.status in ("RUNNING", "SCHEDULED"):
            client.set_tag(run.info.run_id, "error", message[:5000])
            client.set_terminated(run.info.run_id, status)
            closed.append(run.info.run_id)
    return closed
