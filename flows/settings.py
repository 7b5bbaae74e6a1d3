"""Embedded defaults: where a run keeps its state when no servers are configured.

Everything a ``labelshift`` command writes on its own goes under one state folder, the *home*:

====================================  ===========================================================
``<home>/prefect/``                   PREFECT_HOME of the temporary Prefect server (its SQLite db)
``<home>/mlflow.db``                  MLflow tracking store (SQLite)
``<home>/mlartifacts/``               MLflow artifacts (figures, tables) of runs tracked locally
``<home>/store/``                     the object store: result tables and figures by MLflow run id
====================================  ===========================================================

The home is ``./.labelshift`` unless ``LABELSHIFT_HOME`` or ``--home`` names another folder. Each service
can be pointed elsewhere instead, and then the home is not used for it:

* ``PREFECT_API_URL`` -- a running Prefect server (e.g. ``labelshift stack up`` or ``prefect server start``);
  without it, a flow starts a temporary local server for the duration of the command.
* ``MLFLOW_TRACKING_URI`` (or ``--tracking-uri``) -- an MLflow server or another backend store.
* ``LABELSHIFT_STORE`` (or ``--store``) -- an object store URI, ``s3://bucket/prefix`` or a local folder.

This module only reads and writes environment variables and paths; it imports neither Prefect nor MLflow, so
the CLI can configure both before they are imported (Prefect reads its settings once, at import).
"""
from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

#: environment variables of this project
ENV_HOME = "LABELSHIFT_HOME"
ENV_STORE = "LABELSHIFT_STORE"
ENV_EXPERIMENT = "LABELSHIFT_MLFLOW_EXPERIMENT"

DEFAULT_HOME = ".labelshift"
DEFAULT_EXPERIMENT = "labelshift-reproduce"

#: the temporary Prefect server needs 5-20 s to start on a small machine; leave a wide margin
PREFECT_STARTUP_TIMEOUT_S = 180


@dataclass(frozen=True)
class Settings:
    """Resolved locations of every service a run talks to.

    Attributes:
        home: the state folder (absolute).
        store_uri: object store for result tables and figures.
        tracking_uri: MLflow tracking URI.
        artifact_root: where MLflow artifacts go for a local tracking store, ``None`` when a tracking server
            decides (it proxies artifacts to its ``--artifacts-destination``).
        prefect_api_url: a configured Prefect API, or ``None`` for the temporary local server.
        prefect_home: PREFECT_HOME used with the temporary server.
        experiment_name: MLflow experiment the runs are logged to.
    """

    home: Path
    store_uri: str
    tracking_uri: str
    artifact_root: str | None
    prefect_api_url: str | None
    prefect_home: Path
    experiment_name: str

    @property
    def tracking_is_local(self) -> bool:
        """True when the tracking store is a local database or folder rather than a server."""
        return not self.tracking_uri.startswith(("http://", "https://", "databricks"))

    def mlflow_ui_command(self) -> str:
        """The command that opens the MLflow UI on these runs (or the URL of the server that already serves it)."""
        if not self.tracking_is_local:
            return self.tracking_uri
        return f"mlflow ui --backend-store-uri {self.tracking_uri} --port 5000"

    def create_folders(self) -> None:
        """Create the folders the local defaults write into (the temporary Prefect server needs its home)."""
        self.home.mkdir(parents=True, exist_ok=True)
        if self.prefect_api_url is None:
            self.prefect_home.mkdir(parents=True, exist_ok=True)
        if self.artifact_root is not None and "://" not in self.artifact_root:
            Path(self.artifact_root).mkdir(parents=True, exist_ok=True)


def resolve(home: str | os.PathLike | None = None, *, store_uri: str | None = None,
            tracking_uri: str | None = None, experiment_name: str | None = None,
            environ: MutableMapping[str, str] | None = None) -> Settings:
    """Resolve the settings: explicit arguments win over environment variables, which win over the home folder.

    Args:
        home: state folder; default ``$LABELSHIFT_HOME`` or ``./.labelshift``.
        store_uri: object store URI; default ``$LABELSHIFT_STORE`` or ``<home>/store``.
        tracking_uri: MLflow tracking URI; default ``$MLFLOW_TRACKING_URI`` or ``sqlite:///<home>/mlflow.db``.
        experiment_name: MLflow experiment; default ``$LABELSHIFT_MLFLOW_EXPERIMENT`` or ``labelshift-reproduce``.
        environ: the environment to read (``os.environ`` by default).
    """
    env = os.environ if environ is None else environ
    home_path = Path(home or env.get(ENV_HOME) or DEFAULT_HOME).expanduser().resolve()
    store = store_uri or env.get(ENV_STORE) or str(home_path / "store")
    tracking = tracking_uri or env.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home_path / 'mlflow.db'}"
    return Settings(
        home=home_path,
        store_uri=store,
        tracking_uri=tracking,
        artifact_root=local_artifact_root(tracking, home_path),
        prefect_api_url=env.get("PREFECT_API_URL") or None,
        prefect_home=home_path / "prefect",
        experiment_name=experiment_name or env.get(ENV_EXPERIMENT) or DEFAULT_EXPERIMENT,
    )


def local_artifact_root(tracking_uri: str, home: Path) -> str | None:
    """Artifact folder for a local tracking store: ``mlartifacts`` beside the SQLite file (so the database and its
    artifacts travel together), ``<home>/mlartifacts`` for other local stores, None for a tracking server."""
    if tracking_uri.startswith(("http://", "https://", "databricks")):
        return None
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///"):].split("?", 1)[0])
        return str(db.resolve().parent / "mlartifacts")
    return str(home / "mlartifacts")


def apply(settings: Settings, *, verbose: bool = False,
          environ: MutableMapping[str, str] | None = None) -> None:
    """Export the settings as environment variables for Prefect, MLflow and the flow (call before importing them).

    Quiet by default: Prefect prints nothing on the console (its logs still go to its server), MLflow only
    warnings; ``verbose=True`` restores both on the console.
    """
    env = os.environ if environ is None else environ
    settings.create_folders()
    env[ENV_HOME] = str(settings.home)
    env[ENV_STORE] = settings.store_uri
    env["MLFLOW_TRACKING_URI"] = settings.tracking_uri
    env[ENV_EXPERIMENT] = settings.experiment_name
    if settings.prefect_api_url is None:
        # the temporary server keeps its SQLite database (and so the run history) under the home
        env["PREFECT_HOME"] = str(settings.prefect_home)
        env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(PREFECT_STARTUP_TIMEOUT_S))
    # no network calls home from an offline machine
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    if not verbose:
        env.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if verbose:
        env.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
        env.setdefault("MLFLOW_LOGGING_LEVEL", "INFO")
    else:
        # Prefect still records INFO logs on the server (the UI shows them); only its console output is muted.
        # Errors reach the user through the CLI's own message instead of a traceback.
        env["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] = "CRITICAL"
        # the temporary server logs a traceback when it is stopped mid-flush; nothing a user can act on
        env["PREFECT_SERVER_LOGGING_LEVEL"] = "CRITICAL"
        env["MLFLOW_LOGGING_LEVEL"] = "WARNING"
