"""The local stack (``labelshift stack up|down|status``, :mod:`stack.supervisor`).

The integration test starts the real stack (SeaweedFS, MLflow server, Prefect server and one worker) on free
ports in a temporary home through the command line, uses it the way a user would (the printed variables with
boto3, the object store and an MLflow client), and checks that ``down`` leaves no process behind. The other tests
use stand-in processes and take a second or two.
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from stack import supervisor as stack_mod
from stack.supervisor import (DEFAULT_PORTS, MARKER_ENV, LocalStack, StackError, free_ports, marked_processes,
                              pid_alive, resolve_port, stack_dir)

HAS_PROC = Path("/proc/self/stat").exists()

# variables of the caller that must not leak into the stack's processes or the checks
_CLIENT_VARS = ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "LABELSHIFT_STORE", "AWS_ENDPOINT_URL_S3",
                "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE",
                "AWS_SESSION_TOKEN", "MLFLOW_S3_ENDPOINT_URL", "LABELSHIFT_S3_PORT", "LABELSHIFT_MLFLOW_PORT",
                "LABELSHIFT_PREFECT_PORT")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CLIENT_VARS}
    env.update(extra)
    return env


# -- configuration -----------------------------------------------------------------------------------------------------
def test_ports_come_from_the_flag_then_the_environment_then_the_default():
    assert resolve_port("s3", None, environ={}) == DEFAULT_PORTS["s3"] == 8333
    assert resolve_port("mlflow", None, environ={}) == 5000
    assert resolve_port("prefect", None, environ={}) == 4200
    assert resolve_port("mlflow", None, environ={"LABELSHIFT_MLFLOW_PORT": "5100"}) == 5100
    assert resolve_port("mlflow", 5200, environ={"LABELSHIFT_MLFLOW_PORT": "5100"}) == 5200
    with pytest.raises(StackError, match="LABELSHIFT_PREFECT_PORT"):
        resolve_port("prefect", None, environ={"LABELSHIFT_PREFECT_PORT": "http"})
    with pytest.raises(StackError, match="1..65535"):
        resolve_port("s3", 70000, environ={})


def test_stack_dir_follows_labelshift_home(tmp_path):
    assert stack_dir(environ={"LABELSHIFT_HOME": str(tmp_path)}) == tmp_path / "stack"
    assert stack_dir(tmp_path / "other", environ={"LABELSHIFT_HOME": str(tmp_path)}) == tmp_path / "other" / "stack"
    assert stack_dir(environ={}) == (Path.cwd() / ".labelshift" / "stack").resolve()


def test_register_adds_the_stack_command_without_clobbering_a_top_level_home():
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", default=None)
    stack_mod.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["--home", "/top", "stack", "status"])
    assert (args.home, args.stack_command, args.func) == ("/top", "status", stack_mod.run_command)
    assert parser.parse_args(["stack", "up", "--home", "/sub"]).home == "/sub"
    args = parser.parse_args(["stack", "up", "--s3-port", "9001", "--workers", "2"])
    assert (args.home, args.s3_port, args.mlflow_port, args.workers, args.worker_limit) == (None, 9001, None, 2, 1)
    with pytest.raises(SystemExit):  # an action is required
        parser.parse_args(["stack"])


def test_env_before_up_is_a_clear_error(tmp_path):
    with pytest.raises(StackError, match="stack up"):
        LocalStack(tmp_path / "stack").env()
    assert [s.state for s in LocalStack(tmp_path / "stack").status()] == ["stopped"] * 3


def test_env_script_quotes_values(tmp_path):
    script = LocalStack(tmp_path).env_script({"A": "plain", "B": "with space and 'quote'"})
    out = subprocess.run(["bash", "-c", f"{script}\nprintf '%s|%s' \"$A\" \"$B\""], capture_output=True,
                         text=True, check=True).stdout
    assert out == "plain|with space and 'quote'"


def test_credentials_are_generated_once_and_private(tmp_path):
    stack = LocalStack(tmp_path)
    first = stack.credentials()
    assert first == LocalStack(tmp_path).credentials()
    assert (tmp_path / "credentials.json").stat().st_mode & 0o077 == 0
    assert first != LocalStack(tmp_path / "other").credentials()


def test_a_port_in_use_is_refused_before_anything_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        s3, prefect = free_ports(2)
        stack = LocalStack(tmp_path, s3_port=s3, mlflow_port=port, prefect_port=prefect)
        with pytest.raises(StackError, match=rf"port {port} .*--mlflow-port"):
            stack.up()
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").iterdir())


@pytest.mark.skipif(not HAS_PROC, reason="start times come from /proc")
def test_a_recycled_pid_is_not_taken_for_the_service(tmp_path):
    stack = LocalStack(tmp_path)
    stack._write_json(stack._run_file("s3"), {"pid": os.getpid(), "pgid": os.getpid(), "start_ticks": 1,
                                             "log": str(tmp_path / "s3.log"), "url": "http://127.0.0.1:1"})
    assert pid_alive(os.getpid()) and not pid_alive(os.getpid(), 1)
    assert stack.status()[0].state == "stopped"
    assert not stack._run_file("s3").exists()  # the stale record is dropped
    assert stack.down() == []                   # and nothing is signalled


# -- stand-in services: failure handling and cleanup -------------------------------------------------------------------
_HEALTHY = textwrap.dedent("""\
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"OK")
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


class _FakeStack(LocalStack):
    """S3 and Prefect are tiny HTTP servers that answer every health check; MLflow crashes at start."""

    def _weed_command(self, s3_port, access_key, secret_key):
        return [sys.executable, "-c", _HEALTHY, str(s3_port)]

    def _mlflow_command(self, port):
        return [sys.executable, "-c", "print('mlflow: the backend store is corrupt'); raise SystemExit(3)"]

    def _prefect_command(self, port):
        return [sys.executable, "-c", _HEALTHY, str(port)]


@pytest.mark.skipif(not HAS_PROC, reason="process bookkeeping is checked through /proc")
def test_a_service_that_dies_while_starting_fails_up_with_its_log_and_stops_the_others(tmp_path, monkeypatch):
    monkeypatch.setattr(stack_mod, "ensure_bucket", lambda *a, **k: None)
    s3, mlflow, prefect = free_ports(3)
    stack = _FakeStack(tmp_path / "stack", s3_port=s3, mlflow_port=mlflow, prefect_port=prefect, timeout=20)
    with pytest.raises(StackError) as failure:
        stack.up()
    message = str(failure.value)
    assert "MLflow server exited while starting" in message
    assert "the backend store is corrupt" in message  # the log tail is in the error
    assert str(stack.log_path("mlflow")) in message
    # the S3 and Prefect stand-ins that this `up` started are gone again
    assert _wait(lambda: not marked_processes(stack.root), 10)
    assert [s.state for s in stack.status()] == ["stopped"] * 3
    assert not stack.env_file.exists()


@pytest.mark.skipif(not HAS_PROC, reason="the marker is read from /proc/<pid>/environ")
def test_down_ends_stray_processes_that_left_their_group(tmp_path):
    root = (tmp_path / "stack").resolve()
    root.mkdir()
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             env={**os.environ, MARKER_ENV: str(root)}, start_new_session=True)
    try:
        assert _wait(lambda: stray.pid in marked_processes(root), 5)
        LocalStack(root).down()
        assert stray.wait(timeout=15) == -signal.SIGTERM
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


# -- the real stack ----------------------------------------------------------------------------------------------------
def _cli(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stack.supervisor", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _exports(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export "):].partition("=")
            out[name] = shlex.split(value)[0]
    return out


@pytest.mark.integration
def test_stack_up_serves_s3_mlflow_and_prefect_and_down_leaves_nothing(tmp_path, monkeypatch):
    import boto3
    from mlflow import MlflowClient

    from labelshift.storage import open_store

    home = tmp_path / "home"
    root = (home / "stack").resolve()
    s3_port, mlflow_port, prefect_port = free_ports(3)
    env = _clean_env(LABELSHIFT_HOME=str(home))
    try:
        started = time.monotonic()
        up = _cli(["up", "--s3-port", str(s3_port), "--mlflow-port", str(mlflow_port), "--prefect-port",
                   str(prefect_port), "--workers", "1", "--timeout", "180"], env)
        up_seconds = time.monotonic() - started
        assert up.returncode == 0, f"stack up failed:\n{up.stdout}\n{up.stderr}"
        print(f"stack up (cold, with one worker): {up_seconds:.1f} s")

        # the printed variables, the same as env.sh
        exported = _exports(up.stdout)
        assert exported["PREFECT_API_URL"] == f"http://127.0.0.1:{prefect_port}/api"
        assert exported["MLFLOW_TRACKING_URI"] == f"http://127.0.0.1:{mlflow_port}"
        assert exported["AWS_ENDPOINT_URL_S3"] == f"http://127.0.0.1:{s3_port}"
        assert exported["LABELSHIFT_STORE"] == "s3://labelshift/store"
        assert exported["AWS_ACCESS_KEY_ID"] and exported["AWS_SECRET_ACCESS_KEY"]
        sourced = subprocess.run(["bash", "-c", f"source {shlex.quote(str(root / 'env.sh'))} && env"],
                                 capture_output=True, text=True, check=True, env={"PATH": os.environ["PATH"]})
        sourced_env = dict(line.split("=", 1) for line in sourced.stdout.splitlines() if "=" in line)
        assert {k: sourced_env[k] for k in exported} == exported

        # the services outlive the `up` command and report themselves up
        status = _cli(["status"], env, timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        states = {line.split()[0]: line.split()[1] for line in status.stdout.splitlines()}
        assert states == {"s3": "running", "mlflow": "running", "prefect": "running", "worker-1": "running"}
        pids = {name: int((root / "run" / f"{name}.pid").read_text()) for name in states}

        # a second `up` is a no-op
        again = _cli(["up", "--s3-port", str(s3_port), "--mlflow-port", str(mlflow_port), "--prefect-port",
                      str(prefect_port), "--workers", "1"], env, timeout=120)
        assert again.returncode == 0, again.stderr
        assert {name: int((root / "run" / f"{name}.pid").read_text()) for name in states} == pids

        # boto3 with nothing but the printed variables; the stack's keys are enforced
        for name in _CLIENT_VARS:
            monkeypatch.delenv(name, raising=False)
        for name, value in exported.items():
            monkeypatch.setenv(name, value)
        s3 = boto3.session.Session().client("s3")
        key = f"checks/{uuid.uuid4().hex}.txt"
        s3.put_object(Bucket="labelshift", Key=key, Body=b"through the printed variables")
        assert s3.get_object(Bucket="labelshift", Key=key)["Body"].read() == b"through the printed variables"
        stranger = boto3.session.Session().client("s3", aws_access_key_id="nobody", aws_secret_access_key="x" * 40)
        with pytest.raises(Exception, match="InvalidAccessKeyId|AccessDenied|Forbidden|403"):
            stranger.get_object(Bucket="labelshift", Key=key)
        # ... and the object store the flows use
        store = open_store(exported["LABELSHIFT_STORE"])
        store.put_json("checks/hello.json", {"stack": "up"})
        assert store.get_json("checks/hello.json") == {"stack": "up"}
        assert s3.head_object(Bucket="labelshift", Key="store/checks/hello.json")

        # an MLflow run's artifact goes through the server into the bucket
        client = MlflowClient(tracking_uri=exported["MLFLOW_TRACKING_URI"])
        experiment = client.create_experiment(f"stack-check-{uuid.uuid4().hex[:8]}")
        run = client.create_run(experiment)
        client.log_metric(run.info.run_id, "mse", 0.25, step=1)
        client.log_text(run.info.run_id, "artifact through the proxy", "notes/check.txt")
        client.set_terminated(run.info.run_id)
        assert run.info.artifact_uri.startswith("mlflow-artifacts:/")
        listed = s3.list_objects_v2(Bucket="labelshift", Prefix="mlartifacts/")
        keys = [o["Key"] for o in listed.get("Contents", [])]
        (artifact_key,) = [k for k in keys if run.info.run_id in k and k.endswith("notes/check.txt")]
        assert s3.get_object(Bucket="labelshift", Key=artifact_key)["Body"].read() == b"artifact through the proxy"
        assert client.get_run(run.info.run_id).data.metrics["mse"] == 0.25
    finally:
        down = _cli(["down"], env, timeout=120)
    assert down.returncode == 0, down.stderr
    assert "s3" in down.stdout and "worker-1" in down.stdout
    assert all(not pid_alive(pid) for pid in pids.values())
    if HAS_PROC:
        assert marked_processes(root) == []
    status = _cli(["status"], env, timeout=60)
    assert status.returncode == 3
    assert {line.split()[1] for line in status.stdout.splitlines()} == {"stopped"}
    assert (root / "s3").is_dir() and (root / "mlflow" / "mlflow.db").is_file()  # data is kept
