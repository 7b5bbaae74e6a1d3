"""A Prefect process worker that lets its flow runs end before it stops.

Prefect 3.9's process worker, asked to stop (SIGTERM from ``systemctl stop``, Kubernetes, ``labelshift stack down``),
kills the processes of the flow runs it executes without letting them report: the flow run stays *Running* in
Prefect and its MLflow runs *RUNNING*, for good (measured in tests/integration/test_workers.py). A flow run's own
process, sent SIGTERM, ends as Prefect intends -- the run *Crashed* ("aborted by a termination signal"), its MLflow
runs KILLED -- within seconds.

:func:`run_worker` starts the worker as a child in a process group of its own and, on SIGTERM or SIGINT:

1. freezes the worker (SIGSTOP), so it takes no new flow run while its runs end;
2. sends SIGTERM to each flow run's process (the worker's children, each in a group of its own) and waits up to
   ``grace_s`` seconds (:data:`runtime.timeouts.ENV_WORKER_STOP_S`) for them; a second signal cuts the wait short;
   what is still running then is killed (SIGKILL);
3. calls ``settle(flow_run_id, killed, environ, why)`` for each flow run it stopped (``environ``: that run's
   process environment, e.g. its MLflow tracking URI; ``why``: a sentence saying who ended it), so the caller can make sure the run does not stay Running (mark it
   Crashed, close its MLflow runs) when its process could not say so itself;
4. lets the worker go (SIGCONT, then SIGTERM: Prefect's own way out) and returns 128 + the signal's number.

The Prefect server is watched too: when it stops answering (killed, frozen), the flow runs in flight are ended
the same way (steps 1-3; their processes would otherwise wait on it for minutes, then for ever to send their last
logs, holding the worker's slots) and the worker goes on; what could not be settled without the server is settled
once it answers again.

Without a signal the worker's own exit status is returned. Linux and macOS (POSIX signals); the worker's flow runs
are found by the ``PREFECT__FLOW_RUN_ID`` variable Prefect gives their processes.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import psutil

from runtime.processes import die_with

__all__ = ["run_worker", "flow_run_processes", "FLOW_RUN_VARIABLE", "WORKER_EXIT_S"]

#: the variable Prefect sets in the environment of each flow run's process
FLOW_RUN_VARIABLE = "PREFECT__FLOW_RUN_ID"
#: seconds the worker has to end once its flow runs are gone, before it is killed
WORKER_EXIT_S = 15.0


def run_worker(command: Sequence[str], *, env: Mapping[str, str] | None = None, grace_s: float,
               settle: Callable[[str, bool, dict, str], None], echo: Callable[[str], None] = print,
               api_url: str | None = None, lost_after_s: float = 15.0) -> int:
    """Run ``command`` (``prefect worker start ...``) until it exits, or until SIGTERM/SIGINT stops it as the
    module says. Returns the worker's exit status, or 128 + the signal's number when stopped.

    With ``api_url``, the Prefect server is watched (:class:`runtime.server_watch.ServerWatch`): once it has not
    answered for ``lost_after_s`` seconds, the flow runs in flight are ended as on a stop (their processes would
    otherwise wait on the server for minutes, then for ever to send their last logs, holding the worker's slots),
    and the worker goes on, polling until the server is back. A settlement that fails (the server is still gone)
    is tried again every few seconds until it succeeds."""
    received: list[int] = []
    wake = threading.Event()

    def on_signal(signum, frame):
        received.append(signum)
        wake.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        # a group of its own: a terminal's Ctrl-C reaches this process only; and it ends if this one is killed
        worker = subprocess.Popen(list(command), env=dict(env) if env is not None else None,
                                  start_new_session=True,
                                  preexec_fn=die_with(os.getpid()) if sys.platform.startswith("linux") else None)
        guard = _Guard(worker, grace_s, received, wake, settle, echo)
        guard.watch(api_url, lost_after_s)
        while worker.poll() is None and not received:
            wake.wait(0.5)
            guard.after_a_lost_server()
        if not received:
            return worker.returncode
        signum = received[0]
        echo(f"labelshift worker: {signal.Signals(signum).name}: stopping the worker's flow runs first "
             f"(up to {grace_s:g} s)")
        guard.end_runs(f"labelshift worker was stopped ({signal.Signals(signum).name})")
        guard.let_go()
        return 128 + signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Guard:
    """The worker's flow runs ended, settled (again until it succeeds), and the worker let go."""

    def __init__(self, worker: subprocess.Popen, grace_s: float, received: list[int], wake: threading.Event,
                 settle: Callable[[str, bool, dict, str], None], echo: Callable[[str], None]):
        self.worker, self.grace_s, self.received, self.wake = worker, grace_s, received, wake
        self.settle, self.echo = settle, echo
        self.unsettled: dict[str, tuple[bool, dict, str]] = {}
        self.lost: list[str] = []
        self._watch = None
        self._retry_at = 0.0

    def watch(self, api_url: str | None, lost_after_s: float) -> None:
        """Watch the Prefect server at ``api_url`` (nothing when None); a loss wakes the loop."""
        from runtime.server_watch import ServerWatch, health_url

        if api_url is None:
            return
        self._api_url, self._lost_after_s = api_url, lost_after_s

        def on_lost(reason: str) -> None:
            self.lost.append(reason)
            self.wake.set()
        self._watch = ServerWatch(health_url(api_url), lost_after_s, on_lost).__enter__()

    def after_a_lost_server(self) -> None:
        """End the runs in flight once the server is lost (then watch again); retry what is unsettled."""
        if self.lost:
            reason = self.lost.pop()
            self.echo(f"labelshift worker: {reason}: ending the flow runs in flight (up to {self.grace_s:g} s); "
                      "the worker goes on")
            self.end_runs(f"labelshift worker ended it: {reason}", resume=True)
            self._watch.__exit__(None, None, None)
            self.watch(self._api_url, self._lost_after_s)
        if self.unsettled and time.monotonic() >= self._retry_at:
            self._retry_at = time.monotonic() + 5.0
            for run_id, (killed, environ, why) in list(self.unsettled.items()):
                self._settle(run_id, killed, environ, why, quiet=True)

    def end_runs(self, why: str, resume: bool = False) -> None:
        """Freeze the worker, SIGTERM its flow runs, kill what is left after the grace, settle each (``why``: who
        ended them); ``resume``: let the worker go on afterwards (else it stays frozen for :meth:`let_go`)."""
        _send(self.worker.pid, signal.SIGSTOP)
        runs = flow_run_processes(self.worker.pid)
        for pid in runs:
            _signal_run(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        stops = len(self.received)
        while _alive(runs) and time.monotonic() < deadline and len(self.received) <= max(stops, 1):
            self.wake.clear()
            self.wake.wait(0.2)
        killed = _alive(runs)
        for pid in killed:
            _signal_run(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while _alive(runs) and time.monotonic() < deadline:      # SIGKILL is delivered, not awaited
            time.sleep(0.05)
        for pid, (run_id, environ) in runs.items():
            self.echo(f"labelshift worker: flow run {run_id} " + (f"did not end within {self.grace_s:g} s: killed"
                                                                   if pid in killed else "ended"))
            self._settle(run_id, pid in killed, environ, why)
        if resume:
            _send(self.worker.pid, signal.SIGCONT)

    def _settle(self, run_id: str, killed: bool, environ: dict, why: str, quiet: bool = False) -> None:
        try:
            self.settle(run_id, killed, environ, why)
            self.unsettled.pop(run_id, None)
        except Exception as exc:                 # one run's bookkeeping must not keep the worker from stopping
            if not quiet:
                self.echo(f"labelshift worker: could not settle flow run {run_id} ({exc}); tried again while the "
                          "worker runs")
            self.unsettled[run_id] = (killed, environ, why)

    def let_go(self) -> None:
        """The worker out of its freeze and stopped by Prefect's own way (SIGTERM); killed if it lingers."""
        if self._watch is not None:
            self._watch.__exit__(None, None, None)
        for run_id, (killed, environ, why) in list(self.unsettled.items()):
            self._settle(run_id, killed, environ, why, quiet=True)
        for sig in (signal.SIGCONT, signal.SIGTERM):
            _send(self.worker.pid, sig)
        try:
            self.worker.wait(timeout=WORKER_EXIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.worker.pid, signal.SIGKILL)
            self.worker.wait()
        if self.unsettled:
            self.echo(f"labelshift worker: flow run(s) {', '.join(self.unsettled)} could not be settled: mark them "
                      "Crashed in the Prefect UI")


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def flow_run_processes(worker_pid: int) -> dict[int, tuple[str, dict]]:
    """pid -> (flow run id, environment) of each live flow-run process the worker started."""
    found = {}
    try:
        children = psutil.Process(worker_pid).children()
    except psutil.Error:
        return found
    for child in children:
        try:
            environ = child.environ()
        except psutil.Error:
            continue
        if environ.get(FLOW_RUN_VARIABLE) and _running(child):
            found[child.pid] = (environ[FLOW_RUN_VARIABLE], environ)
    return found


def _signal_run(pid: int, sig: int) -> None:
    """Signal a flow run's process group (Prefect starts each in its own), or the process alone."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(runs: Mapping[int, object]) -> list[int]:
    """The pids of ``runs`` still running (a zombie, not reaped while the worker is frozen, has ended)."""
    alive = []
    for pid in runs:
        try:
            if _running(psutil.Process(pid)):
                alive.append(pid)
        except psutil.Error:
            pass
    return alive


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
