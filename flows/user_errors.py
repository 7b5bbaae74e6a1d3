"""A user's error is logged once, as one line, in a flow run's log; unexpected errors keep their traceback.

Prefect's task and flow engines log a raised error several times, each with its traceback, which for a
:class:`~labelshift.errors.LabelShiftError` (a message naming the problem and its fix) only hides that message.
:class:`UserErrorFilter`, on Prefect's flow-run and task-run loggers, rewrites the first record that carries such an
error to its own line (``InputError: <message>``), drops the later records of the same flow run that carry it, and
shortens the "Finished in state" lines that repeat it. States, messages and raised exceptions are unchanged.

:func:`install` adds the filter (once per process); the flow modules call it at import, so runs started by the
CLI, by ``labelshift serve`` and by workers all get it.
"""
from __future__ import annotations

import logging
from collections import deque

from labelshift.errors import LabelShiftError

__all__ = ["UserErrorFilter", "install", "LOGGERS"]

#: the loggers of Prefect's flow-run and task-run engines (their run loggers are adapters of these)
LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


class UserErrorFilter(logging.Filter):
    """Logs each LabelShiftError once, as one line without traceback (see the module docstring)."""

    def __init__(self, remember: int = 64):
        super().__init__()
        self._seen: deque[tuple[str, str]] = deque(maxlen=remember)  # (flow run id, message)

    @staticmethod
    def _user_error(record: logging.LogRecord) -> LabelShiftError | None:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, LabelShiftError):
            return exc
        for arg in record.args if isinstance(record.args, tuple) else ():
            if isinstance(arg, LabelShiftError):
                return arg
        return None

    def filter(self, record: logging.LogRecord) -> bool:
        run = str(getattr(record, "flow_run_id", None) or "")
        exc = self._user_error(record)
        if exc is not None:
            text = str(exc)
            if (run, text) in self._seen:
                return False
            self._seen.append((run, text))
            record.msg, record.args = f"{type(exc).__name__}: {text}", ()
            record.exc_info, record.exc_text, record.stack_info = None, None, None
            return True
        if self._seen and isinstance(record.msg, str) and record.msg.startswith("Finished in state"):
            message = record.getMessage()
            if any(text and seen_run == run and text in message for seen_run, text in self._seen):
                state = message.removeprefix("Finished in state ").split("(", 1)[0]
                record.msg, record.args = f"Finished in state {state} (the error above)", ()
        return True


_installed: UserErrorFilter | None = None


def install() -> UserErrorFilter:
    """Add the filter to Prefect's run loggers, once per process; returns it."""
    global _installed
    if _installed is None:
        _installed = UserErrorFilter()
        for name in LOGGERS:
            logging.getLogger(name).addFilter(_installed)
    return _installed
