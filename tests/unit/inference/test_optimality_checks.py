"""The MLLS optimality checks take their tolerance from the arithmetic (issue 38, item 1): the duality gap a maximiser
reads as on rows rounded once to float32 (or summed in another order) stays within
:func:`~labelshift.inference.mlls_inputs.gap_tolerance` at any m, rows that repeat included, so valid input never
raises; weights that no rounding explains still do.

The bound is checked without the statistical floor 1e-3 / m of :func:`accepted_gap` (which hides it at small m), so
small m, k and repeated rows (the worst case: their rounding errors do not average out) stand for any size."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labelshift import rows
from labelshift.calibration import BCTS
from labelshift.errors import InputError, NotMaximiserError
from labelshift.estimation.solvers import mlls_newton, mlls_optimality
from labelshift.inference.holdout import Holdout, Target
from labelshift.inference.mlls_inputs import accepted_gap, certified_weights, gap_tolerance
from labelshift.inference.no_shift import no_shift_test
from labelshift.inference.report import assess_shift
from labelshift.inference.settings import AssessmentSettings
from labelshift.inference.source_aware import source_aware_interval

EPS32 = float(np.finfo(np.float32).eps)


def _logits(rng, m: int, k: int, items: int | None, scale: float) -> np.ndarray:
    """(m, k) float32 logits of label-shifted Gaussian classes; with ``items``, every row one of that many."""
    n = items or m
    y = rng.choice(k, size=n, p=rng.dirichlet(np.ones(k)))
    z = (scale * rng.standard_normal((n, k)) + 3.0 * np.eye(k)[y]).astype(np.float32)
    return z[rng.integers(0, n, m)] if items else z


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(m=st.integers(50, 4000), k=st.integers(2, 12), repeated=st.booleans(), scale=st.floats(0.5, 8.0),
       seed=st.integers(0, 2**31 - 1))
def test_a_maximiser_solved_on_float32_rows_reads_within_the_bound_on_float64_rows(m, k, repeated, scale, seed):
    rng = np.random.default_rng(seed)
    P64 = _softmax(_logits(rng, m, k, max(2, m // 50) if repeated else None, scale))
    ps = rng.dirichlet(np.full(k, 5.0))
    P32 = P64.astype(np.float32)                       # the pooled target as the flow keeps it
    res = mlls_newton(P32, ps)
    if not res.converged:                              # e.g. a class no row supports: nothing to certify
        return
    w = np.maximum(res.weights, 0.0)
    assert mlls_optimality(P32.astype(np.float64), w, ps) <= gap_tolerance(m, k)
    assert mlls_optimality(P64, w, ps) <= gap_tolerance(m, k, EPS32)
    # and the other way: weights solved on the float64 rows, checked on the float32 ones
    w64 = np.maximum(mlls_newton(P64, ps).weights, 0.0)
    assert mlls_optimality(P32.astype(np.float64), w64, ps) <= gap_tolerance(m, k, EPS32)


def test_the_tolerance_grows_with_the_arithmetic_not_below_the_solver():
    assert gap_tolerance(10, 3) >= 1e-10                                 # the solver's certified gap
    assert gap_tolerance(20_000_000, 4) > gap_tolerance(1_000, 4)        # more blocks to sum
    assert gap_tolerance(1_000, 4, EPS32) >= 2 * EPS32                   # one float32 rounding of the rows
    assert accepted_gap(100, 4) == pytest.approx(1e-5)                   # the statistical floor 1e-3 / m
    assert accepted_gap(20_000_000, 4) == gap_tolerance(20_000_000, 4)


def test_weights_the_rounding_explains_are_re_solved_not_refused():
    rng = np.random.default_rng(3)
    m, k = 60_000, 4
    items = _logits(rng, 300, k, None, 2.0)
    P64 = _softmax(items[rng.integers(0, 300, m)])
    ps = np.full(k, 0.25)
    P32 = P64.astype(np.float32)
    w = mlls_newton(P64, ps).weights
    # the float64 solution nudged by a float32-sized amount, as a solve on other rounding leaves it
    nudged = w * (1 + EPS32 * np.array([1.0, -1.0, 1.0, -1.0]))
    nudged /= nudged @ ps
    gap = float(mlls_optimality(P32, nudged, ps))
    assert accepted_gap(m, k) < gap <= gap_tolerance(m, k, EPS32)       # the case the tiers are for
    out = certified_weights(P32, nudged, ps, "fix")
    assert mlls_optimality(P32, out, ps) <= accepted_gap(m, k)
    np.testing.assert_allclose(out, w, atol=1e-5)
    with pytest.raises(NotMaximiserError, match="not the MLLS maximiser.*more than the rounding.*fix"):
        certified_weights(P32, np.ones(k), ps, "fix")                     # weights of no shift: no rounding explains


def test_the_no_shift_test_takes_weights_solved_on_another_rounding(monkeypatch):
    monkeypatch.setattr(rows, "LARGE_ROWS", 2000)          # kept float32 and summed in row blocks, as at scale
    rng = np.random.default_rng(4)
    P64 = _softmax(_logits(rng, 40_000, 5, 200, 2.0))
    ps = np.full(5, 0.2)
    w64 = mlls_newton(P64, ps).weights
    P32 = P64.astype(np.float32)
    given, solved = no_shift_test(P32, w64, ps), no_shift_test(P32, None, ps)
    # the likelihood-ratio statistic is off by at most 2 m gap (accepted_gap: 2e-3) from the one at the maximum
    assert given.statistic == pytest.approx(solved.statistic, abs=2e-3 + 1e-9 * solved.statistic)


def _holdout_and_target(rng, m: int, items: int | None, k: int = 4):
    def draw(n, prior):
        y = rng.choice(k, size=n, p=prior)
        return (rng.standard_normal((n, k)) + 1.5 * np.eye(k)[y]).astype(np.float32).astype(np.float64), y

    zh, yh = draw(3000, np.full(k, 1 / k))
    cal = BCTS().fit(zh, yh)
    ph = cal.predict_proba(zh)
    holdout = Holdout(ph, yh, ph.mean(axis=0) / ph.mean(axis=0).sum(), outputs=zh, calibrator=cal)
    zt, _ = draw(items or m, np.array([0.1, 0.3, 0.3, 0.3]))
    zt = zt.astype(np.float32)
    if items:
        zt = zt[rng.integers(0, items, m)]
    return holdout, Target(cal.predict_proba(zt).astype(np.float32), zt)


@pytest.mark.parametrize("items", [None, 40])
def test_assess_shift_on_float32_targets_in_row_blocks_gives_a_verdict(monkeypatch, items):
    monkeypatch.setattr(rows, "LARGE_ROWS", 2000)          # the blocked passes of a large target at 5,000 rows
    holdout, target = _holdout_and_target(np.random.default_rng(5), 5000, items)
    report = assess_shift(holdout, target)
    assert report.verdict in ("Shifted", "No significant shift", "Untrustworthy", "Not label shift")
    assert np.isfinite(report.interval.lower).all()


def test_weights_of_other_rows_make_the_report_solve_mlls_itself(monkeypatch):
    """The report's safety net: weights the interval's own rows refuse (a non-converged solve, or rows made in
    another way) are replaced by a solve on those rows, never an error."""
    holdout, target = _holdout_and_target(np.random.default_rng(6), 3000, None)
    import labelshift.inference.report as report_module

    def refusing(*args, weights=None, **kw):
        if weights is not None:
            raise NotMaximiserError("weights are not the MLLS maximiser (test)")
        return source_aware_interval(*args, weights=None, **kw)

    monkeypatch.setattr(report_module, "source_aware_interval", refusing)
    report = assess_shift(holdout, target, AssessmentSettings())
    assert report.interval.method == "source-aware"
    with pytest.raises(InputError, match="not the MLLS maximiser"):        # the API itself still refuses them
        source_aware_interval(holdout.outputs, holdout.labels, target.outputs, holdout.calibrator,
                              weights=np.array([2.0, 2.0, 0.0, 0.0]) / (2 * holdout.prior[:2].sum()))
