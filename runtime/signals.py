"""Where a stop may land: SIGTERM and Ctrl-C kept out of work that an exception raised in its middle leaves broken.

Python runs a signal's handler on the main thread between two bytecodes, wherever that thread is; a handler that
raises (Prefect's SIGTERM handler during a flow run raises ``TerminationSignal``, Ctrl-C raises
``KeyboardInterrupt``) unwinds from that point. Two places must not be cut that way:

* **the database driver.** Raised inside SQLAlchemy's commit or fetch, the exception can leave a SQLite connection
  holding its lock in this process (``labelshift reproduce``'s SIGTERM test failed so about 1 run in 5; a loop of
  MLflow writes stopped at random moments left the file locked within its first 5 stops, 3 runs of 3); every later
  write -- closing the MLflow runs KILLED -- then waits the 20 s busy timeout MLflow sets, beyond the 10 s a
  stopped command has. Within :func:`stops_outside` a stop that lands inside the driver is handled as the block
  ends; elsewhere at once.
* **a commit and its record** (:func:`stops_held`): every stop is handled as the block ends.

Keep each block to one step that talks to the database (the flows decorate those steps): while it runs, Prefect's
own SIGTERM handler is not the one installed, and Prefect acknowledges a cancel from its runner only while it is
(else the run ends Crashed, not Cancelled). A stop held back is handed on with ``_thread.interrupt_main``, to the
handler the block found, at the block's end: once, with nothing sent again through the kernel. Blocking the signal
with ``pthread_sigmask`` does not do this: the mask is per thread, and the kernel hands a process-directed SIGTERM
to any thread that does not block it (Prefect's and MLflow's threads), after which the main thread runs the Python
handler at once. Both act on the main thread only (the only one that runs handlers); the 10 s clock of a stopped
command (:func:`flows.cli.stopping.sigterm_clock`) still starts when the signal arrives.
"""
from __future__ import annotations

import _thread
import signal
import threading
from contextlib import contextmanager
from typing import Callable

__all__ = ["stops_held", "stops_outside", "DRIVER_MODULES"]

STOPS = (signal.SIGTERM, signal.SIGINT)
#: the top-level modules a stop must not land in: SQLAlchemy under MLflow's database stores (the sqlite3 module's
#: own work runs in C, where no handler runs)
DRIVER_MODULES = ("sqlalchemy",)


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
def _deferred(defer: Callable[[object], bool]):
    """Within the block, on the main thread, a stop whose interrupted frame ``defer`` accepts is noted instead of
    handled, and each noted stop is handed once to the handler the block found as the block ends."""
    if not _on_main_thread():
        yield
        return
    noted: list[int] = []

    def deferring(handler):
        def deliver(sig, frame):
            if defer(frame):
                noted.append(sig)
            else:
                handler(sig, frame)
        return deliver

    previous = _replaced(deferring)
    try:
        yield
    finally:
        _restore(previous)
        for sig in dict.fromkeys(noted):
            _thread.interrupt_main(sig)             # run by the restored handler at the next bytecode


def stops_outside(modules: tuple[str, ...] = DRIVER_MODULES):
    """Within the block (a context manager, or a decorator of a function), a SIGTERM or Ctrl-C that lands while the
    main thread runs code of ``modules`` (or code they called) is handled as the block ends; one that lands
    elsewhere, at once. Elsewhere than on the main thread it does nothing."""
    return _deferred(lambda frame: _inside(frame, modules))


def stops_held():
    """SIGTERM and Ctrl-C handled as the block ends, wherever they land (on the main thread): for a short step that
    must not be cut in two. Elsewhere than on the main thread it does nothing."""
    return _deferred(lambda frame: True)
