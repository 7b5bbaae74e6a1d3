"""A Prefect process worker that lets its flow runs end before it stops.

Prefect 3.9's process worker, asked to stop, kills its flow runs' processes without letting them report: the flow
run stays *Running* and its MLflow runs *RUNNING* for good (tests/integration/test_workers.py); a flow run's own
process, sent SIGTERM, ends *Crashed* with its MLflow runs KILLED within seconds. :func:`run_worker` starts the
worker in a process group of its own and, on SIGTERM or SIGINT:

1. freezes the worker (SIGSTOP), so it takes no new flow run;
2. sends SIGTERM to each flow run's process and waits up to ``grace_s`` (:data:`runtime.timeouts.ENV_WORKER_STOP_S`;
   a second signal cuts the wait short), then kills what is left (SIGKILL);
3. calls ``settle(flow_run_id, killed, environ, why, server_answers)`` for each, so the caller can mark the run
   Crashed and close its MLflow runs when its process could not;
4. lets the worker go (SIGCONT, then SIGTERM) and returns 128 + the signal's number.

When the watched Prefect server stops answering, the runs in flight are ended the same way (steps 1-3) and the
worker goes on; the server is asked every :data:`RETRY_S` seconds until it answers, and what was not settled is
settled then. Signals only set a flag and write a byte to a pipe (a handler that took a lock could wait for the
very thread it interrupted). The worker is never left frozen: whatever ends the guard sends SIGCONT first, and the
worker gets SIGKILL if the guard itself is killed (Linux).
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress

import psutil

from runtime.processes import die_with

__all__ = ["run_worker", "flow_run_processes", "FLOW_RUN_VARIABLE", "WORKER_EXIT_S", "KILL_WAIT_S", "RETRY_S",
           "SETTLE_BUDGET_S"]

#: the variable Prefect sets in the environment of each flow run's process
FLOW_RUN_VARIABLE = "PREFECT__FLOW_RUN_ID"
#: seconds the worker has to end once its flow runs are gone, before it is killed
WORKER_EXIT_S = 15.0
#: seconds a killed flow run's process is waited for (SIGKILL is delivered, not awaited)
KILL_WAIT_S = 5.0
#: seconds between two questions to a lost Prefect server, and between two tries of an unsettled run
RETRY_S = 5.0
#: what settling the stopped runs may add to a stop, in seconds (a stopper's own grace must cover all of it)
SETTLE_BUDGET_S = 10.0

#: (process, flow run id, environment) of one flow run's process
FlowRun = tuple[psutil.Process, str, dict]


def run_worker(command: Sequence[str], *, env: Mapping[str, str] | None = None, grace_s: float,
               settle: Callable[[str, bool, dict, str, bool], None], echo: Callable[[str], None] = print,
               api_url: str | None = None, lost_after_s: float = 15.0) -> int:
    """Run ``command`` (``prefect worker start ...``) until it exits, or until SIGTERM/SIGINT stops it as the
    module says. Returns the worker's exit status, or 128 + the signal's number when stopped. With ``api_url``,
    the Prefect server is watched (a loss after ``lost_after_s`` seconds of silence)."""
    received: list[int] = []
    wakeup = _Wakeup()

    def on_signal(signum, frame):
        received.append(signum)
        wakeup.poke()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    worker = guard = None
    try:
        # a group of its own: a terminal's Ctrl-C reaches this process only; SIGKILL if this one is killed (a
        # SIGTERM would wait, pending, on a frozen worker)
        arm = die_with(os.getpid(), signal.SIGKILL) if sys.platform.startswith("linux") else None
        worker = subprocess.Popen(list(command), env=dict(env) if env is not None else None,
                                  start_new_session=True, preexec_fn=arm)
        guard = _Guard(worker, grace_s, received, wakeup, settle, echo)
        guard.watch(api_url, lost_after_s)
        while worker.poll() is None and not received:
            wakeup.wait(1.0)
            guard.tick()
        if not received:
            guard.last_try()
            return worker.returncode
        signum = received[0]
        echo(f"labelshift worker: {signal.Signals(signum).name}: stopping the worker's flow runs first "
             f"(up to {grace_s:g} s)")
        guard.end_runs(f"labelshift worker was stopped ({signal.Signals(signum).name})")
        guard.let_go()
        return 128 + signum
    finally:
        if guard is not None:
            guard.close()
        if worker is not None and worker.poll() is None:
            _end_worker(worker)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        wakeup.close()


class _Wakeup:
    """A pipe the loop waits on: a signal handler or the watch's thread writes a byte (never blocking)."""

    def __init__(self):
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def poke(self) -> None:
        with suppress(BlockingIOError, OSError):
            os.write(self._write, b"\0")

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a poke, then empty the pipe."""
        with suppress(BlockingIOError, InterruptedError, OSError):
            select.select([self._read], [], [], timeout)
            while os.read(self._read, 4096):
                pass

    def close(self) -> None:
        for fd in (self._read, self._write):
            with suppress(OSError):
                os.close(fd)


class _Guard:
    """The worker's flow runs ended, settled (again until it succeeds), and the worker let go."""

    def __init__(self, worker: subprocess.Popen, grace_s: float, received: list[int], wakeup: _Wakeup,
                 settle: Callable[[str, bool, dict, str, bool], None], echo: Callable[[str], None]):
        self.worker, self.grace_s, self.received, self.wakeup = worker, grace_s, received, wakeup
        self.settle, self.echo = settle, echo
        self.unsettled: dict[str, tuple[bool, dict, str]] = {}
        self.lost: list[str] = []
        self.down = False
        self._watch = self._api_url = None
        self._lost_after_s = 15.0
        self._next_tick = 0.0

    def watch(self, api_url: str | None, lost_after_s: float) -> None:
        """Watch the Prefect server at ``api_url`` (nothing when None); a loss wakes the loop."""
        from runtime.server_watch import ServerWatch, health_url

        if api_url is None:
            return
        self._api_url, self._lost_after_s = api_url, lost_after_s

        def on_lost(reason: str) -> None:          # on the watch's thread: a flag and a byte, no lock
            self.lost.append(reason)
            self.wakeup.poke()
        self._watch = ServerWatch(health_url(api_url), lost_after_s, on_lost).__enter__()

    def tick(self) -> None:
        """A lost server: end the runs in flight, then ask it every RETRY_S until it answers and watch it again;
        retry what is unsettled meanwhile."""
        if self.lost:
            reason = self.lost.pop()
            self.down = True
            self.close()
            self.end_runs(f"labelshift worker ended it: {reason}", resume=True, heading=f"{reason}: ")
        if time.monotonic() < self._next_tick or self.received:
            return
        self._next_tick = time.monotonic() + RETRY_S
        if self.down and self._answers():
            self.down = False
            self.echo("labelshift worker: the Prefect server answers again")
            self.watch(self._api_url, self._lost_after_s)
        for run_id, (killed, environ, why) in list(self.unsettled.items()):
            self._settle(run_id, killed, environ, why, quiet=True)

    def _answers(self) -> bool:
        from runtime.server_watch import ServerWatch, health_url

        return ServerWatch(health_url(self._api_url), self._lost_after_s, lambda reason: None).answers()

    def end_runs(self, why: str, resume: bool = False, heading: str = "") -> None:
        """Freeze the worker, SIGTERM its flow runs, SIGKILL what is left after the grace (and what their
        groups still hold), settle each (``why``: who ended them); ``resume``: the worker goes on afterwards
        (else it stays frozen for :meth:`let_go`)."""
        runs = _frozen_runs(self.worker)
        if not runs:
            self.echo(f"labelshift worker: {heading}no flow run in flight" + ("; the worker goes on" if resume
                                                                               else ""))
            if resume:
                _send(self.worker.pid, signal.SIGCONT)
            return
        self.echo(f"labelshift worker: {heading}ending {len(runs)} flow run(s) in flight (up to {self.grace_s:g} s)"
                  + ("; the worker goes on" if resume else ""))
        for pid, (process, _, _) in runs.items():
            _signal_run(pid, process, signal.SIGTERM)
        cut = self._wait_for(runs)
        killed = _alive(runs)
        for pid, (process, _, _) in runs.items():  # what still runs, and what the ended ones left in their group
            _signal_run(pid, process, signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT_S
        while _alive(runs) and time.monotonic() < deadline:
            time.sleep(0.05)
        if resume:
            _send(self.worker.pid, signal.SIGCONT)
        for pid, (_, run_id, environ) in runs.items():
            was_killed = pid in killed
            self.echo(f"labelshift worker: flow run {run_id} " + (
                ("still running when a second signal came: killed" if cut else
                 f"did not end within {self.grace_s:g} s: killed") if was_killed else "ended"))
            self._settle(run_id, was_killed, environ, why)

    def _wait_for(self, runs: Mapping[int, FlowRun]) -> bool:
        """Wait up to the grace for ``runs`` to end; True when a further signal cut the wait short."""
        deadline = time.monotonic() + self.grace_s
        signals = max(len(self.received), 1)
        while _alive(runs) and time.monotonic() < deadline:
            if len(self.received) > signals:
                return True
            self.wakeup.wait(0.2)
        return False

    def _settle(self, run_id: str, killed: bool, environ: dict, why: str, quiet: bool = False) -> None:
        try:
            self.settle(run_id, killed, environ, why, not self.down)
            self.unsettled.pop(run_id, None)
        except Exception as exc:                 # one run's bookkeeping must not keep the worker from stopping
            if not quiet:
                self.echo(f"labelshift worker: flow run {run_id} not settled yet ({exc}); tried again every "
                          f"{RETRY_S:g} s while the worker runs")
            self.unsettled[run_id] = (killed, environ, why)

    def last_try(self) -> None:
        """One more try of what is unsettled (the Prefect server answering), then say what is left."""
        for run_id, (killed, environ, why) in list(self.unsettled.items()):
            if not self.down:
                self._settle(run_id, killed, environ, why, quiet=True)
        if self.unsettled:
            self.echo(f"labelshift worker: flow run(s) {', '.join(self.unsettled)} could not be settled: mark them "
                      "Crashed in the Prefect UI, and end their MLflow runs still RUNNING (tag prefect.flow_run_id)")

    def let_go(self) -> None:
        """The worker out of its freeze and stopped by Prefect's own way (SIGTERM); killed if it lingers."""
        self.close()
        self.last_try()
        _end_worker(self.worker)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.__exit__(None, None, None)
            self._watch = None


def _end_worker(worker: subprocess.Popen) -> None:
    """SIGCONT (a frozen worker cannot act on a signal), SIGTERM, and SIGKILL to its group after WORKER_EXIT_S."""
    for sig in (signal.SIGCONT, signal.SIGTERM):
        _send(worker.pid, sig)
    try:
        worker.wait(timeout=WORKER_EXIT_S)
    except subprocess.TimeoutExpired:
        _killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def _frozen_runs(worker: subprocess.Popen) -> dict[int, FlowRun]:
    """SIGSTOP to the worker, then, once it is stopped (a fork under way finishes first), its flow runs by pid
    (their pids stay theirs while the frozen worker does not reap them)."""
    _send(worker.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            if psutil.Process(worker.pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE):
                break
        except psutil.Error:
            break
        time.sleep(0.01)
    return {process.pid: (process, run_id, environ) for process, run_id, environ in flow_run_processes(worker.pid)}


def flow_run_processes(worker_pid: int) -> list[FlowRun]:
    """(process, flow run id, environment) of each live flow-run process the worker started."""
    found = []
    try:
        children = psutil.Process(worker_pid).children()
    except psutil.Error:
        return found
    for child in children:
        try:
            environ = child.environ()      # the child's own environment (Prefect's variables), not this process's
        except psutil.Error:
            continue
        if environ.get(FLOW_RUN_VARIABLE) and _running(child):
            found.append((child, environ[FLOW_RUN_VARIABLE], environ))
    return found


def _signal_run(pid: int, process: psutil.Process, sig: int) -> None:
    """Signal a flow run's process group when it leads one (Prefect starts each run in its own: what the run
    started goes too, even after the run's own process ended), else the process alone while it runs."""
    try:
        if not process.is_running():             # gone, and its pid maybe another's now
            return
        leads = os.getpgid(pid) == pid
    except (OSError, psutil.Error):
        leads = False
    if leads:
        _killpg(pid, sig)
    elif _running(process):
        with suppress(psutil.Error):
            process.send_signal(sig)


def _killpg(pgid: int, sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _send(pid: int, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, sig)


def _alive(runs: Mapping[int, FlowRun]) -> list[int]:
    """The pids of ``runs`` whose process still runs (a zombie, not reaped while the worker is frozen, has
    ended; a pid now held by another process is not it: psutil compares start times)."""
    return [pid for pid, (process, _, _) in runs.items() if _running(process)]


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
