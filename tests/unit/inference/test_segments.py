"""Estimates per segment, the parts without services: the split by segment value, the checks of the segment column
(errors that name the batch and the fix), the records, metrics, table and figure. The flow end
to end: tests/integration/test_prediction_logs_flow.py."""
from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.close import assert_close_nested

from labelshift import AssessmentSettings, Holdout, Target
from labelshift.errors import InputError
from labelshift.inference.segments import SegmentEstimate, SegmentSettings, split_segments
from labelshift.monitoring.batches import check_segment_values, read_segments


def _parquet(table: dict) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table(table), buf)
    return buf.getvalue()


def test_split_groups_row_indices_by_value_in_sorted_order():
    values = np.array(["b", "a", "b", "c", "a", "b"], dtype=object)
    split = split_segments(values)
    assert list(split) == ["a", "b", "c"]
    assert split["a"].tolist() == [1, 4] and split["b"].tolist() == [0, 2, 5] and split["c"].tolist() == [3]
    assert all(v.dtype == np.int64 for v in split.values())


def test_missing_or_empty_values_are_refused_naming_the_batch_and_count():
    with pytest.raises(InputError, match=r"batch s3://b/x.parquet: segment column 'region' is empty or missing in 3 "
                                         r"of 5 row\(s\) \(first row 1\)"):
        check_segment_values(["eu", None, " ", float("nan"), "us"], column="region", batch="s3://b/x.parquet")
    assert check_segment_values([" eu", 3], column="r", batch="x").tolist() == ["eu", "3"]


def test_read_segments_from_parquet_checks_the_column():
    data = _parquet({"id": ["a", "b", "c"], "region": ["eu", "us", "eu"], "code": [1, 2, 1],
                     "score": [0.5, float("nan"), 1.0], "dict": pa.array(["x", "y", "x"]).dictionary_encode()})
    assert read_segments(data, "u", "region").tolist() == ["eu", "us", "eu"]
    assert read_segments(data, "u", "code").tolist() == ["1", "2", "1"]
    assert read_segments(data, "u", "dict").tolist() == ["x", "y", "x"]
    with pytest.raises(InputError, match="missing in 1 of 3"):
        read_segments(data, "u", "score")
    with pytest.raises(InputError) as err:
        read_segments(data, "s3://b/x.parquet", "Region")
    assert "no segment column 'Region'" in str(err.value) and "'region'" in str(err.value)
    assert "--segment-column" in str(err.value)
    nulls = _parquet({"region": ["eu", None, "us", ""]})
    with pytest.raises(InputError, match="missing in 2 of 4"):
        read_segments(nulls, "u", "region")


def test_npy_batches_cannot_be_segmented():
    from labelshift.monitoring.layout import TargetBatch
    from tasks.reestimation.segments import check_segmentable

    batches = [TargetBatch(key="day1.npy", checksum="0" * 64)]
    with pytest.raises(InputError, match=r"needs Parquet batches.*day1.npy.*without --segment-column"):
        check_segmentable(batches, "region", "s3://b/t/")
    check_segmentable([TargetBatch(key="day1.parquet", checksum="0" * 64)], "region", "s3://b/t/")


def _calibrated_holdout(k: int, n: int, seed: int):
    """A well-specified k-class problem, its random stream, a holdout of n rows, BCTS fit on it and its calibrated
    rows."""
    import warnings

    from labelshift.calibration.scaling import BCTS
    from labelshift.experiments.well_specified import WellSpecifiedGaussians

    pb = WellSpecifiedGaussians.make(k)
    rng = np.random.default_rng(seed)
    xh, yh = pb.holdout(n, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = BCTS().fit(xh, yh)
    return pb, rng, xh, yh, cal, cal.predict_proba(xh)


@pytest.fixture(scope="module")
def segments():
    """Two assessed segments (a shifted and an unshifted one) and a too small one, on a well-specified problem."""
    from labelshift import assess_shift

    pb, rng, xh, yh, cal, ph = _calibrated_holdout(3, 1500, 0)
    out = []
    for name, prior in (("eu west", [0.6, 0.3, 0.1]), ("us", pb.source_prior)):
        xt, _ = pb.draw(prior, 800, rng)
        rep = assess_shift(Holdout(ph, yh, ph.mean(0), outputs=xh, calibrator=cal, class_names=["a", "b/c", "d"]),
                           Target(cal.predict_proba(xt), xt))
        out.append(SegmentEstimate(name, 800, 200, rep))
    out.append(SegmentEstimate("x", 12, 200))
    return out, ph.mean(0)


def test_records_metrics_table_and_figure(segments):
    from mlflow.utils.validation import _validate_metric_name

    from flows.summary import MARKDOWN, PLAIN_TEXT
    from labelshift.figures import figure_png, plot_segment_priors
    from tasks.reestimation.segments import segment_metrics

    segs, ps = segments
    records = [s.to_dict() for s in segs]
    assert records[2] == {"name": "x", "rows": 12, "too_small": True, "verdict": "Too small",
                          "reason": "12 rows, fewer than the minimum segment size 200"}
    assert records[0]["target_prior"] == segs[0].report.target_prior.tolist()
    metrics = segment_metrics(segs, ["a", "b/c", "d"])
    for name in metrics:
        _validate_metric_name(name)
    assert metrics["segment.eu west.target_prior_b_c"] == segs[0].report.target_prior[1]
    assert metrics["segment.x.n_rows"] == 12 and "segment.x.total_variation" not in metrics
    failed = SegmentEstimate("bad", 900, 200, error="InputError: no")
    assert failed.to_dict() == {"name": "bad", "rows": 900, "too_small": False, "verdict": "Failed",
                                "reason": "InputError: no"}
    assert segment_metrics([failed], None) == {"segment.bad.n_rows": 900.0, "segment.bad.too_small": 0.0,
                                               "segment.bad.failed": 1.0}
    records.append(failed.to_dict())
    block = {"column": "region", "min_size": 200, "items": records}
    md = "\n".join(MARKDOWN.segments(block, ["a", "b/c", "d"]))
    assert "| x | 12 | too small |" in md and "p_t(b/c)" in md and "positively correlated" in md
    text = "\n".join(PLAIN_TEXT.segments(block, ["a", "b/c", "d"]))
    assert "too small" in text and "eu west" in text and "failed (InputError: no)" in text
    png = figure_png(plot_segment_priors(ps, [r for r in records if "target_prior" in r], class_names=["a", "b/c", "d"]))
    assert png[:4] == b"\x89PNG"


def test_the_cli_options_are_the_flow_parameters():
    import argparse

    from flows.cli._common import UsageError
    from flows.cli.estimate import parameters_from_args, register

    parser = argparse.ArgumentParser(prog="labelshift")
    register(parser.add_subparsers(dest="command"))
    params = parameters_from_args(parser.parse_args(["estimate", "--segment-column", "region",
                                                     "--min-segment-size", "500"]))
    assert params.segment_column == "region" and params.min_segment_size == 500
    defaults = parameters_from_args(parser.parse_args(["estimate"]))
    assert defaults.segment_column is None and defaults.min_segment_size == 200
    assert defaults.segment_correction == "holm"
    assert parameters_from_args(parser.parse_args(["estimate", "--segment-correction", "bh"])).segment_correction \
        == "bh"
    with pytest.raises(UsageError, match="--min-segment-size"):
        parameters_from_args(parser.parse_args(["estimate", "--min-segment-size", "5"]))


def test_a_segment_with_the_prepared_holdout_is_the_segment_alone():
    # the segments share the label-shift test's work on the holdout (made once, at the target's precision): each
    # report is the one assess_shift gives on that segment alone
    from labelshift import assess_shift
    from labelshift.inference.report import label_shift_holdout

    pb, rng, xh, yh, cal, ph = _calibrated_holdout(4, 1200, 2)
    xt, _ = pb.draw([0.5, 0.2, 0.2, 0.1], 1500, rng)
    for probs in (cal.predict_proba(xt), cal.predict_proba(xt).astype(np.float32)):
        holdout = Holdout(ph, yh, ph.mean(0))
        prepared = holdout.prepared_for(probs)
        # made at the target's precision, as assess_shift tests (so that it is the one used)
        assert prepared.label_shift_part.matches(ph.astype(probs.dtype).astype(np.float64), yh, 25, 4)
        for rows in (np.arange(0, 1500, 2), np.arange(1, 700)):
            alone = assess_shift(holdout, probs[rows], AssessmentSettings(interval="fisher"))
            shared = assess_shift(prepared, probs[rows], AssessmentSettings(interval="fisher"))
            assert_close_nested(shared.to_dict(), alone.to_dict())         # two paths: equal to rounding
            assert shared.label_shift is not None
    # a holdout the test cannot use: nothing prepared, each report says why the test was not run
    assert label_shift_holdout(Holdout(ph[:150], yh[:150], ph[:150].mean(0)), probs) is None


def _numbers_close(value, rel: float = 1e-7, abs_: float = 1e-10):
    """``value`` (a report's dict) with every float wrapped in ``pytest.approx``: equal to a dict computed on another
    path when the words, counts and verdicts are the same and the numbers agree to ``rel`` (or ``abs_`` near 0)."""
    if isinstance(value, dict):
        return {key: _numbers_close(v, rel, abs_) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_numbers_close(v, rel, abs_) for v in value)
    if isinstance(value, float):
        return pytest.approx(value, rel=rel, abs=abs_, nan_ok=True)
    return value


def _small_problem(k=3, n=600, segments=3, m=400):
    from labelshift.calibration.scaling import BCTS
    from labelshift.experiments.well_specified import WellSpecifiedGaussians

    pb = WellSpecifiedGaussians.make(k)
    rng = np.random.default_rng(0)
    xh, yh = pb.holdout(n, rng)
    cal = BCTS().fit(xh, yh)
    targets = [pb.draw(np.random.default_rng([1, s]).dirichlet(np.ones(k)), m, rng)[0] for s in range(segments)]
    probs_h = cal.predict_proba(xh)
    holdout = Holdout(probs_h, yh, probs_h.mean(axis=0), outputs=xh, calibrator=cal, class_names=["a", "b", "c"])
    return holdout, AssessmentSettings(significance=0.01), [Target(cal.predict_proba(x), x) for x in targets]


def test_segments_on_worker_processes_equal_the_same_assessments_in_this_process():
    from concurrent.futures import ThreadPoolExecutor

    import psutil

    from labelshift.inference.segments import SegmentPool

    holdout, settings, targets = _small_problem()
    holdout = holdout.prepared_for(targets[0])
    inline = [SegmentPool(1, holdout, settings).assess(t) for t in targets]
    with SegmentPool(2, holdout, settings) as pool, ThreadPoolExecutor(3) as threads:    # as the flow's tasks call it
        on_workers = list(threads.map(pool.assess, targets))
        # a segment whose assessment raises raises the same error here (the flow reports it as failed)
        with pytest.raises(InputError, match="target_probs"):
            pool.assess(Target(np.hstack([targets[0].probs, targets[0].probs[:, :1]])))
        workers = list(pool._executor._processes)
    assert 1 <= len(workers) <= 2
    # a worker process (BLAS on one thread for life) against this process (BLAS's own threads for the k x k algebra):
    # only the rounding of those products differs (relative k * eps); the MLLS solve stops at its certified duality
    # gap (1e-10, weights to about 1e-8), and the intervals, tests and accuracy are smooth in the estimate: rel 1e-7
    assert [_numbers_close(r.to_dict()) for r in on_workers] == [r.to_dict() for r in inline]
    assert all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE for pid in workers)


def test_segment_processes_automatic_only_for_enough_rows():
    import os

    from labelshift.inference.segments import PROCESS_ROWS, segment_processes

    cpus = len(os.sched_getaffinity(0))
    assert segment_processes(0, 100, PROCESS_ROWS) == min(cpus, 100)
    assert segment_processes(0, 100, PROCESS_ROWS - 1) == 1
    assert segment_processes(0, 1, 10**9) == 1                   # never more processes than segments
    assert segment_processes(4, 3, 10) == 3 and segment_processes(1, 50, 10**9) == 1
    with pytest.raises(InputError, match="0 \\(automatic\\) or more"):
        segment_processes(-1, 3, 10)


def test_usable_cpus_follow_a_cgroup_quota(tmp_path):
    import os

    from labelshift.inference.segments import usable_cpus

    affinity = len(os.sched_getaffinity(0))
    quota = tmp_path / "cpu.max"
    quota.write_text("max 100000\n")
    assert usable_cpus(quota) == affinity
    quota.write_text("150000 100000\n")             # --cpus=1.5: one whole CPU
    assert usable_cpus(quota) == min(affinity, 1)
    assert usable_cpus(tmp_path / "absent") == affinity


_ORPHAN_SCRIPT = """
import sys, time, warnings
sys.path.insert(0, {root!r})
warnings.simplefilter("ignore")
from tests.unit.inference.test_segments import _small_problem
from labelshift.inference.segments import SegmentPool
holdout, settings, targets = _small_problem(segments=1, m=300)
pool = SegmentPool(2, holdout, settings)
pool.assess(targets[0])
print(" ".join(str(pid) for pid in pool._executor._processes), flush=True)
time.sleep(600)
"""


def test_workers_end_when_the_process_that_started_them_is_killed():
    """Forked workers would otherwise outlive a SIGKILLed flow run (holding its pipes, the watchdog's among them)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil

    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    root = str(Path(__file__).resolve().parents[3])
    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT.format(root=root)], stdout=subprocess.PIPE,
                              text=True)
    try:
        workers = [int(pid) for pid in parent.stdout.readline().split()]
        assert workers and all(alive(pid) for pid in workers)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
    deadline = time.monotonic() + 10          # each worker looks for its parent every 0.5 s
    while time.monotonic() < deadline and any(alive(pid) for pid in workers):
        time.sleep(0.1)
    assert not [pid for pid in workers if alive(pid)]


def _with_p_values(report, label_shift_p: float, no_shift_p: float):
    """``report`` with its label-shift and no-shift tests' p-values set (the rest as assessed)."""
    from dataclasses import replace

    return replace(report, label_shift=replace(report.label_shift, p_value=label_shift_p),
                   no_shift_test=replace(report.no_shift_test, p_value=no_shift_p))


def test_adjusted_p_values_decide_the_segments_verdicts(segments):
    # three segments at the single-test level 0.05: A's label-shift p 0.03 and C's no-shift p 0.03 reject
    # alone; over the three, Holm adjusts them to 0.06 (accepted), Benjamini-Hochberg to 0.045 and 0.04 (rejected)
    from flows.summary import MARKDOWN, PLAIN_TEXT
    from labelshift.inference.segments import adjust_segments, correction_record
    from tasks.reestimation.segments import segment_metrics

    base = segments[0][0].report
    assert base.trustworthy and base.label_shift is not None and base.significance == 0.05
    segs = [SegmentEstimate("A", 800, 200, _with_p_values(base, 0.03, 1e-6)),
            SegmentEstimate("B", 800, 200, _with_p_values(base, 0.004, 0.04)),
            SegmentEstimate("C", 800, 200, _with_p_values(base, 0.2, 0.03)),
            SegmentEstimate("tiny", 12, 200)]
    assert [str(s.verdict) for s in segs[:3]] == ["Not label shift", "Not label shift", "Shifted"]   # alone

    holm = adjust_segments(segs)                                  # the default
    assert [s.label_shift_p.adjusted for s in holm[:3]] == pytest.approx([0.06, 0.012, 0.2])
    assert [s.no_shift_p.adjusted for s in holm[:3]] == pytest.approx([3e-6, 0.06, 0.06])
    assert [str(s.verdict) for s in holm[:3]] == ["Shifted", "Not label shift", "No shift"]
    assert holm[3] is segs[3] and holm[0].report is segs[0].report          # the reports as assessed
    assert holm[0].label_shift_p.describe() == "p = 0.03, Holm-adjusted over 3 segments 0.06"
    bh = adjust_segments(segs, "bh")
    assert [s.label_shift_p.adjusted for s in bh[:3]] == pytest.approx([0.045, 0.012, 0.2])
    assert [str(s.verdict) for s in bh[:3]] == ["Not label shift", "Not label shift", "Shifted"]
    assert [str(s.verdict) for s in adjust_segments(segs, "none")[:3]] == [str(s.verdict) for s in segs[:3]]

    record = holm[0].to_dict()
    assert record["verdict"] == "Shifted" and record["verdict_alone"] == "Not label shift"
    assert record["label_shift_p_value"] == 0.03 and record["label_shift_p_adjusted"] == pytest.approx(0.06)
    assert record["label_shift_ok"] is True
    assert "verdict_alone" not in segs[0].to_dict()               # not adjusted: the record as before
    metrics = segment_metrics(holm, ["a", "b/c", "d"])
    assert metrics["segment.C.shifted"] == 0.0 and metrics["segment.C.no_shift_p_adjusted"] == pytest.approx(0.06)
    assert metrics["segment.A.not_label_shift"] == 0.0 and metrics["segment.B.not_label_shift"] == 1.0
    block = {"column": "region", "min_size": 200, "correction": correction_record(holm),
             "items": [s.to_dict() for s in holm]}
    assert block["correction"] == {"method": "holm", "label_shift_tests": 3, "no_shift_tests": 3}
    md = "\n".join(MARKDOWN.segments(block, ["a", "b/c", "d"]))
    assert "| A | 800 | Shifted |" in md and "= 0.03 (0.06)" in md and "Holm-adjusted over the 3 segments" in md
    text = "\n".join(PLAIN_TEXT.segments(block, ["a", "b/c", "d"]))
    assert "Holm-adjusted" in text and "= 0.2" in text and "(0.2)" not in text     # unchanged: not repeated
    assert correction_record(segs) is None
    with pytest.raises(InputError, match="segment correction must be one of"):
        adjust_segments(segs, "BH")


def test_a_runs_segments_are_read_through_the_adjusted_p_values(monkeypatch):
    # assess_segments as the flow calls it (its assess-segment tasks run inline here, without a Prefect server)
    from types import SimpleNamespace

    import tasks.reestimation.segments as tasks_segments
    from labelshift.inference.multiplicity import holm

    assess = tasks_segments.assess_segment.fn

    class Inline:
        @staticmethod
        def submit(*args):
            value = assess(*args)
            return SimpleNamespace(result=lambda: value)

    monkeypatch.setattr(tasks_segments, "assess_segment", Inline)
    holdout, settings, targets = _small_problem(segments=3, m=300)
    probs = np.concatenate([t.probs for t in targets] + [targets[0].probs[:50]])
    outputs = np.concatenate([t.outputs for t in targets] + [targets[0].outputs[:50]])
    values = np.repeat(["s0", "s1", "s2", "small"], [300, 300, 300, 50]).astype(object)
    segs, warning = tasks_segments.assess_segments(holdout, Target(probs, outputs), values, settings,
                                                   SegmentSettings("region", 200, processes=1))
    assert warning is None                          # 50 of 950 rows in a segment too small: no warning
    assert [s.name for s in segs] == ["s0", "s1", "s2", "small"] and segs[3].too_small
    ls = [s.report.label_shift.p_value for s in segs[:3]]
    ns = [s.report.no_shift_test.p_value for s in segs[:3]]
    assert [s.label_shift_p.adjusted for s in segs[:3]] == pytest.approx(holm(ls).tolist())
    assert [s.no_shift_p.adjusted for s in segs[:3]] == pytest.approx(holm(ns).tolist())
    for s in segs[:3]:
        assert s.label_shift_p.family == 3 and s.label_shift_p.level == 0.01 and s.no_shift_p.method == "holm"
        assert s.not_label_shift == (s.label_shift_p.adjusted < 0.01)
        assert s.to_dict()["verdict"] == str(s.verdict)
