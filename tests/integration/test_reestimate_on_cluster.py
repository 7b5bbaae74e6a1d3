"""The ``reestimate`` flow with its rows on a Dask cluster (``dask=ADDRESS``, issue 41) against the same flow in one
process, end to end on SeaweedFS S3, an MLflow server and Prefect: the same prediction logs under two targets give
the same verdict and prior (to 1e-9: the passes' sums differ only in their grouping, and each MLLS solve ends within
2 tol = 2e-10 of its fixed point), the same corrected outputs (written by the workers beside their batches), and one
commit each; a scheduler that does not answer, a batch that fails its checks with ``on_invalid="error"`` and a
setting the cluster cannot do yet each fail clearly, with nothing written and no MLflow run left RUNNING; a batch that fails its checks is quarantined
as one process quarantines it (or fails the run with ``on_invalid="error"``).

Data: Gaussian logits of 4 classes (``tests/fixtures/draws.py``), continuous, so no row repeats. The holdout is
drawn at the uniform prior, the target at a shifted one: label shift holds exactly.
"""
from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient

from tests.fixtures.draws import gaussian_logits

distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.integration

NAMES = ["a", "b", "c", "d"]
SHIFTED = np.array([0.45, 0.3, 0.15, 0.1])
BATCHES = 3
ROWS = 3000


@pytest.fixture(scope="module")
def reference(mlflow_s3_server):
    from labelshift_mlflow import register_reference

    rng = np.random.default_rng(41)
    logits, labels = gaussian_logits(rng, 2000, np.full(4, 0.25), scale=0.7, offset=np.array([0.2, 0, -0.1, 0]))
    info = register_reference(logits, labels, name="cluster-logs", class_names=NAMES, output_kind="logits",
                              tracking_uri=mlflow_s3_server.url)
    return dict(info, tracking_uri=mlflow_s3_server.url)


def _batches() -> list[bytes]:
    rng = np.random.default_rng(42)
    out = []
    for i in range(BATCHES):
        z, _ = gaussian_logits(rng, ROWS, SHIFTED, scale=0.7, offset=np.array([0.2, 0, -0.1, 0]))
        z = z.astype(np.float32)
        table = {"id": [f"r{i}-{j}" for j in range(ROWS)], **{c: z[:, j] for j, c in enumerate(NAMES)}}
        buf = io.BytesIO()
        pq.write_table(pa.table(table), buf)
        out.append(buf.getvalue())
    return out


def _keys(seaweed, bucket, prefix):
    pages = seaweed.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _get(seaweed, bucket, key) -> bytes:
    return seaweed.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def _put_all(seaweed, bucket, prefix, bodies) -> None:
    for i, body in enumerate(bodies):
        seaweed.client().put_object(Bucket=bucket, Key=f"{prefix}day-{i}.parquet", Body=body)


def _run(reference, target, **options):
    from flows.reestimate import reestimate

    return reestimate(model=reference["model_uri"], target=target, tracking_uri=reference["tracking_uri"],
                      return_state=True, **options)


def _running(tracking_uri) -> list:
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("reestimation")
    runs = [] if exp is None else client.search_runs([exp.experiment_id], max_results=1000)
    return [r.info.run_id for r in runs if r.info.status == "RUNNING"]


def _corrected(seaweed, bucket, key) -> np.ndarray:
    table = pq.read_table(io.BytesIO(_get(seaweed, bucket, key)))
    assert table.column_names == ["id", *NAMES]
    return np.column_stack([table.column(c).to_numpy() for c in NAMES])


def _largest_difference(x, y, where="result") -> float:
    """The largest absolute difference of two reports' numbers, after asserting that everything else (keys,
    strings, booleans, integers, None) is equal."""
    if isinstance(x, dict):
        assert isinstance(y, dict) and x.keys() == y.keys(), where
        return max([_largest_difference(x[k], y[k], f"{where}.{k}") for k in x] or [0.0])
    if isinstance(x, list):
        assert isinstance(y, list) and len(x) == len(y), where
        return max([_largest_difference(u, v, f"{where}[{i}]") for i, (u, v) in enumerate(zip(x, y))] or [0.0])
    if isinstance(x, float) and isinstance(y, float):
        return 0.0 if x == y or (np.isnan(x) and np.isnan(y)) else abs(x - y)
    assert x == y, (where, x, y)
    return 0.0


@pytest.fixture
def client(s3_bucket):
    """Two single-threaded worker processes, started after the store's settings are in the environment (the workers
    read the batches with them)."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  worker_dashboard_address=None) as lc, distributed.Client(lc) as c:
        yield c


def test_the_flow_on_a_cluster_gives_one_process_report_and_outputs(prefect_server, reference, seaweed, s3_bucket,
                                                                    client):
    import json

    bodies = _batches()
    _put_all(seaweed, s3_bucket, "one/", bodies)
    _put_all(seaweed, s3_bucket, "many/", bodies)
    here = _run(reference, f"s3://{s3_bucket}/one/")
    there = _run(reference, f"s3://{s3_bucket}/many/", dask=client.scheduler.address)
    assert here.is_completed() and there.is_completed(), (here.message, there.message)
    a, b = here.result(), there.result()
    assert a["verdict"] == b["verdict"] == "Shifted" and a["headline"] == b["headline"]
    assert np.max(np.abs(np.array(a["result"]["target_prior"]) - b["result"]["target_prior"])) < 1e-9
    assert np.abs(np.array(b["result"]["target_prior"]) - SHIFTED).sum() / 2 < 0.05
    assert _largest_difference(a["result"], b["result"]) < 1e-8     # every field: strings and counts exactly
    assert [k.replace("one/", "") for k in a["batches"]] == [k.replace("many/", "") for k in b["batches"]]
    for i in range(BATCHES):          # written by the workers beside their batches: the same rows, ids and summary
        key = f"day-{i}.corrected.parquet"
        assert np.max(np.abs(_corrected(seaweed, s3_bucket, "one/" + key)
                             - _corrected(seaweed, s3_bucket, "many/" + key))) < 1e-6
        summary = json.loads(_get(seaweed, s3_bucket, f"many/day-{i}.summary.json"))
        assert summary["batch"]["rows"] == ROWS and summary["verdict"] == "Shifted"
    for prefix, summary in (("one/", a), ("many/", b)):
        mark = json.loads(_get(seaweed, s3_bucket, f"{prefix}_labelshift/watermark.json"))
        assert mark["sequence"] == 1 == summary["sequence"] and len(mark["history"]) == 1
        assert sorted(mark["processed"]) == [f"day-{i}.parquet" for i in range(BATCHES)]
    run = MlflowClient(reference["tracking_uri"]).get_run(b["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["dask"] == client.scheduler.address
    assert "dask" not in MlflowClient(reference["tracking_uri"]).get_run(a["mlflow"]["run_id"]).data.params
    assert _run(reference, f"s3://{s3_bucket}/many/", dask=client.scheduler.address).name == "No new data"


def test_what_the_cluster_cannot_do_fails_clearly_with_nothing_written(prefect_server, reference, seaweed,
                                                                       s3_bucket, client, monkeypatch):
    from tasks.reestimation import cluster

    monkeypatch.setattr(cluster, "CONNECT_S", 2.0)
    _put_all(seaweed, s3_bucket, "t/", _batches()[:2])
    seaweed.client().put_object(Bucket=s3_bucket, Key="t/day-9.parquet", Body=b"not parquet at all")
    before = {k: _get(seaweed, s3_bucket, k) for k in _keys(seaweed, s3_bucket, "t/")}
    cases = [("tcp://127.0.0.1:9", ["could not reach the Dask scheduler at 'tcp://127.0.0.1:9'", "dask scheduler"]),
             (client.scheduler.address, ["1 of 3 new batch(es) failed their checks", "[day-9.parquet]",
                                         "Nothing was counted", "on_invalid='quarantine'"])]
    for address, words in cases:                  # strict: a batch that fails its checks fails the run
        state = _run(reference, f"s3://{s3_bucket}/t/", dask=address, on_invalid="error")
        assert state.is_failed() and all(w in state.message for w in words), state.message
        assert "Traceback" not in state.message
        assert {k: _get(seaweed, s3_bucket, k) for k in _keys(seaweed, s3_bucket, "t/")} == before   # no watermark
        assert not _running(reference["tracking_uri"])
    state = _run(reference, f"s3://{s3_bucket}/t/", dask=client.scheduler.address, segment_column="region")
    assert state.is_failed() and "segment_column" in state.message and "without --dask" in state.message


def test_a_bad_batch_is_quarantined_on_the_cluster_as_in_one_process(prefect_server, reference, seaweed, s3_bucket,
                                                                     client):
    """Two good batches and one that is not Parquet: on the cluster as in one process the run goes on with the good
    ones (the same report to 1e-8), the bad one recorded as rejected in the watermark with its reason and not tried
    again; a target whose every new batch is bad ends "No valid data" on both, the batches held."""
    import json

    bodies = _batches()[:2]
    for prefix in ("q1/", "qn/"):
        _put_all(seaweed, s3_bucket, prefix, bodies)
        seaweed.client().put_object(Bucket=s3_bucket, Key=f"{prefix}day-9.parquet", Body=b"not parquet at all")
    here = _run(reference, f"s3://{s3_bucket}/q1/")
    there = _run(reference, f"s3://{s3_bucket}/qn/", dask=client.scheduler.address)
    assert here.is_completed() and there.is_completed(), (here.message, there.message)
    a, b = here.result(), there.result()
    assert a["verdict"] == b["verdict"] and _largest_difference(a["result"], b["result"]) < 1e-8
    assert [r["key"].replace("q1/", "") for r in a["rejected"]] == [r["key"].replace("qn/", "")
                                                                   for r in b["rejected"]] == ["day-9.parquet"]
    assert [r["reason"].replace("q1/", "") for r in a["rejected"]] == [r["reason"].replace("qn/", "")
                                                                      for r in b["rejected"]]      # the same reason
    for prefix in ("q1/", "qn/"):
        mark = json.loads(_get(seaweed, s3_bucket, f"{prefix}_labelshift/watermark.json"))
        assert sorted(mark["processed"]) == ["day-0.parquet", "day-1.parquet"]
        assert list(mark["rejected"]) == ["day-9.parquet"]
    assert _run(reference, f"s3://{s3_bucket}/qn/", dask=client.scheduler.address).name == "No new data"
    for prefix, dask in (("bad1/", None), ("badn/", client.scheduler.address)):
        seaweed.client().put_object(Bucket=s3_bucket, Key=f"{prefix}day-0.parquet", Body=b"not parquet either")
        state = _run(reference, f"s3://{s3_bucket}/{prefix}", **({"dask": dask} if dask else {}))
        assert state.name == "No valid data" and "day-0.parquet" in state.message, state.message
        mark = json.loads(_get(seaweed, s3_bucket, f"{prefix}_labelshift/watermark.json"))
        assert list(mark["rejected"]) == ["day-0.parquet"] and not mark["processed"]      # held, not counted
        assert _run(reference, f"s3://{s3_bucket}/{prefix}", **({"dask": dask} if dask else {})).name == "No new data"
    assert not _running(reference["tracking_uri"])
