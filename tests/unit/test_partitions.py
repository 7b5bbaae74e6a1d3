"""Rows in partitions (:mod:`labelshift.partitions`): the per-partition sums of :mod:`labelshift.rows` and their
reduce equal the whole-array passes on the concatenated rows, and MLLS, BBSE and the no-shift test take partitioned
rows. The engine here is :func:`labelshift.partitions.local_rows` (a loop in this process); the Dask cluster's is
tested in tests/integration/test_cluster_rows.py.

Tolerances, from the arithmetic. Both paths compute every row's terms (f_i^T w, its log, f_i / f_i^T w, ...) with the
same float64 operations, and differ only in how the terms are grouped into sums: blocks cut at other rows, partition
sums added last. A float64 sum of n terms is off by at most (n - 1) eps |terms|-summed (recursive summation; numpy's
pairwise sums and BLAS do better), and a row's dot product by k eps relative when BLAS groups its k products
differently at a block's edge. With blocks of B rows, b blocks and p partitions, each path's sum is within
(k + B + b + p) eps of the exact sum of the |terms|, so the two are within twice that: :func:`_bound`. The
float32 passes (the warm start of the row solver) add float32 block sums, so eps32 in place of eps there.
Covariances combined by Chan's formula add the same centred terms, and the outer product of the means' difference,
which is about as large as the covariance entries: the bound times the largest variance.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from labelshift import BBSE, MLLS, rows
from labelshift.errors import InputError
from labelshift.estimation.solvers import mlls_newton_rows
from labelshift.inference.no_shift import no_shift_test
from labelshift.partitions import Moments, PartitionedRows, combine_moments, local_rows

K = 5
BLOCK = 1000
EPS64 = float(np.finfo(np.float64).eps)
EPS32 = float(np.finfo(np.float32).eps)
#: where the sets are cut: uneven partitions, one of 1 row and one of 0 rows
CUTS = (0, 1, 1, 1700, 1701, 4100, 6000)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of 1000 rows, so that a partition spans several blocks and blocks end at other rows than in the whole
    array; sets of more than 2000 rows count as large (the row solver runs on the whole array too)."""
    monkeypatch.setattr(rows, "ROW_BLOCK", BLOCK)
    monkeypatch.setattr(rows, "LARGE_ROWS", 2000)


def _draw(rng, m, prior, sep=2.0, dtype=np.float64):
    y = rng.choice(len(prior), size=m, p=prior)
    z = rng.normal(size=(m, len(prior)))
    z[np.arange(m), y] += sep
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p = (p / p.sum(axis=1, keepdims=True)).astype(dtype)
    return p / p.sum(axis=1, keepdims=True, dtype=dtype), y


def _parts(P):
    return local_rows([P[a:b] for a, b in zip(CUTS[:-1], CUTS[1:])])


def _bound(m, k, eps=EPS64):
    """Twice the rounding of one path's sums, relative to the sum of the |terms| (module docstring)."""
    return 2.0 * (k + BLOCK + -(-m // BLOCK) + len(CUTS)) * eps


def _sets(dtype):
    rng = np.random.default_rng(7)
    P, _ = _draw(rng, CUTS[-1], np.array([0.4, 0.3, 0.1, 0.1, 0.1]), dtype=dtype)
    P[100] = P[2000] = np.array([0.0, 0.0, 0.0, 0.3, 0.7], dtype)      # f_i^T w = 0 below where w_3 = w_4 = 0
    return P, _parts(P)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_partition_sums_equal_the_whole_array_passes(dtype):
    P, R = _sets(dtype)
    m, k = P.shape
    tol = _bound(m, k)
    np.testing.assert_allclose(rows.column_sums(R), rows.column_sums(P), rtol=tol)
    np.testing.assert_array_equal(rows.argmax_counts(R), rows.argmax_counts(P))       # integer counts: exact
    mean, cov = rows.mean_cov(P)
    mean_r, cov_r = rows.mean_cov(R)
    np.testing.assert_allclose(mean_r, mean, rtol=tol)
    np.testing.assert_allclose(cov_r, cov, rtol=0, atol=tol * float(np.max(np.diag(cov))))
    w = np.array([1.3, 0.9, 1.1, 0.7, 0.5])
    P64 = P.astype(np.float64)
    fw = P64 @ w
    for hessian in (False, True):
        obj, grad, H, dead = rows.mlls_pass(P, w, hessian=hessian)
        obj_r, grad_r, H_r, dead_r = rows.mlls_pass(R, w, hessian=hessian)
        assert dead_r is dead is False
        assert abs(obj_r - obj) <= tol * float(np.mean(np.abs(np.log(fw))))
        np.testing.assert_allclose(grad_r, grad, rtol=tol)            # sums of positive terms: relative
        if hessian:
            np.testing.assert_allclose(H_r, H, rtol=tol)
    ratio = rows.log_ratio_sum(R, w, np.ones(k))
    assert abs(ratio - rows.log_ratio_sum(P, w, np.ones(k))) <= tol * float(np.sum(np.abs(np.log(fw / P64.sum(1)))))


def test_dead_rows_are_counted_and_left_out_as_in_the_whole_array():
    P, R = _sets(np.float64)
    w = np.array([2.0, 1.0, 1.0, 0.0, 0.0])
    obj, grad, H, dead = rows.mlls_pass(P, w, hessian=True)
    obj_r, grad_r, H_r, dead_r = rows.mlls_pass(R, w, hessian=True)
    assert dead and dead_r and obj == obj_r == -np.inf
    assert rows.mlls_total(R, w).dead == rows.mlls_total(P, w).dead == 2
    tol = _bound(*P.shape)
    np.testing.assert_allclose(grad_r, grad, rtol=tol)
    np.testing.assert_allclose(H_r, H, rtol=tol)


def test_float32_passes_agree_to_float32_block_sums():
    P, R = _sets(np.float32)
    w = np.array([1.3, 0.9, 1.1, 0.7, 0.5])
    grad = rows.mlls_pass(P, w, precision=np.float32)[1]
    grad_r = rows.mlls_pass(R, w, precision=np.float32)[1]
    np.testing.assert_allclose(grad_r, grad, rtol=_bound(*P.shape, eps=EPS32))


def test_chan_combine_has_no_cancellation_far_from_zero():
    """Rows around 1e6 with spread 1: raw sums of squares would lose the variance (1e12 - 1e12); Chan's update of
    centred parts keeps it to the same relative accuracy as the one-array pass."""
    rng = np.random.default_rng(3)
    X = 1e6 + rng.normal(size=(5000, 3))
    parts = [rows.moments(X[a:b]) for a, b in ((0, 1), (1, 2500), (2500, 2500), (2500, 5000))]
    total = combine_moments(parts)
    assert total.rows == 5000
    exact = np.array([math.fsum(c) for c in X.T]) / 5000          # correctly rounded sums: the mean to 2 eps
    np.testing.assert_allclose(total.mean, exact, rtol=8 * EPS64)
    # the covariance of the rows centred on that mean (no cancellation left): the variances are about 1, and the
    # sums of 5000 centred squares are good to 5000 eps on either side
    np.testing.assert_allclose(total.cross / 4999, np.cov(X - exact, rowvar=False), rtol=0, atol=2 * 5000 * EPS64)
    with pytest.raises(ValueError):
        combine_moments([Moments(0, np.zeros(3), np.zeros((3, 3)))])


def test_mlls_bbse_and_the_no_shift_test_on_partitioned_rows():
    """The estimators and the no-shift test give the one-array answers. MLLS: both runs of the row solver stop
    once the Newton step is at most tol = 1e-10 (max-norm), so each is within about tol of the optimum and the two
    within 2 tol; their float32 warm starts differ by the summation order, so that is what they differ by."""
    rng = np.random.default_rng(11)
    prior = np.array([0.4, 0.3, 0.1, 0.1, 0.1])
    P, _ = _draw(rng, CUTS[-1], prior)
    R = _parts(P)
    S, ys = _draw(rng, 3000, np.full(K, 0.2))
    ps = np.bincount(ys, minlength=K) / ys.size
    a, b = mlls_newton_rows(P, ps), mlls_newton_rows(R, ps)
    assert a.converged and b.converged
    np.testing.assert_allclose(b.weights, a.weights, rtol=0, atol=1e-9)
    for est in (MLLS(), BBSE(), BBSE(soft=True)):
        est.fit(S, ys)
        np.testing.assert_allclose(est.estimate(R).weights, est.estimate(P).weights, rtol=0, atol=1e-9)
    lr, lr_r = no_shift_test(P, None, ps), no_shift_test(R, None, ps)
    assert lr_r.statistic == pytest.approx(lr.statistic, rel=1e-9)
    two, two_r = no_shift_test(P, None, ps, source_probs=S), no_shift_test(R, None, ps, source_probs=S)
    assert two_r.statistic == pytest.approx(two.statistic, rel=1e-9) and two_r.dof == two.dof


def test_partitions_are_checked_where_they_live_and_never_gathered():
    P, _ = _draw(np.random.default_rng(0), 300, np.full(K, 0.2))
    bad = P[100:].copy()
    bad[5, 0] = np.nan
    R = local_rows([P[:100], bad], names=["day-1.npy", "day-2.npy"])
    with pytest.raises(InputError, match="day-2.npy: 1 NaN"):
        MLLS().fit(P, np.argmax(P, 1)).estimate(R)
    logits = local_rows([P[:100], np.log(P[100:])])
    with pytest.raises(InputError, match="partition 1: .* negative entries"):
        no_shift_test(logits, None, np.full(K, 0.2))
    for gather in (np.asarray, lambda x: x[0], lambda x: rows.row_dot(x, np.ones(K))):
        with pytest.raises(TypeError, match="does not run over partitions yet"):
            gather(R)
    with pytest.raises(ValueError, match="hold 300 rows"):
        PartitionedRows((301, K), np.float64, lambda fn, *a: [], (100, 200))
