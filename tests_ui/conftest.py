"""Fixtures of the browser tests (``make test-ui``): a local stack on free loopback ports, ``labelshift serve``
on it, a registered model with target batches, and a headless Chromium page that reaches loopback only.

``LABELSHIFT_UI_ENV=path/to/env.json`` (the variables of a running stack, as ``LocalStack.up`` returns them,
with ``labelshift serve`` already running on it) reuses that stack instead of starting one, to iterate on a test.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from tests_ui import support

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

DEPLOYMENTS = ["reproduce/reproduce", "reproduce/reproduce-images", "reestimate/reestimate"]


@pytest.fixture(scope="session")
def screens() -> Path:
    support.SCREENS.mkdir(parents=True, exist_ok=True)
    for old in support.SCREENS.glob("*.png"):
        old.unlink()
    return support.SCREENS


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """The variables of a running stack with `labelshift serve` on it, the deployment ids, and a thread that
    registers the model and writes the target batches of ``reestimate`` meanwhile (join before using them)."""
    reuse = os.environ.get("LABELSHIFT_UI_ENV")
    if reuse:
        env = json.loads(Path(reuse).read_text())
        ids = support.wait_for_deployments(env["PREFECT_API_URL"], DEPLOYMENTS, None, None, timeout=10)
        os.environ.update(env)
        yield {"env": env, "ids": ids, "ready": _done()}
        return
    from stack.supervisor import LocalStack, free_ports

    root = tmp_path_factory.mktemp("ui-stack")
    started = time.monotonic()
    s3_port, mlflow_port, prefect_port = free_ports(3)
    local = LocalStack(root / "stack", s3_port=s3_port, mlflow_port=mlflow_port, prefect_port=prefect_port)
    served = None
    try:
        env = local.up()
        print(f"stack up in {time.monotonic() - started:.0f} s", file=sys.stderr)
        child_env = {**os.environ, **env, "PYTHONPATH": str(support.ROOT), "LABELSHIFT_HOME": str(root / "home")}
        log_path = root / "serve.log"
        served = support.serve(child_env, log_path)
        os.environ.update(env)
        prepared = _Background(support.prepare_reestimation, env)
        ids = support.wait_for_deployments(env["PREFECT_API_URL"], DEPLOYMENTS, served, log_path)
        print(f"serving {time.monotonic() - started:.0f} s after start", file=sys.stderr)
        yield {"env": env, "ids": ids, "ready": prepared, "serve_log": log_path, "root": root}
    finally:
        if served is not None:
            support.stop_group(served)
        local.down()


class _Background(threading.Thread):
    """A function run on a thread; ``wait()`` re-raises its error."""

    def __init__(self, fn, *args):
        super().__init__(daemon=True)
        self._fn, self._args, self._error = fn, args, None
        self.start()

    def run(self):
        try:
            self._fn(*self._args)
        except BaseException as exc:          # re-raised in the test that needs it
            self._error = exc

    def wait(self, timeout: float = 180.0):
        self.join(timeout)
        if self.is_alive():
            raise TimeoutError(f"preparing the re-estimation target took more than {timeout:.0f} s")
        if self._error is not None:
            raise self._error


def _done():
    class Done:
        def wait(self, timeout: float = 0.0):
            return None
    return Done()


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=support.chromium_path(), args=support.CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A fresh page whose requests to anything but a loopback address are aborted (and recorded)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    blocked: list[str] = []

    def only_loopback(route):
        if support.is_loopback(route.request.url):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", only_loopback)
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.blocked = blocked
    yield page
    context.close()
