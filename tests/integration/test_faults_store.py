"""Fault injection around the store, the watermark and MLflow, on loopback only: after each fault nothing is lost,
nothing is counted twice, no MLflow run is left RUNNING, the message says what to do, and a rerun once the fault is
gone counts every batch once. (SIGKILL of the processes is tested with the process handling.)"""
from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest
from mlflow import MlflowClient

from labelshift.errors import FormatError, StorageError
from labelshift.monitoring.layout import WATERMARK_KEY
from labelshift.monitoring.listing import find_new_batches
from labelshift.monitoring.watermark import commit_watermark, read_watermark
from labelshift.storage import open_store
from tests.fixtures.mlflow_server import MlflowServer
from tests.fixtures.seaweed import SeaweedServer
from tests.reestimation_support import SHIFTED_PRIOR, draw, npy_bytes, register_model


def put_batch(store, key: str, seed: int) -> None:
    store.put_bytes(key, npy_bytes(np.random.default_rng(seed).normal(size=(4, 3)).astype(np.float32)))


def counted(store) -> dict[str, int]:
    out: dict[str, int] = {}
    for entry in read_watermark(store).history:
        for key in entry["batches"]:
            out[key] = out.get(key, 0) + 1
    return out


@pytest.fixture
def target(tmp_path):
    store = open_store(str(tmp_path / "target"))
    put_batch(store, "a.npy", 0)
    new, watermark = find_new_batches(store)
    commit_watermark(store, watermark, new, {})
    put_batch(store, "b.npy", 1)
    return store


# -- the local store -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("failing", [1, 2], ids=["data-file", "checksum-file"])
def test_a_write_failing_half_way_leaves_a_readable_watermark(target, monkeypatch, failing):
    """The commit's rename of the data file (1) or of its checksum file (2) fails: the watermark is the old or the
    new one, never one reported corrupt; the rerun counts what is left, once."""
    new, watermark = find_new_batches(target)
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == failing:
            raise OSError(errno.EIO, "Input/output error (injected)")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(StorageError, match=r"cannot write .*watermark.json"):
        commit_watermark(target, watermark, new, {})
    monkeypatch.undo()
    now = read_watermark(target)  # readable: no checksum mismatch
    assert now.sequence == (1 if failing == 1 else 2)
    again, watermark = find_new_batches(target)
    if again:
        commit_watermark(target, watermark, again, {})
    assert counted(target) == {"a.npy": 1, "b.npy": 1}
    assert not [p for p in target.root.rglob(".labelshift-tmp-*") if "lock" not in p.name]


def test_a_full_disk_fails_the_write_with_what_to_do_and_keeps_the_watermark(target, monkeypatch):
    new, watermark = find_new_batches(target)
    before = target.get_bytes(WATERMARK_KEY)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(StorageError, match=r"disk holding .* is full .* free some space and run again"):
        commit_watermark(target, watermark, new, {})
    with pytest.raises(StorageError, match="is full"):
        target.put_bytes("b.corrected.npy", b"x" * 100)
    monkeypatch.undo()
    assert target.get_bytes(WATERMARK_KEY) == before and not target.exists("b.corrected.npy")
    assert not [p for p in target.root.rglob(".labelshift-tmp-*") if "lock" not in p.name]
    again, watermark = find_new_batches(target)
    commit_watermark(target, watermark, again, {})
    assert counted(target) == {"a.npy": 1, "b.npy": 1}


@pytest.mark.parametrize("how", ["truncated", "truncated-without-checksum", "garbage"])
def test_a_corrupt_or_truncated_watermark_is_never_reset_silently(target, how):
    path = target.root / "_labelshift" / "watermark.json"
    content = path.read_bytes()
    path.write_bytes(b"\x00\xff garbage" if how == "garbage" else content[: len(content) // 2])
    if how == "truncated-without-checksum":
        path.with_name("watermark.json.sha256").unlink()
    before = {k: target.get_bytes(k) for k in target.list() if k != WATERMARK_KEY}
    for attempt in (lambda: find_new_batches(target), lambda: read_watermark(target)):
        with pytest.raises(FormatError) as error:
            attempt()
        message = str(error.value)
        assert target.url(WATERMARK_KEY) in message and "restore the file from a backup" in message
        assert "delete it" in message
    assert {k: target.get_bytes(k) for k in target.list() if k != WATERMARK_KEY} == before
    path.unlink()  # the documented way to start over: every batch is processed again, once
    path.with_name("watermark.json.sha256").unlink(missing_ok=True)
    again, watermark = find_new_batches(target)
    commit_watermark(target, watermark, again, {})
    assert counted(target) == {"a.npy": 1, "b.npy": 1}


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
