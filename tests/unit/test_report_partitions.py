"""The whole assessment (:func:`labelshift.inference.report.assess_shift`, default settings) of a target whose raw
outputs are held in partitions (:func:`labelshift.partitions.local_rows`: uneven, one of 1 row and one of 0 rows),
calibrated where they live (:meth:`Target.from_partitioned_outputs`), against the same rows as one array (in row
blocks: LARGE_ROWS lowered, so that both run the same row solver and passes). The Dask cluster's engine is tested in
tests/integration/test_cluster_rows.py.

How the reports are compared: ``to_dict()`` field by field. Verdicts, strings, flags and integer counts (regions'
rows, repeats, n_target) must be equal: both paths count the same rows. Numbers: the two paths differ only in how
the rows' terms are grouped into sums (within delta = 2 (k + B + b + p) eps of each other relative to the sum of
|terms|: tests/unit/test_partitions.py) and in where MLLS's Newton iterations stop (each stops once its step is at
most tol = 1e-10, so the weights are within 2 tol). Every number of the report is a smooth function of the weights
and of such sums; through the inverse of the target's information H it moves by at most cond(H) times the relative
change of its inputs, and the covariances pass through H^{-1} twice (tests/unit/test_source_aware_partitions.py).
So each number agrees to cond(H)^2 (2 tol + delta) relative to max(1, |x|), and a factor 10 covers the few
additions and products between. Measured: about 1e-12.
"""
from __future__ import annotations

import numpy as np
import pytest

from labelshift import rows
from labelshift.inference.holdout import Target, calibrated_probs
from labelshift.inference.repeats import find_repeats
from labelshift.inference.report import assess_shift
from labelshift.partitions import local_rows
from tests.fixtures.draws import calibrated_holdout, gaussian_logits

BLOCK = 1000
EPS64 = float(np.finfo(np.float64).eps)
TOL = 1e-10
CUTS = (0, 1, 1, 1700, 1701, 4100, 5500)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of 1000 rows; sets of more than 2000 rows count as large (the whole array runs in row blocks too)."""
    monkeypatch.setattr(rows, "ROW_BLOCK", BLOCK)
    monkeypatch.setattr(rows, "LARGE_ROWS", 2000)


def _case(seed, k=4, m=5500):
    """A holdout of 3000 float32-exact logits with its BCTS fit, and m target logits (float32) of another prior."""
    rng = np.random.default_rng(seed)

    def logits(n, prior):
        z, y = gaussian_logits(rng, n, prior, scale=1.3, offset=0.2 * np.arange(k) / k)
        return z.astype(np.float32), y

    Xh, yh = logits(3000, np.full(k, 1 / k))
    Xh = Xh.astype(np.float64)
    holdout, cal = calibrated_holdout(Xh, yh)
    return holdout, cal, logits(m, np.array([0.4, 0.3, 0.2, 0.1][:k]) / np.sum([0.4, 0.3, 0.2, 0.1][:k]))[0]


def _partitioned(X):
    return local_rows([X[a:b] for a, b in zip(CUTS[:-1], CUTS[1:])])


def _tolerance(cal, X, w, k):
    P = cal.predict_proba(X.astype(np.float64))
    S = P / (P @ w)[:, None]
    cond = float(np.linalg.cond(S.T @ S / S.shape[0]))
    delta = 2.0 * (k + BLOCK + -(-X.shape[0] // BLOCK) + len(CUTS)) * EPS64
    return 10.0 * cond ** 2 * (2 * TOL + delta)


def _compare(new, ref, rtol, path="report") -> float:
    """Equal structure, equal non-float values; floats within rtol relative to max(1, |ref|). The largest
    relative difference seen."""
    if isinstance(ref, dict):
        assert set(new) == set(ref), (path, set(new) ^ set(ref))
        return max([_compare(new[key], ref[key], rtol, f"{path}.{key}") for key in ref] or [0.0])
    if isinstance(ref, list):
        assert len(new) == len(ref), path
        return max([_compare(a, b, rtol, f"{path}[{i}]") for i, (a, b) in enumerate(zip(new, ref))] or [0.0])
    if isinstance(ref, float) and isinstance(new, float):
        diff = abs(new - ref) / max(1.0, abs(ref))
        assert diff <= rtol, (path, new, ref, rtol)
        return diff
    assert new == ref and type(new) is type(ref), (path, new, ref)
    return 0.0


def test_the_report_from_partitions_equals_the_one_process_report():
    holdout, cal, Xt = _case(6)
    ref = assess_shift(holdout, Target(calibrated_probs(Xt, cal), Xt))
    new = assess_shift(holdout, Target.from_partitioned_outputs(_partitioned(Xt), cal))
    rtol = _tolerance(cal, Xt, ref.weights, 4)
    assert rtol < 1e-7                                   # the comparison means something
    seen = _compare(new.to_dict(), ref.to_dict(), rtol)
    assert new.verdict == ref.verdict and new.accuracy is not None and new.label_shift is not None
    assert seen < 1e-10


def test_repeats_that_are_the_models_own_ties_are_counted_over_partitions():
    """Holdout rows copied into the target twice: repeats whose outputs occur in the holdout (the model's own ties,
    counted as independent), found by the map-reduce of row-hash counts, with the same report."""
    holdout, cal, Xt = _case(7)
    Xt = np.concatenate([Xt[:4000], holdout.outputs[:300].astype(np.float32),
                         holdout.outputs[:300].astype(np.float32), Xt[4000:4900]])
    ref = assess_shift(holdout, Target(calibrated_probs(Xt, cal), Xt))
    new = assess_shift(holdout, Target.from_partitioned_outputs(_partitioned(Xt), cal))
    assert ref.repeats.shared_rows == 600 and ref.repeats.n_distinct == 5200 and not ref.repeats.adjusts
    _compare(new.to_dict(), ref.to_dict(), _tolerance(cal, Xt, ref.weights, 4))


def test_repeated_rows_across_partitions_are_counted_exactly_and_the_rest_says_it_does_not_run_yet():
    holdout, cal, Xt = _case(8)
    Xt[1::3] = Xt[::3][: Xt[1::3].shape[0]]              # copies straddle the partitions' cuts
    Xt[5000:5100] = holdout.outputs[:100].astype(np.float32)
    Xt[5100:5200] = holdout.outputs[:100].astype(np.float32)
    P = calibrated_probs(Xt, cal)
    rounded = holdout.probs.astype(np.float32).astype(np.float64)
    target = Target.from_partitioned_outputs(_partitioned(Xt), cal)
    ref, new = find_repeats(P, rounded), find_repeats(target.probs, rounded)
    assert ref.adjusts and ref.shared_rows > 0
    assert new.to_dict() == ref.to_dict()                # integers, and Kish's size from a sum of integers
    with pytest.raises(TypeError, match="clustered covariance of repeated target rows: .*does not run over "
                                        "partitions yet"):
        assess_shift(holdout, target)
