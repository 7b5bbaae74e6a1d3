"""The inputs of the statistics of an MLLS estimate (Garg et al., NeurIPS 2020, Sections 4.2 and 5): the target rows
and the source prior checked, the MLLS weights checked for optimality (or solved), and the row sums they need, in
row blocks for a large set (:mod:`labelshift.rows`).

Notation: f_i = f(x_i), the calibrated source posterior on target row i (i = 1..m, k classes); p_s the source
prior; W = {w >= 0, p_s^T w = 1}; L_m(w) = (1/m) sum_i log f_i^T w, eq. (mlls-sample); w_hat its maximiser; the
target prior is p_t = p_s * w.
"""
from __future__ import annotations

import numpy as np

from .. import rows as _rows
from .._validation import as_float_array, check_given_weights, check_prior, check_probabilities
from ..errors import InputError, NotMaximiserError
from ..partitions import is_partitioned
from ..estimation.solvers import mlls_gradient, mlls_newton

# |p_s^T w - 1| above this: the weights are not in W
_SUM_TOL = 1e-6
#: the duality gap the MLLS solvers certify at convergence (their default ``tol``, :mod:`labelshift.estimation`)
SOLVER_GAP = 1e-10
_EPS64 = float(np.finfo(np.float64).eps)


def check_inputs(target_probs, source_prior):
    """The target rows (m, k) and the source prior (k,), checked and checked against each other."""
    P = check_probabilities(target_probs, "target_probs", 2)
    k = P.shape[1]
    p = as_float_array(source_prior, "source_prior", 1)
    if p.shape[0] != k:
        raise InputError(f"source_prior has {p.shape[0]} entries but target_probs has {k} class columns; both must "
                         "describe the same classes of the same classifier.")
    return P, check_prior(p, "source_prior", k)


def dot_rows(P, w) -> np.ndarray:
    """P @ w in float64; in row blocks for a large set (:mod:`labelshift.rows`)."""
    return _rows.row_dot(P, w) if _rows.is_large(P) else P @ w


def mean_cov(P) -> tuple[np.ndarray, np.ndarray]:
    """Column means and covariance (ddof 1); in one blocked pass for a large set (:mod:`labelshift.rows`)."""
    if _rows.is_large(P):
        return _rows.mean_cov(P)
    return P.mean(axis=0), np.cov(P, rowvar=False, ddof=1)


def gap_tolerance(m: int, k: int, rows_eps: float = 0.0) -> float:
    """The largest Frank-Wolfe duality gap that the MLLS maximiser can read as, computed here in float64 sums over m
    rows of k classes, on rows within relative ``rows_eps`` (entrywise) of the rows it was solved on (0: the same
    rows): SOLVER_GAP (what the solver certified) plus what the arithmetic can add. A relative change e of every
    entry moves each s_iy = f_iy / f_i^T w by at most a factor (1 + e) / (1 - e), so the gap by 2 e / (1 - e)
    times (1 + gap); the float64 sums of the solver's gradient and of the one that checks it are each off by at
    most (rows summed in a block + blocks + 2k + 4) eps64, relative (docs/solvers.md, "Reading a maximiser's
    gap"). Rows that repeat do not average the rounding away, so no sqrt(m) is taken."""
    sums = (min(m, _rows.ROW_BLOCK) + -(-m // _rows.ROW_BLOCK) + 2 * k + 4) * _EPS64
    return SOLVER_GAP + (1.0 + SOLVER_GAP) * (2.0 * rows_eps / (1.0 - rows_eps) + 2.0 * sums)


def accepted_gap(m: int, k: int) -> float:
    """The gap up to which given weights are used as they are: 1e-3 / m (the likelihood-ratio statistic, 2 m times
    L_m(w_hat) - L_m(w) <= 2 m gap, is then off by at most 2e-3), or the arithmetic's own :func:`gap_tolerance`."""
    return max(1e-3 / m, gap_tolerance(m, k))


def certified_weights(P, w: np.ndarray, p: np.ndarray, fix: str) -> np.ndarray:
    """Given weights w (in W) as the MLLS maximiser for rows P: as they are when their duality gap on P is at most
    :func:`accepted_gap`; re-solved on P from w when the gap is larger but within what rounding P to its own
    precision explains (:func:`gap_tolerance` with P's eps: weights solved on a float64 copy of float32 rows,
    or on rows made in another order); InputError ending with ``fix`` when nothing in the arithmetic explains it
    (weights of another estimator, or of other rows)."""
    m, k = P.shape
    gap = float(np.max(mlls_gradient(P, w) / p) - 1.0)
    if gap <= accepted_gap(m, k):
        return w
    rounding = gap_tolerance(m, k, float(np.finfo(P.dtype).eps))
    if gap <= rounding:
        return np.maximum(mlls_newton(P, p, init=w).weights, 0.0)
    raise NotMaximiserError(f"weights are not the MLLS maximiser for these target_probs (duality gap {gap:.3g} > "
                            f"{max(rounding, accepted_gap(m, k)):.3g}, more than the rounding of these rows "
                            "explains); " + fix)


def check_mle(P, weights, p) -> np.ndarray:
    """The MLLS weights for target rows P: given ones are checked (shape, range, p_s^T w = 1 and optimality),
    None solves eq. (mlls-sample)."""
    m, k = P.shape
    if weights is None:
        res = mlls_newton(P, p)
        w = np.maximum(res.weights, 0.0)
    else:
        w = check_given_weights(
            weights, k, p, sum_tol=_SUM_TOL, shape_fix="pass the weights estimated on these target_probs.",
            sign_fix="these intervals are for the MLLS estimate, which lies in W = {w >= 0, sum_y w_y p_s(y) = 1}. "
                     "Pass MLLS weights (or None to solve MLLS here), or use bootstrap_interval for other estimators.",
            sum_fix="Pass the MLLS weights estimated with this source_prior (or None to solve MLLS here).")
    zero = _rows.mlls_total(P, w).dead if is_partitioned(P) else int(np.sum(dot_rows(P, w) <= 0))
    if zero:
        raise InputError(f"weights give zero likelihood to {zero} target row(s) (f_i^T w = 0): "
                         "they are not the MLLS estimate for these target_probs.")
    if weights is not None:
        w = certified_weights(P, w, p, "Fisher intervals, the likelihood-ratio test and the Hessian diagnostics hold "
                                       "at the maximum. Pass MLLS().fit(...).estimate(target_probs).weights for the "
                                       "same rows and source prior, or weights=None to solve MLLS here.")
    return w
