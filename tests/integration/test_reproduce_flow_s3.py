"""The ``reproduce`` flow with everything on real servers: the object store on SeaweedFS S3, MLflow as a server
process whose artifacts go to S3 on the same SeaweedFS. Everything written is read back through boto3."""
from __future__ import annotations

import csv
import io

import pytest
from mlflow import MlflowClient

from flows.reproduce import reproduce

pytestmark = pytest.mark.integration

TINY = dict(experiments=["shift", "bins"], shift_values=[0.2, 0.5], bins_values=[2, 6], n_seeds=3, n_source=2000)


def _keys(client, bucket: str, prefix: str) -> set[str]:
    keys, token = set(), None
    while True:
        kw = dict(Bucket=bucket, Prefix=prefix, **({"ContinuationToken": token} if token else {}))
        page = client.list_objects_v2(**kw)
        keys |= {o["Key"] for o in page.get("Contents", [])}
        if not page.get("IsTruncated"):
            return keys
        token = page["NextContinuationToken"]


def test_reproduce_with_s3_store_and_mlflow_server(prefect_server, seaweed, s3_bucket, mlflow_s3_server):
    store_uri = f"s3://{s3_bucket}/labelshift"
    state = reproduce(**TINY, store=store_uri, tracking_uri=mlflow_s3_server.url, mlflow_experiment="test-s3",
                      return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    run_id = result["mlflow"]["run_id"]
    assert result["mlflow"]["ui"].startswith(mlflow_s3_server.url) and run_id in result["mlflow"]["ui"]
    s3 = seaweed.client()

    # the object store: tables, figures and summary under s3://bucket/labelshift/results/<run>/
    prefix = f"labelshift/results/{run_id}/"
    stored = _keys(s3, s3_bucket, prefix)
    assert {prefix + k for k in ("per_seed_shift.csv", "per_seed_bins.csv", "summary.json",
                                 "figures/mse_vs_shift.png", "figures/mse_vs_bins.png")} <= stored
    body = s3.get_object(Bucket=s3_bucket, Key=prefix + "per_seed_bins.csv")
    rows = list(csv.DictReader(io.StringIO(body["Body"].read().decode())))
    assert len(rows) == 2 * 3 * 2                           # 2 bin counts x 3 seeds x (MLLS-binned, MLLS-CM)
    assert len(body["Metadata"]["sha256"]) == 64            # the checksum travels with the object

    # MLflow's artifacts went through the server into the artifact bucket: read them with boto3, not MLflow
    exp_id = result["mlflow"]["experiment_id"]
    art_prefix = f"{mlflow_s3_server.artifact_prefix}/{exp_id}/{run_id}/artifacts/"
    artifacts = _keys(s3, mlflow_s3_server.artifact_bucket, art_prefix)
    assert {art_prefix + "figures/mse_vs_shift.png", art_prefix + "figures/mse_vs_bins.png",
            art_prefix + "tables/per_seed_shift.csv", art_prefix + "tables/summary.csv"} <= artifacts
    png = s3.get_object(Bucket=mlflow_s3_server.artifact_bucket, Key=art_prefix + "figures/mse_vs_bins.png")
    assert png["Body"].read(8) == b"\x89PNG\r\n\x1a\n"

    # and the tracking server has the runs with their curves
    client = MlflowClient(mlflow_s3_server.url)
    assert client.get_run(run_id).info.status == "FINISHED"
    children = client.search_runs([exp_id], filter_string=f"tags.mlflow.parentRunId = '{run_id}'")
    assert {r.data.tags["method"] for r in children} == {"BBSE-hard", "BBSE-soft", "RLLS", "MLLS-CM", "MLLS",
                                                          "MLLS-binned"}
    binned = next(r for r in children if r.data.tags["method"] == "MLLS-binned")
    assert [m.step for m in client.get_metric_history(binned.info.run_id, "bins/mse")] == [2, 6]
