"""How a command that runs a flow stops when it is asked to or when its Prefect server goes away, within a bounded
time and saying why.

- **SIGTERM** (``systemctl stop``, ``kill``, Kubernetes, a Prefect worker cancelling) raises :class:`Terminated` in
  the main thread, so the command unwinds as on Ctrl-C: the flow ends its MLflow run(s) KILLED, the watermark does
  not move, the temporary Prefect server is stopped; exit :data:`EXIT_TERMINATED`.
- **A lost Prefect server** (killed, crashed, frozen): :class:`runtime.server_watch.ServerWatch` notices within
  :data:`runtime.timeouts.ENV_SERVER_LOST_S` seconds and the command unwinds the same way with
  :class:`ServerLost`, exit :data:`EXIT_SERVER_LOST`.
- **Either way**, if unwinding waits on something (Prefect reporting the crash to a dead server, a call to a frozen
  one, a worker thread), the command prints its sentence and leaves :data:`runtime.timeouts.UNWIND_S` seconds
  after the signal regardless. Its processes end with it (``runtime.lifetime``).
- **At exit**, :func:`finish` gives Prefect's log and event queues :data:`runtime.timeouts.EXIT_DRAIN_S` seconds to
  reach the server, instead of Prefect's wait without end.

Each sentence says what is true when it is printed: whether the run had committed (``committed``, a function the
command passes in), and that an MLflow run which could not be ended is ended by the next run. The hard exits
(``os._exit``) happen only in the ``labelshift`` process itself (:func:`as_command`), never when a test or a served
flow run calls the command's functions in-process.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

from runtime import environment as settings_mod
from runtime import timeouts
from runtime.server_watch import ServerWatch, health_url

__all__ = ["EXIT_TERMINATED", "EXIT_SERVER_LOST", "AFTER_STOP", "Terminated", "ServerLost", "sigterm_unwinds",
           "sigterm_clock", "watched", "as_command", "finish", "stopped_sentence", "lost_reason", "tell"]

#: the exit status of a command stopped by SIGTERM (128 + 15, as a shell reports it)
EXIT_TERMINATED = 143
#: the exit status of a command whose Prefect server stopped answering (sysexits' EX_TEMPFAIL: try again later)
EXIT_SERVER_LOST = 75

#: what a command stopped midway leaves behind, said after why it stopped
AFTER_STOP = {
    "estimate": "nothing was committed (the watermark did not move); its MLflow run is ended KILLED (by the next "
                "run, if MLflow did not answer): the next run takes the same batches.",
    "reproduce": "the sweep's MLflow runs are closed KILLED (FAILED where a task failed first; if MLflow did not "
                 "answer, they stay RUNNING); run it again to start over.",
}
#: what to do after a lost Prefect server
LOST_HINT = ("\n  Find out why the server stopped (out of memory? a crash?), or point PREFECT_API_URL at a server that "
             "runs, then rerun.")

_state: dict = {}


def as_command() -> None:
    """Mark this process as the ``labelshift`` command itself: the one place a hard exit may end it. From here
    on SIGTERM unwinds (:class:`Terminated`, exit 143, a sentence) instead of ending the process on the spot, also
    before a command's run starts (a run's own handler, :func:`sigterm_unwinds`, takes over within it)."""
    _state.clear()
    _state.update(command=True, lost=None, told=False, message=None)
    signal.signal(signal.SIGTERM, _terminated)


def _terminated(signum, frame):
    raise Terminated("")


def _no_commit() -> int | None:
    return None


def stopped_sentence(command: str, why: str, committed: int | None = None, hint: str = "") -> str:
    """The command's last sentence when ``why`` stopped it: what it left and what to do; ``committed``: the
    sequence number the run had committed before (its results then stand)."""
    if committed is not None:
        return (f"\nlabelshift {command}: {why} after the run had committed its verdict (sequence {committed}): its "
                "outputs and the watermark stand; Prefect's record of the run is incomplete.")
    if command not in AFTER_STOP:
        return f"\nlabelshift {command}: {why}.{hint}"
    return f"\nlabelshift {command}: {why}; the run was stopped: {AFTER_STOP[command]}{hint}"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread by :func:`sigterm_unwinds` with the command's sentence; the command exits
    :data:`EXIT_TERMINATED`."""


class ServerLost(KeyboardInterrupt):
    """The Prefect server stopped answering during the run, with the command's sentence; the command exits
    :data:`EXIT_SERVER_LOST`."""


@contextmanager
def sigterm_unwinds(command: str, committed: Callable[[], int | None] = _no_commit):
    """Within the block, SIGTERM raises :class:`Terminated` (or :class:`ServerLost`, when the server watch sent
    it) in the main thread instead of ending the process on the spot (Python's default, which leaves the MLflow
    run RUNNING and prints nothing), under :func:`sigterm_clock`. ``committed`` says whether the run had committed."""
    def sentence() -> str:
        return stopped_sentence(command, "stopped by SIGTERM", committed())

    def terminate(signum, frame):
        if _state.get("lost"):
            raise ServerLost(_state["message"](_state["lost"]))
        raise Terminated(sentence())

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        with sigterm_clock(sentence):
            yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def sigterm_clock(sentence: Callable[[], str]):
    """Within the block, in the ``labelshift`` process (:func:`as_command`), a SIGTERM starts a clock the moment
    it arrives (:func:`_clock_on_sigterm`): :data:`runtime.timeouts.UNWIND_S` seconds later ``sentence()`` is
    printed and the process exits 143, whatever its handlers are still doing."""
    wakeup = _clock_on_sigterm(sentence) if _state.get("command") else None
    try:
        yield
    finally:
        if wakeup is not None:
            signal.set_wakeup_fd(wakeup)


def _clock_on_sigterm(sentence: Callable[[], str]) -> int | None:
    """Start :data:`runtime.timeouts.UNWIND_S`'s clock when SIGTERM arrives, whichever Python handler takes it
    (Prefect's own, during a flow run, re-sends it to ours only after its teardown): Python's C-level handler writes
    each signal's number to the wakeup fd, which a thread reads. Returns the previous wakeup fd (to restore), or
    None where it cannot be set (not the main thread). (An asyncio loop run on the main thread within the block
    would take the wakeup fd over, and the clock with it; the commands that use this run none.)"""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:
        os.close(read_end)
        os.close(write_end)
        return None

    def wait_for_sigterm() -> None:
        while signal.SIGTERM not in os.read(read_end, 64):
            pass
        if not _state.get("lost"):                     # a lost server has its own clock and sentence
            _leave_after(timeouts.UNWIND_S, EXIT_TERMINATED, sentence)

    threading.Thread(target=wait_for_sigterm, name="labelshift-sigterm-clock", daemon=True).start()
    return previous


def _leave_after(seconds: float, code: int, sentence: Callable[[], str]) -> None:
    """Exit ``code`` with ``sentence()`` after ``seconds``, unless the process ended first."""
    clock = threading.Timer(seconds, lambda: _leave(code, sentence()))
    clock.daemon = True
    clock.start()


@contextmanager
def watched(api_url: str | None, message: Callable[[str], str]):
    """Within the block, watch the Prefect server at ``api_url`` (nothing when None or not :func:`as_command`);
    when it is lost, SIGTERM to this process (:func:`sigterm_unwinds` raises :class:`ServerLost` with
    ``message(reason)``), and after :data:`runtime.timeouts.UNWIND_S` seconds print that and exit regardless."""
    if api_url is None or not _state.get("command"):
        yield
        return

    def on_lost(reason: str) -> None:
        _state["lost"], _state["message"] = reason, message
        _leave_after(timeouts.UNWIND_S, EXIT_SERVER_LOST, lambda: message(reason))
        os.kill(os.getpid(), signal.SIGTERM)

    watch = ServerWatch(health_url(api_url), settings_mod.server_lost_s(), on_lost)
    with watch:
        try:
            yield
        except Exception as exc:       # an error of the flow's own client: say so when the server is gone
            if watch.lost is None and not _answers_soon(watch):
                raise ServerLost(message(f"the Prefect server at {api_url} does not answer "
                                         f"({_first_line(exc)})")) from exc
            raise


def _answers_soon(watch: ServerWatch, tries: int = 3, pause_s: float = 0.5) -> bool:
    """Whether the server answers one of ``tries`` questions ``pause_s`` apart (one slow answer is not a loss)."""
    for attempt in range(tries):
        if watch.answers():
            return True
        if attempt + 1 < tries:
            time.sleep(pause_s)
    return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def lost_reason() -> str | None:
    """The sentence of the server watch, once the server was lost."""
    return _state.get("lost")


def tell(text: str) -> None:
    """Print the command's last sentence once (the main thread and a hard exit may both want to)."""
    if not _state.get("told"):
        _state["told"] = True
        print(text, file=sys.stderr, flush=True)


def _leave(code: int, text: str) -> None:
    tell(text)
    sys.stdout.flush()
    os._exit(code)


def finish(code: int, prog: str) -> int:
    """At the command's end: let Prefect's queued logs and events reach the server for at most
    :data:`runtime.timeouts.EXIT_DRAIN_S` seconds (one when the server is known lost; a SIGTERM ends the wait);
    if they cannot, say so and exit ``code`` at once instead of waiting for ever. Returns ``code`` otherwise."""
    if not _state.get("command") or "prefect" not in sys.modules:
        return code
    from prefect.events.worker import EventsWorker

    signal.signal(signal.SIGTERM, lambda signum, frame: _leave(EXIT_TERMINATED, f"{prog}: stopped by SIGTERM while "
                                                              "sending the run's last logs and events."))
    wait = 1.0 if _state.get("lost") else timeouts.EXIT_DRAIN_S
    _, pending = EventsWorker.drain_all(timeout=wait, at_exit=False)     # every Prefect queue, logs included
    if not pending:
        return code
    if _state.get("lost"):
        _leave(code, f"{prog}: {_state['lost']}; the run's last logs and events were not sent.")
    _leave(code, f"{prog}: the Prefect server did not take the run's last logs and events within {wait:.0f} s "
                 "(is it overloaded or gone?); they were not sent. What the command printed above stands.")
    return code
