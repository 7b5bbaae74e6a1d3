"""The worker guard with real processes: a stand-in for Prefect's process worker starts two "flow runs" (processes
with PREFECT__FLOW_RUN_ID, each in a group of its own, as Prefect starts them): one ends on SIGTERM, one ignores
it. SIGTERM to the guard: the first ends, the second is killed after the grace, both are settled (killed or not),
the worker is let go last, the guard exits 143, nothing is left. A second SIGTERM cuts the grace short; a worker
that exits by itself gives its own status. The full path with Prefect, MLflow and a real flow run is
tests/integration/test_workers.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from labelshift.errors import InputError
from runtime.environment import worker_stop_s
from runtime.timeouts import ENV_WORKER_STOP_S, WORKER_STOP_S

ROOT = Path(__file__).resolve().parents[3]

#: the stand-in worker: starts the two runs, writes their pids, waits; SIGTERM ends it (the default action), after
#: it writes whether its runs had ended before (the guard lets the worker go last)
WORKER = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    out = sys.argv[1]
    run = "import signal, time; {}; print('up', flush=True); time.sleep(600)"
    def start(run_id, handler):
        return subprocess.Popen([sys.executable, "-c", run.format(handler)], start_new_session=True,
                                stdout=subprocess.PIPE, env={**os.environ, "PREFECT__FLOW_RUN_ID": run_id})
    runs = [start("run-polite", "signal.signal(signal.SIGTERM, lambda *a: exit(0))"),
            start("run-stuck", "signal.signal(signal.SIGTERM, signal.SIG_IGN)")]
    for r in runs:
        r.stdout.readline()
    if sys.argv[2] == "exit":
        for r in runs:
            r.kill()
        sys.exit(3)
    def on_term(*a):
        json.dump({"runs_ended_first": [r.poll() is not None for r in runs]}, open(out + ".worker", "w"))
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    json.dump([r.pid for r in runs], open(out, "w"))
    time.sleep(600)
""")

GUARD = textwrap.dedent("""
    import json, sys
    from runtime.worker_guard import run_worker
    settled = []
    code = run_worker([sys.executable, sys.argv[1], sys.argv[2], sys.argv[3]], grace_s=float(sys.argv[4]),
                      settle=lambda run_id, killed, env, why, up: settled.append([run_id, killed]), echo=print)
    json.dump({"code": code, "settled": sorted(settled)}, open(sys.argv[2] + ".guard", "w"))
""")


def _guard(tmp_path: Path, mode: str, grace: float) -> tuple[subprocess.Popen, Path]:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    out = tmp_path / "pids.json"
    guard = subprocess.Popen([sys.executable, "-c", GUARD, str(worker), str(out), mode, str(grace)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return guard, out


def _wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} not written"
        time.sleep(0.05)
    time.sleep(0.1)


@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_ends_the_runs_first_then_the_worker(tmp_path, signals):
    grace = 3.0 if signals == 1 else 60.0
    guard, out = _guard(tmp_path, "wait", grace)
    _wait_for(out)
    runs = json.loads(out.read_text())
    sent = time.monotonic()
    guard.send_signal(signal.SIGTERM)
    if signals == 2:
        time.sleep(0.5)
        guard.send_signal(signal.SIGTERM)           # hurry: the stuck run is killed now, not after 60 s
    output, _ = guard.communicate(timeout=60)
    took = time.monotonic() - sent
    result = json.loads(Path(str(out) + ".guard").read_text())
    assert guard.returncode == 0 and result["code"] == 143, output
    assert result["settled"] == [["run-polite", False], ["run-stuck", True]], output
    assert json.loads(Path(str(out) + ".worker").read_text()) == {"runs_ended_first": [True, True]}, output
    # the grace (3 s), or the second signal 0.5 s in; the rest is polling (0.2 s) and process exits
    assert (grace if signals == 1 else 0.5) <= took < (grace if signals == 1 else 0.5) + 10, (took, output)
    assert "SIGTERM: stopping the worker's flow runs first" in output
    stuck = "did not end within 3 s: killed" if signals == 1 else "still running when a second signal came: killed"
    assert f"flow run run-stuck {stuck}" in output and "flow run run-polite ended" in output, output
    assert not [pid for pid in runs if psutil.pid_exists(pid) and
                psutil.Process(pid).status() != psutil.STATUS_ZOMBIE], runs


WATCHING_GUARD = textwrap.dedent("""
    import json, os, sys
    from runtime.worker_guard import run_worker
    log = sys.argv[2] + ".settled"
    def settle(run_id, killed, env, why, up):              # fails while the "server" is down (a file says so)
        ok = not os.path.exists(sys.argv[5])
        with open(log, "a") as f:
            f.write(json.dumps([run_id, killed, ok]) + "\\n")
        if not ok:
            raise ConnectionError("server gone")
    code = run_worker([sys.executable, sys.argv[1], sys.argv[2], sys.argv[3]], grace_s=float(sys.argv[4]),
                      settle=settle, echo=print, api_url=sys.argv[6], lost_after_s=1.0)
    json.dump({"code": code}, open(sys.argv[2] + ".guard", "w"))
""")


def _settled(out: Path) -> list:
    path = Path(str(out) + ".settled")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_lost_prefect_server_ends_the_runs_in_flight_and_the_worker_goes_on(tmp_path, health_server):
    """The Prefect server stops answering (its health endpoint closed): after lost_after_s the runs in flight are
    ended as on a stop (the stuck one killed after the grace), the worker itself keeps running; their settlement
    fails while the server is gone and is tried again until it succeeds once it is back; SIGTERM then stops the
    worker as usual (143)."""
    httpd = health_server
    down = tmp_path / "down"
    down.write_text("the server is gone")
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    out = tmp_path / "pids.json"
    guard = subprocess.Popen([sys.executable, "-c", WATCHING_GUARD, str(worker), str(out), "wait", "2.0", str(down),
                              f"http://127.0.0.1:{httpd.server_port}/api"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(out)
        runs = json.loads(out.read_text())
        the_worker = psutil.Process(guard.pid).children()[0]
        time.sleep(2.5)
        assert _settled(out) == []                    # the server answers: nothing is touched
        httpd.shutdown()
        httpd.server_close()
        deadline = time.monotonic() + 30
        while len(_settled(out)) < 2:
            assert time.monotonic() < deadline, _settled(out)
            time.sleep(0.2)
        assert sorted(_settled(out)[:2]) == [["run-polite", False, False], ["run-stuck", True, False]]
        assert not [pid for pid in runs if psutil.pid_exists(pid) and
                    psutil.Process(pid).status() != psutil.STATUS_ZOMBIE], runs
        assert the_worker.is_running() and the_worker.status() != psutil.STATUS_STOPPED   # it goes on
        # the server stays down: the guard asks it every RETRY_S, idle (no second loss, no busy loop)
        cpu = sum(psutil.Process(guard.pid).cpu_times()[:2])
        time.sleep(4 * 1.0)                            # four times lost_after_s
        assert sum(psutil.Process(guard.pid).cpu_times()[:2]) - cpu < 1.0
        down.unlink()                                  # the settlements are tried again (every RETRY_S)
        while sum(ok for _, _, ok in _settled(out)) < 2:
            assert time.monotonic() < deadline + 15, _settled(out)
            time.sleep(0.2)
        assert sorted(r for r in _settled(out) if r[2]) == [["run-polite", False, True], ["run-stuck", True, True]]
    finally:
        guard.send_signal(signal.SIGTERM)
        try:
            output, _ = guard.communicate(timeout=60)
        finally:                                       # nothing left, even when the guard hung
            for process in [*psutil.Process(os.getpid()).children(recursive=True)]:
                if process.pid == guard.pid or guard.pid in [p.pid for p in process.parents()]:
                    process.kill()
    assert json.loads(Path(str(out) + ".guard").read_text()) == {"code": 143}, output
    assert output.count("stopped answering") == 1 and "the worker goes on" in output, output
    assert "no flow run in flight" in output, output   # the SIGTERM found none left to stop


def test_a_worker_that_exits_by_itself_gives_its_own_status(tmp_path):
    guard, out = _guard(tmp_path, "exit", 3.0)
    output, _ = guard.communicate(timeout=60)
    result = json.loads(Path(str(out) + ".guard").read_text())
    assert result == {"code": 3, "settled": []}, output


def test_the_grace_is_read_from_its_variable_and_checked():
    assert worker_stop_s({}) == WORKER_STOP_S
    assert worker_stop_s({ENV_WORKER_STOP_S: "45"}) == 45.0
    for bad in ("0", "soon", "-3"):
        with pytest.raises(InputError, match=ENV_WORKER_STOP_S):
            worker_stop_s({ENV_WORKER_STOP_S: bad})


def test_the_command_line_and_its_errors():
    """The `prefect worker start` line built from the options (further options after --), a bad --limit, and no
    Prefect server: each refused (exit 2) before anything starts, naming the fix."""
    from flows.cli import build_parser
    from flows.cli._common import UsageError
    from flows.cli.worker import prefect_command

    args = build_parser().parse_args(["worker", "--pool", "gpu", "--name", "gpu-0", "--limit", "2", "--",
                                      "--prefetch-seconds", "30"])
    assert prefect_command(args)[1:] == ["-m", "prefect", "worker", "start", "--pool", "gpu", "--type", "process",
                                         "--name", "gpu-0", "--limit", "2", "--prefetch-seconds", "30"]
    with pytest.raises(UsageError, match="--limit must be at least 1"):
        prefect_command(build_parser().parse_args(["worker", "--limit", "0"]))
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    result = subprocess.run([sys.executable, "-m", "flows.cli", "worker"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "PREFECT_API_URL is not set" in result.stderr, result.stderr
