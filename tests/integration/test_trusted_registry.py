"""A trusted registry (labelshift_mlflow.trusted, docs/serving.md): a model version's digest recorded at registration,
checked when ``labelshift estimate`` and the ``reestimate`` flow load it, against a real MLflow registry (SQLite, and
the session's MLflow server with its artifacts in S3). Each test starts with this process's model caches empty, as a
new command does: a process keeps the copy it checked, and later changes in the store do not reach it."""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
from mlflow import MlflowClient

from flows.cli import main
from runtime.environment import ENV_REQUIRE_TRUSTED
from labelshift_mlflow.trusted import DIGEST_TAG, version_digest
from tests.reestimation_support import SHIFTED_PRIOR, draw, npy_bytes, register_model

pytestmark = pytest.mark.integration

ALTERED = "was altered after it was trusted"


@pytest.fixture(autouse=True)
def fresh_loads():
    import labelshift_mlflow.registry as model_mod
    import labelshift_mlflow.references as references_mod

    def clear():
        model_mod._BUNDLES.clear()
        references_mod._CACHE.clear()

    clear()
    yield clear
    clear()


def _running(tracking_uri: str) -> list:
    client = MlflowClient(tracking_uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    return [r for r in client.search_runs(ids, filter_string="attributes.status = 'RUNNING'")]


def _estimate(home, model_uri: str, target, tracking_uri: str, *extra) -> list[str]:
    return ["estimate", "--home", str(home), "--model", model_uri, "--target", str(target), "--tracking-uri",
            tracking_uri, *extra]


def test_estimate_refuses_a_version_altered_after_it_was_trusted(prefect_server, mlflow_sqlite, tmp_path, capsys,
                                                                 fresh_loads):
    uri = mlflow_sqlite(tmp_path / "mlflow")
    model = register_model(uri, "trust-cli", n_holdout=3000)
    client = MlflowClient(uri)
    source = client.get_model_version("trust-cli", model["version"])
    assert source.tags[DIGEST_TAG] == version_digest(client, "trust-cli", model["version"]).value
    target = tmp_path / "incoming"
    target.mkdir()
    rng = np.random.default_rng(5)
    np.save(target / "day-1.npy", draw(SHIFTED_PRIOR, 3000, rng)[0])
    argv = _estimate(tmp_path / "home", model["model_uri"], target, uri, "--register-corrected")
    assert main([*argv, "--check"]) == 3                      # trusted: loaded, no warning
    assert "no recorded digest" not in capsys.readouterr().err

    # the corrected model records its own digest and the digest of the version it wraps
    corrected = client.get_model_version_by_alias("trust-cli-shift-corrected", "shift-corrected")
    assert corrected.tags["labelshift.source_digest"] == source.tags[DIGEST_TAG]
    assert corrected.tags[DIGEST_TAG] == version_digest(client, corrected.name, corrected.version).value

    # the calibrator beside the model overwritten in the artifact store after registration
    fresh_loads()
    root = Path(urlparse(client.get_run(model["run_id"]).info.artifact_uri).path)
    cal = root / "calibration" / "BCTS.json"
    cal.write_text(json.dumps(json.loads(cal.read_text())))         # the same calibrator, other bytes
    np.save(target / "day-2.npy", draw(SHIFTED_PRIOR, 3000, rng)[0])
    watermark = (target / "_labelshift" / "watermark.json").read_bytes()
    assert main(argv) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"{ALTERED}: run/calibration/BCTS.json changed" in err, err
    assert "labelshift reference trust models:/trust-cli/1" in err and "register a new version" in err
    assert (target / "_labelshift" / "watermark.json").read_bytes() == watermark
    assert not (target / "day-2.corrected.npy").exists()
    assert _running(uri) == []
    assert str(client.get_model_version_by_alias("trust-cli-shift-corrected", "shift-corrected").version) == "1"


def test_an_untrusted_version_warns_is_refused_when_required_and_loads_once_trusted(prefect_server, mlflow_sqlite,
                                                                                     tmp_path, capsys, caplog,
                                                                                     monkeypatch, fresh_loads):
    uri = mlflow_sqlite(tmp_path / "mlflow")
    model = register_model(uri, "untrusted", n_holdout=3000, trusted=False)
    target = tmp_path / "incoming"
    target.mkdir()
    rng = np.random.default_rng(6)
    np.save(target / "day-1.npy", draw(SHIFTED_PRIOR, 3000, rng)[0])
    argv = _estimate(tmp_path / "home", model["model_uri"], target, uri)
    assert main(argv) == 0                                     # loaded, with the warning in the run's log
    [warning] = [r.getMessage() for r in caplog.records if "no recorded digest" in r.getMessage()]
    assert "has no recorded digest (tag labelshift.digest): loading it unchecked" in warning
    assert "labelshift reference trust models:/untrusted/1" in warning and ENV_REQUIRE_TRUSTED in warning
    assert (target / "day-1.corrected.npy").exists()
    capsys.readouterr()

    fresh_loads()
    monkeypatch.setenv(ENV_REQUIRE_TRUSTED, "1")
    np.save(target / "day-2.npy", draw(SHIFTED_PRIOR, 3000, rng)[0])
    watermark = (target / "_labelshift" / "watermark.json").read_bytes()
    assert main(argv) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"is not trusted: it has no recorded digest (tag {DIGEST_TAG}), and {ENV_REQUIRE_TRUSTED}=1" in err
    assert (target / "_labelshift" / "watermark.json").read_bytes() == watermark
    assert not (target / "day-2.corrected.npy").exists() and _running(uri) == []

    # the operator reviews it and trusts it: the next load checks and accepts it
    assert main(["reference", "trust", model["model_uri"], "--home", str(tmp_path / "home"),
                 "--tracking-uri", uri]) == 0
    said = capsys.readouterr().out
    client = MlflowClient(uri)
    recorded = client.get_model_version("untrusted", "1").tags[DIGEST_TAG]
    assert f"trusted models:/untrusted/1: digest {recorded}" in said
    assert recorded == version_digest(client, "untrusted", "1").value
    assert main(argv) == 0
    assert (target / "day-2.corrected.npy").exists()


def test_the_flow_refuses_a_model_file_overwritten_in_s3(prefect_server, mlflow_s3_server, seaweed, s3_bucket,
                                                        fresh_loads):
    from flows.reestimate import reestimate

    name = f"trust-flow-{uuid.uuid4().hex[:6]}"
    model = register_model(mlflow_s3_server.url, name, n_holdout=2000)
    client = MlflowClient(mlflow_s3_server.url)
    mv = client.get_model_version(name, model["version"])
    s3 = seaweed.client()
    bucket, prefix = mlflow_s3_server.artifact_bucket, mlflow_s3_server.artifact_prefix
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", [])]
    model_id = mv.source.removeprefix("models:/")
    [weights] = [k for k in keys if model_id in k and k.endswith("data/model.pt2")]
    target, rng = f"s3://{s3_bucket}/trust-{name}/", np.random.default_rng(7)
    s3.put_object(Bucket=s3_bucket, Key=f"trust-{name}/day-1.npy", Body=npy_bytes(draw(SHIFTED_PRIOR, 2000, rng)[0]))
    first = reestimate(model=model["model_uri"], target=target, tracking_uri=mlflow_s3_server.url, return_state=True)
    assert first.is_completed(), first

    fresh_loads()
    original = s3.get_object(Bucket=bucket, Key=weights)["Body"].read()
    s3.put_object(Bucket=bucket, Key=weights, Body=original + b"\0")          # the weights replaced
    s3.put_object(Bucket=s3_bucket, Key=f"trust-{name}/day-2.npy", Body=npy_bytes(draw(SHIFTED_PRIOR, 2000, rng)[0]))

    def listing():
        return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix=f"trust-{name}/")
                      .get("Contents", []))

    before = listing()
    watermark = s3.get_object(Bucket=s3_bucket, Key=f"trust-{name}/_labelshift/watermark.json")["Body"].read()
    state = reestimate(model=model["model_uri"], target=target, tracking_uri=mlflow_s3_server.url, return_state=True)
    assert state.is_failed(), state
    message = " ".join((state.message or "").split())
    assert f"{ALTERED}: model/data/model.pt2 changed" in message, message
    assert f"labelshift reference trust models:/{name}/1" in message
    assert listing() == before
    assert s3.get_object(Bucket=s3_bucket, Key=f"trust-{name}/_labelshift/watermark.json")["Body"].read() == watermark
    assert _running(mlflow_s3_server.url) == []
