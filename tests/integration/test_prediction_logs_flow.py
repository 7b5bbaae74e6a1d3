"""Re-estimation for a scikit-learn deployment end to end on SeaweedFS S3, an MLflow server and Prefect: prediction
logs as Parquet against a registered reference, tabular inputs scored by a registered sklearn model, and bad input
failing clearly with the store and the watermark as they were.

Data: scikit-learn's 8x8 digits (offline). A logistic regression is trained on 500 images; the other 1,297 form a
pool. The labelled holdout (its outputs make the reference) and the target rows are both drawn *with replacement*
from that pool, the holdout uniformly, the target by class at a known shifted prior, each class's images uniformly:
both are then independent draws from one distribution per class (the pool's), so label shift holds exactly, repeated
images and all.
"""
from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient

pytestmark = pytest.mark.integration

NAMES = [f"digit-{d}" for d in range(10)]
SHIFTED = np.array([0.3, 0.02, 0.02, 0.02, 0.02, 0.3, 0.02, 0.02, 0.02, 0.26])


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    x, y = x[order] / 16.0, y[order]
    model = LogisticRegression(max_iter=2000).fit(x[:500], y[:500])
    pool_x, pool_y = x[500:], y[500:]
    hold = rng.choice(len(pool_y), size=900, replace=True)
    return {"model": model, "hold": (pool_x[hold], pool_y[hold]), "test": (pool_x, pool_y)}


def _shifted(digits, n, seed):
    x, y = digits["test"]
    rng = np.random.default_rng(seed)
    cls = rng.choice(10, size=n, p=SHIFTED)
    idx = np.array([rng.choice(np.flatnonzero(y == c)) for c in cls])
    return x[idx], y[idx]


def _parquet(table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table(table), buf)
    return buf.getvalue()


def _keys(seaweed, bucket, prefix):
    pages = seaweed.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _get(seaweed, bucket, key) -> bytes:
    return seaweed.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def _put(seaweed, bucket, key, body: bytes) -> None:
    seaweed.client().put_object(Bucket=bucket, Key=key, Body=body)


def _run(model_uri, tracking_uri, target, **options):
    """The flow at a 1% level, its label-shift test at 0.1%: label shift holds exactly (module docstring), and at
    these levels a chance rejection stays out of tests of the prediction-log plumbing (the verdict itself is tested
    in test_label_shift_test.py and test_reestimate_flow.py). (When the holdout came from other images than the
    target's pool, the test rightly saw the pool's own deviation from the holdout, magnified by the repeats.)"""
    from flows.reestimate import reestimate

    return reestimate(model=model_uri, target=target, tracking_uri=tracking_uri, significance=0.01,
                      label_shift_significance=0.001, return_state=True, **options)


@pytest.fixture(scope="module")
def reference(mlflow_s3_server, digits):
    from labelshift_mlflow import register_reference

    x, y = digits["hold"]
    logits = digits["model"].decision_function(x)
    info = register_reference(logits, [NAMES[v] for v in y], name="digits-logs", class_names=NAMES,
                              output_kind="logits", tracking_uri=mlflow_s3_server.url)
    return dict(info, tracking_uri=mlflow_s3_server.url)


def _log_batch(digits, n, seed):
    x, _ = _shifted(digits, n, seed)
    logits = digits["model"].decision_function(x).astype(np.float32)
    return {"request_id": [f"r{seed}-{i}" for i in range(n)], **{c: logits[:, j] for j, c in enumerate(NAMES)},
            "ts": np.arange(n)}


def test_prediction_logs_as_parquet_are_reestimated_with_class_names(prefect_server, reference, digits, seaweed,
                                                                     s3_bucket):
    from labelshift_mlflow import load_reference

    ref = load_reference(reference["model_uri"], tracking_uri=reference["tracking_uri"])
    assert ref.mode == "outputs" and ref.model is None and list(ref.class_names) == NAMES
    # the reference is a pyfunc whose predict applies the calibrator
    import mlflow.pyfunc

    mlflow.set_tracking_uri(reference["tracking_uri"])
    pyfunc = mlflow.pyfunc.load_model(reference["model_uri"])
    x, _ = digits["hold"]
    out = pyfunc.predict(np.asarray(digits["model"].decision_function(x[:4])))
    assert list(out.columns) == NAMES and np.allclose(out.to_numpy().sum(1), 1)

    for day in (1, 2):
        table = _log_batch(digits, 600, day)
        table["id"] = table.pop("request_id")
        _put(seaweed, s3_bucket, f"logs/2026/11/2{day}/part-0.parquet", _parquet(table))
    state = _run(reference["model_uri"], reference["tracking_uri"], f"s3://{s3_bucket}/logs/")
    assert state.is_completed() and state.name == "Shifted", state.message
    summary = state.result()
    assert summary["classes"] == NAMES and summary["model"]["mode"] == "outputs"
    prior = np.array(summary["result"]["target_prior"])
    assert np.abs(prior - SHIFTED).sum() / 2 < 0.08, prior
    assert "digit-0" in summary["headline"] or "digit-5" in summary["headline"] or "digit-9" in summary["headline"]
    # this holdout was drawn with replacement (its rows tie): ties cannot be told from repeats, and the report says so
    assert not summary["result"]["repeats"]["handled"]
    assert "counted as independent" in summary["result"]["repeats_summary"]

    keys = _keys(seaweed, s3_bucket, "logs/")
    assert "logs/2026/11/21/part-0.corrected.parquet" in keys and "logs/_labelshift/watermark.json" in keys
    corrected = pq.read_table(io.BytesIO(_get(seaweed, s3_bucket, "logs/2026/11/21/part-0.corrected.parquet")))
    assert corrected.column_names == ["id", *NAMES]
    assert corrected.column("id").to_pylist()[:2] == ["r1-0", "r1-1"]
    assert np.allclose(np.column_stack([corrected.column(c).to_numpy() for c in NAMES]).sum(1), 1, atol=1e-5)
    batch_summary = json.loads(_get(seaweed, s3_bucket, "logs/2026/11/21/part-0.summary.json"))
    assert batch_summary["output"]["key"].endswith(".corrected.parquet")

    run = MlflowClient(reference["tracking_uri"]).get_run(summary["mlflow"]["run_id"])
    assert "prior/digit-5" in run.data.metrics and "prior/5" not in run.data.metrics
    from flows.reestimate import summary_markdown

    assert "| digit-5 |" in summary_markdown(summary)

    state = _run(reference["model_uri"], reference["tracking_uri"], f"s3://{s3_bucket}/logs/")
    assert state.name == "No new data"

    # an empty target names a reference's batches: its outputs' columns by class name, nothing about inputs
    state = _run(reference["model_uri"], reference["tracking_uri"], f"s3://{s3_bucket}/logs-empty/")
    assert state.is_failed() and "no target batch under" in state.message, state.message
    assert "the model's logged outputs (logits): one float column per class named 'digit-0'" in state.message
    assert "input" not in state.message and "simulate-target" not in state.message, state.message


def test_a_sklearn_model_scores_tabular_parquet_batches(prefect_server, mlflow_s3_server, digits, seaweed,
                                                        s3_bucket):
    import pandas as pd

    from labelshift_mlflow import register_sklearn_model

    columns = [f"px{i}" for i in range(64)]
    x, y = digits["hold"]
    info = register_sklearn_model(digits["model"], pd.DataFrame(x, columns=columns), y, name="digits-sklearn",
                                  tracking_uri=mlflow_s3_server.url)
    # an empty target names this model's batches: its input columns, not outputs, .npy images or the demo
    state = _run(info["model_uri"], mlflow_s3_server.url, f"s3://{s3_bucket}/tab-empty/")
    assert state.is_failed() and "no target batch under" in state.message, state.message
    assert "NAME.parquet with this scikit-learn model's input columns 'px0', 'px1'" in state.message, state.message
    assert "(64 in all)" in state.message and "simulate-target" not in state.message, state.message
    xs, _ = _shifted(digits, 800, 7)
    _put(seaweed, s3_bucket, "tab/a.parquet", _parquet({c: xs[:, i] for i, c in enumerate(columns)}))
    state = _run(info["model_uri"], mlflow_s3_server.url, f"s3://{s3_bucket}/tab/")
    assert state.is_completed() and state.name == "Shifted", state.message
    summary = state.result()
    assert summary["model"]["mode"] == "sklearn" and summary["classes"] == [str(d) for d in range(10)]
    prior = np.array(summary["result"]["target_prior"])
    assert np.abs(prior - SHIFTED).sum() / 2 < 0.1, prior
    corrected = pq.read_table(io.BytesIO(_get(seaweed, s3_bucket, "tab/a.corrected.parquet")))
    assert corrected.column_names == [str(d) for d in range(10)]

    # columns checked against the signature before anything is written
    _put(seaweed, s3_bucket, "tab/b.parquet", _parquet({c.upper(): xs[:, i] for i, c in enumerate(columns)}))
    before = {k: _get(seaweed, s3_bucket, k) for k in _keys(seaweed, s3_bucket, "tab/")}
    state = _run(info["model_uri"], mlflow_s3_server.url, f"s3://{s3_bucket}/tab/", on_invalid="error")
    assert state.is_failed()
    assert "tab/b.parquet" in state.message and "'px0' is there as 'PX0'" in state.message, state.message
    assert {k: _get(seaweed, s3_bucket, k) for k in _keys(seaweed, s3_bucket, "tab/")} == before


def test_a_model_logged_with_mlflow_alone_is_told_how_to_register_it(prefect_server, mlflow_s3_server, digits,
                                                                     seaweed, s3_bucket):
    """A scikit-learn model logged and registered with MLflow alone has no calibrator and no holdout beside it: the
    run fails naming register_sklearn_model and the prediction-log way, not a calibrator file to pick."""
    import mlflow
    import pandas as pd

    columns = [f"px{i}" for i in range(64)]
    mlflow.set_tracking_uri(mlflow_s3_server.url)
    with mlflow.start_run():
        mlflow.sklearn.log_model(digits["model"], name="model", registered_model_name="digits-plain",
                                 input_example=pd.DataFrame(digits["hold"][0][:2], columns=columns))
    xs, _ = _shifted(digits, 100, 3)
    _put(seaweed, s3_bucket, "plain/a.parquet", _parquet({c: xs[:, i] for i, c in enumerate(columns)}))
    state = _run("models:/digits-plain/1", mlflow_s3_server.url, f"s3://{s3_bucket}/plain/")
    assert state.is_failed(), state
    assert "is a scikit-learn model logged without what re-estimation needs" in state.message, state.message
    assert "register_sklearn_model(model, holdout_x, holdout_y" in state.message, state.message
    assert "`labelshift reference register --holdout FILE" in state.message, state.message
    assert _keys(seaweed, s3_bucket, "plain/") == ["plain/a.parquet"]


def _bad_cases(digits):
    good = _log_batch(digits, 100, 50)
    logits = np.column_stack([good[c] for c in NAMES])
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    nan = dict(good)
    nan["digit-3"] = good["digit-3"].copy()
    nan["digit-3"][4] = np.nan
    renamed = {("Digit 4" if k == "digit-4" else k): v for k, v in good.items()}
    eleven = {"out": pa.array([list(r) + [0.0] for r in logits], type=pa.list_(pa.float32()))}
    return {
        "renamed": (_parquet(renamed), "bad.parquet", ["no column for class(es) 'digit-4'", "Digit 4"]),
        "classes": (_parquet(eleven), "bad.parquet", ["11 values", "10 classes"]),
        "probabilities-declared-logits": (_parquet({c: p[:, j] for j, c in enumerate(NAMES)}), "bad.parquet",
                                          ["probabilities", "--outputs probabilities"]),
        "nan": (_parquet(nan), "bad.parquet", ["NaN or infinite", "first row 4"]),
        "mixed": (np.save(buf := io.BytesIO(), logits) or buf.getvalue(), "bad.npy", ["mix formats", "one format"]),
    }


@pytest.mark.parametrize("case", ["renamed", "classes", "probabilities-declared-logits", "nan", "mixed"])
def test_bad_prediction_logs_fail_naming_batch_and_fix_with_store_and_watermark_unchanged(
        prefect_server, reference, digits, seaweed, s3_bucket, case):
    prefix = f"bad-{case}/"
    _put(seaweed, s3_bucket, prefix + "first.parquet", _parquet(_log_batch(digits, 300, 40)))
    assert _run(reference["model_uri"], reference["tracking_uri"], f"s3://{s3_bucket}/{prefix}").is_completed()
    body, name, words = _bad_cases(digits)[case]
    _put(seaweed, s3_bucket, prefix + "second.parquet", _parquet(_log_batch(digits, 300, 41)))
    _put(seaweed, s3_bucket, prefix + name, body)
    before = {k: _get(seaweed, s3_bucket, k) for k in _keys(seaweed, s3_bucket, prefix)}
    state = _run(reference["model_uri"], reference["tracking_uri"], f"s3://{s3_bucket}/{prefix}", on_invalid="error")
    assert state.is_failed(), state
    assert name in state.message and all(w in state.message for w in words), state.message
    assert {k: _get(seaweed, s3_bucket, k) for k in _keys(seaweed, s3_bucket, prefix)} == before
    if case == "mixed":
        return                   # a target mixing formats is refused whole, whatever the policy
    # the default policy: the bad batch is quarantined with the same reason, the good one is counted
    state = _run(reference["model_uri"], reference["tracking_uri"], f"s3://{s3_bucket}/{prefix}")
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["batches"] == ["second.parquet"], summary["batches"]
    assert [r["key"] for r in summary["rejected"]] == [name]
    assert all(w in summary["rejected"][0]["reason"] for w in words), summary["rejected"]


def test_a_reference_without_class_names_or_with_an_empty_class_is_refused(mlflow_s3_server, digits):
    from labelshift.errors import InputError
    from labelshift_mlflow import register_reference

    x, y = digits["hold"]
    logits = digits["model"].decision_function(x)
    with pytest.raises(InputError, match="no class names"):
        register_reference(logits, y, name="nameless", class_names=None, output_kind="logits",
                           tracking_uri=mlflow_s3_server.url)
    with pytest.raises(InputError, match="no example of class"):
        register_reference(logits[y != 7], y[y != 7], name="no-sevens", class_names=NAMES, output_kind="logits",
                           tracking_uri=mlflow_s3_server.url)


# -- estimates per segment -------------------------------------------------------------------------------------------
#: three segments of the logs: two assessed, one under the minimum size (200)
SEGMENTS = {"north": 500, "south": 400, "tiny": 60}


def _segmented_logs(digits) -> tuple[dict, np.ndarray, np.ndarray]:
    """Two Parquet batches whose rows carry a 'region' column, the segments interleaved; returns the batches (key ->
    table) and, in the pooled order of the flow (the batches sorted by key, rows in order), every row's region and
    float32 logits."""
    x, _ = _shifted(digits, sum(SEGMENTS.values()), 60)
    logits = digits["model"].decision_function(x).astype(np.float32)
    regions = np.random.default_rng(61).permutation(np.repeat(list(SEGMENTS), list(SEGMENTS.values())))
    half = len(regions) // 2
    batches = {}
    for key, sl in (("a.parquet", slice(0, half)), ("b.parquet", slice(half, None))):
        batches[key] = {"region": regions[sl].tolist(), **{c: logits[sl, j] for j, c in enumerate(NAMES)}}
    return batches, regions, logits


def _experiment_runs(tracking_uri: str) -> list:
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("reestimation")
    return [] if exp is None else client.search_runs([exp.experiment_id], max_results=1000)


def test_estimates_per_segment_equal_assess_shift_on_each_segments_rows(prefect_server, reference, digits, seaweed,
                                                                         s3_bucket, monkeypatch):
    from labelshift import AssessmentSettings, Holdout, Target, assess_shift
    from labelshift.inference import segments as segments_mod
    from labelshift.inference.multiplicity import holm
    from labelshift_mlflow import load_reference
    from tasks.reestimation.assessment import estimate_shift

    batches, regions, logits = _segmented_logs(digits)
    for key, table in batches.items():
        _put(seaweed, s3_bucket, f"seg/{key}", _parquet(table))
    # the segments on two worker processes (automatic would assess these few rows in the tasks' threads): the
    # same numbers as assess_shift in this process, below; the workers the pool ran are counted when it closes
    workers, close = [], segments_mod.SegmentPool.close

    def counting_close(pool, cancel=False):
        workers.append(0 if pool._executor is None else len(pool._executor._processes))
        close(pool, cancel)

    monkeypatch.setattr(segments_mod.SegmentPool, "close", counting_close)
    state = _run(reference["model_uri"], reference["tracking_uri"], f"s3://{s3_bucket}/seg/", segment_column="region",
                 segment_processes=2)
    assert state.is_completed(), state.message
    assert workers == [2]
    summary = state.result()
    seg = summary["segments"]
    assert seg["column"] == "region" and seg["min_size"] == 200
    items = {item["name"]: item for item in seg["items"]}
    assert list(items) == sorted(SEGMENTS)
    assert items["tiny"]["too_small"] and items["tiny"]["rows"] == 60 and "60 rows" in items["tiny"]["reason"]

    bundle = load_reference(reference["model_uri"], tracking_uri=reference["tracking_uri"])
    probs = bundle.calibrator.predict_proba(logits.astype(np.float64)).astype(np.float32)   # as the flow keeps them
    settings = AssessmentSettings(significance=0.01, label_shift_significance=0.001)
    holdout = Holdout(bundle.source_probs, bundle.source_labels, bundle.source_prior, outputs=bundle.source_outputs,
                      calibrator=bundle.calibrator, class_names=NAMES)
    # the run calibrated its rows chunk by chunk and assessed each segment in a worker process (BLAS on one thread);
    # here the whole target is calibrated at once, in this process: the float64 probabilities differ by rounding
    # (relative eps, mostly absorbed by the float32 cast), the MLLS solve stops at its certified duality gap (1e-10,
    # weights to about 1e-8), and the intervals, tests and accuracy are smooth in the estimate: rel 1e-7
    close = dict(rel=1e-7, abs=1e-10)
    for name in ("north", "south"):
        rows = np.flatnonzero(regions == name)
        want = assess_shift(holdout, Target(probs[rows], logits[rows]), settings)
        got = items[name]
        assert got["rows"] == SEGMENTS[name] and got["verdict_alone"] == want.verdict     # the segment alone
        assert got["target_prior"] == pytest.approx(want.target_prior.tolist(), **close)
        assert got["lower"] == pytest.approx(want.interval.lower.tolist(), **close)
        assert got["upper"] == pytest.approx(want.interval.upper.tolist(), **close)
        assert got["no_shift_p_value"] == pytest.approx(want.no_shift_test.p_value, **close)
        assert got["label_shift_p_value"] == pytest.approx(want.label_shift.p_value, **close)
        assert got["accuracy"]["expected"] == pytest.approx(want.accuracy.expected, **close)
    # in the run, each segment's tests are read Holm-adjusted over the two segments assessed
    assert seg["correction"] == {"method": "holm", "label_shift_tests": 2, "no_shift_tests": 2}
    for test in ("label_shift", "no_shift"):
        p = [items[name][f"{test}_p_value"] for name in ("north", "south")]
        assert [items[name][f"{test}_p_adjusted"] for name in ("north", "south")] == pytest.approx(holm(p).tolist())
    # the pooled estimate is what it is without segments
    pooled = estimate_shift.fn(bundle.holdout, Target(probs, logits), settings)
    assert summary["result"]["target_prior"] == pytest.approx(pooled.target_prior.tolist(), **close)
    assert summary["verdict"] == pooled.verdict

    client = MlflowClient(reference["tracking_uri"])
    run = client.get_run(summary["mlflow"]["run_id"])
    metrics = run.data.metrics
    assert metrics["segment.north.target_prior_digit-5"] == items["north"]["target_prior"][5]
    assert metrics["segment.tiny.n_rows"] == 60 and metrics["segment.tiny.too_small"] == 1.0
    assert "segment.tiny.target_prior_digit-5" not in metrics and "segment.south.label_shift_p_value" in metrics
    assert run.data.params["segment_column"] == "region"
    figures = [a.path for a in client.list_artifacts(run.info.run_id, "figures")]
    assert "figures/segment_priors.png" in figures
    from flows.reestimate import summary_markdown

    text = summary_markdown(summary)
    assert "| tiny | 60 | too small |" in text and "| north | 500 |" in text


@pytest.mark.parametrize("case", ["unknown-column", "missing-value", "npy"])
def test_bad_segment_input_fails_before_anything_is_written(prefect_server, reference, digits, seaweed, s3_bucket,
                                                            case):
    prefix = f"segbad-{case}/"
    good = _log_batch(digits, 300, 70)
    good["region"] = ["north"] * 300
    if case == "npy":
        logits = np.column_stack([good[c] for c in NAMES])
        _put(seaweed, s3_bucket, prefix + "a.npy", np.save(buf := io.BytesIO(), logits) or buf.getvalue())
        words = ["a.npy", ".npy arrays, which have no columns", "without --segment-column"]
    else:
        if case == "missing-value":
            good["region"] = ["north"] * 296 + [None, "", "  ", None]
            words = ["a.parquet", "empty or missing in 4 of 300 row(s)", "first row 296"]
        else:
            words = ["a.parquet", "no segment column 'regio'", "'request_id'", "'region'", "--segment-column"]
        _put(seaweed, s3_bucket, prefix + "a.parquet", _parquet(good))
    before = {k: _get(seaweed, s3_bucket, k) for k in _keys(seaweed, s3_bucket, prefix)}
    runs_before = len(_experiment_runs(reference["tracking_uri"]))
    state = _run(reference["model_uri"], reference["tracking_uri"], f"s3://{s3_bucket}/{prefix}",
                 segment_column="regio" if case == "unknown-column" else "region")
    assert state.is_failed(), state
    assert all(w in state.message for w in words), state.message
    assert {k: _get(seaweed, s3_bucket, k) for k in _keys(seaweed, s3_bucket, prefix)} == before    # no watermark
    runs = _experiment_runs(reference["tracking_uri"])
    assert len(runs) == runs_before and not [r for r in runs if r.info.status == "RUNNING"]


def test_logs_that_score_images_again_are_label_shift_and_say_how_many_rows_repeat(prefect_server, mlflow_s3_server,
                                                                                  digits, seaweed, s3_bucket):
    """The walk-through of docs/operations.md through the flow: a holdout of 900 distinct images, logs scoring 397
    other images again and again (2,000 rows of about 300 images). The run is Shifted, its label-shift test ran on
    the distinct rows, and the summary, the stored report and MLflow say how many rows repeat."""
    from flows.reestimate import summary_markdown
    from sklearn.datasets import load_digits
    from labelshift_mlflow import register_reference

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order] / 16.0, y[order]
    model = digits["model"]
    info = register_reference(model.decision_function(x[500:1400]), [NAMES[v] for v in y[500:1400]],
                              name="digits-fresh", class_names=NAMES, output_kind="logits",
                              tracking_uri=mlflow_s3_server.url)
    new_x, new_y = x[1400:], y[1400:]
    rng = np.random.default_rng(5)
    for day in (1, 2):
        idx = np.array([rng.choice(np.flatnonzero(new_y == c)) for c in rng.choice(10, size=1000, p=SHIFTED)])
        logits = model.decision_function(new_x[idx]).astype(np.float32)
        _put(seaweed, s3_bucket, f"again/2026/11/2{day}/part-0.parquet",
             _parquet({"id": [f"d{day}-{i}" for i in range(len(idx))], **{c: logits[:, j] for j, c in enumerate(NAMES)}}))
    state = _run(info["model_uri"], mlflow_s3_server.url, f"s3://{s3_bucket}/again/")
    assert state.is_completed() and state.name == "Shifted", state.message
    summary = state.result()
    repeats = summary["result"]["repeats"]
    assert repeats["n_rows"] == 2000 and repeats["handled"] and repeats["collapsed_rows"] > 1000
    assert summary["result"]["label_shift_test"]["n_target"] == 2000 - repeats["collapsed_rows"]
    assert "rows that repeat:" in summary_markdown(summary) and "effective sample" in summary["result"]["repeats_summary"]
    run = MlflowClient(mlflow_s3_server.url).get_run(summary["mlflow"]["run_id"])
    assert run.data.metrics["target_distinct_rows"] == repeats["n_distinct"]
