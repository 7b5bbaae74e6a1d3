"""The ``reestimate`` flow end to end on real parts: SeaweedFS S3, an MLflow server (artifacts proxied to S3), the
Prefect test server, and a deployment served by a separate process and started through the Prefect API.

The classifier is the Bayes-optimal linear model of a three-class 2-D Gaussian mixture
(:mod:`tests.reestimation_support`), registered with BCTS and its source holdout, so the true target prior of
every drawn batch is known.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from labelshift.estimation.diagnostics import correct_predictions
from tests.reestimation_support import K, SHIFTED_PRIOR, SOURCE_PRIOR, draw, npy_bytes, register_model

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MODEL_NAME = "reestimate-e2e"


@pytest.fixture(scope="module")
def registry(mlflow_s3_server):
    """The classifier registered as models:/reestimate-e2e@production through the MLflow server."""
    info = register_model(mlflow_s3_server.url, MODEL_NAME)
    return dict(info, tracking_uri=mlflow_s3_server.url)


def _put(seaweed, bucket: str, key: str, arr: np.ndarray) -> None:
    seaweed.client().put_object(Bucket=bucket, Key=key, Body=npy_bytes(arr))


def _keys(seaweed, bucket: str, prefix: str = "") -> list[str]:
    pages = seaweed.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _get(seaweed, bucket: str, key: str) -> bytes:
    return seaweed.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def _runs(tracking_uri: str, kind: str | None = None, target: str | None = None) -> list:
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("reestimation")
    if exp is None:
        return []
    filters = []
    if kind:
        filters.append(f"tags.`labelshift.kind` = '{kind}'")
    if target:
        filters.append(f"tags.`labelshift.target` = '{target}'")
    return client.search_runs([exp.experiment_id], filter_string=" and ".join(filters), max_results=1000)


def _run_flow(registry, target: str, **kw):
    from flows.reestimate import reestimate

    return reestimate(model=kw.pop("model", registry["model_uri"]), target=target,
                      tracking_uri=kw.pop("tracking_uri", registry["tracking_uri"]), return_state=True, **kw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_deployment(name: str, timeout: float = 180.0, proc=None):
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"the serving process exited with {proc.returncode}")
            try:
                return client.read_deployment_by_name(name)
            except Exception:
                time.sleep(1.0)
    raise AssertionError(f"deployment {name} did not appear within {timeout} s")


def test_deployment_processes_new_batches_once_writes_outputs_and_logs_the_drift(
        prefect_server, registry, seaweed, s3_bucket, tmp_path):
    from prefect.deployments import run_deployment

    rng = np.random.default_rng(11)
    target = f"s3://{s3_bucket}/target/"
    truth = {}
    for day in ("day-1", "day-2"):
        x, y = draw(SHIFTED_PRIOR, 2500, rng)
        _put(seaweed, s3_bucket, f"target/{day}.npy", x)
        truth[day] = (x, y)

    # the deployment is served by its own process, as `labelshift serve` or a worker would run it
    env = {**os.environ, **seaweed.env(), "PREFECT_API_URL": prefect_server,
           "MLFLOW_TRACKING_URI": registry["tracking_uri"], "PYTHONPATH": str(REPO),
           "PREFECT_RUNNER_POLL_FREQUENCY": "1"}          # each run picked up within 1 s, not Prefect's default 10
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "-c",
                             "from flows.reestimate import reestimate; reestimate.serve(name='e2e')"],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    # the label-shift test, like any test, fires by chance on some label-shifted draws (about 2% here); day-3 below
    # is one of them at 5% (p between 0.01 and 0.05), so this test of the deployment's bookkeeping gives the
    # label-shift test a level of its own, 1%, through the deployment's parameters; the no-shift test keeps the
    # default 5% (the shift, total variation 0.35, has p < 1e-16 at any level)
    params = {"model": registry["model_uri"], "target": target, "tracking_uri": registry["tracking_uri"],
              "label_shift_significance": 0.01}
    try:
        _wait_for_deployment("reestimate/e2e", proc=proc)
        first = run_deployment("reestimate/e2e", parameters=params, timeout=300)
        assert first.state.is_completed(), (first.state, (tmp_path / "serve.log").read_text()[-3000:])
        assert first.state.name == "Shifted"

        keys = _keys(seaweed, s3_bucket, "target/")
        for day in truth:
            assert f"target/{day}.corrected.npy" in keys and f"target/{day}.summary.json" in keys
        watermark = json.loads(_get(seaweed, s3_bucket, "target/_labelshift/watermark.json"))
        assert watermark["sequence"] == 1 and sorted(watermark["processed"]) == ["day-1.npy", "day-2.npy"]

        # the corrected predictions are p_t(y|x) ~ w_y f_y(x) with the reported w
        summary = json.loads(_get(seaweed, s3_bucket, "target/day-1.summary.json"))
        w = np.array(summary["result"]["weights"])
        corrected = np.load(__import__("io").BytesIO(_get(seaweed, s3_bucket, "target/day-1.corrected.npy")))
        x = truth["day-1"][0]
        from labelshift.calibration import load_calibrator   # the calibrator the flow applied, from MLflow
        client = MlflowClient(registry["tracking_uri"])
        cal_doc = json.loads(Path(client.download_artifacts(registry["run_id"], "calibration/BCTS.json",
                                                            str(tmp_path))).read_text())
        cal = load_calibrator(cal_doc["calibrator"])
        from tests.reestimation_support import bayes_logits
        expected = correct_predictions(cal.predict_proba(bayes_logits(x.astype(np.float64))), w)
        # float32 storage and float32 forward pass: agreement to ~1e-5
        np.testing.assert_allclose(corrected, expected, atol=1e-4)
        # the corrected predictions are more accurate on the shifted target than the source-calibrated ones: the
        # Bayes rule of the target prior gains 1.9 points here in the population (91.7% -> 93.6%, measured on 2e5
        # draws); on 2500 rows the gain of the same rows has sd ~ sqrt(0.02 / 2500) = 0.3 points: > 0.5 is 4.7 sd
        y = truth["day-1"][1]
        assert (corrected.argmax(1) == y).mean() > (bayes_logits(x).argmax(1) == y).mean() + 0.005

        # MLflow: one finished child run with the prior per class at step 1, the interval, the p-value, a figure
        target_url = summary["target"]
        (child,) = _runs(registry["tracking_uri"], "reestimation", target_url)
        assert child.info.status == "FINISHED"
        m = child.data.metrics
        assert m["no_shift_p_value"] < 0.05 and m["shifted"] == 1.0
        ci = summary["result"]["interval"]
        for c in range(K):
            assert m[f"prior_lower/{c}"] <= m[f"prior/{c}"] <= m[f"prior_upper/{c}"]
            # the metrics are the numbers of the summary written beside the batches
            assert (m[f"prior/{c}"], m[f"prior_lower/{c}"], m[f"prior_upper/{c}"]) == pytest.approx(
                (summary["result"]["target_prior"][c], ci["lower"][c], ci["upper"][c]), rel=1e-12)
        assert sum(m[f"prior/{c}"] for c in range(K)) == pytest.approx(1.0, abs=1e-9)
        artifacts = [a.path for a in client.list_artifacts(child.info.run_id, "figures")]
        assert "figures/target_prior.png" in artifacts
        (monitor,) = _runs(registry["tracking_uri"], "monitor", target_url)
        (point,) = client.get_metric_history(monitor.info.run_id, "prior/2")
        assert point.step == 1 and point.value == pytest.approx(m["prior/2"], abs=1e-6)   # rounded in the history

        # a third batch later is the only one processed next time
        x3, _ = draw(SHIFTED_PRIOR, 2000, rng)
        _put(seaweed, s3_bucket, "target/day-3.npy", x3)
        before = {k: _get(seaweed, s3_bucket, f"target/{k}.corrected.npy") for k in ("day-1", "day-2")}
        second = run_deployment("reestimate/e2e", parameters=params, timeout=300)
        assert second.state.is_completed(), second.state
        watermark = json.loads(_get(seaweed, s3_bucket, "target/_labelshift/watermark.json"))
        assert watermark["sequence"] == 2
        assert [h["batches"] for h in watermark["history"]] == [["day-1.npy", "day-2.npy"], ["day-3.npy"]]
        day3 = json.loads(_get(seaweed, s3_bucket, "target/day-3.summary.json"))["result"]
        assert day3["n_target"] == 2000
        # judged at its own level, 1%, the label-shift test lets day-3 through (at the law averaged over holdouts,
        # holdout_inflation = 1, its p-value was in [0.01, 0.05): 5% would have withheld its outputs; with the
        # holdout's error carried, kappa = 2, it is 0.42 -- the level's use is tested in tests/unit/inference)
        assert day3["significance"] == 0.05 and day3["label_shift_significance"] == 0.01
        assert day3["label_shift_test"]["p_value"] >= 0.01 and day3["label_shift_ok"] is True
        assert second.state.name == "Shifted" and "(test level 0.01)" in day3["label_shift_summary"]
        assert {k: _get(seaweed, s3_bucket, f"target/{k}.corrected.npy") for k in before} == before
        history = client.get_metric_history(monitor.info.run_id, "prior/2")
        assert sorted(p.step for p in history) == [1, 2]

        # nothing new: a third run says so and changes nothing
        third = run_deployment("reestimate/e2e", parameters=params, timeout=300)
        assert third.state.is_completed() and third.state.name == "No new data", third.state
        assert json.loads(_get(seaweed, s3_bucket, "target/_labelshift/watermark.json"))["sequence"] == 2
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_intervals_cover_the_true_prior_and_unshifted_data_is_not_flagged(prefect_server, registry, seaweed,
                                                                          s3_bucket):
    """Coverage over repeated draws, through the flow (in this process: the model is loaded once).

    10 draws x 3 classes = 30 (draw, class) pairs at a nominal 95%: about 28.5 are covered; a binomial sd is
    sqrt(30 * 0.95 * 0.05) = 1.2. The default (source-aware) interval includes the error of the 4000-row source
    holdout (about 0.4 of the target's own standard error here; the target-only Fisher interval, which ignores it,
    covers about 93%), and the classes of one draw are correlated, so the bound is set at 24 (80%): still a "clear
    majority", and far above what a too-narrow interval would give (half the width covers about 68%). The no-shift test at 5% on unshifted data: 8 draws flag
    0.4 on average; at most 2 is allowed (P(>= 3) = 0.6% at the nominal level).
    """
    rng = np.random.default_rng(2026)
    covered = 0
    for i in range(10):
        prefix = f"cov-{i}/"
        for part in range(2):
            x, _ = draw(SHIFTED_PRIOR, 1000, rng)
            _put(seaweed, s3_bucket, f"{prefix}part-{part}.npy", x)
        state = _run_flow(registry, f"s3://{s3_bucket}/{prefix}")
        assert state.is_completed(), state.message
        res = state.result()["result"]
        lo, hi = np.array(res["interval"]["lower"]), np.array(res["interval"]["upper"])
        covered += int(np.sum((lo <= SHIFTED_PRIOR) & (SHIFTED_PRIOR <= hi)))
        assert res["shifted"]                     # a shift of this size (TV 0.35) at m = 2000 is never missed
    print(f"coverage of the 95% source-aware intervals: {covered}/30")
    assert covered >= 24

    flagged = 0
    for i in range(8):
        x, _ = draw(SOURCE_PRIOR, 2000, rng)
        _put(seaweed, s3_bucket, f"same-{i}/batch.npy", x)
        state = _run_flow(registry, f"s3://{s3_bucket}/same-{i}/")
        assert state.is_completed(), state.message
        flagged += int(state.result()["result"]["shifted"])
        assert state.name in ("No shift", "Shifted")
    print(f"unshifted draws flagged at 5%: {flagged}/8")
    assert flagged <= 2


# -- bad input and faults: a clear failure, the store and the watermark unchanged, no MLflow run left RUNNING ----------
def _assert_clean_failure(state, registry, seaweed, bucket, prefix, before, match):
    assert state.is_failed(), state
    assert any(m.lower() in (state.message or "").lower() for m in match), state.message
    assert _keys(seaweed, bucket, prefix) == before            # nothing written, nothing removed
    running = [r for r in _runs(registry["tracking_uri"]) if r.info.status == "RUNNING"]
    assert running == []


def test_empty_and_missing_targets_fail_clearly(prefect_server, registry, seaweed, s3_bucket, tmp_path):
    state = _run_flow(registry, f"s3://{s3_bucket}/nothing-here/")
    _assert_clean_failure(state, registry, seaweed, s3_bucket, "", [], ["no target batch"])
    assert "NAME.npy, a float32 array of shape (n, 2) of this PyTorch model's inputs" in state.message
    assert "reference register" not in state.message, state.message
    missing = tmp_path / "no-such-folder"
    state = _run_flow(registry, str(missing))
    assert state.is_failed() and "batch" in state.message.lower(), state.message


@pytest.mark.parametrize("bad, words", [
    (np.zeros((50, 3), np.float32), ["shape"]),
    (np.zeros((50,), np.float32), ["shape"]),
    (np.zeros((50, 2), np.int64), ["dtype", "int64"]),
    (np.full((50, 2), np.nan, np.float32), ["finite", "nan"]),
])
def test_a_bad_batch_fails_a_strict_run_before_anything_is_written(prefect_server, registry, seaweed, s3_bucket, bad,
                                                                   words):
    rng = np.random.default_rng(5)
    _put(seaweed, s3_bucket, "t/good.npy", draw(SHIFTED_PRIOR, 500, rng)[0])
    _put(seaweed, s3_bucket, "t/zz-bad.npy", bad)
    before = _keys(seaweed, s3_bucket, "t/")
    state = _run_flow(registry, f"s3://{s3_bucket}/t/", on_invalid="error")
    _assert_clean_failure(state, registry, seaweed, s3_bucket, "t/", before, words)
    assert "zz-bad.npy" in state.message and "Nothing was counted" in state.message


def test_bad_batches_are_quarantined_all_named_and_the_run_goes_on(prefect_server, registry, seaweed, s3_bucket):
    """Default policy: every bad batch is named in one run (strict too), recorded as rejected and not counted; the
    good ones are counted; a later run leaves the rejected alone until their content changes."""
    rng = np.random.default_rng(15)
    _put(seaweed, s3_bucket, "q/good.npy", draw(SHIFTED_PRIOR, 600, rng)[0])
    _put(seaweed, s3_bucket, "q/bad-dtype.npy", np.zeros((50, 2), np.int64))
    _put(seaweed, s3_bucket, "q/bad-nan.npy", np.full((50, 2), np.nan, np.float32))
    seaweed.client().put_object(Bucket=s3_bucket, Key="q/bad-garbage.npy", Body=b"not an array")
    bad = ["bad-dtype.npy", "bad-garbage.npy", "bad-nan.npy"]
    target = f"s3://{s3_bucket}/q/"

    strict = _run_flow(registry, target, on_invalid="error")
    assert strict.is_failed() and all(k in strict.message for k in bad), strict.message

    state = _run_flow(registry, target)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["batches"] == ["good.npy"] and [r["key"] for r in summary["rejected"]] == bad
    assert "int64" in summary["rejected"][0]["reason"] and "NaN" in summary["rejected"][2]["reason"]
    watermark = json.loads(_get(seaweed, s3_bucket, "q/_labelshift/watermark.json"))
    assert list(watermark["processed"]) == ["good.npy"] and sorted(watermark["rejected"]) == bad
    assert watermark["history"][-1]["rejected"] == bad
    child = MlflowClient(registry["tracking_uri"]).get_run(summary["mlflow"]["run_id"])
    assert child.data.metrics["n_rejected"] == 3 and child.data.params["on_invalid"] == "quarantine"
    assert child.data.tags["labelshift.rejected"] == ", ".join(bad)
    from flows.cli.estimate import format_summary
    from flows.reestimate import summary_markdown

    for text in (summary_markdown(summary), format_summary(summary)):
        assert all(k in text for k in bad) and "rejected" in text.lower()

    again = _run_flow(registry, target)
    assert again.name == "No new data" and "3 batch(es) rejected earlier" in again.message
    assert "3 batch(es) rejected earlier are left alone" in format_summary(again.result())     # the CLI says it too

    seaweed.client().delete_object(Bucket=s3_bucket, Key="q/bad-dtype.npy")
    _put(seaweed, s3_bucket, "q/bad-nan.npy", draw(SHIFTED_PRIOR, 300, rng)[0])      # fixed: new content
    fixed = _run_flow(registry, target)
    assert fixed.is_completed() and fixed.result()["batches"] == ["bad-nan.npy"], fixed.message
    watermark = json.loads(_get(seaweed, s3_bucket, "q/_labelshift/watermark.json"))
    assert sorted(watermark["processed"]) == ["bad-nan.npy", "good.npy"]
    assert list(watermark["rejected"]) == ["bad-garbage.npy"]
    assert [h["batches"] for h in watermark["history"]] == [["good.npy"], ["bad-nan.npy"]]


def test_only_bad_batches_is_no_valid_data_and_the_rejections_are_recorded(prefect_server, registry, seaweed,
                                                                           s3_bucket):
    seaweed.client().put_object(Bucket=s3_bucket, Key="n/a.npy", Body=b"garbage")
    _put(seaweed, s3_bucket, "n/b.npy", np.zeros((10, 5), np.float32))
    state = _run_flow(registry, f"s3://{s3_bucket}/n/")
    assert state.is_completed() and state.name == "No valid data", state.message
    assert "a.npy" in state.message and "b.npy" in state.message and "fix" in state.message
    summary = state.result()
    assert [r["key"] for r in summary["rejected"]] == ["a.npy", "b.npy"]
    watermark = json.loads(_get(seaweed, s3_bucket, "n/_labelshift/watermark.json"))
    assert watermark["processed"] == {} and sorted(watermark["rejected"]) == ["a.npy", "b.npy"]
    run = MlflowClient(registry["tracking_uri"]).get_run(summary["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.data.metrics["n_rejected"] == 2
    assert _run_flow(registry, f"s3://{s3_bucket}/n/").name == "No new data"


def test_missing_alias_wrong_calibrator_and_unreachable_services(prefect_server, registry, seaweed, s3_bucket,
                                                                 monkeypatch):
    rng = np.random.default_rng(6)
    _put(seaweed, s3_bucket, "t/b.npy", draw(SHIFTED_PRIOR, 300, rng)[0])
    before = _keys(seaweed, s3_bucket, "t/")
    target = f"s3://{s3_bucket}/t/"

    state = _run_flow(registry, target, model=f"models:/{MODEL_NAME}@no-such-alias")
    _assert_clean_failure(state, registry, seaweed, s3_bucket, "t/", before, ["no alias 'no-such-alias'"])
    assert "production" in state.message                      # the aliases that do exist

    state = _run_flow(registry, target, model="models:/no-such-model@production")
    _assert_clean_failure(state, registry, seaweed, s3_bucket, "t/", before, ["no registered model"])

    bad = register_model(registry["tracking_uri"], f"reestimate-badcal-{uuid.uuid4().hex[:6]}",
                         calibrator_classes=4, n_holdout=300)
    state = _run_flow(registry, target, model=bad["model_uri"])
    _assert_clean_failure(state, registry, seaweed, s3_bucket, "t/", before, ["4 classes"])

    state = _run_flow(registry, target, tracking_uri=f"http://127.0.0.1:{_free_port()}")
    _assert_clean_failure(state, registry, seaweed, s3_bucket, "t/", before, ["not reachable"])

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{_free_port()}")
    state = _run_flow(registry, target)
    assert state.is_failed() and "S3 endpoint" in state.message and "did not answer" in state.message, \
        state.message
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", seaweed.endpoint)
    assert _keys(seaweed, s3_bucket, "t/") == before


def test_a_crash_between_outputs_and_watermark_loses_and_double_counts_nothing(prefect_server, registry, seaweed,
                                                                               s3_bucket, monkeypatch):
    import flows.reestimate as flow_module

    rng = np.random.default_rng(7)
    for day in ("a", "b"):
        _put(seaweed, s3_bucket, f"crash/{day}.npy", draw(SHIFTED_PRIOR, 800, rng)[0])
    target = f"s3://{s3_bucket}/crash/"

    def crash(*args, **kwargs):
        raise RuntimeError("injected crash after the outputs were written")

    original = flow_module.commit_watermark
    monkeypatch.setattr(flow_module, "commit_watermark", crash)
    state = _run_flow(registry, target)
    assert state.is_failed() and "injected crash" in state.message
    keys = _keys(seaweed, s3_bucket, "crash/")
    assert "crash/a.corrected.npy" in keys and "crash/b.summary.json" in keys     # outputs were written ...
    assert "crash/_labelshift/watermark.json" not in keys                         # ... the watermark was not
    first_outputs = {k: _get(seaweed, s3_bucket, k) for k in keys if k.endswith(".corrected.npy")}
    failed = [r for r in _runs(registry["tracking_uri"], "reestimation") if r.info.status == "FAILED"
              and r.data.tags.get("labelshift.target", "").rstrip("/").endswith(f"{s3_bucket}/crash")]
    assert len(failed) == 1 and "injected crash" in failed[0].data.tags["error"]
    monitor_id = failed[0].data.tags["mlflow.parentRunId"]
    client = MlflowClient(registry["tracking_uri"])
    assert client.get_metric_history(monitor_id, "prior/0") == []                 # no point for the failed run

    monkeypatch.setattr(flow_module, "commit_watermark", original)
    state = _run_flow(registry, target)
    assert state.is_completed(), state.message
    watermark = json.loads(_get(seaweed, s3_bucket, "crash/_labelshift/watermark.json"))
    assert watermark["sequence"] == 1 and sorted(watermark["processed"]) == ["a.npy", "b.npy"]
    assert [h["batches"] for h in watermark["history"]] == [["a.npy", "b.npy"]]
    assert state.result()["result"]["n_target"] == 1600                            # each row counted once
    assert {k: _get(seaweed, s3_bucket, k) for k in first_outputs} == first_outputs  # rewritten, identical
    assert [p.step for p in client.get_metric_history(monitor_id, "prior/0")] == [1]
    state = _run_flow(registry, target)
    assert state.name == "No new data"


def test_a_failure_after_the_watermark_moved_does_not_fail_the_run_and_the_next_run_fills_the_series(
        prefect_server, registry, seaweed, s3_bucket, monkeypatch):
    """Once the watermark counts the batches, a retry would find no new data: so MLflow trouble after the commit must
    not fail the run, and the point the monitor run missed is added by the next run (from the watermark's history)."""
    import flows.reestimate as flow_module

    rng = np.random.default_rng(8)
    _put(seaweed, s3_bucket, "late/a.npy", draw(SHIFTED_PRIOR, 800, rng)[0])
    target = f"s3://{s3_bucket}/late/"
    original = flow_module.sync_monitor

    def unreachable(*args, **kwargs):
        raise ConnectionError("MLflow went away after the commit (injected)")

    monkeypatch.setattr(flow_module, "sync_monitor", unreachable)
    state = _run_flow(registry, target)
    assert state.is_completed(), state.message
    summary = state.result()
    assert any("injected" in w for w in summary["warnings"])
    watermark = json.loads(_get(seaweed, s3_bucket, "late/_labelshift/watermark.json"))
    assert watermark["sequence"] == 1
    client = MlflowClient(registry["tracking_uri"])
    monitor_id = summary["mlflow"]["monitor_run_id"]
    assert client.get_metric_history(monitor_id, "prior/0") == []
    assert client.get_run(summary["mlflow"]["run_id"]).info.status == "FINISHED"

    monkeypatch.setattr(flow_module, "sync_monitor", original)
    _put(seaweed, s3_bucket, "late/b.npy", draw(SHIFTED_PRIOR, 800, rng)[0])
    state = _run_flow(registry, target)
    assert state.is_completed() and state.result()["warnings"] == []
    points = {p.step: p.value for p in client.get_metric_history(monitor_id, "prior/0")}
    history = json.loads(_get(seaweed, s3_bucket, "late/_labelshift/watermark.json"))["history"]
    assert points == {h["sequence"]: pytest.approx(h["target_prior"][0]) for h in history}
    assert sorted(points) == [1, 2]


# -- the source-aware interval and the label-shift test ------------------------------------------------------------
def _artifact(state) -> str:
    """The markdown of the run's ``reestimate`` artifact, read back from the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["reestimate"]),
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    assert len(found) == 1
    return found[0].data


def test_label_shift_is_shifted_with_source_aware_intervals_and_a_new_class_is_not_label_shift(
        prefect_server, registry, seaweed, s3_bucket):
    """True label shift: Shifted, the default (source-aware) interval, the label-shift test passed, outputs written.
    A class the model never saw (a tight cluster at the centre of the three classes, 20% of the rows): "Not label
    shift" with its evidence in the summary, the Prefect artifact and MLflow; no corrected outputs; the batch
    counted in the watermark; the monitor run gets the test's p-value and no prior."""
    rng = np.random.default_rng(11)
    client = MlflowClient(registry["tracking_uri"])
    x, _ = draw(SHIFTED_PRIOR, 3000, rng)
    _put(seaweed, s3_bucket, "lst/day-1.npy", x)
    target = f"s3://{s3_bucket}/lst/"
    state = _run_flow(registry, target)
    assert state.is_completed() and state.name == "Shifted", state.message
    summary = state.result()
    res = summary["result"]
    assert res["interval"]["method"] == "source-aware" and res["interval"]["n_source"] == 4000
    assert res["label_shift_ok"] is True and res["label_shift_summary"].startswith("Consistent with label shift")
    lo, hi = np.array(res["interval"]["lower"]), np.array(res["interval"]["upper"])
    assert np.all(lo <= SHIFTED_PRIOR + 0.05) and np.all(SHIFTED_PRIOR - 0.05 <= hi)
    assert "lst/day-1.corrected.npy" in _keys(seaweed, s3_bucket, "lst/")
    child = client.get_run(summary["mlflow"]["run_id"])
    assert child.data.tags["labelshift.verdict"] == "Shifted" and child.data.metrics["label_shift_ok"] == 1.0
    assert "- interval: source-aware (includes the labelled holdout's error" in _artifact(state)
    # what the shift costs, in the verdict text, the artifact and MLflow (child run and monitor series)
    acc = res["accuracy"]
    assert f"accuracy estimated {acc['expected']:.2f} [{acc['lower']:.2f}, {acc['upper']:.2f}], " \
           f"{acc['source']:.2f} on the source" in summary["headline"]
    assert "What the shift costs in accuracy" in _artifact(state)
    assert child.data.metrics["accuracy_expected"] == pytest.approx(acc["expected"])
    monitor = client.get_run(summary["mlflow"]["monitor_run_id"])
    assert monitor.data.metrics["accuracy_expected"] == pytest.approx(acc["expected"], abs=1e-6)

    x, _ = draw(SOURCE_PRIOR, 2400, rng)
    _put(seaweed, s3_bucket, "lst/day-2.npy",
         np.concatenate([x, 0.3 * rng.standard_normal((600, 2)).astype(np.float32)]))
    state = _run_flow(registry, target)
    assert state.is_completed() and state.name == "Not label shift", state.message
    summary = state.result()
    res = summary["result"]
    assert summary["verdict"] == "Not label shift" and res["label_shift_ok"] is False
    assert summary["headline"].startswith("The new data are not label-shifted source data (Not label shift: p = ")
    assert "(regions chi2 = " in summary["headline"] and "log-odds profiles p = " in summary["headline"]
    assert "% of target vs " in summary["headline"] and "no corrected outputs were written" in summary["headline"]
    lst = res["label_shift_test"]
    assert lst["p_value"] < 1e-6 and lst["dof"] >= 2 and lst["disagreeing"]
    # the regions where the target disagrees: more rows than the reweighted holdout explains
    assert max(r["z"] for r in lst["disagreeing"]) > 4
    # no corrected outputs, the batch counted
    keys = _keys(seaweed, s3_bucket, "lst/")
    assert "lst/day-2.corrected.npy" not in keys and "lst/day-2.summary.json" not in keys
    assert summary["outputs"] == [] and "on_changed='reprocess'" in summary["outputs_withheld"]
    watermark = json.loads(_get(seaweed, s3_bucket, "lst/_labelshift/watermark.json"))
    assert "day-2.npy" in watermark["processed"] and watermark["history"][-1]["verdict"] == "Not label shift"
    # the Prefect artifact: the summary line and the table of disagreeing regions
    md = _artifact(state)
    assert md.startswith("# 🚫 Not label shift: ") and "- label-shift test: Not label shift: p = " in md
    assert "| region | target fraction | expected under label shift | z |" in md
    assert f"| {lst['disagreeing'][0]['name']} | " in md and "**No corrected outputs were written:**" in md
    # MLflow: the metrics, the tag and the test's JSON; the monitor run's point is the p-value, without a prior
    child = client.get_run(summary["mlflow"]["run_id"])
    assert child.data.tags["labelshift.verdict"] == "Not label shift"
    assert child.data.metrics["label_shift_dof"] == lst["dof"] and child.data.metrics["label_shift_ok"] == 0.0
    assert child.data.metrics["label_shift_statistic"] == pytest.approx(lst["statistic"])
    assert "label_shift_p_value" in child.data.metrics and "label_shift_p_value_log_odds" in child.data.metrics
    doc = json.loads(Path(client.download_artifacts(child.info.run_id, "reestimation/label_shift_test.json",
                                                    str(Path(os.environ.get("TMPDIR", "/tmp"))
                                                        / uuid.uuid4().hex))).read_text())
    assert doc["ok"] is False and doc["statistic"] == pytest.approx(lst["statistic"])
    monitor = summary["mlflow"]["monitor_run_id"]
    assert [p.step for p in client.get_metric_history(monitor, "label_shift_p_value")] == [1, 2]
    assert [p.step for p in client.get_metric_history(monitor, "prior/0")] == [1]      # no prior for run 2
