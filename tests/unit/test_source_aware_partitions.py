"""The source-aware prior interval and the accuracy estimate on raw outputs in partitions
(:mod:`labelshift.partitions`): the calibrated rows are made where each partition lives
(:meth:`~labelshift.partitions.PartitionedRows.derived`, the calibrator sent as an argument), the target's sums are
summed per partition and added here, and the results equal those of the whole array in row blocks. The engine is
:func:`labelshift.partitions.local_rows` (uneven partitions, one of 1 row and one of 0 rows); the Dask cluster's is
tested in tests/integration/test_cluster_rows.py.

Tolerances, from the arithmetic. Both paths calibrate every row with the same float64 operations and differ only in
how the rows' terms are grouped into sums (blocks cut at other rows, partition sums added last): as in
tests/unit/test_partitions.py each sum is within delta = 2 (k + B + b + p) eps of the other, relative to the sum of
its |terms| (B rows a block, b blocks, p partitions). With the weights given, every number of the interval is a
smooth function of those sums (g, H, A) and of the holdout's terms (the same in both paths): the covariances pass
through H_FF^{-1} twice, which multiplies a relative error by at most cond(H_FF) each time, so they agree to
cond^2 delta relative to their largest entry; 4 cond^2 delta leaves a factor of 4 for the additions between. A
pinned class's profile bound is the root of a convex increasing drop with drop(0) = 0 found to 1e-12 relative (by
bisection on an array, by Newton's method on partitions), whose values agree to delta relative: the root moves by at
most delta relative (t drop'(t) >= drop(t)), so 2e-12 more.
The accuracy's sums are of one sign (pi (1 - pi)) or shifted sums of squares combined by Chan's update (within
3 delta of the variance, as in tests/unit/test_label_shift_partitions.py), and its prior comes from the interval:
the same 4 cond^2 delta. Solving MLLS on both (weights=None): each solve stops once its Newton step is at most
tol = 1e-10 on the same float32 calibrated rows, so the two weights are within 2 tol.
"""
from __future__ import annotations

import numpy as np
import pytest

from labelshift import rows
from labelshift.calibration import BCTS
from labelshift.errors import InputError
from labelshift.inference.accuracy import expected_accuracy
from labelshift.inference.repeats import find_repeats
from labelshift.inference.source_aware import source_aware_interval
from labelshift.partitions import PerPartition, local_rows
from tests.fixtures.draws import gaussian_logits

BLOCK = 1000
EPS64 = float(np.finfo(np.float64).eps)
#: where the target is cut: uneven partitions, one of 1 row and one of 0 rows
CUTS = (0, 1, 1, 1700, 1701, 4100, 5500)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of 1000 rows; sets of more than 2000 rows count as large (the whole array runs in row blocks too)."""
    monkeypatch.setattr(rows, "ROW_BLOCK", BLOCK)
    monkeypatch.setattr(rows, "LARGE_ROWS", 2000)


def _case(seed, k, m, pinned, dtype=np.float32):
    """Holdout logits (3000 rows) and a BCTS fit on them; target logits of m rows (one class absent when
    ``pinned``), cut into partitions at CUTS (or three for k > 100)."""
    rng = np.random.default_rng(seed)

    def logits(n, prior):
        return gaussian_logits(rng, n, prior, scale=1.3, offset=0.2 * np.arange(k) / k)

    Xh, yh = logits(3000, np.full(k, 1 / k))
    cal = BCTS(tol=1e-9).fit(Xh, yh)
    pt = rng.dirichlet(np.ones(k) * 3)
    if pinned:
        pt[1] = 0.0
    Xt = logits(m, pt / pt.sum())[0].astype(dtype)
    cuts = CUTS if k <= 100 else (0, 1, 1500, m)
    return Xh, yh, cal, Xt, local_rows([Xt[a:b] for a, b in zip(cuts[:-1], cuts[1:])])


def _delta(m, k, parts):
    return 2.0 * (k + BLOCK + -(-m // BLOCK) + parts) * EPS64


def _close(new, ref, rtol, name):
    new, ref = np.asarray(new, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    scale = float(np.nanmax(np.abs(ref))) if np.any(np.isfinite(ref)) else 1.0
    np.testing.assert_allclose(new, ref, rtol=rtol, atol=rtol * scale, equal_nan=True, err_msg=name)


def scaled(B, factor, offset):
    return B * factor + offset


def row_sums(B, more):
    return B.sum(axis=0) + more


def test_derived_rows_run_the_transform_first_with_per_partition_arguments():
    parts = [np.arange(6.0).reshape(3, 2), np.ones((1, 2)), np.zeros((0, 2))]
    R = local_rows(parts)
    D = R.derived(scaled, PerPartition((2.0, 3.0, 4.0)), 1.0, dtype=np.float32)
    assert D.shape == R.shape and D.partition_rows == R.partition_rows and D.dtype == np.float32
    got = D.run(row_sums, PerPartition((10.0, 20.0, 30.0)))
    want = [scaled(p, f, 1.0).sum(axis=0) + c for p, f, c in zip(parts, (2.0, 3.0, 4.0), (10.0, 20.0, 30.0))]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    twice = D.derived(scaled, 0.5, 0.0)                   # a transform of a transform: applied in order
    np.testing.assert_array_equal(twice.run(row_sums, 0.0)[0], (parts[0] * 2.0 + 1.0).sum(axis=0) * 0.5)
    with pytest.raises(TypeError, match="not gathered"):
        np.asarray(D)


@pytest.mark.parametrize("k, pinned, seed", [(4, False, 6), (4, True, 1), (120, True, 121)])
def test_interval_and_accuracy_on_partitions_equal_the_whole_array(k, pinned, seed):
    m = 5500 if k <= 100 else 4000
    Xh, yh, cal, Xt, R = _case(seed, k, m, pinned)
    solved = source_aware_interval(Xh, yh, Xt, cal)
    assert bool(solved.pinned.any()) == pinned
    np.testing.assert_allclose(source_aware_interval(Xh, yh, R, cal).weights, solved.weights, rtol=0, atol=2e-10)

    w = solved.weights
    ref = source_aware_interval(Xh, yh, Xt, cal, weights=w)
    new = source_aware_interval(Xh, yh, R, cal, weights=w)
    F = np.flatnonzero(~ref.pinned)
    cond = float(np.linalg.cond(_free_hessian(cal, Xt, w, F)))
    rtol = 4.0 * cond ** 2 * _delta(m, k, len(R.partition_rows))
    assert rtol < 1e-8                                    # the comparison means something
    for key in ("covariance", "covariance_target", "covariance_holdout", "weights_covariance", "holdout_influence",
                "lower", "upper", "weights_lower", "std_error", "weights_std_error"):
        _close(getattr(new, key), getattr(ref, key), rtol, key)
    _close(new.weights_upper, ref.weights_upper, rtol + 2e-12, "weights_upper")   # pinned: roots to 1e-12
    assert new.reasons == ref.reasons and np.array_equal(new.pinned, ref.pinned)

    acc_ref = expected_accuracy(Xh, yh, Xt, cal, interval=ref)
    acc = expected_accuracy(Xh, yh, R, cal, interval=new)
    for key in ("expected", "lower", "upper", "std_error", "batch_std_error", "batch_lower", "corrected",
                "corrected_std_error", "corrected_batch_std_error"):
        _close(getattr(acc, key), getattr(acc_ref, key), rtol, key)
    assert acc.n_target == m and acc.reasons == acc_ref.reasons


def _free_hessian(cal, Xt, w, F):
    """H_FF = (1/m) sum_i s_i,F s_i,F^T of the calibrated target rows (for the tolerance)."""
    P = cal.predict_proba(Xt.astype(np.float64))
    S = P / (P @ w)[:, None]
    return S[:, F].T @ S[:, F] / S.shape[0]


def test_what_does_not_run_on_partitions_yet_says_so():
    Xh, yh, cal, Xt, R = _case(6, 4, 5500, False)
    Xr = Xt.copy()
    Xr[1::2] = Xr[::2][: Xr[1::2].shape[0]]                 # every row twice
    Rr = local_rows([Xr[:3000], Xr[3000:]])
    P = cal.predict_proba(Xr.astype(np.float64))
    with pytest.raises(TypeError, match="repeated target rows: this pass .* does not run over partitions yet"):
        source_aware_interval(Xh, yh, Rr, cal, repeats=find_repeats(P))
    with pytest.raises(InputError, match="target_outputs has 3 class columns"):
        source_aware_interval(Xh, yh, local_rows([Xt[:, :3]]), cal)


def test_a_calibrator_fit_on_probabilities_and_an_empty_partition():
    """Raw outputs that are probabilities (read as log-scores on the workers) with a pinned class: the profile
    bound's float64 calibrated rows are made per partition, the empty one included; tolerances as above."""
    Xh, yh, _, Xt, _ = _case(1, 4, 5500, True, dtype=np.float64)

    def softmax(z):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    Sh, St = softmax(Xh), softmax(Xt)
    cal = BCTS(tol=1e-9).fit(Sh, yh)
    R = local_rows([St[a:b] for a, b in zip(CUTS[:-1], CUTS[1:])])
    ref = source_aware_interval(Sh, yh, St, cal)
    new = source_aware_interval(Sh, yh, R, cal, weights=ref.weights)
    ref = source_aware_interval(Sh, yh, St, cal, weights=ref.weights)
    assert ref.pinned.any() and np.array_equal(new.pinned, ref.pinned)
    F = np.flatnonzero(~ref.pinned)
    rtol = 4.0 * float(np.linalg.cond(_free_hessian(cal, St, ref.weights, F))) ** 2 * _delta(5500, 4, len(CUTS) - 1)
    _close(new.weights_upper, ref.weights_upper, rtol + 2e-12, "weights_upper")
    _close(new.std_error, ref.std_error, rtol, "std_error")


@pytest.mark.parametrize("k, seed", [(4, 1), (120, 121)])
def test_pinned_bounds_on_partitions_take_newtons_few_passes_for_all_pinned_classes(k, seed):
    """The profile bounds of the pinned classes on partitions: every pinned class's root in the same passes, about
    eight (Newton's method converges quadratically once near the root; bisection took about 40 a class), and the
    bounds of the array's bisection to 2e-12 relative plus the sums' grouping (module docstring)."""
    from dataclasses import replace

    from labelshift.estimation.solvers import mlls_hessian, mlls_newton_rows
    from labelshift.inference.intervals import PIN_TOL, pinned_bounds

    _, _, cal, Xt, R = _case(seed, k, 4000 if k > 100 else 5500, True)
    P = cal.predict_proba(Xt).astype(np.float32)
    cuts = np.cumsum((0,) + R.partition_rows)
    parts = local_rows([P[a:b] for a, b in zip(cuts[:-1], cuts[1:])])
    p = np.full(k, 1.0 / k)
    w = mlls_newton_rows(P, p).weights
    H = mlls_hessian(P.astype(np.float64), w)
    free = w > PIN_TOL
    calls = []
    counted = replace(parts, run=lambda fn, *args: calls.append(fn.__name__) or parts.run(fn, *args))
    ref = pinned_bounds(P, w, H, p, free, 1.96)
    new = pinned_bounds(counted, w, H, p, free, 1.96)
    assert (~free).sum() >= 1 and len(calls) <= 12, (int((~free).sum()), len(calls))
    pinned = ~free
    np.testing.assert_allclose(new[pinned], ref[pinned], rtol=2e-12 + 4 * _delta(P.shape[0], k, len(cuts) - 1))
    assert np.isnan(new[free]).all()


def test_pinned_bounds_on_partitions_are_not_fooled_by_one_hot_rows_at_the_segments_end():
    """Rows all on one class (a confident classifier's, float32) make 1 + t r round to ~1e-16 at the segment's end:
    drop there is finite and huge, its slope far larger, so Newton's first step is tiny although the root is far
    away. The bound must still be the root (the array's bisection), not the segment's end."""
    from labelshift.estimation.solvers import mlls_hessian, mlls_newton_rows
    from labelshift.inference.intervals import PIN_TOL, pinned_bounds

    k, checked = 3, 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        P = rng.dirichlet(np.full(k, 0.7), size=3000) * np.array([1.0, 1.0, 0.05])
        P = (P / P.sum(axis=1, keepdims=True)).astype(np.float32)
        p = np.full(k, 1.0 / k)
        w = mlls_newton_rows(P, p).weights
        free = w > PIN_TOL
        if free.all():
            continue
        binding = int(np.argmax(free))                  # a free class: rows all on it end a pinned class's segment
        P[:3] = np.eye(k, dtype=np.float32)[binding]
        w = mlls_newton_rows(P, p).weights
        free = w > PIN_TOL
        if free.all():
            continue
        H = mlls_hessian(P.astype(np.float64), w)
        ref = pinned_bounds(P, w, H, p, free, 1.96)
        new = pinned_bounds(local_rows([P[:1000], P[1000:]]), w, H, p, free, 1.96)
        np.testing.assert_allclose(new[~free], ref[~free], rtol=1e-9)
        checked += 1
    assert checked >= 3, checked
