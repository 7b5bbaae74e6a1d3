"""Where a stop may land: SIGTERM and Ctrl-C kept out of work that an exception raised in its middle leaves broken.

Python runs a signal's handler on the main thread between two bytecodes, wherever that thread is; a handler that
raises (Prefect's SIGTERM handler during a flow run raises ``TerminationSignal``, Ctrl-C raises
``KeyboardInterrupt``) unwinds from that point. Two places must not be cut that way:

* **the database driver.** Raised inside SQLAlchemy's commit or fetch, the exception can leave a SQLite connection
  holding its lock in this process (seen 1 run in 5 in ``labelshift reproduce``'s SIGTERM test, about 1 in 80
  stops in a loop of MLflow writes); every later write -- closing the MLflow runs KILLED -- then waits the 20 s
  busy timeout MLflow sets, beyond the 10 s a stopped command has. :func:`stops_outside` sends such a signal again
  a moment later, until it lands outside the driver.
* **a commit and its record** (:func:`stops_held`): the signal is noted and handed to its handler when the block
  ends.

Blocking the signal with ``pthread_sigmask`` does not do this: the mask is per thread, and the kernel hands a
process-directed SIGTERM to any thread that does not block it (Prefect's and MLflow's threads), after which the
main thread runs the Python handler at once. Both context managers act on the main thread only (the only one that
runs handlers) and restore the handlers they replaced; the 10 s clock of a stopped command
(:func:`flows.cli.stopping.sigterm_clock`) still starts when the signal arrives.
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager

__all__ = ["stops_held", "stops_outside", "DRIVER_MODULES"]

STOPS = (signal.SIGTERM, signal.SIGINT)
#: the top-level modules a stop must not land in (SQLAlchemy and the sqlite3 module under MLflow's stores)
DRIVER_MODULES = ("sqlalchemy", "sqlite3")
#: how long after landing inside the driver a stop is sent again (a driver call on a local store takes milliseconds)
RETRY_S = 0.05


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _replaced(make_handler) -> dict:
    """Each stop's Python handler replaced by ``make_handler(previous)``; returns the previous handlers (a signal
    whose handler is not a Python callable -- ignored, or set outside Python -- is left alone)."""
    previous = {}
    for sig in STOPS:
        handler = signal.getsignal(sig)
        if callable(handler):
            previous[sig] = handler
            signal.signal(sig, make_handler(handler))
    return previous


def _restore(previous: dict) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _inside(frame, modules: tuple[str, ...]) -> bool:
    """Whether the interrupted frame, or any frame that called it, runs code of ``modules`` (top-level names)."""
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).split(".", 1)[0] in modules:
            return True
        frame = frame.f_back
    return False


@contextmanager
def stops_outside(modules: tuple[str, ...] = DRIVER_MODULES, retry_s: float = RETRY_S):
    """Within the block, a SIGTERM or Ctrl-C that lands while the main thread runs code of ``modules`` (or code they
    called) is not handled there: it is sent again every ``retry_s`` seconds and handled where it first lands
    outside them, by the handler the block found. Elsewhere than on the main thread the block does nothing."""
    if not _on_main_thread():
        yield
        return

    def outside(handler):
        def deliver(sig, frame):
            if _inside(frame, modules):
                again = threading.Timer(retry_s, os.kill, (os.getpid(), sig))
                again.daemon = True
                again.start()
                return
            handler(sig, frame)
        return deliver

    previous = _replaced(outside)
    try:
        yield
    finally:
        _restore(previous)


@contextmanager
def stops_held():
    """SIGTERM and Ctrl-C noted, not handled, within the block (on the main thread), and handed to the handlers the
    block found as it ends, once each: for a short step that must not be cut in two. Elsewhere than on the main
    thread the block does nothing."""
    if not _on_main_thread():
        yield
        return
    noted: list[int] = []
    previous = _replaced(lambda handler: lambda sig, frame: noted.append(sig))
    try:
        yield
    finally:
        _restore(previous)
        for sig in dict.fromkeys(noted):
            previous[sig](sig, None)
