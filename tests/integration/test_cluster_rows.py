"""A target's rows kept on the workers of a Dask cluster (``tasks/reestimation/cluster.py``): MLLS, BBSE, the
no-shift test, the label-shift test, the source-aware interval, the accuracy estimate and the whole assessment
(``assess_shift``) over the partitions give the one-process answers on the same rows, and what goes wrong (a partition
that does not load, one of the wrong shape, a scheduler that is not there) is said naming the partition and the fix.

On a ``distributed.LocalCluster`` of 2 worker processes, 1 thread each. The one-process answers are those of a large
target (``labelshift.rows.LARGE_ROWS`` lowered, so that the same row solver runs on the whole array). Tolerance
1e-9: the passes' sums differ only in their grouping (``tests/unit/test_partitions.py``: about 1e-12 relative here),
and the row solver stops once its Newton step is at most tol = 1e-10, so two runs end within 2 tol of each other.
"""
from __future__ import annotations

import numpy as np
import pytest

from labelshift import BBSE, MLLS, rows
from labelshift.errors import InputError, PartitionError, ServiceUnavailableError
from labelshift.estimation.solvers import mlls_newton_rows
from labelshift.calibration import BCTS
from labelshift.inference.accuracy import expected_accuracy
from labelshift.inference.holdout import Target, calibrated_probs
from labelshift.inference.report import assess_shift
from labelshift.inference.label_shift_test import label_shift_test
from labelshift.inference.no_shift import no_shift_test
from labelshift.inference.source_aware import source_aware_interval
from tests.fixtures.draws import calibrated_holdout, gaussian_logits, softmax_draw

distributed = pytest.importorskip("distributed")
cluster = pytest.importorskip("tasks.reestimation.cluster")

pytestmark = pytest.mark.integration

K = 6


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  worker_dashboard_address=None) as lc, distributed.Client(lc) as c:
        yield c




def test_estimates_from_partitions_on_the_workers_equal_one_process(client, tmp_path, monkeypatch):
    monkeypatch.setattr(rows, "LARGE_ROWS", 10_000)
    rng = np.random.default_rng(41)
    P, _ = softmax_draw(rng, 120_000, np.array([0.35, 0.25, 0.15, 0.1, 0.1, 0.05]))
    S, ys = softmax_draw(rng, 4000, np.full(K, 1 / K))
    ps = np.bincount(ys, minlength=K) / ys.size
    cuts = (0, 50_000, 50_001, 97_000, 120_000)
    sources = []
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        if i == 1:
            sources.append(P[a:b])                       # scattered from here: a partition of one row
        else:
            np.save(tmp_path / f"part-{i}.npy", P[a:b])
            sources.append(cluster.npy_partition(tmp_path / f"part-{i}.npy"))      # read by the workers
    R = cluster.cluster_rows(client, sources)
    assert R.shape == P.shape and R.partition_rows == (50_000, 1, 46_999, 23_000)

    np.testing.assert_allclose(mlls_newton_rows(R, ps).weights, mlls_newton_rows(P, ps).weights, rtol=0, atol=1e-9)
    for est in (MLLS(), BBSE(), BBSE(soft=True)):
        est.fit(S, ys)
        np.testing.assert_allclose(est.estimate(R).weights, est.estimate(P).weights, rtol=0, atol=1e-9)
    for source in (None, S):
        one, parts = no_shift_test(P, None, ps, source_probs=source), no_shift_test(R, None, ps, source_probs=source)
        assert parts.statistic == pytest.approx(one.statistic, rel=1e-9) and parts.dof == one.dof


def test_the_label_shift_test_from_partitions_on_the_workers_equals_one_process(client, tmp_path, monkeypatch):
    """Both forms with the log-odds part: region counts, moments and the Wald form's sums summed on the workers, the
    bootstrap world's subsample taken from them. Tolerance 1e-9 as above (the regions' part is a function of the
    integer counts, which are equal; tests/unit/test_label_shift_partitions.py derives the rest)."""
    monkeypatch.setattr(rows, "LARGE_ROWS", 10_000)
    rng = np.random.default_rng(43)
    S, y = softmax_draw(rng, 3000, np.full(K, 1 / K))
    P, _ = softmax_draw(rng, 40_000, np.array([0.35, 0.25, 0.15, 0.1, 0.1, 0.05]))
    np.save(tmp_path / "first.npy", P[:25_000])
    R = cluster.cluster_rows(client, [cluster.npy_partition(tmp_path / "first.npy"), P[25_000:25_001], P[25_001:]])
    for method in ("likelihood-ratio", "wald"):
        one = label_shift_test(S, y, P, method=method, bootstrap_draws=39, seed=1, log_odds=True)
        parts = label_shift_test(S, y, R, method=method, bootstrap_draws=39, seed=1, log_odds=True)
        assert parts.statistic == pytest.approx(one.statistic, rel=1e-9) and parts.dof == one.dof
        for key in ("p_value_regions", "p_value_log_odds"):          # the combined p-value's two parts
            assert abs(parts.extra[key] - one.extra[key]) <= 1e-9 and abs(parts.p_value - one.p_value) <= 1e-9
        assert parts.extra["log_odds_statistic"] == pytest.approx(one.extra["log_odds_statistic"], rel=1e-9)


def test_the_source_aware_interval_and_accuracy_from_raw_outputs_on_the_workers_equal_one_process(client, tmp_path,
                                                                                                  monkeypatch):
    """Raw logits on the workers, calibrated there (the BCTS calibrator sent with each pass): MLLS solved on them,
    the interval's sums, a pinned class's profile bound and the accuracy's sums; to 1e-9 as above
    (tests/unit/test_source_aware_partitions.py derives the sums' agreement, about 1e-13 here)."""
    monkeypatch.setattr(rows, "LARGE_ROWS", 10_000)
    rng = np.random.default_rng(48)

    def logits(n, prior):
        return gaussian_logits(rng, n, prior, scale=1.3, offset=0.1 * np.arange(K))

    Xh, yh = logits(3000, np.full(K, 1 / K))
    cal = BCTS(tol=1e-9).fit(Xh, yh)
    Xt = logits(30_000, np.array([0.4, 0.0, 0.2, 0.2, 0.1, 0.1]))[0].astype(np.float32)    # class 1 absent
    np.save(tmp_path / "logits.npy", Xt[:18_000])
    R = cluster.cluster_rows(client, [cluster.npy_partition(tmp_path / "logits.npy"), Xt[18_000:18_001],
                                      Xt[18_001:]])
    one = source_aware_interval(Xh, yh, Xt, cal)
    parts = source_aware_interval(Xh, yh, R, cal)
    assert np.array_equal(parts.pinned, one.pinned) and one.pinned.any() and parts.reasons == one.reasons
    for key in ("weights", "lower", "upper", "weights_upper", "std_error"):
        np.testing.assert_allclose(getattr(parts, key), getattr(one, key), rtol=0, atol=1e-9, err_msg=key)
    acc_one = expected_accuracy(Xh, yh, Xt, cal, interval=one)
    acc = expected_accuracy(Xh, yh, R, cal, interval=parts)
    for key in ("expected", "lower", "upper", "batch_lower", "batch_upper", "corrected", "corrected_lower",
                "corrected_upper"):
        assert abs(getattr(acc, key) - getattr(acc_one, key)) <= 1e-9, key


def _numbers_within(new, ref, tol, path="report", skip=()):
    """Equal structure and non-float values (verdicts, strings, integer counts); floats within ``tol``, relative to
    max(1, |x|), except at the paths ``skip``."""
    if isinstance(ref, dict):
        assert set(new) == set(ref), path
        for key in ref:
            _numbers_within(new[key], ref[key], tol, f"{path}.{key}", skip)
    elif isinstance(ref, list):
        assert len(new) == len(ref), path
        for i, (a, b) in enumerate(zip(new, ref)):
            _numbers_within(a, b, tol, f"{path}[{i}]", skip)
    elif isinstance(ref, float) and isinstance(new, float):
        assert path in skip or abs(new - ref) <= tol * max(1.0, abs(ref)), (path, new, ref)
    else:
        assert new == ref, (path, new, ref)


def test_the_whole_assessment_from_raw_outputs_on_the_workers_equals_one_process(client, tmp_path, monkeypatch):
    """``assess_shift`` with the default settings on raw logits kept on the workers and calibrated there
    (Target.from_partitioned_outputs), some of them holdout rows copied twice (the model's own ties, counted by the
    map-reduce of row hashes): the report's verdicts, strings and counts equal one process's, its numbers to 1e-9
    (measured about 1e-10: the MLLS weights, within 2 tol). One number is a statistic of m rows, not a mean: the
    miscalibration check's T = d^T V^+ d (V of order 1/m) moves by 2 sqrt(T) |V^{-1/2} dd| for a change dd of
    d = p_MLLS - p_c, and dd is at most 2 (2 tol) here (p_MLLS and p_c each follow w), so it is held to that bound
    (measured 3e-9 of a bound of about 1e-7); its p-value is within 1e-9 again."""
    monkeypatch.setattr(rows, "LARGE_ROWS", 10_000)
    rng = np.random.default_rng(49)

    def logits(n, prior):
        z, y = gaussian_logits(rng, n, prior, scale=1.3, offset=0.1 * np.arange(K))
        return z.astype(np.float32), y

    Xh, yh = logits(3000, np.full(K, 1 / K))
    Xh = Xh.astype(np.float64)
    holdout, cal = calibrated_holdout(Xh, yh)
    copies = Xh[:200].astype(np.float32)
    Xt = np.concatenate([logits(24_000, np.array([0.35, 0.25, 0.15, 0.1, 0.1, 0.05]))[0], copies, copies])
    np.save(tmp_path / "logits.npy", Xt[:15_000])
    R = cluster.cluster_rows(client, [cluster.npy_partition(tmp_path / "logits.npy"), Xt[15_000:15_001],
                                      Xt[15_001:]])
    one = assess_shift(holdout, Target(calibrated_probs(Xt, cal), Xt))
    parts = assess_shift(holdout, Target.from_partitioned_outputs(R, cal))
    assert one.repeats.shared_rows == 400 and parts.verdict == one.verdict
    _numbers_within(parts.to_dict(), one.to_dict(), 1e-9, skip={"report.miscalibration.statistic"})
    V = one.miscalibration.reference_covariance
    smallest = float(np.min(np.linalg.eigvalsh(0.5 * (V + V.T))[1:]))           # V^+ on the sum-to-zero range
    bound = 2.0 * np.sqrt(one.miscalibration.statistic) * (4 * 1e-10) / np.sqrt(smallest)
    assert abs(parts.miscalibration.statistic - one.miscalibration.statistic) <= bound < 1e-6


def test_a_partition_that_does_not_load_is_named_with_the_fix(client, tmp_path):
    np.save(tmp_path / "good.npy", np.full((10, K), 1 / K))
    with pytest.raises(PartitionError, match=r"missing\.npy could not be loaded on the cluster \(FileNotFoundError.*"
                                             r"Fix: make its source readable from every worker"):
        cluster.cluster_rows(client, [cluster.npy_partition(tmp_path / "good.npy"),
                                      cluster.npy_partition(tmp_path / "missing.npy")])
    with pytest.raises(InputError, match=r"partition 1 is float64 with 4 classes but partition 0 is float64 with 6"):
        cluster.cluster_rows(client, [np.full((10, K), 1 / K), np.full((10, 4), 0.25)])
    np.save(tmp_path / "ints.npy", np.ones((10, K), dtype=np.int64))
    with pytest.raises(InputError, match=r"ints\.npy loaded as int64 .* must return an \(m, k\) float32 or float64"):
        cluster.cluster_rows(client, [cluster.npy_partition(tmp_path / "ints.npy")])


def test_a_scheduler_that_is_not_there_is_said_with_the_fix():
    with pytest.raises(ServiceUnavailableError, match=r"could not reach the Dask scheduler at 'tcp://127.0.0.1:9'"
                                                      r".*Fix: start one"):
        cluster.connect("tcp://127.0.0.1:9", timeout=2)


def _fail_or_mark(B, folder):
    """A per-partition call: the first row's partition fails at once, the others write a file after a pause."""
    import time
    from pathlib import Path

    if B.shape[0] == 1:
        raise ValueError("this partition fails")
    time.sleep(1.0)
    Path(folder, f"done-{B.shape[0]}").write_text("written")
    return B.shape[0]


def test_a_failed_pass_raises_only_once_every_partition_call_ended(client, tmp_path):
    """One partition's call fails at once while another's is still writing: the error comes after that write ended,
    so no output of a failed run lands later (e.g. after the next run rewrote it)."""
    P = np.ones((5, K)) / K
    R = cluster.cluster_rows(client, [P[:1], P[1:]])
    with pytest.raises(ValueError, match="this partition fails"):
        R.run(_fail_or_mark, str(tmp_path))
    assert (tmp_path / "done-4").read_text() == "written"


def _doubled_and_counted(B, folder):
    """A per-partition transform that leaves a file behind at each call (to count the calls)."""
    import uuid
    from pathlib import Path

    Path(folder, uuid.uuid4().hex).write_text("called")
    return (B * 2.0).astype(np.float32)


def _column_sums(B):
    return np.asarray(B, dtype=np.float64).sum(axis=0)


def test_kept_rows_are_transformed_once_where_they_live_and_give_the_derived_rows(client, tmp_path):
    """kept_rows: the transform runs once a partition (not once a pass, as derived rows do), and every pass sees the
    same rows as the derived ones (the same transform of the same partition: equal to float64 rounding)."""
    P = np.random.default_rng(8).dirichlet(np.ones(K), size=900).astype(np.float32)
    R = cluster.cluster_rows(client, [P[:400], P[400:401], P[401:]])
    calls = tmp_path / "calls"
    calls.mkdir()
    kept = cluster.kept_rows(R, _doubled_and_counted, str(calls), dtype=np.float32)
    sums = [kept.run(_column_sums) for _ in range(3)]
    assert len(list(calls.iterdir())) == 3                       # 3 partitions, once each, whatever the passes
    derived = R.derived(_doubled_and_counted, str(calls), dtype=np.float32).run(_column_sums)
    assert len(list(calls.iterdir())) == 6                       # derived rows: again at each pass
    for a, b in zip(sums[-1], derived):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    assert kept.shape == R.shape and kept.partition_rows == R.partition_rows and kept.dtype == np.float32
    with pytest.raises(PartitionError, match=r"partition 0: _fails failed on its worker \(ValueError: boom\)"):
        cluster.kept_rows(R, _fails, "boom")


def _fails(B, message):
    raise ValueError(message)


def _load_or_fail(kind: str, rows: int):
    """A partition source: ``rows`` rows, or the error of a batch that fails its checks, or of an unreadable store."""
    from labelshift.errors import StorageError

    if kind == "bad":
        raise InputError("this batch fails its checks" + " because" * 2500)
    if kind == "unreadable":
        raise StorageError("the store did not answer")
    return np.full((rows, K), 1.0 / K)


def test_partitions_set_aside_by_their_error_and_the_others_kept_in_order(client):
    """cluster_rows_setting_aside: a partition whose load raised an error of the kinds set aside is left out (its
    error returned as a value, whole: a message of 20,000 characters, which Dask would rebuild as a task's error),
    the others kept in their order with their names; none kept -> no rows; another error -> the PartitionError of
    cluster_rows, naming the partition."""
    def sources(*kinds):
        return [cluster.PartitionSource(_load_or_fail, (kind, 10 + i), f"batch-{i}") for i, kind in enumerate(kinds)]

    takes = (InputError,)

    placed = cluster.cluster_rows_setting_aside(client, sources("ok", "bad", "ok", "bad"), takes)
    assert placed.kept == (0, 2) and sorted(placed.set_aside) == [1, 3]
    assert isinstance(placed.set_aside[1], InputError) and str(placed.set_aside[1]).startswith("this batch fails")
    assert len(str(placed.set_aside[3])) == len("this batch fails its checks") + 8 * 2500
    assert placed.rows.names == ("batch-0", "batch-2") and placed.rows.partition_rows == (10, 12)
    assert placed.rows.run(len) == [10, 12]
    assert cluster.cluster_rows_setting_aside(client, sources("bad", "bad"), takes).rows is None
    with pytest.raises(PartitionError, match=r"batch-1 could not be loaded on the cluster \(StorageError: the store"):
        cluster.cluster_rows_setting_aside(client, sources("ok", "unreadable", "bad"), takes)
