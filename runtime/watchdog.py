"""The watchdog of one ``labelshift`` command (see :mod:`runtime.lifetime`): ``python watchdog.py NAME VALUE``.

It reads its standard input, a pipe whose only writer is the command, until end-of-file -- which the kernel
delivers when the command ends, however it ends -- then sends SIGTERM to every process whose environment has
``NAME=VALUE``, waits up to :data:`GRACE_S` seconds, sends SIGKILL to those still running, and exits. Run by file
path with nothing but the standard library and psutil, so it starts fast and does not depend on the command's
import path.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import psutil

GRACE_S = 4.0


def marked(name: str, value: str) -> list[psutil.Process]:
    """The live processes (this one aside) whose environment has ``name=value``, among those we may read."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if process.environ().get(name) == value and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.Error, OSError):
            continue
    return found


def end_marked(name: str, value: str, grace: float = GRACE_S) -> int:
    """SIGTERM to the marked processes, SIGKILL after ``grace`` s to what is left; returns how many there were."""
    first = marked(name, value)
    _send(first, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = first
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked(name, value)
    _send(left, signal.SIGKILL)
    return len(first)


def _send(processes: list[psutil.Process], sig: int) -> None:
    for process in processes:
        try:
            process.send_signal(sig)
        except psutil.Error:
            pass                                     # ended meanwhile


def main(argv: list[str]) -> int:
    name, value = argv
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)          # outlive the command's terminal (Ctrl-C, hang-up)
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    end_marked(name, value)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
