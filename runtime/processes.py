"""Server processes on this machine: start, wait until ready, stop with everything they started; ports and probes.

:class:`ServiceProcess` starts a command in a session of its own with its output appended to a log file, waits
until a readiness check passes (or fails with the log's tail), and stops the leader, its group and its descendants
that left it (SIGTERM, then SIGKILL after a grace period); :meth:`ServiceProcess.attach` takes over one started
earlier. The start time recorded with a pid (:func:`start_time`) tells a process from a later one reusing its pid.
"""
from __future__ import annotations

import fcntl
import json
import os
import random
import re
import shlex
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path

import psutil

from runtime.watchdog import marked

__all__ = ["HOST", "ServiceProcess", "ServiceStartError", "free_ports", "port_in_use", "http_ok", "log_tail",
           "wait_until", "pid_alive", "start_time", "processes_with_env", "signal_processes", "die_with"]

HOST = "127.0.0.1"
#: start times of one process read by two programs may differ by the rounding of the boot time (whole seconds)
_SAME_START_S = 1.0
_PR_SET_PDEATHSIG = 1


class ServiceStartError(RuntimeError):
    """A service exited while starting or did not become ready in time; the message ends with its log tail."""


# -- ports and probes --------------------------------------------------------------------------------------------------
#: how long a port handed out by :func:`free_ports` stays reserved for the server it was chosen for
PORT_RESERVATION_S = 600.0
#: ports are drawn from this many next to the kernel's ephemeral range
_PORT_SPAN = 12_000


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections, first and last (Linux's default where unreadable)."""
    try:
        first, last = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2])
        return first, last
    except (OSError, ValueError):
        return 32768, 60999


def _port_range() -> tuple[int, int]:
    """[low, high) to draw server ports from: below the ephemeral range, else above it, else any unprivileged port
    (only when the ephemeral range leaves no room on either side)."""
    first, last = _ephemeral_range()
    if first - 1024 >= 1000:
        return max(1024, first - _PORT_SPAN), first
    if 65535 - last >= 1000:
        return last + 1, min(65536, last + 1 + _PORT_SPAN)
    return 1024, 65536


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as the servers bind
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _reservations(registry: Path, now: float) -> dict[int, float]:
    """The ports :func:`free_ports` handed out within :data:`PORT_RESERVATION_S`, with when (none when unreadable)."""
    try:
        return {int(p): float(t) for p, t in json.loads(registry.read_text()).items()
                if now - float(t) < PORT_RESERVATION_S}
    except Exception:           # missing, half-written by an older version, or not ours: no reservations
        return {}


def _draw_ports(count: int, host: str, taken: Mapping[int, float]) -> list[int]:
    low, high = _port_range()
    rng, chosen = random.SystemRandom(), []
    for _ in range(50 * count + 1000):
        if len(chosen) == count:
            return chosen
        port = rng.randrange(low, high)
        if port not in taken and port not in chosen and _bindable(port, host):
            chosen.append(port)
    raise ServiceStartError(f"no {count} free ports on {host} between {low} and {high - 1}; stop servers you no "
                            "longer need.")


def _ports_folder() -> Path | None:
    """This user's folder for the port reservations (temp folder, mode 0700), or None when it cannot be had."""
    folder = Path(tempfile.gettempdir()) / f"labelshift-ports-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
    except OSError:
        return None
    return folder if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() else None


def free_ports(count: int, host: str = HOST) -> list[int]:
    """``count`` distinct ports free on ``host`` now, for servers about to start. Drawn at random outside the
    kernel's ephemeral range (:func:`_port_range`), so that no outgoing connection of any process takes one before
    its server binds it, and not one this function handed out, in any process of this user, within the last
    :data:`PORT_RESERVATION_S` (recorded in a file of this user's folder in the temp folder, under a lock): servers
    started side by side (pytest-xdist workers, each with a stack) do not race for a port. Where that folder cannot
    be written, the ports are drawn without the record."""
    folder = _ports_folder()
    if folder is None:
        return _draw_ports(count, host, {})
    try:
        with open(folder / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)          # released when the file closes
            now = time.time()
            registry = folder / "reserved.json"
            reserved = _reservations(registry, now)
            chosen = _draw_ports(count, host, reserved)
            reserved.update((p, now) for p in chosen)
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({str(p): t for p, t in reserved.items()}, f)
                os.replace(tmp, registry)
            except OSError:
                with suppress(OSError):
                    os.unlink(tmp)
            return chosen
    except OSError:             # the folder went away or filled up: ports without the record
        return _draw_ports(count, host, {})


def port_in_use(port: int, host: str = HOST) -> bool:
    """True when something accepts connections on host:port (or the port cannot be bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        if s.connect_ex((host, port)) == 0:
            return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as the servers do: connections of an earlier run in TIME_WAIT do not block the port
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """True when GET url answers 2xx."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def log_tail(path: Path, lines: int = 40, *, notable: re.Pattern | None = None) -> str:
    """The last ``lines`` lines of a log; with ``notable``, first the earlier lines matching it (at most 10)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    all_lines = text.splitlines()
    tail = all_lines[-lines:]
    if notable is not None:
        earlier = [line for line in all_lines[:-lines] if notable.search(line)][:10]
        if earlier:
            tail = [*earlier, "...", *tail]
    return "\n".join(tail) or "(empty log)"


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.1) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


# -- process identity --------------------------------------------------------------------------------------------------
def start_time(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch, psutil's ``create_time``), or None if it does not run."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our child (a zombie would otherwise look alive)."""
    if hasattr(os, "waitpid") and hasattr(os, "WNOHANG"):
        with suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _running(process: psutil.Process) -> bool:
    """True while the process runs and is not a zombie (without reaping it)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def pid_alive(pid: int, create_time: float | None = None) -> bool:
    """True when ``pid`` runs, is not a zombie, and (when ``create_time`` is given) started at that time (a child
    of this process is reaped first)."""
    _reap(pid)
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        if create_time is not None and abs(process.create_time() - create_time) > _SAME_START_S:
            return False
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
    return True


def processes_with_env(name: str, value: str) -> list[int]:
    """Pids of the live processes (this one aside) whose environment has ``name=value`` (those we may read)."""
    return [process.pid for process in marked(name, value)]


def signal_processes(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to each pid still running (one that ended meanwhile is skipped)."""
    for pid in pids:
        with suppress(psutil.Error):
            psutil.Process(pid).send_signal(sig)


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (OSError, AttributeError):
        return None


def die_with(parent: int, sig: int = signal.SIGTERM) -> Callable[[], None]:
    """The function the child runs before exec: ask Linux to send ``sig`` when the parent thread ends; exit at
    once if the parent already died between the fork and this call (then no signal would ever come)."""
    def arm() -> None:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:
            os._exit(1)
    return arm


# -- one service process -----------------------------------------------------------------------------------------------
class ServiceProcess:
    """A server process in a process group of its own, with its output appended to ``log``; ``notable``: lines of
    the log shown in an error before its tail. ``die_with_parent`` (Linux): the process alone gets SIGTERM when the
    thread that started it ends, even on SIGKILL, so start it from the main thread."""

    def __init__(self, command: Sequence[str], *, log: str | os.PathLike, env: Mapping[str, str] | None = None,
                 cwd: str | os.PathLike | None = None, name: str | None = None, notable: re.Pattern | None = None,
                 die_with_parent: bool = False):
        self.command = [str(part) for part in command]
        self.log = Path(log)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.name = name or (Path(self.command[0]).name if self.command else "process")
        self.notable = notable
        self.die_with_parent = die_with_parent
        self.pid: int | None = None
        self.pgid: int | None = None
        self.create_time: float | None = None
        self._popen: subprocess.Popen | None = None

    @classmethod
    def attach(cls, pid: int, *, create_time: float | None = None, pgid: int | None = None,
               log: str | os.PathLike = os.devnull, name: str | None = None,
               command: Sequence[str] = ()) -> "ServiceProcess":
        """The service started earlier (maybe by another program) as ``pid``, started at ``create_time``."""
        process = cls(command, log=log, name=name or f"process {pid}")
        process.pid, process.pgid, process.create_time = pid, pgid, create_time
        return process

    def start(self) -> "ServiceProcess":
        """Launch the command (not waiting for it to be ready); returns self."""
        if self.alive:
            return self
        self.log.parent.mkdir(parents=True, exist_ok=True)
        preexec = die_with(os.getpid()) if self.die_with_parent and sys.platform.startswith("linux") else None
        with open(self.log, "ab") as out:
            out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(self.command)}\n".encode())
            out.flush()
            self._popen = subprocess.Popen(self.command, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                           stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                           preexec_fn=preexec)
        self.pid = self._popen.pid
        self.pgid = self.pid if hasattr(os, "killpg") else None
        self.create_time = start_time(self.pid)
        return self

    @property
    def alive(self) -> bool:
        """True while the started process runs (a zombie does not count)."""
        if self.pid is None:
            return False
        if self._popen is not None:
            return self._popen.poll() is None
        return pid_alive(self.pid, self.create_time)

    @property
    def returncode(self) -> int | None:
        """Exit status once ended, when this object started the process; else None."""
        return None if self._popen is None else self._popen.poll()

    def tail(self, lines: int = 40) -> str:
        return log_tail(self.log, lines, notable=self.notable)

    def wait_ready(self, check: Callable[[], bool], timeout: float, *, what: str = "its readiness check",
                   if_exited: str = "", if_slow: str = "", step: float = 0.2,
                   error: type[Exception] = ServiceStartError) -> None:
        """Poll ``check`` until it returns True; ``error`` when the process exits first or ``timeout`` seconds
        pass, with the advice ``if_exited`` or ``if_slow`` after the cause, then the log's path and tail."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive:
                status = _exit_status(self.returncode)
                raise error(f"{self.name} exited while starting{status}{if_exited}; log {self.log}:\n{self.tail()}")
            if check():
                return
            time.sleep(step)
        raise error(f"{self.name} did not answer {what} within {timeout:.0f} s{if_slow}; log {self.log}:\n"
                    f"{self.tail()}")

    def _members(self) -> dict[int, psutil.Process]:
        """The live processes of this service: the leader and its descendants, and whatever is in its group."""
        found: dict[int, psutil.Process] = {}
        if self.pid is not None and self.alive:
            with suppress(psutil.Error):
                leader = psutil.Process(self.pid)
                found[leader.pid] = leader
                for child in leader.children(recursive=True):
                    found[child.pid] = child
        if self.pgid is not None:
            for process in psutil.process_iter():
                if process.pid not in found and _group_of(process.pid) == self.pgid:
                    found[process.pid] = process
        return {pid: p for pid, p in found.items() if _running(p)}

    def _signal(self, members: Mapping[int, psutil.Process], sig: int) -> None:
        """Signal the group once, and each member outside it (so no process gets the signal twice)."""
        if self.pgid is not None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, sig)
        for pid, process in members.items():
            if self.pgid is None or _group_of(pid) != self.pgid:
                with suppress(psutil.Error):
                    process.send_signal(sig)

    def stop(self, grace: float = 10.0, kill_wait: float = 5.0, *, leader_only: bool = False) -> bool:
        """End the process and everything it started: SIGTERM (``leader_only``: to the process alone, which ends
        what it started itself), then SIGKILL to what is left after ``grace`` s. Returns True when the process was
        running; does nothing to a pid now held by another process."""
        if not self.alive:
            if self._popen is not None:
                self._popen.poll()
            return False
        tracked = self._members()

        def remaining() -> dict[int, psutil.Process]:
            current = {pid: p for pid, p in tracked.items() if _running(p)}
            current.update(self._members())
            return current

        if leader_only and self.pid in tracked:
            tracked[self.pid].send_signal(signal.SIGTERM)
        else:
            self._signal(tracked, signal.SIGTERM)
        if not wait_until(lambda: not remaining(), grace):
            tracked.update(self._members())
            self._signal(remaining(), signal.SIGKILL)
            wait_until(lambda: not remaining(), kill_wait)
        if self._popen is not None:
            with suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=kill_wait)
        return True

    def __repr__(self) -> str:
        state = "running" if self.alive else "not running"
        return f"ServiceProcess({self.name!r}, pid={self.pid}, {state})"


def _exit_status(code: int | None) -> str:
    """`` (exit status N)``, or `` (killed by SIGKILL)`` for a signal (a negative code), or nothing when unknown."""
    if code is None:
        return ""
    if code < 0:
        try:
            return f" (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f" (killed by signal {-code})"
    return f" (exit status {code})"
