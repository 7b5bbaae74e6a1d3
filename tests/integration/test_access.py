"""The credentials of the container stack, on the same servers started here (no Docker) behind the stack's own
proxy (tests/fixtures/proxy.py: infra/proxy/'s nginx.conf and roles.conf, without TLS): MLflow's basic-auth app with
infra/mlflow/basic_auth.ini, SeaweedFS with stack/access.py's identities, Prefect reached only through the proxy.

Every door refuses a request without credentials or with a wrong one (Prefect's REST API and each of its
websockets, MLflow's REST API and UI, S3), each role may do what infra/README.md's table says and no more (a worker
neither registers a model nor moves an alias, a reader starts no run), and a sweep run as a worker, through the
proxy, runs with the workers' credentials and writes no secret into its output, its Prefect parameters or its
MLflow params. ``make stack-e2e`` checks the same on the containers (infra/stack_e2e.py).
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from stack.access import (PASSWORDS, S3_KEYS, SECRETS, ensure_mlflow_user, prefect_client_environment,
                          secret_values, write_s3_config)
from infra.access_probes import (PREFECT_MAY, mlflow_answers, mlflow_problems, prefect_answers, prefect_problems,
                                 role_users, s3_answers)
from runtime.processes import ServiceProcess, free_ports, http_ok
from tests.fixtures.proxy import start_proxy

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration
BUCKET = "labelshift"


def _secrets() -> dict[str, str]:
    values = {name: secrets.token_hex(16) for name in SECRETS}
    values.update(AWS_ACCESS_KEY_ID="op" + secrets.token_hex(4), LABELSHIFT_S3_WORKER_ACCESS_KEY_ID="wk" +
                  secrets.token_hex(4), LABELSHIFT_S3_READER_ACCESS_KEY_ID="rd" + secrets.token_hex(4))
    return values



@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """S3, MLflow and Prefect with the stack's credentials on free loopback ports, and the proxy in front of
    them (the URLs yielded are the proxy's); stopped at the end."""
    from stack.supervisor import (MLFLOW_SERVER_ENV, WEED_INTERNAL_PORT_FLAGS, ensure_bucket, find_weed,
                                  mlflow_server_command, prefect_server_command, weed_server_command)

    root = tmp_path_factory.mktemp("access")
    values = _secrets()
    s3_port, mlflow_port, prefect_port, *internal = free_ports(3 + len(WEED_INTERNAL_PORT_FLAGS))
    write_s3_config(root / "s3.json", values, BUCKET)
    (root / "weed").mkdir()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_", "PREFECT_"))}
    weed = ServiceProcess(weed_server_command(find_weed(), data_dir=root / "weed", identities=root / "s3.json",
                                              ports={"s3.port": s3_port, **dict(zip(WEED_INTERNAL_PORT_FLAGS,
                                                                                    internal))}),
                          log=root / "s3.log", env=base, name="SeaweedFS").start()
    # the ini of the image, with the database where this test keeps it
    ini = (ROOT / "infra" / "mlflow" / "basic_auth.ini").read_text().replace("sqlite:////data/basic_auth.db",
                                                                             f"sqlite:///{root}/auth.db")
    (root / "basic_auth.ini").write_text(ini)
    s3_url = f"http://127.0.0.1:{s3_port}"
    mlflow = ServiceProcess(
        [*mlflow_server_command(mlflow_port, backend_store_uri=f"sqlite:///{root}/mlflow.db",
                                artifacts_destination=f"s3://{BUCKET}/mlartifacts"), "--app-name", "basic-auth"],
        log=root / "mlflow.log", name="MLflow server",
        env={**base, **MLFLOW_SERVER_ENV, "MLFLOW_S3_ENDPOINT_URL": s3_url,
             "AWS_ACCESS_KEY_ID": values["AWS_ACCESS_KEY_ID"],
             "AWS_SECRET_ACCESS_KEY": values["AWS_SECRET_ACCESS_KEY"], "AWS_DEFAULT_REGION": "us-east-1",
             "MLFLOW_AUTH_CONFIG_PATH": str(root / "basic_auth.ini"),
             "MLFLOW_AUTH_ADMIN_PASSWORD": values["LABELSHIFT_MLFLOW_OPERATOR_PASSWORD"],
             "MLFLOW_FLASK_SERVER_SECRET_KEY": values["LABELSHIFT_MLFLOW_SECRET_KEY"]})
    prefect = ServiceProcess(prefect_server_command(prefect_port), log=root / "prefect.log", name="Prefect server",
                             env={**base, "PREFECT_HOME": str(root / "prefect"),
                                  "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    started = [weed]
    try:
        weed.wait_ready(lambda: http_ok(f"{s3_url}/healthz"), 60)
        ensure_bucket(s3_url, BUCKET, values["AWS_ACCESS_KEY_ID"], values["AWS_SECRET_ACCESS_KEY"])
        for process in (mlflow.start(), prefect.start()):
            started.append(process)
        mlflow_url, api = f"http://127.0.0.1:{mlflow_port}", f"http://127.0.0.1:{prefect_port}/api"
        mlflow.wait_ready(lambda: http_ok(f"{mlflow_url}/health"), 120)
        prefect.wait_ready(lambda: http_ok(f"{api}/health"), 180)
        for role in ("worker", "reader"):
            ensure_mlflow_user(mlflow_url, ("operator", values["LABELSHIFT_MLFLOW_OPERATOR_PASSWORD"]), role,
                               values[PASSWORDS["mlflow"][role]])
        proxy, urls = start_proxy(root / "proxy", {"prefect": api.removesuffix("/api"), "mlflow": mlflow_url,
                                                   "s3": s3_url},
                                  {name: values[name] for roles in PASSWORDS.values() for name in roles.values()},
                                  base)
        started.append(proxy)
        yield dict(values=values, s3=urls["s3"], mlflow=urls["mlflow"], api=f"{urls['prefect']}/api", root=root,
                   base=base)
    finally:
        for process in reversed(started):
            process.stop()


def test_every_door_refuses_no_or_wrong_credentials_and_each_role_gets_its_rights(servers):
    values = servers["values"]
    prefect = prefect_answers(servers["api"], role_users(values, "prefect"))
    assert not prefect_problems(prefect), (prefect_problems(prefect), prefect)
    # the rules are not vacuous: each role was refused something, and let through something
    refused = {who: [k for k, v in prefect.items() if k.endswith(f" as {who}") and v == 403] for who in PREFECT_MAY}
    assert refused["operator"] == [] and len(refused["worker"]) >= 6 and len(refused["reader"]) >= 8, refused

    mlflow = mlflow_answers(servers["mlflow"], role_users(values, "mlflow"))
    assert not mlflow_problems(mlflow), (mlflow_problems(mlflow), mlflow)
    assert [mlflow[f"{what} as worker"] for what in ("register a model", "move an alias", "tag a model version")] \
        == [403] * 3, mlflow

    keys = {role: (values[key], values[secret]) for role, (key, secret) in S3_KEYS.items()}
    s3 = s3_answers(servers["s3"], BUCKET, keys)
    assert s3 == {"list anonymous": "AccessDenied", "list with a wrong secret": "SignatureDoesNotMatch",
                  **{f"{what} as operator": "ok" for what in ("write", "list", "read", "delete", "create a bucket")},
                  **{f"{what} as worker": "ok" for what in ("write", "list", "read", "delete")},
                  "create a bucket as worker": "AccessDenied",
                  "write as reader": "AccessDenied", "list as reader": "ok", "read as reader": "ok",
                  "delete as reader": "AccessDenied", "create a bucket as reader": "AccessDenied"}, s3


def _client_env(servers, tmp_path, role: str = "worker", *, prefect_password: str | None = None,
                mlflow_password: str | None = None) -> dict[str, str]:
    """What ``role`` holds, as a client of the proxy: its Prefect and MLflow users (or the passwords given) and
    S3 key (the workers' for the reader too: the reader's cannot write)."""
    values = servers["values"]
    s3 = "WORKER" if role != "operator" else None
    return {**servers["base"], "PREFECT_API_URL": servers["api"],
            **prefect_client_environment(role, prefect_password or values[PASSWORDS["prefect"][role]]),
            "MLFLOW_TRACKING_URI": servers["mlflow"], "MLFLOW_TRACKING_USERNAME": role,
            "MLFLOW_TRACKING_PASSWORD": mlflow_password or values[PASSWORDS["mlflow"][role]],
            "AWS_ENDPOINT_URL_S3": servers["s3"], "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": values[f"LABELSHIFT_S3_{s3}_ACCESS_KEY_ID" if s3 else "AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": values[f"LABELSHIFT_S3_{s3}_SECRET_ACCESS_KEY" if s3 else "AWS_SECRET_ACCESS_KEY"],
            "LABELSHIFT_STORE": f"s3://{BUCKET}/store", "LABELSHIFT_HOME": str(tmp_path / f"home-{role}"),
            "PREFECT_HOME": str(tmp_path / f"prefect-{role}"), "MLFLOW_DISABLE_TELEMETRY": "true"}


@pytest.mark.parametrize("wrong", ["PREFECT_API_AUTH_STRING", "MLFLOW_TRACKING_PASSWORD"])
def test_a_wrong_password_is_refused_with_the_setting_to_fix(servers, tmp_path, wrong, monkeypatch):
    """The operator's command with one wrong password: it ends (exit 1) with a sentence naming the variable to
    set, no traceback, and no MLflow run left RUNNING."""
    bad = {"prefect_password" if wrong.startswith("PREFECT") else "mlflow_password": "not-the-password-42"}
    env = _client_env(servers, tmp_path, "operator", **bad)
    done = subprocess.run([sys.executable, "-m", "flows.cli", "reproduce", "--experiments", "shift",
                           "--shift-values", "0.5", "--seeds", "2", "--n-source", "300",
                           "--experiment-name", f"access-wrong-{wrong}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    said = " ".join(done.stderr.split())
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert wrong in said and "401" in said, said[-2000:]
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "operator")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", servers["values"]["LABELSHIFT_MLFLOW_OPERATOR_PASSWORD"])
    client = MlflowClient(servers["mlflow"])
    experiment = client.get_experiment_by_name(f"access-wrong-{wrong}")
    if experiment is not None:               # no run of it left RUNNING
        assert [r.info.status for r in client.search_runs([experiment.experiment_id])
                if r.info.status == "RUNNING"] == []


def _deploy_and_run_as_operator(servers, tmp_path, pool: str) -> str:
    """The operator's part: the work pool, the ``reproduce-smoke`` deployment of prefect.yaml, one run of it
    (not waited for). Returns the flow run's id."""
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    env = _client_env(servers, tmp_path, "operator")
    for command in (["work-pool", "create", pool, "--type", "process"], ["--no-prompt", "deploy", "-n", "reproduce-smoke"]):
        done = subprocess.run([sys.executable, "-m", "prefect", *command], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=180)
        assert done.returncode == 0, f"prefect {' '.join(command)}:\n{done.stdout}\n{done.stderr}"
    with temporary_settings(updates={PREFECT_API_URL: servers["api"], PREFECT_API_AUTH_STRING: env[
            "PREFECT_API_AUTH_STRING"]}):
        return str(run_deployment("reproduce/reproduce-smoke", timeout=0, tags=["access"]).id)


def _final_run(servers, flow_run_id: str, timeout: float = 300):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    deadline = time.monotonic() + timeout
    with temporary_settings(updates={PREFECT_API_URL: servers["api"], PREFECT_API_AUTH_STRING:
                                     "reader:" + servers["values"]["LABELSHIFT_PREFECT_READER_PASSWORD"]}), \
            get_client(sync_client=True) as prefect:
        while True:
            run = prefect.read_flow_run(flow_run_id)
            if run.state.is_final() or time.monotonic() > deadline:
                return run
            time.sleep(1)


def test_a_worker_runs_a_deployment_with_the_workers_credentials_and_writes_no_secret(servers, tmp_path,
                                                                                       monkeypatch):
    """The operator deploys ``reproduce-smoke`` and starts a run; ``labelshift worker`` holding only the workers'
    credentials runs it through the proxy: it completes within the worker's rights (no request of the worker refused),
    and no secret appears in the worker's output, the flow run's parameters or its MLflow params and tags."""
    from mlflow import MlflowClient

    values = servers["values"]
    proxy_log = servers["root"] / "proxy" / "proxy.log"
    before = proxy_log.stat().st_size       # the probes' refusals of the tests above come before
    flow_run_id = _deploy_and_run_as_operator(servers, tmp_path, "labelshift")
    env = {**_client_env(servers, tmp_path, "worker"), "LABELSHIFT_CODE_DIR": str(ROOT),
           "PREFECT_WORKER_QUERY_SECONDS": "2"}
    env.pop("PREFECT_CLIENT_CUSTOM_HEADERS")        # labelshift worker derives it from the auth string
    log = tmp_path / "worker.log"
    worker = ServiceProcess([sys.executable, "-m", "flows.cli", "worker", "--pool", "labelshift", "--limit", "1"],
                            log=log, env=env, name="labelshift worker").start()
    try:
        run = _final_run(servers, flow_run_id)
    finally:
        worker.stop(grace=40)
    said = log.read_text(errors="replace")
    assert run.state.is_completed(), f"{run.state.name}: {run.state.message}\n{said[-3000:]}"
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "operator")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", values["LABELSHIFT_MLFLOW_OPERATOR_PASSWORD"])
    client = MlflowClient(servers["mlflow"])
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"tags.`prefect.flow_run_id` = '{flow_run_id}'")
    assert runs and all(r.info.status == "FINISHED" for r in runs), [r.info.status for r in runs]
    said = "\n".join([said, repr(run.parameters), *(repr(r.data.params) + repr(r.data.tags) for r in runs)])
    leaked = [name for name, value in secret_values(values).items() if value in said]    # header forms too
    assert not leaked, leaked
    # nothing the worker and its run needed was refused by the proxy (it logs each refusal with the user); Prefect
    # 3.9's worker first tries its worker channel (a websocket, which could create pools) and, refused, polls by REST
    refused = [line for line in proxy_log.read_bytes()[before:].decode().splitlines() if "user=worker" in line
               and "/workers/connect" not in line]
    assert not refused, refused[:5]


def test_a_worker_may_not_register_a_model_and_the_sweep_keeps_it_logged(servers, monkeypatch):
    """Through the proxy as the workers' MLflow user: a registration is refused (PERMISSION_DENIED, which
    tasks.tracking.registry_refused recognises); the image sweep's registration step then leaves the model logged
    in its run, tags the run with the refusal and goes on, and the registry holds nothing new."""
    import numpy as np
    import torch
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from tasks.sweep.images import _register, registered_model_name
    from tasks.tracking import registry_refused

    values, url = servers["values"], servers["mlflow"]
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "worker")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", values["LABELSHIFT_MLFLOW_WORKER_PASSWORD"])
    client = MlflowClient(url)
    with pytest.raises(MlflowException) as refused:
        client.create_registered_model("access-by-a-worker")
    assert registry_refused(refused.value), refused.value

    run_id = client.create_run(client.create_experiment("access-register")).info.run_id
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    ds = SimpleNamespace(valid=SimpleNamespace(x=np.zeros((8, 4, 4), np.uint8)))
    meta = {"test_accuracy": 0.95}
    assert _register(client, run_id, url, model, ds, "access-digits", meta, good_accuracy=0.9) is False
    assert "registered_model" not in meta and "version" not in meta, meta
    tag = client.get_run(run_id).data.tags["labelshift.registration"]
    assert tag.startswith("refused:") and "403" in tag and "worker" in tag, tag
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "operator")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", values["LABELSHIFT_MLFLOW_OPERATOR_PASSWORD"])
    assert client.search_registered_models(f"name = '{registered_model_name('access-digits')}'") == []
