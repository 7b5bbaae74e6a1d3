"""What the browser tests need besides the browser: the served deployments on a local stack, a registered model
with target batches for ``reestimate``, and a Chromium that contacts loopback addresses only."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
#: where a person finds the screenshots of a run of the suite
SCREENS = ROOT / ".labelshift" / "ui-screens"
#: the registered model and the target the reestimate deployment is served with
MODEL_NAME = "ui-gaussian-classifier"
MODEL_URI = f"models:/{MODEL_NAME}@production"
TARGET_URI = "s3://labelshift/store/ui-target"
#: Chromium flags that work in a container without a GPU, a sandbox or the network
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def chromium_path() -> str:
    """Debian's chromium (``apt-get install chromium``; Playwright's own download is not available here)."""
    for candidate in (os.environ.get("LABELSHIFT_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium",
                      shutil.which("chromium-browser")):
        if candidate and Path(candidate).exists():
            return candidate
    raise FileNotFoundError("no chromium found: install it with `apt-get install -y chromium` (make test-ui does) "
                            "or point LABELSHIFT_CHROMIUM at a Chromium binary")


def is_loopback(url: str) -> bool:
    scheme = url.split(":", 1)[0]
    if scheme in ("data", "blob", "about"):
        return True
    return (urlsplit(url).hostname or "") in LOOPBACK


def serve(env: dict[str, str], log_path: Path, *, name: str = "reproduce") -> subprocess.Popen:
    """``labelshift serve`` (both deployments, reestimate on the UI model and target) in a session of its own."""
    log = open(log_path, "ab")
    env = {"PREFECT_RUNNER_POLL_FREQUENCY": "2", **env}      # pick up a submitted run within 2 s, not 10
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "serve", "--name", name, "--model", MODEL_URI, "--target", TARGET_URI],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def stop_group(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def wait_for_deployments(api_url: str, names: list[str], proc: subprocess.Popen, log_path: Path,
                         timeout: float = 120.0) -> dict[str, str]:
    """Ids of the deployments ``flow/name`` once `serve` has registered them all."""
    found: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"labelshift serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        for name in names:
            if name in found:
                continue
            flow, _, dep = name.partition("/")
            r = httpx.get(f"{api_url}/deployments/name/{flow}/{dep}", timeout=5)
            if r.status_code == 200:
                found[name] = r.json()["id"]
        if len(found) == len(names):
            return found
        time.sleep(0.5)
    raise TimeoutError(f"serve did not register {sorted(set(names) - set(found))} in {timeout:.0f} s:\n"
                       f"{log_path.read_text()[-3000:]}")


def prepare_reestimation(env: dict[str, str]) -> None:
    """Register the small Bayes classifier of the re-estimation tests (3 classes of 2-D Gaussians)."""
    from tests.reestimation_support import register_model

    register_model(env["MLFLOW_TRACKING_URI"], MODEL_NAME, alias="production", n_holdout=2000)


def put_batches(env: dict[str, str], count: int = 2, rows: int = 1500) -> list[str]:
    """Write ``count`` new label-shifted batches (new keys) under the target; returns their keys."""
    import boto3

    from tests.reestimation_support import SHIFTED_PRIOR, draw, npy_bytes

    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name=env["AWS_DEFAULT_REGION"])
    bucket, _, prefix = TARGET_URI.removeprefix("s3://").partition("/")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rng = np.random.default_rng(int(time.time()))
    keys = []
    for i in range(count):
        x, _ = draw(SHIFTED_PRIOR, rows, rng)
        keys.append(f"{prefix}/{stamp}-part-{i}.npy")
        s3.put_object(Bucket=bucket, Key=keys[-1], Body=npy_bytes(x))
    return keys


def prefect_log_tail(stack: dict, lines: int = 60) -> str:
    """The last lines of the stack's Prefect server log (tests_ui/conftest.py keeps the stack under ``root``)."""
    log = Path(stack.get("root", ".")) / "stack" / "logs" / "prefect.log"
    if not log.is_file():
        return f"(no log at {log})"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
