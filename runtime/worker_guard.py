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
3. calls ``settle(flow_run_id, killed, environ)`` for each flow run it stopped (``environ``: that run's process
   environment, e.g. its MLflow tracking URI), so the caller can make sure the run does not stay Running (mark it
   Crashed, close its MLflow runs) when its process could not say so itself;
4. lets the worker go (SIGCONT, then SIGTERM: Prefect's own way out) and returns 128 + the signal's number.

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
               settle: Callable[[str, bool, dict], None], echo: Callable[[str], None] = print) -> int:
    """Run ``command`` (``prefect worker start ...``) until it exits, or until SIGTERM/SIGINT stops it as the
    module says. Returns the worker's exit status, or 128 + the signal's number when stopped."""
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
        while worker.poll() is None and not received:
            wake.wait(0.5)
        if not received:
            return worker.returncode
        signum = received[0]
        echo(f"labelshift worker: {signal.Signals(signum).name}: stopping the worker's flow runs first "
             f"(up to {grace_s:g} s)")
        _stop(worker, grace_s, received, wake, settle, echo)
        return 128 + signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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


def _stop(worker: subprocess.Popen, grace_s: float, received: list[int], wake: threading.Event,
          settle: Callable[[str, bool, dict], None], echo: Callable[[str], None]) -> None:
    """The stop of :func:`run_worker`: freeze the worker, end its flow runs, settle them, let the worker go."""
    try:
        os.kill(worker.pid, signal.SIGSTOP)
    except ProcessLookupError:
        pass
    runs = flow_run_processes(worker.pid)
    for pid in runs:
        _signal_run(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _alive(runs) and time.monotonic() < deadline and len(received) < 2:
        wake.clear()
        wake.wait(0.2)
    killed = _alive(runs)
    for pid in killed:
        _signal_run(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while _alive(runs) and time.monotonic() < deadline:      # SIGKILL is delivered, not awaited
        time.sleep(0.05)
    for pid, (run_id, environ) in runs.items():
        echo(f"labelshift worker: flow run {run_id} " + (f"did not end within {grace_s:g} s: killed"
                                                          if pid in killed else "ended"))
        try:
            settle(run_id, pid in killed, environ)
        except Exception as exc:                 # one run's bookkeeping must not keep the worker from stopping
            echo(f"labelshift worker: could not settle flow run {run_id}: {exc}")
    for sig in (signal.SIGCONT, signal.SIGTERM):
        try:
            os.kill(worker.pid, sig)
        except ProcessLookupError:
            pass
    try:
        worker.wait(timeout=WORKER_EXIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


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
