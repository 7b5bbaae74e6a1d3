"""Closing a sweep's MLflow runs when it stops: by the parent's id, and by the flow run's tag for runs created
before their ids were returned (a SIGTERM while the runs are being made)."""
from __future__ import annotations

from mlflow import MlflowClient

from tasks.sweep.runs import fail_sweep_runs
from tasks.tracking import FLOW_RUN_TAG

FLOW_RUN = "0f9e2c1a-5b7d-4e11-9c3a-2d4b6f8a1e07"


def _runs(client: MlflowClient, experiment: str, flow_run: str) -> tuple[str, list[str]]:
    parent = client.create_run(experiment, run_name="sweep", tags={FLOW_RUN_TAG: flow_run}).info.run_id
    children = [client.create_run(experiment, run_name=f"m{i}", tags={"mlflow.parentRunId": parent,
                                                                      FLOW_RUN_TAG: flow_run}).info.run_id
                for i in range(2)]
    return parent, children


def test_runs_are_closed_by_their_flow_run_when_the_parents_id_was_never_returned(mlflow_sqlite, tmp_path):
    client = MlflowClient(mlflow_sqlite(tmp_path))
    experiment = client.create_experiment("sweeps")
    parent, children = _runs(client, experiment, FLOW_RUN)
    other, _ = _runs(client, experiment, FLOW_RUN.replace("0f9e", "1f9e"))      # another flow run's: left alone
    closed = fail_sweep_runs(client.tracking_uri, None, "SIGTERM: stopped", status="KILLED", flow_run_id=FLOW_RUN)
    assert sorted(closed) == sorted([parent, *children])
    assert {client.get_run(r).info.status for r in closed} == {"KILLED"}
    assert client.get_run(parent).data.tags["error"] == "SIGTERM: stopped"
    assert client.get_run(other).info.status == "RUNNING"
    assert fail_sweep_runs(client.tracking_uri, parent, "again", flow_run_id=FLOW_RUN) == []   # nothing twice


def test_without_a_flow_run_the_parent_and_its_children_are_closed(mlflow_sqlite, tmp_path):
    client = MlflowClient(mlflow_sqlite(tmp_path))
    experiment = client.create_experiment("sweeps")
    parent, children = _runs(client, experiment, "")
    assert sorted(fail_sweep_runs(client.tracking_uri, parent, "ValueError: x")) == sorted([parent, *children])
    assert {client.get_run(r).info.status for r in [parent, *children]} == {"FAILED"}
