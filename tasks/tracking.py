"""MLflow logging of a sweep: one parent run per ``reproduce`` call, one child run per method.

Layout of what lands in MLflow:

* parent run (``run_name`` from the Prefect flow run): every flow parameter as an MLflow param; tags ``dataset``,
  ``prefect.flow_run_id``, ``prefect.flow_run_name`` and ``mlflow.source.git.commit`` (when the code is a git
  checkout); the figures under ``figures/`` (PNG); the per-seed estimates as ``tables/per_seed_<experiment>.csv``
  and the per-setting summary as ``tables/summary.csv`` (the MLflow UI previews CSV artifacts as tables).
* child run per method, named ``<method> · <parent run name>`` so the run table shows the method (tag
  ``mlflow.parentRunId``, so the UI nests it): for each experiment the MSE curve as metric ``<experiment>/mse``
  whose ``step`` is the swept value itself when it is an integer (target size m, number of bins) and the value in
  thousandths otherwise (p_t(y=1) = 0.1 is step 100; the tag ``labelshift.step.<experiment>`` says which), so an
  MLflow chart against step reads as the curve; its standard error ``<experiment>/mse_se``, the x value
  ``<experiment>/<x name>`` and ``<experiment>/min_eigenvalue`` (MLLS family) at the same steps; one metric per
  setting, ``<experiment>/mse/<x name> <value>``, so the run's overview lists every point, not only the last
  step; and the method's own figure ``figures/<method>_mse_vs_<experiment>.png``.
* the experiment is tagged ``mlflow.experimentKind = custom_model_development`` (model training, not GenAI), and
  the links given out (:func:`run_url`, :func:`experiment_url`) ask for MLflow 3's model-training view, which the
  UI otherwise replaces by its GenAI tracing overview (a per-browser switch); runs carry a markdown description
  (``mlflow.note.content``) linking back to the Prefect flow run when its URL is known.

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

from labelshift.errors import InputError, ServiceUnavailableError

__all__ = ["X_NAMES", "check_tracking_server", "start_sweep_runs", "log_experiment", "finish_sweep_runs",
           "fail_sweep_runs", "run_url", "experiment_url", "artifact_url", "git_commit", "metric_steps", "log_bytes",
           "EXPERIMENT_KIND_TAG", "MODEL_TRAINING_KIND", "mark_model_training", "experiment_id"]

#: the experiment tag MLflow 3 reads to choose an experiment's view, and its value for model training
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"
#: tag with the address of the Prefect flow run that logged a run
PREFECT_URL_TAG = "prefect.flow_run_url"

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


#: the MLflow 3 UI opens on its GenAI view unless told otherwise (a switch it remembers per browser, which a
#: link can set); every link given to a person asks for the model-training view, where runs and metrics are
MODEL_TRAINING_VIEW = "workflowType=machine_learning"


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """The MLflow UI address of a run (in the model-training view) when the tracking URI is a server, else None."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{MODEL_TRAINING_VIEW}"
    return None


def experiment_url(tracking_uri: str, experiment_id: str) -> str | None:
    """The MLflow UI address of an experiment's runs table when the tracking URI is a server, else None."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs?{MODEL_TRAINING_VIEW}"
    return None


def artifact_url(tracking_uri: str, experiment_id: str, run_id: str, path: str) -> str | None:
    """The MLflow UI page that shows one artifact of a run (an image is previewed there; the server proxies it
    from the artifact store), when the tracking URI is a server; else None. (The server's own download
    address, ``/get-artifact``, always sends an attachment, which a browser saves instead of showing.)"""
    if tracking_uri.startswith(("http://", "https://")):
        from urllib.parse import quote

        return (f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}/artifactPath/"
                f"{quote(path)}?{MODEL_TRAINING_VIEW}")
    return None


def metric_steps(values) -> tuple[list[int], str]:
    """The MLflow ``step`` of each swept value, and what the step means.

    Integer values (target size m, number of bins) are their own step; fractional ones are counted in
    thousandths (p_t(y=1) = 0.05 is step 50), or in the index of the setting when thousandths would collide.
    """
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


def mark_model_training(client: MlflowClient, experiment_id: str) -> None:
    """Tag the experiment as model training, so MLflow 3 opens it on its runs (not the GenAI overview)."""
    exp = client.get_experiment(experiment_id)
    if (exp.tags or {}).get(EXPERIMENT_KIND_TAG) != MODEL_TRAINING_KIND:
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)


def _note(prefect_url: str | None, text: str) -> dict[str, str]:
    """The run description MLflow shows on a run's overview (markdown), with the link to Prefect."""
    if not prefect_url:
        return {"mlflow.note.content": text}
    return {"mlflow.note.content": f"{text}\n\nPrefect flow run: [{prefect_url}]({prefect_url})",
            PREFECT_URL_TAG: prefect_url}


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


def experiment_id(client: MlflowClient, name: str, *, artifact_location: str | None = None,
                  tags: dict[str, str] | None = None, if_deleted: str = "restore") -> str:
    """The id of the MLflow experiment ``name``, created with ``artifact_location`` and ``tags`` when there is none
    (one created meanwhile by a concurrent run is used).

    A deleted experiment is restored (``if_deleted="restore"``: the sweeps of ``reproduce``, each run
    self-contained) or refused with an InputError naming the fix (``"raise"``: re-estimation, whose monitor runs
    carry the series of earlier runs, which a restore would bring back unasked). Each caller keeps the behaviour it
    had before the two copies of this function were merged.
    """
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            if if_deleted == "raise":
                raise InputError(f"MLflow experiment {name!r} is deleted; restore it (mlflow experiments restore) or "
                                 "choose another --experiment-name.")
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location, tags=tags)
    except Exception:                       # created concurrently by another run: use that one
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


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
    """Create the parent run and one child run per method; returns their ids.

    ``prefect_url``: the address of the Prefect flow run, tagged on every run and linked from its description.

    Returns:
        ``{"experiment_id", "parent_run_id", "child_run_ids": {method: run_id}}``.
    """
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
        fail_sweep_runs(tracking_uri, parent_id, f"{type(exc).__name__}: {exc}")
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


def log_bytes(client: MlflowClient, run_id: str, data: bytes, artifact_file: str) -> None:
    """Log ``data`` as the artifact ``artifact_file`` (``folder/name``) of a run."""
    folder, _, name = artifact_file.rpartition("/")
    with tempfile.TemporaryDirectory(prefix="labelshift-mlflow-") as tmp:
        path = Path(tmp, name)
        path.write_bytes(data)
        client.log_artifact(run_id, str(path), artifact_path=folder or None)


@task(name="log-experiment", task_run_name="log-{sweep.kind}", cache_policy=NO_CACHE, persist_result=False)
def log_experiment(tracking_uri: str, runs: dict, sweep, outputs: dict[str, bytes]) -> dict[str, str]:
    """Log one experiment: each method's curve and its own figure on its child run; the figure and the per-seed
    table (from :func:`tasks.sweep.outputs.render_outputs`) on the parent. Returns the artifact paths written on the
    parent."""
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
