"""The reestimate flow's MLflow run when the command is stopped (SIGTERM, Ctrl-C) as the run is being created, before
its id came back to the flow: the runs of this flow run still RUNNING are ended KILLED by their tag; an error (not a
stop) asks MLflow nothing more on that path."""
import logging
import types

from mlflow import MlflowClient

import flows.reestimate as flow
from tasks.tracking import FLOW_RUN_TAG

FLOW_RUN = "7a1c9e44-0b2d-4f6e-8a35-c1d2e3f4a5b6"


def _setting(mlflow_sqlite, tmp_path, monkeypatch):
    uri = mlflow_sqlite(tmp_path)
    client = MlflowClient(uri)
    experiment = client.create_experiment("reestimation")
    mine = client.create_run(experiment, tags={FLOW_RUN_TAG: FLOW_RUN}).info.run_id
    other = client.create_run(experiment, tags={FLOW_RUN_TAG: FLOW_RUN.replace("7a1c", "8a1c")}).info.run_id
    monkeypatch.setattr(flow, "flow_run_info", lambda: (FLOW_RUN, "stopped-run"))
    run = types.SimpleNamespace(mlflow=None, tracking_uri=uri, logger=logging.getLogger("test"))
    return client, run, mine, other


def test_a_stop_before_the_runs_id_came_back_ends_this_flow_runs_run_killed(mlflow_sqlite, tmp_path, monkeypatch):
    client, run, mine, other = _setting(mlflow_sqlite, tmp_path, monkeypatch)
    flow._end_failed_run(SystemExit(143), run)
    assert client.get_run(mine).info.status == "KILLED"
    assert client.get_run(other).info.status == "RUNNING"          # another flow run's: left alone


def test_an_error_before_the_runs_id_came_back_asks_mlflow_nothing_more(mlflow_sqlite, tmp_path, monkeypatch):
    client, run, mine, _ = _setting(mlflow_sqlite, tmp_path, monkeypatch)
    flow._end_failed_run(ValueError("bad parameter"), run)
    assert client.get_run(mine).info.status == "RUNNING"           # the next run's end_orphaned_runs ends it
