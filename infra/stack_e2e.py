"""End-to-end check of the container stack (``make stack-e2e``): the images of ``make image`` started with
``infra/compose.yaml`` and driven from this machine through the published ports, as an operator would.

1. Start the stack as its own compose project (``labelshift-e2e``: random S3 keys and Postgres password, free
   loopback ports, its own network), servers and two CPU workers, every healthcheck passing.
2. ``prefect deploy`` of ``prefect.yaml`` (deployments ``reproduce`` and ``reestimate``). The two-Gaussian sweep
   runs as one deployment run per experiment (shift, size, bins): each fans its estimation tasks out (several task
   runs, read from the Prefect API), the runs spread over both workers (the ``prefect.worker.name`` label of each
   flow run), and each leaves one FINISHED MLflow parent run and one ``summary.json`` in S3.
3. A reference model is registered in MLflow, two batches of prediction logs are put in ``s3://.../store/target``,
   and ``reestimate`` is given a 20-second schedule: the first scheduled run re-estimates (on a worker) and writes
   one corrected file and one summary per batch; the next scheduled run finds no new data and every output is
   byte-for-byte the object it was (same ETag and time): written exactly once.
4. A worker is killed (SIGKILL to its container's init, as the kernel's OOM killer would) while it runs a sweep:
   Docker restarts the container (restart policy), the worker registers again, and the flow run, whose
   heartbeats stopped, is marked Crashed by the "crash silent runs" automation. The run is then retried (set back
   to Scheduled, as "Retry" in the UI does) and completes; its flow run id has exactly one FINISHED MLflow run and
   one summary in S3: the crashed attempt counted nothing.
5. A worker's container is stopped (``docker stop``: SIGTERM) while it runs a sweep: the run ends Crashed by the
   termination signal, its MLflow runs KILLED (``labelshift worker``, issue 32), within compose's grace.
6. TLS and credentials (issue 31): each published port speaks only TLS (plain HTTP gets 400) with a certificate of
   the stack's private CA that a client trusting only the public CAs, or expecting another host name, refuses;
   every published door (Prefect REST and websockets, MLflow REST and UI, S3) refuses no
   credentials and wrong ones, and each role gets what stack/access.py says (infra/access_probes.py); after the
   other steps, no secret of the env file is in any container's log, flow run's parameters or MLflow run's params
   and tags.
7. Always: ``down --volumes``, then Docker is asked for anything of the project still there (containers,
   networks, volumes); any leftover fails the check.

Prints the time of each step. Exit status 0 passed, 1 a check failed, 2 the machine is not ready (Docker, images).
"""
from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from infra.compose_stack import Stack, check_images, compose_tool, up
from infra.image import SetupError, require_docker

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "labelshift-e2e"
BUCKET = "labelshift"
EXPERIMENTS = ("shift", "size", "bins")
#: a grid small enough for seconds per experiment, still several estimation tasks per run (2 seeds per task)
SWEEP = dict(dataset="gaussian", shift_values=[0.05, 0.2, 0.5], target_sizes=[100, 1000], bins_values=[2, 8],
             n_seeds=10, seeds_per_task=2, methods=["BBSE-soft", "MLLS"])
#: long enough (tens of seconds in a container) to be killed mid-run
LONG_SWEEP = dict(dataset="gaussian", experiments=list(EXPERIMENTS), n_seeds=60, seeds_per_task=2,
                  methods=["BBSE-hard", "BBSE-soft", "RLLS", "MLLS"])
NAMES = [f"digit-{d}" for d in range(10)]
SHIFTED = [0.3, 0.02, 0.02, 0.02, 0.02, 0.3, 0.02, 0.02, 0.02, 0.26]


class CheckFailed(AssertionError):
    """The stack did not do what it should; the message says what was seen."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_env_file(folder: Path) -> tuple[Path, dict[str, str]]:
    """An env file for the check's own project: fresh secrets and free loopback ports."""
    from stack.access import SECRETS

    values = {"COMPOSE_PROJECT_NAME": PROJECT, "LABELSHIFT_NETWORK": PROJECT,
              **{name: secrets.token_hex(24) for name in SECRETS},
              "AWS_ACCESS_KEY_ID": "e2e" + secrets.token_hex(6),
              "LABELSHIFT_S3_WORKER_ACCESS_KEY_ID": "e2e-worker-" + secrets.token_hex(4),
              "LABELSHIFT_S3_READER_ACCESS_KEY_ID": "e2e-reader-" + secrets.token_hex(4),
              "LABELSHIFT_BUCKET": BUCKET, "LABELSHIFT_BIND": "127.0.0.1",
              "LABELSHIFT_PREFECT_PORT": str(free_port()), "LABELSHIFT_MLFLOW_PORT": str(free_port()),
              "LABELSHIFT_S3_PORT": str(free_port()), "LABELSHIFT_WORKER_POLL_SECONDS": "2"}
    values["LABELSHIFT_TLS_DIR"] = str(folder / "tls")      # made for a private CA at the start (ensure_certificate)
    path = folder / "e2e.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    path.chmod(0o600)
    return path, values


def client_environment(values: dict[str, str], home: Path) -> dict[str, str]:
    """What a client on this machine needs to reach the stack through the published ports: the operator's
    credentials."""
    from infra.tls import client_environment as trust

    from stack.access import prefect_client_environment

    return {**trust(Path(values["LABELSHIFT_TLS_DIR"]) / "ca.crt"),
            "PREFECT_API_URL": f"https://127.0.0.1:{values['LABELSHIFT_PREFECT_PORT']}/api",
            **prefect_client_environment("operator", values["LABELSHIFT_PREFECT_OPERATOR_PASSWORD"]),
            "MLFLOW_TRACKING_URI": f"https://127.0.0.1:{values['LABELSHIFT_MLFLOW_PORT']}",
            "MLFLOW_TRACKING_USERNAME": "operator",
            "MLFLOW_TRACKING_PASSWORD": values["LABELSHIFT_MLFLOW_OPERATOR_PASSWORD"],
            "AWS_ENDPOINT_URL_S3": f"https://127.0.0.1:{values['LABELSHIFT_S3_PORT']}",
            "AWS_ACCESS_KEY_ID": values["AWS_ACCESS_KEY_ID"], "AWS_SECRET_ACCESS_KEY": values["AWS_SECRET_ACCESS_KEY"],
            "AWS_DEFAULT_REGION": "us-east-1", "LABELSHIFT_STORE": f"s3://{BUCKET}/store",
            "PREFECT_HOME": str(home / "prefect"), "LABELSHIFT_HOME": str(home / "labelshift"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
            # artifacts through the MLflow server, never by presigned URLs naming the compose-internal s3:8333
            "MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD": "false", "MLFLOW_ENABLE_PROXY_MULTIPART_UPLOAD": "false"}


# -- Prefect ---------------------------------------------------------------------------------------------------------
def prefect_client():
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def wait_for_workers(pool: str, count: int, timeout: float = 120) -> list[str]:
    """Names of the online workers of ``pool`` once there are ``count`` of them."""
    deadline = time.monotonic() + timeout
    with prefect_client() as client:
        while True:
            try:
                workers = client.read_workers_for_work_pool(pool)
            except Exception:          # the pool is created by the first worker that starts
                workers = []
            online = sorted(w.name for w in workers if str(w.status).upper().endswith("ONLINE"))
            if len(online) >= count or time.monotonic() > deadline:
                expect(len(online) >= count, f"{count} workers expected on pool {pool}, online: {online}")
                return online
            time.sleep(2)


def wait_final(run_ids: list, timeout: float) -> list:
    """The flow runs once all are in a final state (or the timeout passed)."""
    deadline = time.monotonic() + timeout
    with prefect_client() as client:
        while True:
            runs = [client.read_flow_run(i) for i in run_ids]
            if all(r.state.is_final() for r in runs) or time.monotonic() > deadline:
                return runs
            time.sleep(2)


def deploy(env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "-n", "reproduce", "-n",
                           "reestimate"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    expect(done.returncode == 0, f"prefect deploy failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def estimation_task_runs(flow_run_id, timeout: float = 30) -> int:
    """How many runs of the estimation task (tasks.sweep.estimation.estimate_settings) the flow run made; the server
    records task runs from their events, so a few seconds after the flow run ends they may still be coming."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout
    with prefect_client() as client:
        while True:
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            count = sum(1 for t in tasks if t.task_key.startswith("estimate_settings") and t.state.is_completed())
            if count > 1 or time.monotonic() > deadline:
                return count
            time.sleep(2)


# -- MLflow and S3 ---------------------------------------------------------------------------------------------------
def s3(env: dict[str, str]):
    import boto3

    return boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")


def objects(env: dict[str, str], prefix: str) -> dict[str, tuple[str, float]]:
    """key -> (ETag, LastModified as a timestamp) of every object under ``prefix``."""
    pages = s3(env).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"]: (o["ETag"], o["LastModified"].timestamp()) for p in pages for o in p.get("Contents", [])}


def sweep_records(env: dict[str, str], flow_run_id: str) -> tuple[list[str], list[dict]]:
    """(statuses of the MLflow parent runs tagged with this flow run, the S3 summaries naming it)."""
    from mlflow import MlflowClient

    mlflow = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = mlflow.get_experiment_by_name("labelshift-reproduce")
    runs = mlflow.search_runs([experiment.experiment_id], filter_string=f"tags.`prefect.flow_run_id` = "
                                                                          f"'{flow_run_id}'")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    client = s3(env)
    summaries = []
    for key in objects(env, "store/results/"):
        if key.endswith("/summary.json"):
            body = json.loads(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
            if body.get("prefect_flow_run_id") == flow_run_id:
                summaries.append(body)
    return [r.info.status for r in parents], summaries


# -- the checks --------------------------------------------------------------------------------------------------------
def check_sweep(env: dict[str, str], workers: list[str]) -> dict:
    """The two-Gaussian sweep as deployment runs: fanned out, spread over both workers, results in S3 and MLflow."""
    from prefect.deployments import run_deployment

    submitted = [run_deployment("reproduce/reproduce", parameters=dict(SWEEP, experiments=[e]), timeout=0,
                                tags=["e2e"]) for e in EXPERIMENTS]
    runs = wait_final([r.id for r in submitted], timeout=600)
    expect(all(r.state.is_completed() for r in runs),
           "sweep runs not all completed: " + ", ".join(f"{r.name} {r.state.name}: {r.state.message}" for r in runs))
    ran_by = {r.name: r.labels.get("prefect.worker.name") for r in runs}
    expect(set(ran_by.values()) == set(workers), f"runs did not use both workers {workers}: {ran_by}")
    fan_out = {r.name: estimation_task_runs(r.id) for r in runs}
    expect(all(n > 1 for n in fan_out.values()), f"estimation tasks not fanned out: {fan_out}")
    for run in runs:
        statuses, summaries = sweep_records(env, str(run.id))
        expect(statuses == ["FINISHED"] and len(summaries) == 1,
               f"run {run.name}: MLflow parent runs {statuses}, {len(summaries)} summaries in S3 (want 1 and 1)")
    return {"ran_by": ran_by, "estimation_tasks": fan_out}


def register_reference_and_batches(env: dict[str, str]) -> tuple[str, list[str]]:
    """A logistic regression on scikit-learn's digits, its holdout outputs registered as a reference; two
    label-shifted batches of its logits as Parquet under store/target/. Returns (model URI, batch keys)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    from labelshift_mlflow import register_reference

    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    x, y = x[order] / 16.0, y[order]
    model = LogisticRegression(max_iter=2000).fit(x[:500], y[:500])
    pool_x, pool_y = x[500:], y[500:]
    hold = rng.choice(len(pool_y), size=900, replace=True)
    info = register_reference(model.decision_function(pool_x[hold]), [NAMES[v] for v in pool_y[hold]],
                              name="e2e-digits-logs", class_names=NAMES, output_kind="logits",
                              tracking_uri=env["MLFLOW_TRACKING_URI"])
    keys = []
    for day in (1, 2):
        cls = rng.choice(10, size=600, p=SHIFTED)
        idx = np.array([rng.choice(np.flatnonzero(pool_y == c)) for c in cls])
        logits = model.decision_function(pool_x[idx]).astype(np.float32)
        buf = io.BytesIO()
        pq.write_table(pa.table({"id": [f"r{day}-{i}" for i in range(600)],
                                 **{c: logits[:, j] for j, c in enumerate(NAMES)}}), buf)
        key = f"store/target/2026/11/2{day}/part-0.parquet"
        s3(env).put_object(Bucket=BUCKET, Key=key, Body=buf.getvalue())
        keys.append(key)
    return info["model_uri"], keys


def schedule_reestimate(model_uri: str, every: timedelta) -> str:
    """Point the ``reestimate`` deployment at the reference and replace its daily schedule by one every ``every``."""
    from prefect.client.schemas.actions import DeploymentScheduleCreate, DeploymentUpdate
    from prefect.client.schemas.schedules import IntervalSchedule

    with prefect_client() as client:
        deployment = client.read_deployment_by_name("reestimate/reestimate")
        params = dict(deployment.parameters, model=model_uri, target=f"s3://{BUCKET}/store/target",
                      significance=0.01, label_shift_significance=0.001)
        client.update_deployment(deployment.id, DeploymentUpdate(parameters=params))
        for schedule in deployment.schedules:
            client.delete_deployment_schedule(deployment.id, schedule.id)
        client.create_deployment_schedules(deployment.id, [DeploymentScheduleCreate(
            schedule=IntervalSchedule(interval=every), active=True)])
        return str(deployment.id)


def scheduled_runs_of(deployment_id: str, count: int, timeout: float) -> list:
    """The first ``count`` runs of the deployment that reached a final state, oldest first."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.sorting import FlowRunSort

    deadline = time.monotonic() + timeout
    with prefect_client() as client:
        while True:
            runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
                                         sort=FlowRunSort.START_TIME_ASC)
            done = [r for r in runs if r.state.is_final()]
            if len(done) >= count or time.monotonic() > deadline:
                expect(len(done) >= count, f"{count} finished scheduled reestimate runs expected, saw "
                                           f"{[(r.name, r.state.name) for r in runs]}")
                return done[:count]
            time.sleep(3)


def stop_schedule(deployment_id: str) -> None:
    """Pause the deployment's schedule and delete the runs it had created ahead."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowRunFilter, \
        FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    with prefect_client() as client:
        client.pause_deployment(deployment_id)
        ahead = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
                any_=[StateType.SCHEDULED]))))
        for run in ahead:
            client.delete_flow_run(run.id)


def check_reestimate(env: dict[str, str]) -> dict:
    """A scheduled reestimate on a worker writes its outputs to S3 once; the next scheduled run writes nothing."""
    model_uri, batches = register_reference_and_batches(env)
    deployment_id = schedule_reestimate(model_uri, timedelta(seconds=20))
    first = scheduled_runs_of(deployment_id, 1, timeout=300)[0]
    expect(first.state.is_completed() and first.state.name in ("Shifted", "No shift"),
           f"first scheduled reestimate: {first.state.name}: {first.state.message}")
    expect(bool(first.labels.get("prefect.worker.name")), f"run {first.name} not run by a worker: {first.labels}")
    outputs = {k: v for k, v in objects(env, "store/target/").items() if k not in batches}
    for batch in batches:
        stem = batch.removesuffix(".parquet")
        for suffix in (".corrected.parquet", ".summary.json"):
            expect(stem + suffix in outputs, f"{stem + suffix} not written; S3 has {sorted(outputs)}")
    second = scheduled_runs_of(deployment_id, 2, timeout=300)[1]
    stop_schedule(deployment_id)
    expect(second.state.name == "No new data", f"second scheduled run: {second.state.name} (want No new data)")
    after = {k: v for k, v in objects(env, "store/target/").items() if k not in batches}
    changed = {k for k in outputs if after.get(k) != outputs[k] and not k.endswith("watermark.json")}
    expect(not changed and set(after) == set(outputs), f"outputs rewritten or added by the second run: "
                                                       f"{sorted(changed | (set(after) - set(outputs)))}")
    return {"runs": [(r.name, r.state.name, r.labels.get("prefect.worker.name")) for r in (first, second)],
            "outputs": sorted(outputs), "model_uri": model_uri, "batch": batches[0]}


def check_nothing_started_without_the_right(env: dict[str, str], values: dict[str, str]) -> dict:
    """The reader and the workers' Prefect users may read the deployed ``reproduce`` deployment but not start a run
    of it, nor pause its schedule (403 from the proxy); the workers' MLflow user may not move an alias."""
    from infra.access_probes import http_status, role_users

    with prefect_client() as client:
        deployment = client.read_deployment_by_name("reproduce/reproduce")
    api = env["PREFECT_API_URL"]
    found = {}
    for role, (user, password) in role_users(values, "prefect").items():
        if role == "operator":
            continue
        found[f"read it as {role}"] = http_status(f"{api}/deployments/{deployment.id}", user=(user, password))
        found[f"start a run as {role}"] = http_status(f"{api}/deployments/{deployment.id}/create_flow_run",
                                                      user=(user, password), method="POST", body={})
        found[f"pause it as {role}"] = http_status(f"{api}/deployments/{deployment.id}", user=(user, password),
                                                   method="PATCH", body={"paused": True})
    expect(all(v == (200 if k.startswith("read") else 403) for k, v in found.items()), f"deployment: {found}")
    return found


def check_tampered_version_refused(env: dict[str, str], values: dict[str, str], reestimate: dict) -> dict:
    """A file of the registered reference's version altered in S3 with the workers' key (which may write the
    bucket): ``labelshift estimate`` of it, from this machine, refuses the version naming the file, and writes
    nothing beside the new batch."""
    import boto3
    from mlflow import MlflowClient

    model_uri = reestimate["model_uri"]
    client, address = MlflowClient(env["MLFLOW_TRACKING_URI"]), model_uri.removeprefix("models:/")
    name, at, alias = address.partition("@")
    run_id = (client.get_model_version_by_alias(name, alias) if at else
              client.get_model_version(*address.rsplit("/", 1))).run_id
    files = sorted(k for k in objects(env, "mlartifacts/") if f"/{run_id}/artifacts/calibration/" in k)
    expect(bool(files), f"no calibration file of run {run_id} in s3://{BUCKET}/mlartifacts/")
    worker = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"], region_name="us-east-1",
                          aws_access_key_id=values["LABELSHIFT_S3_WORKER_ACCESS_KEY_ID"],
                          aws_secret_access_key=values["LABELSHIFT_S3_WORKER_SECRET_ACCESS_KEY"])
    original = worker.get_object(Bucket=BUCKET, Key=files[0])["Body"].read()
    worker.put_object(Bucket=BUCKET, Key=files[0], Body=original + b" ")
    batch = "store/tampered/2026/11/23/part-0.parquet"
    s3(env).copy_object(Bucket=BUCKET, Key=batch, CopySource={"Bucket": BUCKET, "Key": reestimate["batch"]})
    home = Path(tempfile.mkdtemp(prefix="labelshift-e2e-estimate-"))
    done = subprocess.run([sys.executable, "-m", "flows.cli", "estimate", "--model", model_uri,
                           "--target", f"s3://{BUCKET}/store/tampered", "--home", str(home),
                           "--tracking-uri", env["MLFLOW_TRACKING_URI"]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    said = " ".join((done.stdout + done.stderr).split())
    changed = files[0].split("/artifacts/", 1)[1]
    expect(done.returncode == 1 and f"run/{changed} changed" in said and "labelshift reference trust" in said,
           f"estimate of the altered version: exit {done.returncode}: {said[-1500:]}")
    left = sorted(objects(env, "store/tampered/"))
    expect(left == [batch], f"estimate of the altered version wrote {left}")
    return {"altered": files[0], "exit": done.returncode}


def create_crash_automation(within: timedelta) -> None:
    """Prefect's documented "zombie flow run" automation: a run whose heartbeats stop for ``within`` is Crashed."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    Automation(
        name="crash silent runs",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                    "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"}, posture=Posture.Proactive, threshold=1, within=within),
        actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                    message="no heartbeat: its worker or container stopped")]).create()


def container_of_worker(stack: Stack, worker_name: str) -> str:
    """The id of the compose container whose worker has this name (``worker-<container hostname>``)."""
    for cid in stack.leftovers()["containers"]:
        info = json.loads(subprocess.run(["docker", "inspect", cid], capture_output=True, text=True).stdout)[0]
        if worker_name == f"worker-{info['Config']['Hostname']}":
            return cid
    raise CheckFailed(f"no container runs worker {worker_name}")


def kill_container_init(cid: str) -> int:
    """SIGKILL the container's first process from the host (a crash, not `docker stop`); returns its pid."""
    info = json.loads(subprocess.run(["docker", "inspect", cid], capture_output=True, text=True).stdout)[0]
    pid = int(info["State"]["Pid"])
    os.kill(pid, 9)
    return pid


def wait_running(run_id, timeout: float):
    deadline = time.monotonic() + timeout
    with prefect_client() as client:
        while True:
            run = client.read_flow_run(run_id)
            if run.state.is_running() and run.labels.get("prefect.worker.name") or time.monotonic() > deadline:
                expect(run.state.is_running(), f"run {run.name} never ran: {run.state.name}")
                return run
            time.sleep(1)


def restart_count(cid: str) -> int:
    info = json.loads(subprocess.run(["docker", "inspect", cid], capture_output=True, text=True).stdout)[0]
    return int(info["RestartCount"])


def check_worker_killed(env: dict[str, str], stack: Stack) -> dict:
    """Kill a worker mid-run; Docker restarts it, Prefect marks the run Crashed, a retry counts once."""
    from prefect.deployments import run_deployment
    from prefect.states import Scheduled

    create_crash_automation(timedelta(seconds=75))
    submitted = run_deployment("reproduce/reproduce", parameters=LONG_SWEEP, timeout=0, tags=["e2e-kill"])
    run = wait_running(submitted.id, timeout=120)
    time.sleep(8)                                      # well inside the sweep: tasks and MLflow runs under way
    victim = run.labels["prefect.worker.name"]
    cid = container_of_worker(stack, victim)
    restarts = restart_count(cid)
    kill_container_init(cid)
    killed_at = time.monotonic()
    deadline = killed_at + 120
    while restart_count(cid) == restarts and time.monotonic() < deadline:
        time.sleep(1)
    expect(restart_count(cid) > restarts, f"container {cid[:12]} of worker {victim} was not restarted")
    crashed = wait_final([submitted.id], timeout=240)[0]
    crash_seconds = time.monotonic() - killed_at
    expect(crashed.state.is_crashed(), f"killed run {crashed.name}: {crashed.state.name} (want Crashed)")
    statuses, summaries = sweep_records(env, str(submitted.id))
    expect("FINISHED" not in statuses and not summaries,
           f"the crashed attempt left MLflow runs {statuses} and {len(summaries)} summaries")
    with prefect_client() as client:                   # "Retry" as the UI does it: the same flow run, scheduled again
        client.set_flow_run_state(submitted.id, Scheduled(), force=True)
    retried = wait_final([submitted.id], timeout=600)[0]
    expect(retried.state.is_completed(), f"retried run {retried.name}: {retried.state.name}")
    statuses, summaries = sweep_records(env, str(submitted.id))
    expect(statuses.count("FINISHED") == 1 and len(summaries) == 1,
           f"after the retry: MLflow parent runs {statuses}, {len(summaries)} summaries (want one FINISHED, one)")
    return {"killed_worker": victim, "crashed_after_s": round(crash_seconds), "statuses": statuses,
            "retried_on": retried.labels.get("prefect.worker.name")}


def check_worker_stopped(env: dict[str, str], stack: Stack) -> dict:
    """`docker stop` of a worker's container mid-run (SIGTERM, as compose, systemd or Kubernetes stop it): the
    worker (`labelshift worker`) lets the run end first -- Crashed by a termination signal, its MLflow runs KILLED,
    not left Running -- and the container stops within compose's stop_grace_period; then it is started again."""
    from prefect.deployments import run_deployment

    submitted = run_deployment("reproduce/reproduce", parameters=LONG_SWEEP, timeout=0, tags=["e2e-stop"])
    run = wait_running(submitted.id, timeout=120)
    time.sleep(8)                                      # well inside the sweep: tasks and MLflow runs under way
    victim = run.labels["prefect.worker.name"]
    cid = container_of_worker(stack, victim)
    t0 = time.monotonic()
    stopped = subprocess.run(["docker", "stop", "-t", "60", cid], capture_output=True, text=True)
    stop_seconds = time.monotonic() - t0
    expect(stopped.returncode == 0, f"docker stop {cid[:12]}: {stopped.stderr}")
    ended = wait_final([submitted.id], timeout=60)[0]
    expect(ended.state.is_crashed() and "termination signal" in (ended.state.message or ""),
           f"stopped run {ended.name}: {ended.state.name} {ended.state.message!r} (want Crashed by a signal)")
    statuses, summaries = sweep_records(env, str(submitted.id))
    expect(statuses and set(statuses) == {"KILLED"} and not summaries,
           f"the stopped run left MLflow runs {statuses} and {len(summaries)} summaries (want KILLED, none)")
    expect(stop_seconds < 60, f"the worker took {stop_seconds:.0f} s to stop (Docker kills it at 60)")
    subprocess.run(["docker", "start", cid], capture_output=True, check=True)
    return {"stopped_worker": victim, "stopped_in_s": round(stop_seconds, 1), "statuses": statuses}


# -- the whole check -----------------------------------------------------------------------------------------------------
def tear_down(stack: Stack) -> dict[str, list[str]]:
    stack.run("--profile", "cpu", "down", "--volumes", "--remove-orphans", check=False, capture=True)
    return {kind: ids for kind, ids in stack.leftovers().items() if ids}


def check_credentials(env: dict[str, str], values: dict[str, str]) -> dict:
    """Every published door with no credentials, wrong ones and each role's (infra/access_probes.py): refused
    and allowed as stack/access.py's roles say."""
    from infra.access_probes import (mlflow_answers, mlflow_problems, prefect_answers, prefect_problems,
                                     role_users, s3_answers, tls_answers)

    ca = str(Path(values["LABELSHIFT_TLS_DIR"]) / "ca.crt")
    tls = {name: tls_answers(url, ca) for name, url in (
        ("prefect", env["PREFECT_API_URL"].removesuffix("/api")), ("mlflow", env["MLFLOW_TRACKING_URI"]),
        ("s3", env["AWS_ENDPOINT_URL_S3"]))}
    for name, found in tls.items():
        expect(found["plain HTTP"] == "400" and found["TLS, the stack's CA"] == "ok"
               and found["TLS, public CAs only"].startswith("refused")
               and found["TLS, another host name"].startswith("refused"), f"TLS of {name}: {found}")

    prefect = prefect_answers(env["PREFECT_API_URL"], role_users(values, "prefect"))
    expect(not prefect_problems(prefect), f"Prefect: {prefect_problems(prefect)}")
    mlflow = mlflow_answers(env["MLFLOW_TRACKING_URI"], role_users(values, "mlflow"))
    expect(not mlflow_problems(mlflow), f"MLflow: {mlflow_problems(mlflow)}")
    from stack.access import S3_KEYS

    keys = {role: (values[key], values[secret]) for role, (key, secret) in S3_KEYS.items()}
    s3 = s3_answers(env["AWS_ENDPOINT_URL_S3"], BUCKET, keys)
    expect(s3["list anonymous"] == "AccessDenied" and s3["list with a wrong secret"] == "SignatureDoesNotMatch"
           and s3["create a bucket as worker"] == "AccessDenied" and s3["write as reader"] == "AccessDenied"
           and s3["write as worker"] == "ok" and s3["read as reader"] == "ok", f"S3: {s3}")
    return {"tls": tls, "prefect": prefect, "mlflow": mlflow, "s3": s3}


#: the artifacts searched for secrets: every text file the stack wrote to the bucket (MLflow's artifacts, the store)
TEXT_SUFFIXES = (".json", ".txt", ".md", ".yaml", ".yml", ".csv", ".html", ".log", "MLmodel")


def bucket_texts(env: dict[str, str], limit: int = 2 << 20) -> str:
    """Every text object of the bucket (by :data:`TEXT_SUFFIXES`, up to ``limit`` bytes each), concatenated."""
    client = s3(env)
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
    keys = [o["Key"] for p in pages for o in p.get("Contents", [])
            if o["Key"].endswith(TEXT_SUFFIXES) and o["Size"] <= limit]
    return "\n".join(client.get_object(Bucket=BUCKET, Key=k)["Body"].read().decode("utf-8", "replace")
                     for k in keys)


def check_no_secret_written(stack: Stack, env: dict[str, str], values: dict[str, str]) -> dict:
    """No secret of the env file in any container's log, any flow run's parameters, any Prefect artifact, any MLflow
    run's params and tags or any text file in the bucket (MLflow's artifacts, the store): the operator's view of
    everything the check made."""
    from mlflow import MlflowClient
    from stack.access import secret_values

    texts = {"container logs": stack.run("--profile", "cpu", "logs", "--no-color", check=False,
                                         capture=True).stdout}
    with prefect_client() as client:
        texts["flow run parameters"] = repr([r.parameters for r in client.read_flow_runs()])
        texts["Prefect artifacts"] = repr([a.data for a in client.read_artifacts()])
    texts["text files in the bucket"] = bucket_texts(env)
    mlflow = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = [r for e in mlflow.search_experiments() for r in mlflow.search_runs([e.experiment_id])]
    texts["MLflow params and tags"] = repr([(r.data.params, r.data.tags) for r in runs])
    secret = secret_values(values)                   # every secret, and each password's basic-auth header form
    leaked = {where: [name for name, value in secret.items() if value in text] for where, text in texts.items()}
    expect(not any(leaked.values()), f"secrets written: {leaked}")
    return {where: len(text) for where, text in texts.items()}


def run_checks(stack: Stack, env: dict[str, str], timings: dict[str, float], values: dict[str, str]) -> dict:
    results = {}
    for name, step in (("stack up (2 workers)", lambda: up(stack, workers=2)),
                       ("credentials", lambda: results.update(access=check_credentials(env, values))),
                       ("workers online", lambda: results.update(workers=wait_for_workers("labelshift", 2))),
                       ("prefect deploy", lambda: deploy(env)),
                       ("sweep on the workers", lambda: results.update(sweep=check_sweep(env, results["workers"]))),
                       ("reader and worker start nothing", lambda: results.update(
                           rights=check_nothing_started_without_the_right(env, values))),
                       ("scheduled reestimate", lambda: results.update(reestimate=check_reestimate(env))),
                       ("altered version refused", lambda: results.update(
                           tampered=check_tampered_version_refused(env, values, results["reestimate"]))),
                       ("worker killed", lambda: results.update(kill=check_worker_killed(env, stack))),
                       ("worker stopped", lambda: results.update(stop=check_worker_stopped(env, stack))),
                       ("no secret written", lambda: results.update(
                           secrets=check_no_secret_written(stack, env, values)))):
        t0 = time.monotonic()
        print(f"[e2e] {name} ...", flush=True)
        step()
        timings[name] = time.monotonic() - t0
        print(f"[e2e] {name}: ok ({timings[name]:.0f} s)", flush=True)
    return results


def main() -> int:
    t_start = time.monotonic()
    try:
        require_docker()
        tool = compose_tool()
        check_images({})
    except SetupError as exc:
        print(f"make stack-e2e: {exc}", file=sys.stderr)
        return 2
    home = Path(tempfile.mkdtemp(prefix="labelshift-e2e-"))
    env_file, values = write_env_file(home)
    from infra.compose_stack import ensure_certificate

    ensure_certificate(values)                            # the private CA's, as make stack-docker-up makes it
    stack = Stack(project=PROJECT, env_file=env_file, tool=tuple(tool))
    stale = tear_down(stack)                              # a previous check killed before its own clean-up
    if stale:
        print(f"[e2e] could not remove what an earlier run left: {stale}", file=sys.stderr)
        return 2
    env = dict(os.environ, **client_environment(values, home))
    os.environ.update(env)                                # before prefect and mlflow are imported
    timings: dict[str, float] = {}
    failure = None
    try:
        results = run_checks(stack, env, timings, values)
    except (CheckFailed, SetupError, KeyboardInterrupt) as exc:
        failure = exc
    except Exception as exc:                              # a client error: say which step, still clean up
        failure = CheckFailed(f"{type(exc).__name__}: {exc}")
        import traceback

        traceback.print_exc()
    finally:
        t0 = time.monotonic()
        left = tear_down(stack)
        timings["down --volumes"] = time.monotonic() - t0
        shutil.rmtree(home, ignore_errors=True)
    timings["total"] = time.monotonic() - t_start
    print("[e2e] timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    if left:
        print(f"[e2e] FAILED: left behind after down: {left}", file=sys.stderr)
        return 1
    if failure is not None:
        print(f"[e2e] FAILED: {type(failure).__name__}: {failure}", file=sys.stderr)
        return 1
    print("[e2e] passed; nothing of the project left (containers, networks, volumes)")
    print(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # a client library's retry threads (MLflow downloads of a stack that is gone) must not hold the exit
    os._exit(status)
