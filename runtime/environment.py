"""Embedded defaults: where a run keeps its state when no servers are configured.

Everything a ``labelshift`` command writes on its own goes under one state folder, the *home* (``./.labelshift``,
``LABELSHIFT_HOME`` or ``--home``): ``prefect/`` (the temporary Prefect server's PREFECT_HOME), ``mlflow.db`` and
``mlartifacts/`` (MLflow), ``store/`` (the object store) -- unless ``PREFECT_API_URL``, ``MLFLOW_TRACKING_URI``
or ``LABELSHIFT_STORE`` point a service elsewhere.

Every environment variable the project reads is named once here (:data:`VARIABLES`, which the table of
``docs/operations.md`` mirrors) and read by :func:`resolve` into one :class:`Settings`; :func:`apply` is the
writer, kept apart so that a command can resolve, check and report before anything is exported. This is the one
module that touches ``os.environ`` (``tests/architecture/test_layering.py`` lists the few exceptions); it imports
neither Prefect nor MLflow, so the CLI can configure both before they are imported.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from runtime.timeouts import ENV_SERVER_LOST_S, ENV_WORKER_STOP_S, SERVER_LOST_S, WORKER_STOP_S, apply_timeouts

# -- the environment variables, each named once ----------------------------------------------------------------------
ENV_HOME = "LABELSHIFT_HOME"
ENV_STORE = "LABELSHIFT_STORE"
ENV_EXPERIMENT = "LABELSHIFT_MLFLOW_EXPERIMENT"
ENV_TRACKING_URI = "MLFLOW_TRACKING_URI"
ENV_PREFECT_API_URL = "PREFECT_API_URL"
ENV_MODEL = "LABELSHIFT_MODEL"
ENV_TARGET = "LABELSHIFT_TARGET"
ENV_DASK = "LABELSHIFT_DASK_ADDRESS"
ENV_CRON = "LABELSHIFT_REESTIMATE_CRON"
ENV_TIMEZONE = "LABELSHIFT_REESTIMATE_TIMEZONE"
ENV_CACHE = "LABELSHIFT_CACHE"
#: "1" refuses to load a model version without a recorded digest (docs/serving.md, "A trusted registry")
ENV_REQUIRE_TRUSTED = "LABELSHIFT_REQUIRE_TRUSTED_MODELS"
#: port of each service of the local stack (``labelshift stack up``)
ENV_PORTS = {"s3": "LABELSHIFT_S3_PORT", "mlflow": "LABELSHIFT_MLFLOW_PORT", "prefect": "LABELSHIFT_PREFECT_PORT"}
#: set by ``labelshift stack up --workers`` and the worker image; the deployments' pull step reads it
ENV_CODE_DIR = "LABELSHIFT_CODE_DIR"
#: the S3 server and its credentials: read by boto3 itself (``labelshift stack up`` writes them to its env.sh)
ENV_AWS = ("AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")

#: the notification targets and thresholds of ``labelshift alerts`` (docs/alerts.md)
ENV_ALERT_WEBHOOK_URL = "LABELSHIFT_ALERT_WEBHOOK_URL"
ENV_ALERT_SLACK_URL = "LABELSHIFT_ALERT_SLACK_WEBHOOK_URL"
ENV_ALERT_EMAIL_TO = "LABELSHIFT_ALERT_EMAIL_TO"
ENV_ALERT_EMAIL_FROM = "LABELSHIFT_ALERT_EMAIL_FROM"
ENV_ALERT_SENDGRID_KEY = "LABELSHIFT_ALERT_SENDGRID_API_KEY"
ENV_ALERT_BLOCKS = "LABELSHIFT_ALERT_BLOCKS"
ENV_ALERT_TV = "LABELSHIFT_ALERT_SHIFTED_TV"
ENV_ALERT_ACCURACY_DROP = "LABELSHIFT_ALERT_SHIFTED_ACCURACY_DROP"

DEFAULT_HOME = ".labelshift"
#: total variation from which a Shifted verdict is alerted on, unless set
DEFAULT_ALERT_TV = "0.10"
DEFAULT_EXPERIMENT = "labelshift-reproduce"
DEFAULT_TIMEZONE = "UTC"


@dataclass(frozen=True)
class Variable:
    """One environment variable as documented: what it sets, its default, and the flag that wins over it."""

    name: str
    sets: str
    default: str
    flag: str = ""


#: the variables of ``labelshift alerts`` (docs/alerts.md), the last rows of :data:`VARIABLES`
ALERT_VARIABLES: tuple[Variable, ...] = (
    Variable(ENV_ALERT_WEBHOOK_URL, "URL a custom webhook block of `alerts` posts to", "none", "`--webhook-url`"),
    Variable(ENV_ALERT_SLACK_URL, "Slack incoming-webhook URL of `alerts`", "none", "`--slack-webhook-url`"),
    Variable(ENV_ALERT_EMAIL_TO, "e-mail recipients of `alerts` (comma-separated; sent through SendGrid)", "none",
             "`--email-to`"),
    Variable(ENV_ALERT_EMAIL_FROM, "sender address of those e-mails", "none", "`--email-from`"),
    Variable(ENV_ALERT_SENDGRID_KEY, "SendGrid API key of those e-mails", "none", ""),
    Variable(ENV_ALERT_BLOCKS, "existing notification blocks of `alerts`, `TYPE/NAME` comma-separated", "none",
             "`--block`"),
    Variable(ENV_ALERT_TV, "total variation from which `alerts` notifies of a Shifted verdict (`off`: never)",
             f"`{DEFAULT_ALERT_TV}`", "`--shifted-tv`"),
    Variable(ENV_ALERT_ACCURACY_DROP, "accuracy drop from which `alerts` notifies of a Shifted verdict", "`off`",
             "`--shifted-accuracy-drop`"),
)

#: every environment variable the project reads, in the order of the table in docs/operations.md
VARIABLES: tuple[Variable, ...] = (
    Variable(ENV_HOME, "state folder of the embedded defaults (Prefect's temporary server, MLflow's SQLite store, "
                       "the object store, the local stack)", f"`./{DEFAULT_HOME}`", "`--home`"),
    Variable(ENV_STORE, "object store of results, datasets and models: `s3://bucket/prefix` or a folder",
             "`<home>/store`", "`--store`"),
    Variable(ENV_TRACKING_URI, "MLflow tracking URI (a server `http://host:port` or a local store)",
             "`sqlite:///<home>/mlflow.db`", "`--tracking-uri`"),
    Variable(ENV_EXPERIMENT, "MLflow experiment of `reproduce` and `report`", f"`{DEFAULT_EXPERIMENT}`",
             "`--experiment-name`"),
    Variable(ENV_PREFECT_API_URL, "a running Prefect server's API", "a temporary local server per command", ""),
    Variable(ENV_SERVER_LOST_S, "seconds the Prefect server may not answer during a run before the command stops "
                                "it (exit 75)", f"`{SERVER_LOST_S:g}`", ""),
    Variable(ENV_DASK, "Dask cluster of the estimation tasks of `reproduce` (also of served and deployed runs): "
                       "`tcp://host:8786` or `local`; `estimate` takes its cluster from `--dask` only (the variable "
                       "set for sweeps does not move a re-estimation)", "threads in the flow's process",
             "`--dask`"),
    Variable(ENV_MODEL, "registered model of `estimate` and of the served `reestimate` deployment",
             "`models:/labelshift-mnist-5k@latest-good`", "`--model`"),
    Variable(ENV_TARGET, "where new batches arrive for `estimate`, `serve` and `data simulate-target`",
             "`<store>/target`", "`--target` (`--to`)"),
    Variable(ENV_REQUIRE_TRUSTED, "`1`: `estimate` and the `reestimate` flow refuse a model version without a "
                                  "recorded digest (`labelshift reference trust`); else they load it with a warning",
             "unset: load with a warning", ""),
    Variable(ENV_CRON, "cron schedule of the served `reestimate` deployment", "unscheduled", "`--cron`"),
    Variable(ENV_TIMEZONE, "time zone the cron hours are read in", f"`{DEFAULT_TIMEZONE}`", "`--timezone`"),
    Variable(ENV_PORTS["s3"], "port of the local stack's S3 server", "`8333`", "`--s3-port`"),
    Variable(ENV_PORTS["mlflow"], "port of the local stack's MLflow server", "`5000`", "`--mlflow-port`"),
    Variable(ENV_PORTS["prefect"], "port of the local stack's Prefect server", "`4200`", "`--prefect-port`"),
    Variable(ENV_CACHE, "download folder of `data push --download`", "`~/.cache/labelshift`", ""),
    Variable(ENV_CODE_DIR, "the checkout a worker runs deployments from (the pull step of `prefect.yaml`)",
             "set by `stack up --workers` and the worker image", ""),
    Variable(ENV_AWS[0], "endpoint of the S3 server of `s3://` stores (read by boto3)", "AWS's own endpoint", ""),
    Variable(ENV_AWS[1], "S3 access key (read by boto3)", "boto3's credential chain", ""),
    Variable(ENV_AWS[2], "S3 secret key (read by boto3)", "boto3's credential chain", ""),
    *ALERT_VARIABLES,
)



def read(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of one environment variable, without surrounding blanks; None when unset or blank."""
    return ((os.environ if environ is None else environ).get(name) or "").strip() or None


def values(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """name -> value of each of ``names`` that is set, exactly as set (keys and passwords keep their blanks)."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in names if name in env}


def export(name: str, value: str, environ: MutableMapping[str, str] | None = None) -> None:
    """Set ``name`` to ``value`` in this process's environment (``environ``)."""
    (os.environ if environ is None else environ)[name] = value


def child_environment(overrides: Mapping[str, str] | None = None, *, drop: Iterable[str] = (),
                      environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of this process's environment (``environ``) without ``drop``, with ``overrides`` set."""
    env = dict(os.environ if environ is None else environ)
    for name in drop:
        env.pop(name, None)
    env.update(overrides or {})
    return env


def apply_time_limits(environ: MutableMapping[str, str] | None = None) -> None:
    """Set the libraries' time limits the user has not set (:func:`runtime.timeouts.apply_timeouts`)."""
    apply_timeouts(os.environ if environ is None else environ)


def server_lost_s(environ: Mapping[str, str] | None = None) -> float:
    """:data:`~runtime.timeouts.ENV_SERVER_LOST_S` in seconds (at least 2; InputError otherwise)."""
    return _seconds(ENV_SERVER_LOST_S, SERVER_LOST_S, 2, environ)


def worker_stop_s(environ: Mapping[str, str] | None = None) -> float:
    """:data:`~runtime.timeouts.ENV_WORKER_STOP_S` in seconds (at least 1; InputError otherwise)."""
    return _seconds(ENV_WORKER_STOP_S, WORKER_STOP_S, 1, environ)


def dask_scheduler_address(address: str, given_by: str = f"--dask or ${ENV_DASK}") -> str:
    """A Dask scheduler address as a client takes it: ``tcp://host:port`` (``host:port`` gets ``tcp://``), or
    ``"local"`` (a cluster of this machine) as given. InputError for anything else, saying what is expected and
    where the address came from (``given_by``)."""
    from labelshift.errors import InputError

    address = (address or "").strip()
    if address.lower() == "local":
        return "local"
    scheme, sep, rest = address.rpartition("://")
    host, colon, port = (rest if sep else address).rpartition(":")
    if not colon or not host or not port.isdigit() or (sep and not scheme.isalpha()):
        raise InputError(f"{address!r} is not a Dask scheduler address; expected tcp://host:port (the scheduler "
                         f"listens on 8786 by default: tcp://host:8786), or 'local' ({given_by})")
    return address if sep else f"tcp://{address}"


def _seconds(variable: str, default: float, least: float, environ: Mapping[str, str] | None) -> float:
    from labelshift.errors import InputError

    text = read(variable, environ) or ""
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not least <= value < 1e6:
        raise InputError(f"{variable} must be a number of seconds, {least:g} or more; got {text!r}")
    return value

#: the temporary Prefect server needs 5-20 s to start on a small machine; leave a wide margin
PREFECT_STARTUP_TIMEOUT_S = 180


@dataclass(frozen=True)
class Settings:
    """Resolved locations of every service a run talks to (:data:`VARIABLES` says what each sets); None where the
    environment leaves it to the code that uses it (``artifact_root``: a tracking server decides)."""

    home: Path
    store_uri: str
    tracking_uri: str
    artifact_root: str | None
    prefect_api_url: str | None
    prefect_home: Path
    experiment_name: str
    model: str | None = None
    target: str | None = None
    dask_address: str | None = None
    reestimate_cron: str | None = None
    reestimate_timezone: str | None = None
    stack_ports: Mapping[str, str | None] = field(default_factory=dict)
    cache_dir: Path | None = None

    @property
    def stack_dir(self) -> Path:
        """Folder of the local stack: ``<home>/stack`` (absolute)."""
        return (self.home / "stack").resolve()

    @property
    def tracking_is_local(self) -> bool:
        """True when the tracking store is a local database or folder rather than a server."""
        return not self.tracking_uri.startswith(("http://", "https://", "databricks"))

    def mlflow_ui_command(self) -> str:
        """The command that opens the MLflow UI on these runs (or the URL of the server that already serves it)."""
        return (f"mlflow ui --backend-store-uri {self.tracking_uri} --port 5000" if self.tracking_is_local
                else self.tracking_uri)

    def create_folders(self) -> None:
        """Create the folders the local defaults write into (the temporary Prefect server needs its home)."""
        self.home.mkdir(parents=True, exist_ok=True)
        if self.prefect_api_url is None:
            self.prefect_home.mkdir(parents=True, exist_ok=True)
        if self.artifact_root is not None and "://" not in self.artifact_root:
            Path(self.artifact_root).mkdir(parents=True, exist_ok=True)


def resolve(home: str | os.PathLike | None = None, *, store_uri: str | None = None,
            tracking_uri: str | None = None, experiment_name: str | None = None,
            environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve the settings: explicit arguments win over environment variables, which win over the home folder.
    The other variables of :data:`VARIABLES` are read as given (None when unset): the user supplies the default."""
    env = os.environ if environ is None else environ
    home_path = Path(home or read(ENV_HOME, env) or DEFAULT_HOME).expanduser().resolve()
    store = store_uri or read(ENV_STORE, env) or str(home_path / "store")
    tracking = tracking_uri or read(ENV_TRACKING_URI, env) or f"sqlite:///{home_path / 'mlflow.db'}"
    cache = read(ENV_CACHE, env)
    return Settings(
        home=home_path,
        store_uri=store,
        tracking_uri=tracking,
        artifact_root=local_artifact_root(tracking, home_path),
        prefect_api_url=read(ENV_PREFECT_API_URL, env),
        prefect_home=home_path / "prefect",
        experiment_name=experiment_name or read(ENV_EXPERIMENT, env) or DEFAULT_EXPERIMENT,
        model=read(ENV_MODEL, env),
        target=read(ENV_TARGET, env),
        dask_address=read(ENV_DASK, env),
        reestimate_cron=read(ENV_CRON, env),
        reestimate_timezone=read(ENV_TIMEZONE, env),
        stack_ports={service: read(name, env) for service, name in ENV_PORTS.items()},
        cache_dir=Path(cache).expanduser() if cache else None,
    )


def local_artifact_root(tracking_uri: str, home: Path) -> str | None:
    """Artifact folder of a local tracking store: ``mlartifacts`` beside the SQLite file (they travel together),
    ``<home>/mlartifacts`` for other local stores, None for a tracking server."""
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
    env[ENV_TRACKING_URI] = settings.tracking_uri
    env[ENV_EXPERIMENT] = settings.experiment_name
    if settings.prefect_api_url is None:
        # the temporary server keeps its SQLite database (and so the run history) under the home
        env["PREFECT_HOME"] = str(settings.prefect_home)
        env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(PREFECT_STARTUP_TIMEOUT_S))
    # no network calls home from an offline machine
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    apply_timeouts(env)
    if not verbose:
        env.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        # MLflow's "View run ... at: <url>" lines on every run's end (a tracking server only); the CLI prints its links
        env.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
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


def on_temporary_prefect_server(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process reports to a command's temporary Prefect server: :func:`apply` then sets PREFECT_HOME
    to ``<home>/prefect``, which no lasting server of the project uses."""
    home, prefect_home = read(ENV_HOME, environ), read("PREFECT_HOME", environ)
    return bool(home and prefect_home) and Path(prefect_home) == Path(home) / "prefect"


def require_trusted_models(environ: Mapping[str, str] | None = None) -> bool:
    """Whether :data:`ENV_REQUIRE_TRUSTED` asks to refuse model versions without a recorded digest (1/true/yes,
    0/false/no or unset); ValueError otherwise, so that a typo does not silently load untrusted models."""
    value = (read(ENV_REQUIRE_TRUSTED, environ) or "0").lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    raise ValueError(f"{ENV_REQUIRE_TRUSTED}={value!r}: set it to 1 to refuse model versions without a recorded "
                     "digest, or to 0 (or unset it) to load them with a warning.")


#: the file under the home where ``labelshift alerts`` records the Prefect server its automations live on
ALERTS_RECORD = "alerts-server.txt"


def record_alerts_server(home: Path, api_url: str) -> None:
    """Remember (under ``home``) that alerts were set up on the Prefect server at ``api_url``."""
    Path(home).mkdir(parents=True, exist_ok=True)
    (Path(home) / ALERTS_RECORD).write_text(api_url.strip() + "\n")


def alerts_missed(environ: Mapping[str, str] | None = None) -> str | None:
    """The Prefect server where ``labelshift alerts`` was set up from this home, when this process reports to a
    temporary server instead (its events reach no automation); else None."""
    if not on_temporary_prefect_server(environ):
        return None
    record = Path(read(ENV_HOME, environ) or ".") / ALERTS_RECORD
    try:
        return record.read_text().strip() or None
    except OSError:
        return None
