"""A user's error appears once, as one line without traceback, in a flow run's log and on the command line;
an unexpected error keeps its traceback."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flows.user_errors import UserErrorFilter
from labelshift.errors import InputError

pytestmark = pytest.mark.integration

ROOT = str(Path(__file__).resolve().parents[2])


def _logs(flow_run_id) -> list[str]:
    """The messages the Prefect server holds for one flow run (its own and its tasks'), after a flush."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return [log.message for log in logs]


def _flows():
    from prefect import flow, task

    @task
    def check(value: int) -> int:
        if value < 0:
            raise InputError(f"value {value} is negative; give a value of 0 or more")
        if value == 13:
            raise RuntimeError("unexpected thirteen")
        return value

    @flow
    def in_task(value: int) -> int:
        return check(value)

    @flow
    def in_flow(value: int) -> int:
        raise InputError(f"value {value} refused at the flow; give another")

    return in_task, in_flow


def test_a_user_error_in_a_task_is_logged_once_without_traceback(prefect_server):
    from flows import user_errors

    user_errors.install()
    in_task, in_flow = _flows()
    state = in_task(-1, return_state=True)
    assert state.is_failed() and "value -1 is negative" in state.message
    with pytest.raises(InputError):
        state.result()
    logs = _logs(state.state_details.flow_run_id)
    text = "\n".join(logs)
    assert text.count("value -1 is negative") == 1, text
    assert "Traceback" not in text
    assert any(line == "InputError: value -1 is negative; give a value of 0 or more" for line in logs), text
    assert any(line.startswith("Finished in state Failed") for line in logs), text

    state = in_flow(5, return_state=True)
    text = "\n".join(_logs(state.state_details.flow_run_id))
    assert text.count("refused at the flow") == 1 and "Traceback" not in text, text


def test_an_unexpected_error_keeps_its_traceback(prefect_server):
    from flows import user_errors

    user_errors.install()
    in_task, _ = _flows()
    state = in_task(13, return_state=True)
    assert state.is_failed()
    text = "\n".join(_logs(state.state_details.flow_run_id))
    assert "Traceback" in text and "unexpected thirteen" in text


def test_the_reestimate_flow_logs_a_bad_batch_once(prefect_server, mlflow_database_template, tmp_path):
    """The real case: a batch of the wrong shape under the target (an InputError raised in a task)."""
    target = tmp_path / "incoming"
    target.mkdir()
    np.save(target / "bad.npy", np.zeros((10, 5), np.float32))
    import shutil

    from tests.reestimation_support import register_model

    shutil.copyfile(mlflow_database_template, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    model = register_model(uri, "errors-model", n_holdout=500)
    # as a user runs it: a separate process (its Prefect console output muted), against the test's server
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
           "PREFECT_API_URL": prefect_server}
    done = subprocess.run([sys.executable, "-m", "flows.cli", "estimate", "--home", str(tmp_path / "home"),
                           "--model", model["model_uri"], "--target", str(target), "--tracking-uri", uri,
                           "--fail-on-invalid"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert done.stderr.count("shape (10, 5)") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "watermark did not move" in done.stderr

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        run = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["reestimate"])),
                                    sort=FlowRunSort.START_TIME_DESC, limit=1)[0]
    text = "\n".join(_logs(run.id))
    assert text.count("shape (10, 5)") == 1 and "Traceback" not in text, text


def test_the_filter_leaves_other_records_alone():
    f = UserErrorFilter()
    record = logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, "boom %s", ("x",), None)
    assert f.filter(record) and record.getMessage() == "boom x"
    finished = logging.LogRecord("prefect.flow_runs", logging.INFO, __file__, 1, "Finished in state Completed()",
                                 (), None)
    assert f.filter(finished) and finished.getMessage() == "Finished in state Completed()"
