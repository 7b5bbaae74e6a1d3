"""Servers stopped or data removed in the middle of a re-estimation run, on loopback only: after each fault nothing
is lost, nothing is counted twice, no MLflow run is left RUNNING, the message says what to do, and a rerun once the
fault is gone counts every batch once. (Faults while committing the watermark on a local folder are tested with the
watermark, tests/unit/monitoring/test_watermark.py; SIGKILL of the processes in test_faults_processes.py.)"""
from __future__ import annotations

import json

import numpy as np
import pytest
from mlflow import MlflowClient

from tests.fixtures.mlflow_server import MlflowServer
from tests.fixtures.seaweed import SeaweedServer
from tests.reestimation_support import SHIFTED_PRIOR, draw, npy_bytes, register_model


# -- servers stopped mid-run (the flow) ----------------------------------------------------------------------------------
def _no_running(tracking_uri: str) -> None:
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("reestimation")
    runs = client.search_runs([exp.experiment_id], max_results=1000) if exp else []
    assert [r.info.run_id for r in runs if r.info.status == "RUNNING"] == []


@pytest.fixture(scope="module")
def own_mlflow(tmp_path_factory, mlflow_database_template):
    """An MLflow server of this module (it is stopped and started again), with the test model registered."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-faults"), database_template=mlflow_database_template)
    server.start()
    server.model = register_model(server.url, "faults-model", n_holdout=1500)["model_uri"]
    yield server
    server.stop()


@pytest.fixture
def quick_mlflow_client(monkeypatch):
    """MLflow's client gives up on an unreachable server at once instead of retrying with backoff for minutes."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def _restart_on_the_same_port(server: MlflowServer) -> None:
    import tests.fixtures.mlflow_server as mlflow_fixture

    port = server.port
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mlflow_fixture, "free_ports", lambda n: [port])
        server.start()


def _run(model, target, tracking_uri):
    from flows.reestimate import reestimate

    return reestimate(model=model, target=target, tracking_uri=tracking_uri, return_state=True)


@pytest.mark.integration
def test_s3_server_stopped_mid_run(prefect_server, own_mlflow, tmp_path, monkeypatch, quick_mlflow_client):
    """SeaweedFS goes away after scoring, before the outputs and the commit: the run fails saying the endpoint did
    not answer, its MLflow run is FAILED, the watermark did not move; once the server is back the rerun counts each
    batch once."""
    import flows.reestimate as flow_module

    rng = np.random.default_rng(21)
    with SeaweedServer(tmp_path / "weed") as s3:
        bucket = s3.create_bucket()
        for name in ("a", "b"):
            s3.client().put_object(Bucket=bucket, Key=f"t/{name}.npy", Body=npy_bytes(draw(SHIFTED_PRIOR, 400, rng)[0]))
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
        real = flow_module.write_for_reestimation

        def stop_then_write(*args, **kwargs):
            s3.stop()
            return real(*args, **kwargs)

        monkeypatch.setattr(flow_module, "write_for_reestimation", stop_then_write)
        target = f"s3://{bucket}/t/"
        state = _run(own_mlflow.model, target, own_mlflow.url)
        assert state.is_failed() and "did not answer" in state.message and "server is running" in state.message
        _no_running(own_mlflow.url)
        monkeypatch.setattr(flow_module, "write_for_reestimation", real)
        s3.start()  # the same data, on new ports
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)
        keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket, Prefix="t/").get("Contents", [])]
        assert "t/_labelshift/watermark.json" not in keys
        rerun = _run(own_mlflow.model, target, own_mlflow.url)
        assert rerun.is_completed(), rerun.message
        watermark = json.loads(s3.client().get_object(Bucket=bucket, Key="t/_labelshift/watermark.json")["Body"].read())
        assert [h["batches"] for h in watermark["history"]] == [["a.npy", "b.npy"]]
        _no_running(own_mlflow.url)


@pytest.mark.integration
def test_a_batch_deleted_between_listing_and_reading_is_skipped(prefect_server, own_mlflow, s3_bucket, seaweed,
                                                               monkeypatch):
    import flows.reestimate as flow_module

    rng = np.random.default_rng(22)
    for name in ("a", "b"):
        seaweed.client().put_object(Bucket=s3_bucket, Key=f"d/{name}.npy",
                                    Body=npy_bytes(draw(SHIFTED_PRIOR, 400, rng)[0]))
    kept = seaweed.client().get_object(Bucket=s3_bucket, Key="d/b.npy")["Body"].read()
    real = flow_module.score_for_reestimation

    def delete_then_score(*args, **kwargs):
        seaweed.client().delete_object(Bucket=s3_bucket, Key="d/b.npy")
        return real(*args, **kwargs)

    monkeypatch.setattr(flow_module, "score_for_reestimation", delete_then_score)
    state = _run(own_mlflow.model, f"s3://{s3_bucket}/d/", own_mlflow.url)
    monkeypatch.setattr(flow_module, "score_for_reestimation", real)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["batches"] == ["a.npy"] and [s["key"] for s in summary["skipped"]] == ["b.npy"]
    assert "next run lists" in flow_module.summary_markdown(summary)
    seaweed.client().put_object(Bucket=s3_bucket, Key="d/b.npy", Body=kept)  # back: taken by the next run
    again = _run(own_mlflow.model, f"s3://{s3_bucket}/d/", own_mlflow.url)
    assert again.is_completed() and again.result()["batches"] == ["b.npy"], again.message
    watermark = json.loads(seaweed.client().get_object(Bucket=s3_bucket, Key="d/_labelshift/watermark.json")
                           ["Body"].read())
    assert [h["batches"] for h in watermark["history"]] == [["a.npy"], ["b.npy"]] and "rejected" not in watermark
    _no_running(own_mlflow.url)


@pytest.mark.integration
def test_mlflow_server_stopped_after_the_estimate(prefect_server, own_mlflow, s3_bucket, seaweed, monkeypatch,
                                                  quick_mlflow_client):
    """MLflow goes away after the estimate was logged, before the commit: the batches are counted and the run
    completes with warnings that say the next run catches up; the next run (MLflow back) adds the missing point and
    ends the run MLflow could not be told about, so none is left RUNNING."""
    import flows.reestimate as flow_module

    rng = np.random.default_rng(23)
    seaweed.client().put_object(Bucket=s3_bucket, Key="m/a.npy", Body=npy_bytes(draw(SHIFTED_PRIOR, 400, rng)[0]))
    real = flow_module.write_for_reestimation

    def stop_then_write(*args, **kwargs):
        own_mlflow.stop()
        return real(*args, **kwargs)

    monkeypatch.setattr(flow_module, "write_for_reestimation", stop_then_write)
    state = _run(own_mlflow.model, f"s3://{s3_bucket}/m/", own_mlflow.url)
    monkeypatch.setattr(flow_module, "write_for_reestimation", real)
    assert state.is_completed(), state.message
    warnings = " ".join(state.result()["warnings"])
    assert "next run with new data adds the missing point" in warnings and "FINISHED" in warnings
    first_child = state.result()["mlflow"]["run_id"]
    _restart_on_the_same_port(own_mlflow)  # same database
    seaweed.client().put_object(Bucket=s3_bucket, Key="m/b.npy", Body=npy_bytes(draw(SHIFTED_PRIOR, 400, rng)[0]))
    again = _run(own_mlflow.model, f"s3://{s3_bucket}/m/", own_mlflow.url)
    assert again.is_completed() and again.result()["batches"] == ["b.npy"], again.message
    assert MlflowClient(own_mlflow.url).get_run(first_child).info.status == "FINISHED"
    _no_running(own_mlflow.url)
    watermark = json.loads(seaweed.client().get_object(Bucket=s3_bucket, Key="m/_labelshift/watermark.json")
                           ["Body"].read())
    assert [h["batches"] for h in watermark["history"]] == [["a.npy"], ["b.npy"]]
