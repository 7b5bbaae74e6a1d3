"""``labelshift serve``: the ``reproduce`` flow as a Prefect deployment, launched from the Prefect UI.

The deployment (``reproduce/reproduce`` by default) carries the flow's parameter schema, so the Prefect UI shows
every parameter of :mod:`flows.params` as a form field with its description and default. To launch a sweep:

1. ``labelshift serve`` (or, with a running server, ``PREFECT_API_URL=http://127.0.0.1:4200/api labelshift serve``);
2. open the Prefect UI (http://127.0.0.1:4200 by default) -> *Deployments* -> ``reproduce/reproduce``;
3. *Run* -> *Custom run*, edit the form (experiments, grids, seeds, methods, store...), *Submit*.

This process executes the runs it is asked for (``--limit`` at a time) in subprocesses that inherit its
environment, so the runs log to the MLflow tracking URI and object store resolved here (the embedded defaults under
``--home`` unless MLFLOW_TRACKING_URI / LABELSHIFT_STORE say otherwise). For work pools and many workers use the
``prefect.yaml`` at the repository root instead.

Without PREFECT_API_URL a Prefect server with its UI (``prefect server start``) is started for as long as this
command runs, with its database under ``<home>/prefect`` -- the same place the temporary servers of
``labelshift reproduce`` keep theirs, so earlier runs show up in its UI too.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

from flows.settings import Settings
from labelshift.errors import ServiceUnavailableError

__all__ = ["serve_reproduce", "start_prefect_server", "DEPLOYMENT_DESCRIPTION"]

DEPLOYMENT_DESCRIPTION = (
    "Reproduce the label-shift experiments of Garg et al. (NeurIPS 2020), Section 6: weight MSE of BBSE, RLLS, "
    "MLLS-CM and MLLS against the shift, the target size and the number of calibration bins, on two Gaussians. "
    "Results: an MLflow parent run (figures, per-seed tables) with one child run per method, tables and figures in "
    "the object store, and a markdown artifact here.")


def _prefect_executable() -> list[str]:
    exe = Path(sys.executable).with_name("prefect")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("prefect")
    if found:
        return [found]
    raise ServiceUnavailableError("the 'prefect' command was not found next to this Python; reinstall the package "
                                  "(make setup) or set PREFECT_API_URL to a running Prefect server.")


def start_prefect_server(prefect_home: Path, port: int, *, timeout_s: float = 120.0,
                         log_path: Path | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``prefect server start`` on 127.0.0.1:port with its state under ``prefect_home``; wait until healthy.

    Returns the process and the API URL. Raises ServiceUnavailableError if it exits or does not answer in time.
    """
    prefect_home.mkdir(parents=True, exist_ok=True)
    log_path = log_path or prefect_home / "server.log"
    env = {**os.environ, "PREFECT_HOME": str(prefect_home), "PREFECT_SERVER_API_HOST": "127.0.0.1",
           "PREFECT_SERVER_API_PORT": str(port), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    api_url = f"http://127.0.0.1:{port}/api"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([*_prefect_executable(), "server", "start", "--host", "127.0.0.1", "--port",
                                 str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceUnavailableError(
                f"the Prefect server exited with status {proc.returncode} (is port {port} taken? try --port); "
                f"its log: {log_path}")
        try:
            if httpx.get(f"{api_url}/health", timeout=2.0).status_code == 200:
                return proc, api_url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise ServiceUnavailableError(f"the Prefect server did not answer on {api_url} within {timeout_s:.0f} s; "
                                  f"its log: {log_path}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def serve_reproduce(env: Settings, *, name: str = "reproduce", port: int = 4200, limit: int = 1) -> int:
    """Serve the ``reproduce`` deployment until interrupted (see the module docstring). Returns an exit status."""
    server = None
    if env.prefect_api_url is None:
        print(f"Starting a Prefect server with its UI on http://127.0.0.1:{port} (state in {env.prefect_home}) ...")
        server, api_url = start_prefect_server(env.prefect_home, port)
        os.environ["PREFECT_API_URL"] = api_url
    try:
        # imported only now: Prefect reads PREFECT_API_URL at import
        from prefect import serve

        from flows.reproduce import reproduce

        deployment = reproduce.to_deployment(name=name, description=DEPLOYMENT_DESCRIPTION,
                                             tags=["labelshift", "paper-reproduction"])
        ui = os.environ["PREFECT_API_URL"].removesuffix("/api")
        print(f"Deployment 'reproduce/{name}': open {ui}/deployments, pick it, then Run > Custom run to edit the "
              f"parameters and launch a sweep.\nRuns log to MLflow at {env.tracking_uri} and store results in "
              f"{env.store_uri}. Stop with Ctrl-C.")
        serve(deployment, limit=limit)
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            _stop(server)
            print("Stopped the Prefect server.")
            sys.stdout.flush()
            sys.stderr.flush()
            # Prefect's background services would now retry delivering their last events to the server just
            # stopped, keeping the process alive for minutes: end it here (everything of ours is closed).
            os._exit(0)
    return 0
