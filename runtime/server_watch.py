"""Notice, during a run, that the Prefect server stopped answering -- killed, crashed, out of memory or frozen -- and
stop the command within a bounded time instead of letting it wait on the server for ever.

Prefect's client keeps working a while without its server (task states are kept locally and sent as events), and
at exit its log and event queues wait to drain to a server that is gone: the command hangs. :class:`ServerWatch`
asks the server's health endpoint every second, on a thread of its own, with a short time limit per question;
once the server has not answered for ``lost_after_s`` seconds it calls ``on_lost(reason)`` once. The command's
``on_lost`` (``flows.cli._common``) stops the run as SIGTERM would, and exits regardless after
:data:`runtime.timeouts.UNWIND_S`. A server that refuses connections and one that accepts them and never answers
(SIGSTOP) are the same to it.
"""
from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

__all__ = ["ServerWatch", "health_url"]


def health_url(api_url: str) -> str:
    """The health endpoint of a Prefect API URL (``http://host:port/api`` -> ``.../api/health``)."""
    return f"{api_url.rstrip('/')}/health"


class ServerWatch:
    """A daemon thread that calls ``on_lost(reason)`` once when ``url`` has not answered for ``lost_after_s``.

    Use it as a context manager (the thread runs within the block). ``lost`` holds the reason once it fired.

    Args:
        url: a health URL (any answer below 500 counts as alive).
        lost_after_s: seconds without an answer before the server counts as lost.
        on_lost: called on the watch's thread with a sentence saying what happened.
        interval_s: seconds between questions; each may take at most ``min(2, 2 * interval_s)`` seconds.
    """

    def __init__(self, url: str, lost_after_s: float, on_lost: Callable[[str], None], *, interval_s: float = 1.0):
        self.url, self.lost_after_s, self.on_lost, self.interval_s = url, float(lost_after_s), on_lost, interval_s
        self.lost: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()        # on_lost is called within the block, never after it
        self._thread = threading.Thread(target=self._watch, name="labelshift-server-watch", daemon=True)

    def __enter__(self) -> "ServerWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._stop.set()

    def answers(self) -> bool:
        """Whether the server answers now."""
        try:
            with urllib.request.urlopen(self.url, timeout=min(2.0, self.interval_s * 2)) as response:
                return response.status < 500
        except urllib.error.HTTPError as exc:
            return exc.code < 500
        except (OSError, ValueError):
            return False

    def _watch(self) -> None:
        last_answer = time.monotonic()
        while not self._stop.wait(self.interval_s):
            if self.answers():
                last_answer = time.monotonic()
                continue
            silent = time.monotonic() - last_answer
            if silent >= self.lost_after_s:
                with self._lock:
                    if self._stop.is_set():
                        return
                    self.lost = (f"the Prefect server at {self.url.removesuffix('/health')} stopped answering "
                                 f"(nothing for {silent:.0f} s)")
                    self.on_lost(self.lost)
                return
