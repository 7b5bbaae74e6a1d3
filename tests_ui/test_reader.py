"""The reader's role of the container stack, in a browser: behind the stack's own proxy (tests/fixtures/proxy.py:
infra/proxy/'s nginx.conf and roles.conf), a person with the reader's password browses the Prefect UI (a
deployment and its flow run) and the MLflow UI (an experiment and its run) without one request refused, and the
Prefect UI's Run > Quick run is refused (403) with no flow run made. The servers are this module's own: the Prefect
server must hand the browser the proxy's address as its API (PREFECT_UI_API_URL); MLflow runs without its
basic-auth app here (the proxy's check of the reader is what is under test; tests/integration/test_access.py
checks MLflow's own)."""
from __future__ import annotations

import os
import re
import secrets
from contextlib import contextmanager

import pytest
from playwright.sync_api import expect

from stack.access import PASSWORDS
from runtime.processes import ServiceProcess, free_ports, http_ok
from tests.fixtures.proxy import SERVICES, start_proxy
from tests_ui import support

FLOW, DEPLOYMENT, EXPERIMENT = "reader-flow", "reader-deployment", "reader-browses"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """Prefect and MLflow servers behind the proxy (neither checks credentials itself here), with one deployment,
    its flow run and one MLflow run made by the operator through the proxy."""
    from stack.supervisor import MLFLOW_SERVER_ENV, mlflow_server_command, prefect_server_command

    root = tmp_path_factory.mktemp("reader")
    shared = secrets.token_hex(12)           # one reader password for both services: one browser context
    passwords = {name: (shared if role == "reader" else secrets.token_hex(12))
                 for roles in PASSWORDS.values() for role, name in roles.items()}
    mlflow_port, prefect_port, *proxy_ports = free_ports(2 + len(SERVICES))
    ports = dict(zip(SERVICES, proxy_ports))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_", "PREFECT_"))}
    mlflow = ServiceProcess(mlflow_server_command(mlflow_port, backend_store_uri=f"sqlite:///{root}/mlflow.db",
                                                  artifacts_destination=str(root / "artifacts")),
                            log=root / "mlflow.log", name="MLflow server", env={**base, **MLFLOW_SERVER_ENV})
    prefect = ServiceProcess(prefect_server_command(prefect_port), log=root / "prefect.log", name="Prefect server",
                             env={**base, "PREFECT_HOME": str(root / "prefect"),
                                  "PREFECT_UI_API_URL": f"http://127.0.0.1:{ports['prefect']}/api"})
    started = []
    try:
        for process in (mlflow.start(), prefect.start()):
            started.append(process)
        mlflow.wait_ready(lambda: http_ok(f"http://127.0.0.1:{mlflow_port}/health"), 120)
        prefect.wait_ready(lambda: http_ok(f"http://127.0.0.1:{prefect_port}/api/health"), 180)
        proxy, urls = start_proxy(root / "proxy", {"prefect": f"http://127.0.0.1:{prefect_port}",
                                                   "mlflow": f"http://127.0.0.1:{mlflow_port}",
                                                   "s3": "http://127.0.0.1:9"}, passwords, base, ports=ports)
        started.append(proxy)
        made = _made_by_the_operator(urls, passwords)
        yield dict(urls=urls, reader=shared, log=root / "proxy" / "proxy.log", **made)
    finally:
        for process in reversed(started):
            process.stop()


def _made_by_the_operator(urls: dict[str, str], passwords: dict[str, str]) -> dict:
    from mlflow import MlflowClient

    with _as_operator(urls, passwords) as client:
        flow_id = client.create_flow_from_name(FLOW)
        deployment_id = client.create_deployment(flow_id=flow_id, name=DEPLOYMENT)
        run = client.create_flow_run_from_deployment(deployment_id)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_TRACKING_USERNAME", "operator")
        env.setenv("MLFLOW_TRACKING_PASSWORD", passwords["LABELSHIFT_MLFLOW_OPERATOR_PASSWORD"])
        mlflow = MlflowClient(urls["mlflow"])
        experiment_id = mlflow.create_experiment(EXPERIMENT)
        run_id = mlflow.create_run(experiment_id, run_name="reader-run").info.run_id
        mlflow.log_metric(run_id, "mse", 0.125)
        mlflow.set_terminated(run_id)
    return {"deployment_id": str(deployment_id), "flow_run": run.name, "mlflow_run": f"{experiment_id}/runs/{run_id}",
            "runs_of": lambda: _runs_of(
        urls, passwords, deployment_id)}


@contextmanager
def _as_operator(urls, passwords):
    """A Prefect client of the proxy with the operator's credentials."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: f"{urls['prefect']}/api", PREFECT_API_AUTH_STRING:
                                     "operator:" + passwords["LABELSHIFT_PREFECT_OPERATOR_PASSWORD"]}), \
            get_client(sync_client=True) as client:
        yield client


def _runs_of(urls, passwords, deployment_id) -> int:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with _as_operator(urls, passwords) as client:
        return len(client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(
            any_=[deployment_id]))))


def _refusals(log, user: str = "reader") -> list[str]:
    return [line for line in log.read_text().splitlines() if f"user={user} " in line]


def test_a_reader_browses_prefect_and_mlflow_and_cannot_start_a_run(guarded, browser, screens):
    context = browser.new_context(viewport={"width": 1400, "height": 1000},
                                  http_credentials={"username": "reader", "password": guarded["reader"]})
    context.route("**/*", lambda route: route.continue_() if support.is_loopback(route.request.url)
                  else route.abort())
    page = context.new_page()
    page.set_default_timeout(30_000)
    prefect, mlflow = guarded["urls"]["prefect"], guarded["urls"]["mlflow"]
    try:
        page.goto(f"{prefect}/deployments/deployment/{guarded['deployment_id']}")
        expect(page.get_by_text(DEPLOYMENT).first).to_be_visible()
        page.goto(f"{prefect}/runs")
        expect(page.get_by_text(guarded["flow_run"]).first).to_be_visible()
        page.screenshot(path=str(screens / "3-reader-01-prefect-runs.png"))
        page.goto(f"{mlflow}/#/experiments")
        expect(page.get_by_text(EXPERIMENT).first).to_be_visible()
        page.goto(f"{mlflow}/#/experiments/{guarded['mlflow_run']}?workflowType=machine_learning")
        expect(page.get_by_text("reader-run").first).to_be_visible()
        expect(page.get_by_text("mse").first).to_be_visible()
        page.screenshot(path=str(screens / "3-reader-02-mlflow-runs.png"))
        assert _refusals(guarded["log"]) == []             # browsing needed nothing the reader may not do

        # Run > Quick run: the proxy refuses it, and no flow run is made
        page.goto(f"{prefect}/deployments/deployment/{guarded['deployment_id']}")
        page.get_by_role("button", name="Run", exact=True).click()
        with page.expect_response(lambda r: r.url.endswith("/create_flow_run")) as created:
            page.get_by_text("Quick run", exact=True).click()
        assert created.value.status == 403, created.value.status
        page.wait_for_timeout(1000)
        page.screenshot(path=str(screens / "3-reader-03-quick-run-refused.png"))
        refused = _refusals(guarded["log"])
        assert len(refused) == 1 and re.search(
            rf'"POST /api/deployments/{guarded["deployment_id"]}/create_flow_run" 403$', refused[0]), refused
        assert guarded["runs_of"]() == 1
    finally:
        context.close()
