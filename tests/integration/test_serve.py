"""``labelshift serve``: both deployments from one process, the re-estimation schedule, bad schedules refused.

The integration tests run the command in a subprocess, as an operator does, against the session's Prefect server
(:mod:`tests.fixtures.prefect`; a real HTTP API), with deployment names of their own so that nothing else in the
session collides with them; they read what was registered through Prefect's client. The option-resolution tests
need no server.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from flows import serve as serve_mod
from flows.cli import build_parser
from flows.serve import ENV_CRON, ENV_MODEL, ENV_TARGET, ENV_TIMEZONE, ReestimateOptions, reestimate_options

ROOT = Path(__file__).resolve().parents[2]

#: variables of the caller that would send the served runs elsewhere
_FOREIGN = ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "LABELSHIFT_STORE", "LABELSHIFT_HOME", ENV_CRON,
            ENV_TIMEZONE, ENV_MODEL, ENV_TARGET, "LABELSHIFT_DASK_ADDRESS")


# -- options: flags, variables, defaults (no server) -------------------------------------------------------------------
def test_a_flag_wins_over_its_variable_and_only_given_parameters_are_set():
    environ = {ENV_CRON: "0 7 * * *", ENV_MODEL: "models:/from-env@prod", ENV_TARGET: "s3://env/target",
               ENV_TIMEZONE: "Europe/Paris"}
    options = reestimate_options(cron="0 6 * * *", model="models:/flag@good", environ=environ)
    assert options == ReestimateOptions(cron="0 6 * * *", timezone="Europe/Paris",
                                        parameters={"model": "models:/flag@good", "target": "s3://env/target"},
                                        cron_from="--cron")
    from_env = reestimate_options(environ=environ)
    assert (from_env.cron, from_env.cron_from) == ("0 7 * * *", f"${ENV_CRON}")
    # nothing given: unscheduled, UTC, the flow's own defaults (no parameters pinned by the deployment)
    assert reestimate_options(environ={}) == ReestimateOptions(cron=None, timezone="UTC", parameters={})
    # blank values count as not given
    assert reestimate_options(cron="  ", environ={ENV_CRON: ""}).cron is None


def test_check_schedule_accepts_cron_and_zone_and_says_what_is_wrong():
    assert serve_mod.check_schedule("0 6 * * *", "UTC").cron == "0 6 * * *"
    assert serve_mod.check_schedule("30 5 * * mon-fri", "Europe/Paris").timezone == "Europe/Paris"
    with pytest.raises(serve_mod.ScheduleError, match=r"--cron '61 6 \* \* \*'.*Invalid cron string.*five fields"):
        serve_mod.check_schedule("61 6 * * *")
    with pytest.raises(serve_mod.ScheduleError, match=rf"\${ENV_CRON} '0 6 \* \*'"):
        serve_mod.check_schedule("0 6 * *", source=f"${ENV_CRON}")
    with pytest.raises(serve_mod.ScheduleError, match="Invalid timezone"):
        serve_mod.check_schedule("0 6 * * *", "Mars/Olympus_Mons")


def test_next_runs_follow_the_cron_in_its_zone():
    first, second = serve_mod.next_runs("0 6 * * *", "Asia/Tokyo")
    assert (first.hour, first.minute, second.hour) == (6, 0, 6)
    assert first.utcoffset().total_seconds() == 9 * 3600          # read in Tokyo time, not UTC
    assert (second - first).total_seconds() == 24 * 3600


def test_serve_help_explains_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--cron", "--timezone", "--model", "--target", "--name", "--reestimate-name", "--limit",
                   "--port", "--store", "--tracking-uri"):
        assert option in out
    for variable in (ENV_CRON, ENV_MODEL, ENV_TARGET):
        assert variable in out
    assert "reestimate/reestimate" in out and "0 6 * * *" in out


# -- the command against a Prefect server ------------------------------------------------------------------------------
def _serve_env(api_url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    env.update(PREFECT_API_URL=api_url, PREFECT_HOME=str(tmp_path / "prefect-client"), PYTHONUNBUFFERED="1",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", MLFLOW_DISABLE_TELEMETRY="true",
               PYTHONFAULTHANDLER="1",                # SIGABRT then dumps every thread's stack into the log
               PREFECT_RUNNER_POLL_FREQUENCY="1", **extra)   # a run is picked up within 1 s, not Prefect's 10
    return env


def _terminal_sigint() -> None:
    """In the child before exec: SIGINT at its default, as a terminal starts a command. A process started with
    SIGINT ignored keeps ignoring it (Python installs its Ctrl-C handler only where SIGINT is at its default), and the
    test's own process inherits "ignored" when the suite runs as a background job of a non-interactive shell
    (`bash .ci/run &`): serve then went on serving after the test's Ctrl-C (seen in this repository's CI runs)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _read_deployment(api_url: str, full_name: str):
    """The deployment ``flow/name`` on the server, or None."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        try:
            return client.read_deployment_by_name(full_name)
        except ObjectNotFound:
            return None


@pytest.mark.integration
def test_serve_registers_both_deployments_with_the_schedule_and_stops_cleanly(prefect_server, tmp_path):
    tag = uuid.uuid4().hex[:8]
    reproduce_name, reestimate_name = f"reproduce-{tag}", f"reestimate-{tag}"
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "flows.cli", "serve", "--home", str(tmp_path / "home"),
               "--name", reproduce_name, "--reestimate-name", reestimate_name,
               "--cron", "0 6 * * *", "--timezone", "Europe/Paris",
               "--model", "models:/labelshift-test@candidate", "--target", "s3://labelshift/store/target-test"]
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=_serve_env(prefect_server, tmp_path), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_terminal_sigint)
    try:
        deadline = time.monotonic() + 120
        reestimate = reproduce = None
        while time.monotonic() < deadline and (reestimate is None or reproduce is None):
            assert proc.poll() is None, f"serve exited early ({proc.returncode}):\n{log.read_text()}"
            reestimate = _read_deployment(prefect_server, f"reestimate/{reestimate_name}")
            reproduce = _read_deployment(prefect_server, f"reproduce/{reproduce_name}")
            time.sleep(0.5)
        assert reestimate is not None and reproduce is not None, f"not registered in 120 s:\n{log.read_text()}"
        print(f"both deployments registered {time.monotonic() - started:.1f} s after launch")

        # reestimate: the cron schedule in its zone, active; the defaults given; one run at a time
        (schedule,) = reestimate.schedules
        assert (schedule.schedule.cron, schedule.schedule.timezone, schedule.active) == \
            ("0 6 * * *", "Europe/Paris", True)
        assert reestimate.parameters == {"model": "models:/labelshift-test@candidate",
                                         "target": "s3://labelshift/store/target-test"}
        assert reestimate.global_concurrency_limit is not None and reestimate.global_concurrency_limit.limit == 1
        assert reestimate.enforce_parameter_schema and not reestimate.paused
        props = reestimate.parameter_openapi_schema["properties"]
        assert {"model", "target", "estimator", "interval", "level", "significance"} <= set(props)
        assert reestimate.entrypoint == "flows.reestimate.reestimate"    # by module: any working directory

        # reproduce: unscheduled, with the form of the two-Gaussian family (flows.forms)
        from flows.forms import FAMILIES

        assert reproduce.schedules == []
        assert list(reproduce.parameter_openapi_schema["properties"]) == FAMILIES["gaussian"]
        assert reproduce.entrypoint == "flows.reproduce.reproduce"

        output = log.read_text()
        assert f"reestimate/{reestimate_name}': scheduled '0 6 * * *' (Europe/Paris)" in output

        # serving: Prefect's runner polls for scheduled runs (the server records when); the Ctrl-C below comes then
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _read_deployment(prefect_server,
                                                                f"reestimate/{reestimate_name}").last_polled is None:
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGINT)          # what Ctrl-C sends
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)     # the stacks of its threads, to see where it waits
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise AssertionError(f"serve did not stop within 60 s of SIGINT; its log:\n{log.read_text()}") from None
    assert code == 0, log.read_text()
    # stopping paused the schedule: no runs pile up while nobody serves them
    assert _read_deployment(prefect_server, f"reestimate/{reestimate_name}").paused


@pytest.mark.integration
@pytest.mark.parametrize("how", ["flag", "variable", "zone"])
def test_a_bad_schedule_exits_2_with_a_clear_message_and_registers_nothing(prefect_server, tmp_path, how):
    tag = uuid.uuid4().hex[:8]
    args, extra = {"flag": (["--cron", "61 6 * * *"], {}),
                   "variable": ([], {ENV_CRON: "0 6 * *"}),
                   "zone": (["--cron", "0 6 * * *", "--timezone", "Europe/Atlantis"], {})}[how]
    done = subprocess.run([sys.executable, "-m", "flows.cli", "serve", "--home", str(tmp_path / "home"),
                           "--name", f"reproduce-{tag}", "--reestimate-name", f"reestimate-{tag}", *args],
                          cwd=ROOT, env=_serve_env(prefect_server, tmp_path, **extra), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    expected = {"flag": "--cron '61 6 * * *'", "variable": f"${ENV_CRON} '0 6 * *'",
                "zone": "Invalid timezone"}[how]
    assert "labelshift serve: error:" in done.stderr and expected in done.stderr
    assert "is not a valid schedule" in done.stderr
    assert _read_deployment(prefect_server, f"reestimate/reestimate-{tag}") is None
    assert _read_deployment(prefect_server, f"reproduce/reproduce-{tag}") is None


@pytest.mark.integration
def test_sigterm_to_serve_with_a_run_in_flight_stops_both_cleanly(prefect_server, tmp_path, mlflow_database_template):
    """SIGTERM to ``labelshift serve`` (systemctl stop) while a served re-estimation runs: serve ends within seconds
    (exit 0: Prefect's runner takes SIGTERM as a request to stop, cancels the runs it executes and returns); the
    run ends Cancelled or Crashed in Prefect, its MLflow run KILLED (not left RUNNING), the watermark as it was;
    no process of serve is left; the schedule is paused."""
    import shutil

    import numpy as np
    import psutil
    from mlflow import MlflowClient

    from tests.reestimation_support import SHIFTED_PRIOR, draw, register_model

    shutil.copyfile(mlflow_database_template, tmp_path / "mlflow.db")
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    model = register_model(tracking, "serve-sigterm", n_holdout=600)
    target = tmp_path / "target"
    target.mkdir()
    np.save(target / "day-1.npy", draw(SHIFTED_PRIOR, 40_000, np.random.default_rng(3))[0])
    tag = uuid.uuid4().hex[:8]
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "flows.cli", "serve", "--home", str(tmp_path / "home"), "--name", f"r-{tag}",
               "--reestimate-name", f"e-{tag}", "--model", model["model_uri"], "--target", str(target),
               "--tracking-uri", tracking]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=_serve_env(prefect_server, tmp_path), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_terminal_sigint)
    serve = psutil.Process(proc.pid)
    started: dict[int, psutil.Process] = {}
    client = MlflowClient(tracking)
    try:
        deadline = time.monotonic() + 120
        while (deployment := _read_deployment(prefect_server, f"reestimate/e-{tag}")) is None:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        flow_run = _run_deployment(prefect_server, deployment.id, {"interval": "bootstrap", "n_bootstrap": 4000})
        deadline = time.monotonic() + 180
        while not _mlflow_running(client):            # the run is past loading the model and scoring
            state = _flow_run_state(prefect_server, flow_run, message=True)
            assert proc.poll() is None and time.monotonic() < deadline and not state.startswith(
                ("COMPLETED", "FAILED", "CRASHED")), f"{state}\n{log.read_text()[-3000:]}"
            started.update({p.pid: p for p in serve.children(recursive=True)})
            time.sleep(0.2)
        started.update({p.pid: p for p in serve.children(recursive=True)})
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = proc.wait(timeout=60)
        ended_s = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _, left = psutil.wait_procs(list(started.values()), timeout=10)      # the watchdog ends them within seconds
    left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for process in left:
        process.kill()
    assert code == 0 and ended_s < 30, (code, ended_s, log.read_text()[-3000:])
    assert not left, [" ".join(p.cmdline())[:120] for p in left]
    state = _flow_run_state(prefect_server, flow_run)
    assert state in ("CANCELLED", "CANCELLING", "CRASHED"), state
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
            if r.data.tags.get("labelshift.kind") == "reestimation"]
    assert runs and all(r.info.status == "KILLED" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    assert not (target / "_labelshift" / "watermark.json").exists()
    assert _read_deployment(prefect_server, f"reestimate/e-{tag}").paused
    print(f"serve: exit {code} {ended_s:.1f} s after SIGTERM; flow run {state}; MLflow run KILLED")


def _mlflow_running(client) -> bool:
    return any(r.info.status == "RUNNING" and r.data.tags.get("labelshift.kind") == "reestimation"
               for e in client.search_experiments() for r in client.search_runs([e.experiment_id]))


def _run_deployment(api_url: str, deployment_id, parameters: dict):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        return client.create_flow_run_from_deployment(deployment_id, parameters=parameters).id


def _flow_run_state(api_url: str, flow_run_id, message: bool = False) -> str:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
        if not message:
            return state.type.value
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
        return f"{state.type.value}: {state.message}\n" + "\n".join(entry.message[:500] for entry in logs[-15:])
