"""The service-process helper (runtime.processes): start, readiness, stopping a whole tree, pid identity."""
from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from runtime.processes import (ServiceProcess, ServiceStartError, free_ports, pid_alive, processes_with_env,
                             start_time, wait_until)

posix_only = pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")

# a parent that starts one child in the same group and one that left it (a session of its own), writes their
# pids, and waits
_TREE = textwrap.dedent("""\
    import subprocess, sys, time
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    inside = subprocess.Popen(sleep)
    outside = subprocess.Popen(sleep, start_new_session=True)
    open(sys.argv[1], "w").write(f"{inside.pid} {outside.pid}")
    print("children started", flush=True)
    time.sleep(120)
""")


@posix_only
def test_stop_ends_the_leader_its_group_and_children_that_left_it(tmp_path):
    pids = tmp_path / "pids"
    process = ServiceProcess([sys.executable, "-c", _TREE, str(pids)], log=tmp_path / "tree.log", name="tree")
    process.start()
    process.wait_ready(lambda: pids.exists() and len(pids.read_text().split()) == 2, 30, what="its pid file")
    inside, outside = map(int, pids.read_text().split())
    assert process.alive and pid_alive(inside) and pid_alive(outside)
    assert process.stop(grace=5) is True
    assert not process.alive and process.returncode is not None
    assert wait_until(lambda: not pid_alive(inside) and not pid_alive(outside), 5)
    assert process.stop() is False                      # a second stop has nothing to do
    log = (tmp_path / "tree.log").read_text()
    assert log.startswith("\n=== ") and "children started" in log


def test_a_process_that_exits_while_starting_fails_with_its_status_and_log(tmp_path):
    process = ServiceProcess([sys.executable, "-c", "print('cannot open the database'); raise SystemExit(3)"],
                             log=tmp_path / "svc.log", name="the service").start()
    with pytest.raises(ServiceStartError) as failure:
        process.wait_ready(lambda: False, 30, if_exited=" (is the database there?)")
    message = str(failure.value)
    assert message.startswith("the service exited while starting (exit status 3) (is the database there?); log ")
    assert "cannot open the database" in message and str(tmp_path / "svc.log") in message


def test_a_slow_process_fails_with_the_advice_and_is_left_running(tmp_path):
    process = ServiceProcess([sys.executable, "-c", "import time; print('still loading', flush=True); "
                              "time.sleep(60)"], log=tmp_path / "svc.log", name="slow").start()
    try:
        with pytest.raises(KeyError, match="slow did not answer a ping within 1 s .raise --timeout.; log"):
            process.wait_ready(lambda: False, 1, what="a ping", if_slow=" (raise --timeout)", error=KeyError)
        assert process.alive
    finally:
        process.stop(grace=5)


def test_pid_identity_by_start_time():
    me = os.getpid()
    assert pid_alive(me) and pid_alive(me, start_time(me)) and not pid_alive(me, 1.0)


def _ports_of_one_process(count: int) -> list[int]:
    return free_ports(count)


def test_free_ports_lie_below_the_ephemeral_range_and_processes_side_by_side_never_share_one():
    """Ports for servers are drawn below the kernel's range for outgoing connections (none can take one before its
    server binds it), and processes asking at once (as pytest-xdist workers starting a stack each do) each get
    their own: 6 processes x 20 ports, all distinct."""
    import multiprocessing
    import socket

    from runtime.processes import _ephemeral_range

    with multiprocessing.get_context("fork").Pool(6) as pool:
        handed = pool.map(_ports_of_one_process, [20] * 6)
    ports = [p for got in handed for p in got]
    assert len(set(ports)) == len(ports) == 120
    first, last = _ephemeral_range()
    assert all(1024 <= p < 65536 and not first <= p <= last for p in ports)
    assert not set(ports) & set(free_ports(20))          # reserved for a while: not handed out again
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))                  # free when handed out


def test_free_ports_without_a_usable_record_still_hand_out_ports(tmp_path, monkeypatch):
    """A record that is not ours, half-written or unwritable costs the reservation, never the ports."""
    import tempfile

    import runtime.processes as processes

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = tmp_path / f"labelshift-ports-{os.getuid()}"
    folder.mkdir(mode=0o700)
    (folder / "reserved.json").write_text('{"25000": "x", "25001": null}')      # not numbers
    assert len(set(free_ports(5))) == 5
    (folder / "reserved.json").unlink()
    (folder / "reserved.json").mkdir()                                            # cannot be replaced
    assert len(set(free_ports(5))) == 5 and not list(folder.glob("*.tmp"))
    monkeypatch.setattr(processes, "_ports_folder", lambda: None)               # no folder of ours
    assert len(set(free_ports(5))) == 5


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="clock ticks of older run records are Linux's")
def test_run_records_of_older_versions_with_start_ticks_are_still_read():
    from stack.supervisor import _recorded_start

    ticks = int(Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[-1].split()[19])
    assert pid_alive(os.getpid(), _recorded_start({"start_ticks": ticks}))
    assert not pid_alive(os.getpid(), _recorded_start({"start_ticks": 1}))
    assert _recorded_start({"create_time": 12.5, "start_ticks": ticks}) == 12.5
    assert _recorded_start({}) is None


def test_processes_are_found_by_an_environment_marker(tmp_path):
    marker = f"marker-{os.getpid()}-{tmp_path.name}"
    process = ServiceProcess([sys.executable, "-c", "import time; time.sleep(60)"], log=tmp_path / "m.log",
                             env={**os.environ, "LABELSHIFT_TEST_MARKER": marker}).start()
    try:
        assert wait_until(lambda: process.pid in processes_with_env("LABELSHIFT_TEST_MARKER", marker), 5)
    finally:
        process.stop(grace=5)
    assert processes_with_env("LABELSHIFT_TEST_MARKER", marker) == []
