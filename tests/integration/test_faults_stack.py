"""The servers of the local stack lost under a running ``labelshift estimate``: its Prefect server, its MLflow server
and its SeaweedFS, each killed (SIGKILL: a crash, the OOM killer) and, separately, frozen (SIGSTOP: it accepts
connections and never answers; SIGCONT once the command ended) at three moments: as the command starts, while the
run is under way, and at its commit; SIGTERM to the command as it starts and at its commit too.

For each: the command ends within a bound derived from ``runtime/timeouts.py``, with a non-zero exit and a message
naming the part that failed and the fix; nothing is committed unless the message says so; no process of the command
is left; once the server is back (the killed one started again by ``LocalStack.up``, the frozen one continued) the
next run counts every batch exactly once and no MLflow run of the target is left RUNNING.

One stack for the module (in each pytest-xdist worker with ``make test-faults-stack FAULT_WORKERS=3``), on free
loopback ports and stopped at the end whatever happens; one model registered on its MLflow, and one S3 prefix per
case. The command runs as a user runs it (``python -m flows.cli estimate``, a separate
process with the stack's variables); the moment of the fault is watched for, not timed: the run's MLflow run is
RUNNING (the model is loaded, the batches are being scored).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import numpy as np
import psutil
import pytest

from runtime import timeouts
from runtime.processes import free_ports
from tests.integration.test_faults_processes import ORPHAN_LIMIT_S, _command_env, kill_at
from tests.reestimation_support import SHIFTED_PRIOR, draw, npy_bytes, register_model

pytestmark = pytest.mark.integration

#: how long the Prefect server may be silent before the command stops the run, here (the setting; 15 s by default)
LOST_AFTER_S = 3
#: batches of each case: big enough that scoring them from S3 takes a few seconds, so the fault lands mid-run
BATCHES = [f"day-{i}.npy" for i in range(1, 5)]
ROWS = 300_000
#: a bound for a command that hangs: the test fails instead of the session (what it measured is printed)
HANG_LIMIT_S = 420.0
SERVICES = ("prefect", "mlflow", "s3")
#: what the command's last words must name, per server: the part that failed and the fix (either of these; S3 lost
#: while MLflow proxies an artifact to it fails MLflow's request first)
NAMES = {"prefect": [("Prefect server at http://127.0.0.1:", "PREFECT_API_URL"),
                     ("Prefect server at http://127.0.0.1:", "after the run had committed its verdict")],
         "mlflow": [("MLflow tracking server at http://127.0.0.1:", "labelshift stack up")],
         "s3": [("S3 endpoint", "server is running"), ("artifact store (the S3 server", "labelshift stack status")]}


# -- the bound on the command's end, from runtime/timeouts.py -----------------------------------------------------------
def _limit(variable: str) -> float:
    return float(next(limit.value for limit in timeouts.limits() if limit.variable == variable))


def detection_s(name: str, how: int) -> float:
    """The longest a call to the lost server can take before it fails, by runtime/timeouts.py.

    - Prefect: the server watch stops the run after LABELSHIFT_SERVER_LOST_S of silence (+ 1 s between its
      questions and 2 s for the last one), then the command has UNWIND_S to leave.
    - MLflow: 1 + MLFLOW_HTTP_REQUEST_MAX_RETRIES requests, each failing at once when the server is gone or after
      MLFLOW_HTTP_REQUEST_TIMEOUT when it is frozen, with MLflow's back-off between them (0, 4, 8 s, + up to 1 s of
      jitter each: 3 retries, 15 s). The failed run does not ask the lost server again (flows/reestimate.py).
    - S3: botocore's 5 attempts (labelshift.storage.s3.RetryPolicy), each failing at once or after
      S3Store.READ_TIMEOUT_S, with a back-off under a second in all (0.05 s x 2^i, jittered); a failed commit then
      reads the watermark back once, without retries, to see whether its write landed (one more timeout).
    """
    from labelshift.storage.s3 import RetryPolicy, S3Store

    if name == "prefect":
        return LOST_AFTER_S + 3 + timeouts.UNWIND_S
    if name == "mlflow":
        retries = int(_limit("MLFLOW_HTTP_REQUEST_MAX_RETRIES"))
        backoff = sum(2 * 2 ** (n - 1) + 1 for n in range(2, retries + 1)) + 1
        per_request = _limit("MLFLOW_HTTP_REQUEST_TIMEOUT") if how == signal.SIGSTOP else 0.0
        return (1 + retries) * per_request + backoff
    attempts = RetryPolicy().max_attempts
    return (attempts + 1) * (S3Store.READ_TIMEOUT_S if how == signal.SIGSTOP else 0.0) + 1


def bound_s(stack, name: str, how: int) -> float:
    """How long after the fault the command may take to end: the work an undisturbed run does (measured here, at
    the module's start: the work left before the flow next calls the server is part of it), the detection above,
    and the command's way out (Prefect's queues drain for at most EXIT_DRAIN_S, + 5 s to report and exit). The
    Prefect watch needs no work of the flow to fire."""
    work = 0.0 if name == "prefect" else stack["undisturbed_s"]
    return work + detection_s(name, how) + timeouts.EXIT_DRAIN_S + 5


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A local stack on free ports with the test model registered on its MLflow, and how long an undisturbed run
    takes on it (``undisturbed_s``: it must succeed); stopped at the end."""
    from stack.supervisor import LocalStack

    root = tmp_path_factory.mktemp("faults-stack")
    s3_port, mlflow_port, prefect_port = free_ports(3)
    local = LocalStack(root / "stack", s3_port=s3_port, mlflow_port=mlflow_port, prefect_port=prefect_port)
    try:
        env = local.up()
        model = register_model(env["MLFLOW_TRACKING_URI"], "stack-faults-model", n_holdout=1500)["model_uri"]
        command_env = {**_command_env(), **env, "LABELSHIFT_SERVER_LOST_S": str(LOST_AFTER_S)}
        setting = dict(local=local, env=env, model=model, root=root, command_env=command_env)
        started = time.monotonic()
        done = subprocess.run(_estimate(setting, _target(setting, "undisturbed"), root / "home"), env=command_env,
                              capture_output=True, text=True, timeout=HANG_LIMIT_S)
        setting["undisturbed_s"] = time.monotonic() - started
        assert done.returncode == 0, done.stderr[-3000:]
        print(f"\nan undisturbed run: {setting['undisturbed_s']:.1f} s")
        yield setting
    finally:
        _continue_all(local)
        local.down()


def _s3(stack):
    from stack.supervisor import s3_client

    env = stack["env"]
    return s3_client(env["AWS_ENDPOINT_URL_S3"], env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])


def _bucket(stack) -> str:
    return stack["local"].saved_state()["bucket"]


def _target(stack, case: str) -> str:
    """A new S3 prefix holding :data:`BATCHES`."""
    client, rng = _s3(stack), np.random.default_rng(abs(hash(case)) % 2**32)
    for name in BATCHES:
        client.put_object(Bucket=_bucket(stack), Key=f"faults/{case}/{name}",
                          Body=npy_bytes(draw(SHIFTED_PRIOR, ROWS, rng)[0]))
    return f"s3://{_bucket(stack)}/faults/{case}/"


def _estimate(stack, target: str, home) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "estimate", "--home", str(home), "--model", stack["model"],
            "--target", target, "--tracking-uri", stack["env"]["MLFLOW_TRACKING_URI"]]


def _watermark(stack, target: str) -> dict | None:
    prefix = target.removeprefix(f"s3://{_bucket(stack)}/")
    try:
        body = _s3(stack).get_object(Bucket=_bucket(stack), Key=f"{prefix}_labelshift/watermark.json")["Body"]
    except Exception as exc:                                  # NoSuchKey: nothing committed
        if "NoSuchKey" in type(exc).__name__ or "NoSuchKey" in str(exc):
            return None
        raise
    return json.loads(body.read())


def _runs_of(stack, target: str) -> list:
    """The MLflow re-estimation runs on ``target``."""
    from mlflow import MlflowClient

    client = MlflowClient(stack["env"]["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("reestimation")
    return [] if experiment is None else [
        r for r in client.search_runs([experiment.experiment_id], max_results=1000)
        if r.data.tags.get("labelshift.target", "").rstrip("/") == target.rstrip("/")]


def _run_under_way(stack, target: str):
    """The moment: the run's MLflow run is RUNNING (asked at most every half second)."""
    last = [0.0]

    def moment(processes) -> bool:
        if time.monotonic() - last[0] < 0.5:
            return False
        last[0] = time.monotonic()
        return any(r.info.status == "RUNNING" for r in _runs_of(stack, target))
    return moment


def _starting(stack, target: str):
    """The moment: the command runs (its watchdog is up), before it has asked any server for anything."""
    return lambda processes: bool(processes)


def _committing(stack, target: str):
    """The moment: the first corrected output is in S3 (outputs are written just before the watermark's conditional
    write, and its record in MLflow after it)."""
    prefix = target.removeprefix(f"s3://{_bucket(stack)}/")
    last = [0.0]

    def moment(processes) -> bool:
        if time.monotonic() - last[0] < 0.2:
            return False
        last[0] = time.monotonic()
        listed = _s3(stack).list_objects_v2(Bucket=_bucket(stack), Prefix=prefix).get("Contents", [])
        return any(item["Key"].endswith(".corrected.npy") for item in listed)
    return moment


#: when the fault comes: as the command starts, while the run is under way, at its commit
MOMENTS = {"start": _starting, "under-way": _run_under_way, "commit": _committing}


def _rerun_counts_every_batch_once(stack, argv: list[str], target: str) -> None:
    """With the servers back, the command again: it succeeds, every batch counted exactly once over the runs, no
    MLflow run of the target left RUNNING."""
    done = subprocess.run(argv, env=stack["command_env"], capture_output=True, text=True, timeout=HANG_LIMIT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    watermark = _watermark(stack, target)
    assert sorted(b for entry in watermark["history"] for b in entry.get("batches", [])) == BATCHES, watermark
    running = [r.info.run_id for r in _runs_of(stack, target) if r.info.status == "RUNNING"]
    assert not running, running


# -- the servers' processes --------------------------------------------------------------------------------------------
def _group(stack_or_local, name: str) -> list[psutil.Process]:
    """The processes of one stack service: its process group (``run/<name>.json`` records the group id)."""
    local = stack_or_local["local"] if isinstance(stack_or_local, dict) else stack_or_local
    record = json.loads((local.root / "run" / f"{name}.json").read_text())
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == record["pgid"]:
                members.append(process)
        except (psutil.Error, OSError):
            continue
    return members


def _continue_all(local) -> None:
    """SIGCONT to every service of the stack (a frozen server is never left frozen)."""
    for name in SERVICES:
        try:
            for process in _group(local, name):
                process.send_signal(signal.SIGCONT)
        except (OSError, ValueError, psutil.Error):
            continue


@contextmanager
def _restored(stack, name: str, how: int):
    """After the block (whatever happened in it): the frozen server continued, the killed one started again."""
    try:
        yield
    finally:
        if how == signal.SIGSTOP:
            _continue_all(stack["local"])
        else:
            stack["local"].up()


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
@pytest.mark.parametrize("name", SERVICES)
def test_a_stack_server_lost_during_the_run(stack, tmp_path, name, how, moment):
    """One of the stack's servers killed or frozen as the command starts, once the run's MLflow run is RUNNING, or
    at its commit: the command ends within :func:`bound_s` with last words naming the server and the fix, and a
    non-zero exit (75 for the Prefect server) unless the fault came after the commit (at the "commit" moment the
    run may be a step further than the watcher saw): then exit 0, every batch counted, and what failed after the
    commit said as a warning (MLflow: the run's record; Prefect: its last logs and events not sent); the watermark
    did not move
    unless the command says the run had committed (or exits 0); no process of the command is left; with the
    server back, the next run succeeds, every batch counted exactly once, no MLflow run left RUNNING."""
    case = f"{name}-{signal.Signals(how).name.lower()}-{moment}"
    target = _target(stack, case)
    argv = _estimate(stack, target, tmp_path / "home")
    with _restored(stack, name, how):
        result = kill_at(argv, stack["command_env"], MOMENTS[moment](stack, target), sig=how,
                         victims=lambda processes: _group(stack, name), limit_s=HANG_LIMIT_S)
    said = [line for line in result["stderr"].strip().splitlines() if " | " not in line][-3:]   # not Prefect's log
    print(f"\n{case}: exit {result['returncode']} {result['ended_s']:.1f} s after the signal (bound "
          f"{bound_s(stack, name, how):.0f} s): " + " ".join(said))
    assert result["killed"], result
    assert result["ended_s"] < bound_s(stack, name, how), result["stderr"][-3000:]
    assert result["gone"], f"still running after {ORPHAN_LIMIT_S} s: {result['left']}"
    watermark = _watermark(stack, target)
    committed = result["returncode"] == 0 or "had committed" in result["stderr"]
    if committed:                                            # then true: its batches are counted already
        assert sorted(b for entry in watermark["history"] for b in entry["batches"]) == BATCHES, watermark
    else:
        assert watermark is None, watermark
    if result["returncode"] == 0:      # the commit was done when the fault came; only what follows it may fail
        assert moment == "commit", result["stderr"][-3000:]
    else:
        assert result["returncode"] == 75 or name != "prefect", result["stderr"][-3000:]
        assert any(all(words in result["stderr"] for words in named) for named in NAMES[name]), \
            result["stderr"][-3000:]
    _rerun_counts_every_batch_once(stack, argv, target)


def test_sigterm_while_s3_is_frozen_ends_the_command_within_the_unwinding_bound(stack, tmp_path):
    """SIGTERM to the command while it waits on a frozen SeaweedFS (reading the batches): the handler cannot run
    until the read returns (up to the S3 read limit, times botocore's attempts), so the command's clock, started
    when the signal arrives, ends it after UNWIND_S: exit 143 with its sentence, no process left; with S3 back,
    the next run counts every batch exactly once."""
    from runtime.timeouts import UNWIND_S

    target = _target(stack, "sigterm-s3-frozen")
    argv = _estimate(stack, target, tmp_path / "home")

    def freeze_s3_then_the_command(processes):
        for process in _group(stack, "s3"):
            process.send_signal(signal.SIGSTOP)
        time.sleep(2.0)                              # the command is now waiting on a read
        return None                                  # SIGTERM goes to the command

    with _restored(stack, "s3", signal.SIGSTOP):
        result = kill_at(argv, stack["command_env"], _run_under_way(stack, target), sig=signal.SIGTERM,
                         victims=freeze_s3_then_the_command, limit_s=HANG_LIMIT_S)
    print(f"\nSIGTERM, S3 frozen: exit {result['returncode']} {result['ended_s']:.1f} s after the signal")
    assert result["killed"], result
    assert result["returncode"] == 143 and result["ended_s"] < UNWIND_S + 6, result["stderr"][-3000:]
    assert "stopped by SIGTERM" in result["stderr"], result["stderr"][-3000:]
    assert result["gone"], f"still running after {ORPHAN_LIMIT_S} s: {result['left']}"
    assert _watermark(stack, target) is None
    done = subprocess.run(argv, env=stack["command_env"], capture_output=True, text=True, timeout=HANG_LIMIT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    watermark = _watermark(stack, target)
    assert sorted(b for entry in watermark["history"] for b in entry.get("batches", [])) == BATCHES, watermark


@pytest.mark.parametrize("moment", ["start", "commit"])
def test_sigterm_as_the_command_starts_or_commits(stack, tmp_path, moment):
    """SIGTERM to the command as it starts and at its commit (while the run is under way: test_faults_processes.py):
    exit 143 within the unwinding bound with its sentence, which says whether the run had committed -- true either
    way (a commit and its record are never cut: SIGTERM waits around the conditional write) -- or, when the signal
    lands as the command exits with its run done, the process ends on the signal with everything committed and
    recorded; no process left; the next run counts every batch exactly once."""
    from runtime.timeouts import UNWIND_S

    target = _target(stack, f"sigterm-{moment}")
    argv = _estimate(stack, target, tmp_path / "home")
    result = kill_at(argv, stack["command_env"], MOMENTS[moment](stack, target), sig=signal.SIGTERM,
                     limit_s=HANG_LIMIT_S)
    said = [line for line in result["stderr"].strip().splitlines() if " | " not in line][-2:]
    print(f"\nSIGTERM at {moment}: exit {result['returncode']} {result['ended_s']:.1f} s after: " + " ".join(said))
    assert result["killed"], result
    assert result["gone"], f"still running after {ORPHAN_LIMIT_S} s: {result['left']}"
    watermark = _watermark(stack, target)
    if result["returncode"] == -signal.SIGTERM:
        # the signal came as the command exited, its run done: Python puts the default handlers back while it
        # shuts down (seen once at the commit moment, 0.1 s after the signal): then everything is committed and
        # recorded, and a shell reports 143 all the same
        assert moment == "commit" and result["ended_s"] < 2, result["stderr"][-3000:]
        assert sorted(b for entry in watermark["history"] for b in entry["batches"]) == BATCHES, watermark
        assert {r.info.status for r in _runs_of(stack, target)} == {"FINISHED"}
        return
    assert result["returncode"] == 143 and result["ended_s"] < UNWIND_S + 6, result["stderr"][-3000:]
    assert "stopped by SIGTERM" in result["stderr"], result["stderr"][-3000:]
    if "had committed" in result["stderr"]:
        assert sorted(b for entry in watermark["history"] for b in entry["batches"]) == BATCHES, watermark
    else:
        assert watermark is None, watermark
    _rerun_counts_every_batch_once(stack, argv, target)
