"""More than one process, more than one machine: Dask for the estimation tasks, two workers on one work pool.

- The ``reproduce`` flow gives the same MSE numbers whether its estimation tasks run on the default thread pool or
  on a Dask cluster (here a ``LocalCluster`` of two single-threaded worker processes, reached by its scheduler
  address exactly as a cluster on other machines would be).
- The local stack with two process workers (``labelshift worker``) polling one work pool: the ``reproduce-smoke``
  deployment of ``prefect.yaml`` is registered with ``prefect deploy``, four runs are submitted at once, all
  complete, and both workers executed some of them (the worker that ran a flow run is recorded on it as the label
  ``prefect.worker.name``, and each worker's log under the stack folder names the runs it submitted). Then SIGTERM
  to a worker running a slow run (the run ends Crashed, its MLflow runs KILLED), and the Prefect server killed
  under the other one's run (the worker ends the run, goes on, and the run is Crashed once the server is back).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from runtime.timeouts import WORKER_STOP_S
from runtime.worker_guard import WORKER_EXIT_S

ROOT = Path(__file__).resolve().parents[2]

# -- Dask --------------------------------------------------------------------------------------------------------------
#: two experiments of two settings each, 4 seeds split 2 per task: 4 estimation tasks per experiment
DASK_SWEEP = dict(experiments=["shift", "size"], shift_values=[0.1, 0.5], target_sizes=[100, 300], n_seeds=4,
                  seeds_per_task=2, n_source=2000, methods=["BBSE-soft", "MLLS"])


def test_dask_task_runner_choices_and_errors():
    pytest.importorskip("prefect_dask")
    from flows.reproduce import InputError, dask_task_runner, with_task_runner

    local = dask_task_runner("local")
    assert local.cluster_class is not None and local.cluster_kwargs["threads_per_worker"] == 1
    assert dask_task_runner("10.0.0.5:8786").address == "tcp://10.0.0.5:8786"      # the default protocol
    assert dask_task_runner("tls://sched:8786").address == "tls://sched:8786"
    for bad in ("", "sched", "tcp://sched", "tcp://sched:port"):
        with pytest.raises(InputError, match="Dask"):
            dask_task_runner(bad)
    with pytest.raises(InputError, match="'local' Dask cluster only"):
        dask_task_runner("tcp://sched:8786", n_workers=2)
    assert type(with_task_runner("local").task_runner).__name__ == "DaskTaskRunner"
    assert type(with_task_runner(None).task_runner).__name__ == "ThreadPoolTaskRunner"


def test_without_prefect_dask_the_error_says_what_to_install(monkeypatch):
    from flows.reproduce import MissingExtraError, dask_task_runner

    monkeypatch.setitem(sys.modules, "prefect_dask", None)          # makes `import prefect_dask` fail
    with pytest.raises(MissingExtraError, match=r"pip install 'labelshift\[dask\]'"):
        dask_task_runner("tcp://127.0.0.1:8786")


@pytest.mark.integration
def test_reproduce_on_a_dask_cluster_gives_the_same_mse_as_the_thread_pool(prefect_server, mlflow_sqlite, tmp_path):
    pytest.importorskip("prefect_dask")
    from distributed import Client, LocalCluster, get_task_stream
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.params import ReproduceParameters
    from flows.plan import plan
    from flows.reproduce import reproduce, with_task_runner

    tracking = mlflow_sqlite(tmp_path)
    common = dict(DASK_SWEEP, store=str(tmp_path / "store"), tracking_uri=tracking, mlflow_experiment="dask")
    t0 = time.perf_counter()
    threads = reproduce(**common, return_state=True)
    t1 = time.perf_counter()
    assert threads.is_completed(), threads.message

    # processes: the tasks and their results cross process boundaries (pickled), as they do between machines
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client, get_task_stream(client) as stream:
        t2 = time.perf_counter()
        dask = with_task_runner(cluster.scheduler_address)(**common, return_state=True)
        t3 = time.perf_counter()
        workers = set(client.scheduler_info()["workers"])
    assert dask.is_completed(), dask.message
    print(f"thread pool {t1 - t0:.1f} s, Dask cluster of 2 processes {t3 - t2:.1f} s (cluster start excluded)")

    # every estimation task ran on the cluster's workers (as many as the flow's plan cuts the sweep into)
    n_tasks = sum(len(batches) for batches in plan(ReproduceParameters(**DASK_SWEEP)).values())
    ran_on = [record["worker"] for record in stream.data]
    assert n_tasks >= 4 and len(ran_on) == n_tasks and set(ran_on) <= workers

    # ... and reported its task run to the flow's Prefect server
    with get_client(sync_client=True) as prefect:
        flow_run_id = dask.state_details.flow_run_id
        task_runs = prefect.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    estimates = [t for t in task_runs if t.task_key.startswith("estimate")]
    assert len(estimates) == n_tasks and all(t.state.is_completed() for t in estimates)

    # the same numbers: every task draws from streams seeded by (base seed, setting, seed), whichever process
    # runs it; the arithmetic is the same code on the same data, so only BLAS threading could change the last bits
    def mse(state):
        return {(r["experiment"], r["method"], r["value"]): r["mse_mean"] for r in state.result()["rows"]}

    a, b = mse(threads), mse(dask)
    assert set(a) == set(b) and len(a) == 8
    keys = sorted(a)
    np.testing.assert_allclose([b[k] for k in keys], [a[k] for k in keys], rtol=1e-12, atol=0)


# -- two workers on one work pool --------------------------------------------------------------------------------------
_CLIENT_VARS = ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "LABELSHIFT_STORE", "AWS_ENDPOINT_URL_S3",
                "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE",
                "AWS_SESSION_TOKEN", "MLFLOW_S3_ENDPOINT_URL", "LABELSHIFT_S3_PORT", "LABELSHIFT_MLFLOW_PORT",
                "LABELSHIFT_PREFECT_PORT", "LABELSHIFT_DASK_ADDRESS", "LABELSHIFT_CODE_DIR", "LABELSHIFT_HOME",
                "LABELSHIFT_MLFLOW_EXPERIMENT")
RUNS = 4
#: seconds the workers wait for a silent Prefect server before they end the runs in flight (the setting)
LOST_AFTER_S = 3


def _stack_env(home: Path, client_home: Path) -> dict[str, str]:
    """The environment of `stack up` (the workers inherit it) and of this test's clients."""
    env = {k: v for k, v in os.environ.items() if k not in _CLIENT_VARS}
    # workers poll every 2 s instead of 10 s, to keep the test short
    env.update(LABELSHIFT_HOME=str(home), PREFECT_WORKER_QUERY_SECONDS="2", PREFECT_HOME=str(client_home),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", MLFLOW_DISABLE_TELEMETRY="true",
               # the workers' logs (checked below) show their own and their flow runs' INFO lines
               PREFECT_LOGGING_LEVEL="INFO", PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL="INFO",
               # the workers give up on a silent Prefect server after 3 s instead of 15 (the last step)
               LABELSHIFT_SERVER_LOST_S=str(LOST_AFTER_S))
    return env


def _stack(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", "stack", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.integration
@pytest.mark.slow
def test_runs_of_one_pool_spread_over_two_workers(tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from stack.supervisor import LocalStack, free_ports, stack_dir

    home = tmp_path / "home"
    s3_port, mlflow_port, prefect_port = free_ports(3)
    env = _stack_env(home, tmp_path / "client")
    timings = {}
    t0 = time.monotonic()
    try:
        up = _stack(["up", "--s3-port", str(s3_port), "--mlflow-port", str(mlflow_port), "--prefect-port",
                     str(prefect_port), "--workers", "2", "--timeout", "180"], env)
        assert up.returncode == 0, f"stack up failed:\n{up.stdout}\n{up.stderr}"
        timings["stack up"] = time.monotonic() - t0
        root = stack_dir(home)
        stack_env = LocalStack(root).env()
        api = stack_env["PREFECT_API_URL"]
        records = {n: LocalStack(root)._record(n) for n in ("worker-1", "worker-2")}
        names = {n: r["worker_name"] for n, r in records.items()}
        assert len(set(names.values())) == 2

        # the deployment as an operator registers it: prefect.yaml, from the repository root
        t1 = time.monotonic()
        deploy = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "-n", "reproduce-smoke"],
                                cwd=ROOT, env={**env, **stack_env}, capture_output=True, text=True, timeout=180)
        assert deploy.returncode == 0, f"prefect deploy failed:\n{deploy.stdout}\n{deploy.stderr}"
        timings["prefect deploy"] = time.monotonic() - t1

        t2 = time.monotonic()
        with temporary_settings(updates={PREFECT_API_URL: api}):
            runs = [run_deployment("reproduce/reproduce-smoke", timeout=0, tags=["test-workers"])
                    for _ in range(RUNS)]
            deadline = time.monotonic() + 240
            with get_client(sync_client=True) as client:
                while True:
                    current = [client.read_flow_run(r.id) for r in runs]
                    if all(r.state.is_final() for r in current) or time.monotonic() > deadline:
                        break
                    time.sleep(1)
        timings[f"{RUNS} runs"] = time.monotonic() - t2
        states = {str(r.id): r.state.name for r in current}
        logs = {n: Path(records[n]["log"]).read_text(errors="replace") for n in records}
        assert all(r.state.is_completed() for r in current), \
            f"runs not all completed: {states}\n" + "\n".join(f"--- {n}\n{text[-3000:]}" for n, text in logs.items())

        # which worker ran each flow run: recorded on the run (the UI shows it) and in the worker's own log
        ran_by = {str(r.id): r.labels.get("prefect.worker.name") for r in current}
        assert set(ran_by.values()) == set(names.values()), f"runs did not spread: {ran_by}"
        # (a worker may also log "submitting" a run that the other one claimed first, so the check is on what the
        # flow run's own process printed, which goes to the log of the worker that started it only)
        for worker, name in names.items():
            for run in current:
                started_here = f"Beginning flow run '{run.name}'" in logs[worker]
                assert started_here == (ran_by[str(run.id)] == name), \
                    f"{worker} ({name}) log vs label of run {run.name}: {ran_by}"
        # the runs used the stack's services: each one's MLflow parent run is on the stack's MLflow server
        from mlflow import MlflowClient

        mlflow = MlflowClient(stack_env["MLFLOW_TRACKING_URI"])
        experiment = mlflow.get_experiment_by_name("labelshift-reproduce")
        tagged = {r.data.tags.get("prefect.flow_run_id"): r.info.status
                  for r in mlflow.search_runs([experiment.experiment_id])}
        assert all(tagged.get(run_id) == "FINISHED" for run_id in states), tagged
        timings["SIGTERM to a worker"] = _sigterm_to_the_worker_of_a_run(api, records, names, mlflow, experiment)
        ports = ["--s3-port", str(s3_port), "--mlflow-port", str(mlflow_port), "--prefect-port", str(prefect_port)]
        timings["Prefect server lost"] = _prefect_lost_under_a_worker_run(
            api, root, records, names, mlflow, experiment, restart=lambda: _stack(["up", *ports], env))
    finally:
        down = _stack(["down"], env, timeout=120)
        timings["total"] = time.monotonic() - t0
        print("timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    assert down.returncode == 0, down.stderr
    # the worker ended by SIGTERM above is gone already; down stops the other and the servers
    assert sum(f"worker-{i}" in down.stdout for i in (1, 2)) == 1 and "prefect" in down.stdout, down.stdout


def _sigterm_to_the_worker_of_a_run(api: str, records: dict, names: dict, mlflow, experiment) -> float:
    """SIGTERM (as `systemctl stop` or Kubernetes sends it) to the worker executing a slow run: the run's process
    gets the SIGTERM first and reports itself (Crashed in Prefect, its MLflow runs KILLED), then the worker ends;
    nothing of them left. (Prefect's bare process worker kills the run's process without letting it report: the
    flow run stayed Running and its MLflow runs RUNNING; `labelshift worker`, which the stack starts, is the fix:
    runtime.worker_guard.) Returns the seconds the worker took to end."""
    import psutil
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        run = run_deployment("reproduce/reproduce-smoke", timeout=0, parameters={"n_seeds": 20_000},
                             tags=["test-workers-sigterm"])
        deadline = time.monotonic() + 120
        while not (current := client.read_flow_run(run.id)).state.is_running():
            assert time.monotonic() < deadline and not current.state.is_final(), current.state
            time.sleep(0.5)
        while not [r for r in mlflow.search_runs([experiment.experiment_id])
                   if r.data.tags.get("prefect.flow_run_id") == str(run.id)]:     # its MLflow runs exist
            assert time.monotonic() < deadline, "the run's MLflow runs did not appear"
            time.sleep(0.5)
        worker = next(n for n, name in names.items() if name == current.labels.get("prefect.worker.name"))
        process = psutil.Process(records[worker]["pid"])
        family = [process, *process.children(recursive=True)]
        sent = time.monotonic()
        process.terminate()
        gone, alive = psutil.wait_procs(family, timeout=60)
        ended_s = time.monotonic() - sent
        for left in alive:
            left.kill()
        assert not alive, [" ".join(p.cmdline())[:120] for p in alive]
        # the run's grace (WORKER_STOP_S) and the worker's own exit bound it; measured 11 s
        assert ended_s < WORKER_STOP_S + WORKER_EXIT_S, ended_s
        state = client.read_flow_run(run.id).state
    statuses = sorted({r.info.status for r in mlflow.search_runs([experiment.experiment_id])
                       if r.data.tags.get("prefect.flow_run_id") == str(run.id)})
    print(f"SIGTERM to {worker}: it and its run's process ended {ended_s:.1f} s after; flow run {state.name}; "
          f"MLflow runs {statuses}")
    assert state.is_crashed() and "termination signal" in (state.message or ""), state
    assert statuses == ["KILLED"], statuses
    log = Path(records[worker]["log"]).read_text(errors="replace")
    assert f"flow run {run.id} ended" in log and "SIGTERM: stopping the worker's flow runs first" in log, log[-3000:]
    return ended_s


def _slow_run_under_way(client, mlflow, experiment, tag: str):
    """A slow run of reproduce-smoke, once it runs and its MLflow runs exist."""
    from prefect.deployments import run_deployment

    run = run_deployment("reproduce/reproduce-smoke", timeout=0, parameters={"n_seeds": 20_000}, tags=[tag])
    deadline = time.monotonic() + 120
    while not (current := client.read_flow_run(run.id)).state.is_running():
        assert time.monotonic() < deadline and not current.state.is_final(), current.state
        time.sleep(0.5)
    while not [r for r in mlflow.search_runs([experiment.experiment_id])
               if r.data.tags.get("prefect.flow_run_id") == str(run.id)]:
        assert time.monotonic() < deadline, "the run's MLflow runs did not appear"
        time.sleep(0.5)
    return current


def _prefect_lost_under_a_worker_run(api: str, root, records: dict, names: dict, mlflow, experiment,
                                     restart) -> float:
    """The stack's Prefect server killed while a worker executes a slow run: the worker ends the run's process
    (it would wait on the server for minutes, then for ever to send its last logs, holding the worker's slot)
    within LABELSHIFT_SERVER_LOST_S + its grace, ends the run's MLflow runs KILLED, and goes on; once the server
    is started again, the worker marks the run Crashed. Returns the seconds from the kill to the run's process
    ending."""
    import psutil
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        run = _slow_run_under_way(client, mlflow, experiment, "test-workers-lost")
    worker = next(n for n, name in names.items() if name == run.labels.get("prefect.worker.name"))
    guard = psutil.Process(records[worker]["pid"])
    engines = [p for p in guard.children(recursive=True) if "prefect.engine" in " ".join(p.cmdline())]
    assert engines, [p.cmdline() for p in guard.children(recursive=True)]
    prefect = json.loads((root / "run" / "prefect.json").read_text())
    killed = time.monotonic()
    os.killpg(prefect["pgid"], signal.SIGKILL)
    gone, alive = psutil.wait_procs(engines, timeout=LOST_AFTER_S + WORKER_STOP_S + 30)
    ended_s = time.monotonic() - killed
    assert not alive, f"the run's process still runs {ended_s:.0f} s after the server was killed"
    statuses = sorted({r.info.status for r in mlflow.search_runs([experiment.experiment_id])
                       if r.data.tags.get("prefect.flow_run_id") == str(run.id)})
    assert statuses == ["KILLED"], statuses
    assert guard.is_running() and guard.status() != psutil.STATUS_ZOMBIE        # the worker goes on
    again = restart()                                                           # the server back, same database
    assert again.returncode == 0, again.stderr
    with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        deadline = time.monotonic() + 60
        while not (state := client.read_flow_run(run.id).state).is_final():
            assert time.monotonic() < deadline, state
            time.sleep(1)
    log = Path(records[worker]["log"]).read_text(errors="replace")
    print(f"Prefect server killed under {worker}'s run: its process ended {ended_s:.1f} s after; MLflow runs "
          f"{statuses}; once the server was back, the flow run {state.name}: {state.message}")
    assert state.is_crashed() and "stopped answering" in log, (state, log[-3000:])
    return ended_s


@pytest.mark.integration
def test_a_run_the_worker_had_to_kill_is_marked_crashed_and_its_mlflow_runs_killed(prefect_server, mlflow_server,
                                                                                  tmp_path):
    """`labelshift worker` settling a flow run whose process it killed (it ignored SIGTERM for the whole grace):
    the run, Running, becomes Crashed with a message saying so; its MLflow runs still RUNNING end KILLED, in any
    experiment; a finished one and another flow run's stay as they were; settling again changes nothing. While the
    Prefect server does not answer, only the MLflow half is done and the error says the rest comes later; a run
    that tracked to a local store is not looked for (its path is the run's, not the worker's)."""
    from mlflow import MlflowClient
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    from flows.worker import PrefectNotAnswering, settle_flow_run
    from tasks.tracking import FLOW_RUN_TAG

    @flow(name="settle-probe")
    def probe():
        pass

    tracking = mlflow_server.url
    ml = MlflowClient(tracking)
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(probe)
        client.set_flow_run_state(run.id, Running(), force=True)
        other = client.create_flow_run(probe)
        names = [f"settle-sweep-{run.id}", f"settle-reestimation-{run.id}"]
        mine = [ml.create_run(ml.create_experiment(name), tags={FLOW_RUN_TAG: str(run.id)}).info.run_id
                for name in names]
        sweep = ml.get_experiment_by_name(names[0]).experiment_id
        finished = ml.create_run(sweep, tags={FLOW_RUN_TAG: str(run.id)})
        ml.set_terminated(finished.info.run_id, "FINISHED")
        foreign = ml.create_run(sweep, tags={FLOW_RUN_TAG: str(other.id)})
        said = []
        with pytest.raises(PrefectNotAnswering):       # the server down: MLflow now, Prefect later
            settle_flow_run(str(run.id), True, {"MLFLOW_TRACKING_URI": tracking}, why="labelshift worker was stopped",
                            server_answers=False, echo=said.append)
        assert [ml.get_run(r).info.status for r in mine] == ["KILLED", "KILLED"]
        assert client.read_flow_run(run.id).state.is_running()
        local = []
        settle_flow_run(str(other.id), True, {"MLFLOW_TRACKING_URI": "sqlite:///elsewhere/mlflow.db"},
                        why="labelshift worker was stopped", echo=local.append)
        assert "not checked: it tracked to sqlite:///elsewhere/mlflow.db" in local[0], local
        for _ in range(2):
            settle_flow_run(str(run.id), True, {"MLFLOW_TRACKING_URI": tracking}, why="labelshift worker was stopped",
                            echo=said.append)
        state = client.read_flow_run(run.id).state
    assert state.is_crashed(), state
    assert state.message == "labelshift worker was stopped; the flow run's process was killed before it ended", \
        state.message
    assert [ml.get_run(r).info.status for r in mine] == ["KILLED", "KILLED"]
    assert ml.get_run(finished.info.run_id).info.status == "FINISHED"
    assert ml.get_run(foreign.info.run_id).info.status == "RUNNING"
    assert len(said) == 2 and "2 MLflow run(s)" in said[0] and "marked Crashed (was Running)" in said[1], said
