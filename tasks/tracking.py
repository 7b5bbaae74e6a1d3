"""MLflow helpers both flows share: the tracking server's reachability check, experiments, artifacts written from
bytes, links into the MLflow UI's model-training view and the git commit a run records. Like :mod:`tasks.sweep.runs`
they talk to MLflow through an ``MlflowClient`` with explicit ids, never the thread-local fluent API.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import httpx
from mlflow import MlflowClient

from labelshift.errors import InputError, ServiceUnavailableError

__all__ = ["check_tracking_server", "tracking_server_lost", "ended_status", "FLOW_RUN_TAG", "end_runs_of_flow_run",
           "run_url", "experiment_url", "artifact_url", "git_commit", "git_commit_tag", "log_bytes", "EXPERIMENT_KIND_TAG", "MODEL_TRAINING_KIND", "MODEL_TRAINING_VIEW", "mark_model_training", "experiment_id"]

#: the tag both flows put on each of their MLflow runs: the Prefect flow run that wrote it
FLOW_RUN_TAG = "prefect.flow_run_id"

#: the experiment tag MLflow 3 reads to choose an experiment's view, and its value for model training
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"


def git_commit(start: str | os.PathLike | None = None) -> str | None:
    """The commit of the git checkout holding ``start`` (default: this package), or None outside one."""
    folder = Path(start) if start is not None else Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


def git_commit_tag() -> dict[str, str]:
    """MLflow's ``mlflow.source.git.commit`` tag of this checkout's commit; empty outside a checkout."""
    commit = git_commit()
    return {"mlflow.source.git.commit": commit} if commit else {}


#: the MLflow 3 UI opens on its GenAI view unless told otherwise (a switch it remembers per browser, which a
#: link can set); every link given to a person asks for the model-training view, where runs and metrics are
MODEL_TRAINING_VIEW = "workflowType=machine_learning"


def _ui_url(tracking_uri: str, page: str) -> str | None:
    """``page`` of the MLflow UI (model-training view) when the tracking URI is a server, else None."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"{tracking_uri.rstrip('/')}/#/experiments/{page}?{MODEL_TRAINING_VIEW}"
    return None


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """The MLflow UI address of a run when the tracking URI is a server, else None."""
    return _ui_url(tracking_uri, f"{experiment_id}/runs/{run_id}")


def experiment_url(tracking_uri: str, experiment_id: str) -> str | None:
    """The MLflow UI address of an experiment's runs table when the tracking URI is a server, else None."""
    return _ui_url(tracking_uri, f"{experiment_id}/runs")


def artifact_url(tracking_uri: str, experiment_id: str, run_id: str, path: str) -> str | None:
    """The MLflow UI page that previews one artifact of a run (the server's ``/get-artifact`` always sends an
    attachment, which a browser saves instead of showing), when the tracking URI is a server; else None."""
    from urllib.parse import quote

    return _ui_url(tracking_uri, f"{experiment_id}/runs/{run_id}/artifactPath/{quote(path)}")


def mark_model_training(client: MlflowClient, experiment_id: str) -> None:
    """Tag the experiment as model training, so MLflow 3 opens it on its runs (not the GenAI overview)."""
    exp = client.get_experiment(experiment_id)
    if (exp.tags or {}).get(EXPERIMENT_KIND_TAG) != MODEL_TRAINING_KIND:
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)


def check_tracking_server(tracking_uri: str, timeout_s: float = 10.0) -> None:
    """Fail fast, saying what to do, when an MLflow tracking *server* does not answer (MLflow's own client retries
    for minutes)."""
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


#: how MLflow's REST client words a request that got no answer once its retries were spent (refused, reset, timed
#: out); an HTTP error status is worded "API request to endpoint ... failed with error code"
_NO_ANSWER = re.compile(r"^API request to (?!endpoint )\S+ failed with (timeout )?exception")


def tracking_server_lost(exc: BaseException, tracking_uri: str) -> ServiceUnavailableError | None:
    """When ``exc`` is MLflow's client giving up on a tracking server that did not answer during a run (it was
    killed, stopped or frozen), the error that says so and what to do; else None."""
    if not tracking_uri.startswith(("http://", "https://")) or not _NO_ANSWER.match(str(exc)):
        return None
    said = str(exc) if len(str(exc)) < 320 else f"{str(exc)[:140]} ... {str(exc)[-160:]}"   # the URL and the cause
    if "too many 5" in str(exc):            # urllib3's "too many 500 error responses": it answers, with errors
        return ServiceUnavailableError(
            f"the MLflow tracking server at {tracking_uri} answered every try of a request with a server error "
            f"(after MLflow's retries: {said}): its database or its artifact store (the S3 server, "
            "for proxied artifacts) has likely failed. Check that both run (`labelshift stack status`; `labelshift "
            "stack up` starts the local stack's again) and read the MLflow server's log, then rerun.")
    cause = "timed out" if "timed out" in str(exc) or "timeout exception" in str(exc) else \
        "refused or dropped the connection"
    store = (" It was storing an artifact, which the server passes on to its artifact store: a frozen or "
             "overloaded artifact store (the S3 server, for proxied artifacts) holds the server's answer too."
             if "/mlflow-artifacts/" in str(exc) and cause == "timed out" else "")
    return ServiceUnavailableError(
        f"the MLflow tracking server at {tracking_uri} stopped answering during the run (it {cause}, after "
        f"MLflow's retries: {said}).{store} Check that it runs (`labelshift stack status`; `labelshift stack up` "
        "starts the local stack's again) or fix MLFLOW_TRACKING_URI / --tracking-uri, then rerun.")


def experiment_id(client: MlflowClient, name: str, *, artifact_location: str | None = None,
                  tags: dict[str, str] | None = None, if_deleted: str = "restore") -> str:
    """The id of the MLflow experiment ``name``, created with ``artifact_location`` and ``tags`` when there is none.
    A deleted one is restored (``if_deleted="restore"``: the self-contained sweeps) or refused with an InputError
    (``"raise"``: re-estimation, whose monitor runs a restore would bring back unasked)."""
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


def log_bytes(client: MlflowClient, run_id: str, data: bytes, artifact_file: str) -> None:
    """Log ``data`` as the artifact ``artifact_file`` (``folder/name``) of a run."""
    folder, _, name = artifact_file.rpartition("/")
    with tempfile.TemporaryDirectory(prefix="labelshift-mlflow-") as tmp:
        path = Path(tmp, name)
        path.write_bytes(data)
        client.log_artifact(run_id, str(path), artifact_path=folder or None)


def ended_status(exc: BaseException) -> str:
    """The MLflow status of a run that ``exc`` ended: FAILED for an error, KILLED when it was stopped (any
    BaseException that is no Exception: Ctrl-C, SystemExit, SIGTERM)."""
    return "FAILED" if isinstance(exc, Exception) else "KILLED"


def one_line(what: object, limit: int = 300) -> str:
    """``what`` (an exception's message, a response's text) on one line, at most ``limit`` characters."""
    return " ".join(str(what).split())[:limit]


def registry_refused(exc: BaseException) -> bool:
    """True when ``exc`` is the tracking server refusing this user what it asked (PERMISSION_DENIED, HTTP 403;
    infra/README.md, "Who may do what")."""
    return getattr(exc, "error_code", None) == "PERMISSION_DENIED"


def running_runs_of_flow_run(client: MlflowClient, flow_run_id: str, search=None) -> list:
    """The MLflow runs still RUNNING that the flow run ``flow_run_id`` wrote (tag :data:`FLOW_RUN_TAG`), in any
    experiment; none for an id that is not one. ``search(call)`` makes each request (default: as it is)."""
    search = search or (lambda call: call())
    if not re.fullmatch(r"[0-9a-fA-F-]{1,64}", flow_run_id or ""):
        return []
    experiments = [e.experiment_id for e in search(client.search_experiments)]
    if not experiments:
        return []
    return search(lambda: client.search_runs(
        experiments, filter_string=f"tags.`{FLOW_RUN_TAG}` = '{flow_run_id}' and attributes.status = 'RUNNING'",
        max_results=10_000))


def end_runs_of_flow_run(tracking_uri: str, flow_run_id: str, status: str = "KILLED") -> list[str]:
    """End as ``status`` every MLflow run still RUNNING that the flow run ``flow_run_id`` wrote
    (:func:`running_runs_of_flow_run`; its process was killed before it could). Returns their ids."""
    client = MlflowClient(tracking_uri)
    found = running_runs_of_flow_run(client, flow_run_id)
    for run in found:
        client.set_terminated(run.info.run_id, status=status)
    return [run.info.run_id for run in found]
