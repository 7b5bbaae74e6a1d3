"""Every process a ``labelshift`` command starts ends with the command, also when the command is killed outright.

Two mechanisms, each covering what the other cannot:

1. **A watchdog on a pipe** (:func:`watch_descendants`, every command through ``flows.cli._common.setup``). The
   command exports ``LABELSHIFT_COMMAND=<pid>-<start time>``, which every process it starts inherits -- Prefect's
   servers and their children, the subprocesses ``serve`` runs flow runs in, Dask workers -- and starts a small
   watchdog process (:mod:`runtime.watchdog`, in a session of its own) that blocks reading a pipe whose only
   writer is the command. The kernel closes that pipe whenever the command ends, whatever ends it (SIGKILL, the
   OOM killer, a cron timeout); the watchdog then sends SIGTERM to every process that carries the marker, and
   SIGKILL after a few seconds to what is left. A pipe's end-of-file needs no polling and works on every POSIX
   system, and the marker finds grandchildren that a parent-death signal does not reach.
2. **Linux's parent-death signal** for the temporary Prefect server (:class:`TemporaryPrefectServer`): it is
   started here (``uvicorn`` directly, one process) with ``PR_SET_PDEATHSIG`` = SIGTERM, so it ends the moment
   the command does, even if the watchdog itself was killed too (e.g. by ``kill -9 -- -<group>``, or the OOM
   killer choosing it).

Without ``PREFECT_API_URL`` the command starts the temporary server itself instead of letting Prefect's client
start one lazily (``SubprocessASGIServer``, which nothing ends when the command is killed): same command, same
database (``<home>/prefect``), but started as soon as the settings are known, so the server boots while the
command imports Prefect, MLflow and the flows, and it is stopped at exit (``atexit``; SIGTERM and SIGHUP are
turned into a normal exit so that ``atexit`` runs).

Limits: the parent-death signal is Linux-only and tied to the *thread* that started the child (start it from the
main thread; a worker thread's end would kill it). A process that drops the marker from its environment, or one
that forks (not exec) and keeps the pipe open, escapes the watchdog until it ends; processes meant to outlive the
command (``labelshift stack up``'s servers) are started without the marker. Processes of other users cannot be
read or signalled, and none of ours are started as another user.
"""
from __future__ import annotations

import atexit
import importlib.util
import os
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

from runtime import environment
from runtime.processes import HOST, ServiceProcess, free_ports, http_ok, start_time

__all__ = ["MARKER_ENV", "watch_descendants", "TemporaryPrefectServer"]

#: the variable that marks every process a command started (its value names the command's process)
MARKER_ENV = "LABELSHIFT_COMMAND"

_watchdog: dict | None = None


def _marker() -> str:
    return f"{os.getpid()}-{int(start_time(os.getpid()) or 0)}"


def watch_descendants() -> str:
    """Export the marker and start the watchdog of this process (once per process, before it starts anything;
    POSIX only); returns the marker."""
    global _watchdog
    value = _marker()
    environment.export(MARKER_ENV, value)      # every process this one starts from now on carries it
    if os.name != "posix" or (_watchdog is not None and _watchdog["pid"] == os.getpid()):
        return value
    read_end, write_end = os.pipe()          # not inheritable: only this process holds the writing end
    env = environment.child_environment(drop=(MARKER_ENV,))
    script = str(Path(__file__).resolve().parent / "watchdog.py")      # by path: it imports only psutil
    process = subprocess.Popen([sys.executable, script, MARKER_ENV, value], stdin=read_end,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                               start_new_session=True)
    os.close(read_end)
    _watchdog = {"pid": os.getpid(), "write_end": write_end, "process": process}
    return value


class TemporaryPrefectServer:
    """Prefect's temporary API server (no UI) for one command, with its SQLite database under ``prefect_home``:
    :meth:`start` returns at once, :meth:`wait_ready` waits until it answers, :meth:`stop` runs at exit."""

    def __init__(self, prefect_home: Path, *, timeout_s: float = 180.0):
        self.prefect_home = Path(prefect_home)
        self.timeout_s = timeout_s
        self.port = free_ports(1)[0]
        self.api_url = f"http://{HOST}:{self.port}/api"
        self.process: ServiceProcess | None = None

    def command(self) -> list[str]:
        """What Prefect's own ``SubprocessASGIServer`` runs, plus a bound on the graceful shutdown."""
        spec = importlib.util.find_spec("prefect")
        app_dir = str(Path(spec.origin).parent.parent) if spec and spec.origin else "."
        return [sys.executable, "-m", "uvicorn", "--app-dir", app_dir, "--factory",
                "prefect.server.api.server:create_app", "--host", HOST, "--port", str(self.port),
                "--log-level", "error", "--lifespan", "on", "--timeout-graceful-shutdown", "3"]

    def start(self) -> "TemporaryPrefectServer":
        self.prefect_home.mkdir(parents=True, exist_ok=True)
        env = environment.child_environment(
            {"PREFECT_HOME": str(self.prefect_home), "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
             "PREFECT__SERVER_FINAL": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"},
            drop=(environment.ENV_PREFECT_API_URL,))
        self.process = ServiceProcess(self.command(), log=self.prefect_home / "temporary-server.log", env=env,
                                      name="the temporary Prefect server", die_with_parent=True).start()
        atexit.register(self.stop)
        _exit_normally_on(signal.SIGTERM, signal.SIGHUP)
        return self

    def wait_ready(self) -> str:
        """Wait until the API answers; returns its URL. Raises ServiceUnavailableError (with the log's tail)."""
        from labelshift.errors import ServiceUnavailableError

        assert self.process is not None, "start() first"
        self.process.wait_ready(lambda: http_ok(f"{self.api_url}/health", timeout=1.0), self.timeout_s,
                                what=f"on {self.api_url}", step=0.1, error=ServiceUnavailableError,
                                if_exited=": nothing was read or written. If it was killed, look for why (out of "
                                          "memory? `dmesg`); else its log below says. Rerun, or point "
                                          "PREFECT_API_URL at a running server",
                                if_slow=f" (set PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS above "
                                        f"{self.timeout_s:.0f}, or PREFECT_API_URL to a running server)")
        return self.api_url

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=5.0)


def _exit_normally_on(*signals: int) -> None:
    """Turn these signals into SystemExit in the main thread (so ``finally`` blocks and ``atexit`` run), where
    they still have their default action."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)

    for sig in signals:
        with suppress(ValueError, OSError):              # not the main thread, or no such signal here
            if signal.getsignal(sig) == signal.SIG_DFL:
                signal.signal(sig, handler)
