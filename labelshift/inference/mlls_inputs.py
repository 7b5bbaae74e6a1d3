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
from ..errors import InputError
from ..estimation.solvers import mlls_gradient, mlls_newton

# |p_s^T w - 1| above this: the weights are not in W
_SUM_TOL = 1e-6


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


def _mle_gap_tol(m: int) -> float:
    """Largest Frank-Wolfe duality gap accepted for 'w is the MLLS maximiser'. The gap bounds L_m(w_hat) - L_m(w),
    so the likelihood-ratio statistic is off by at most 2 m gap: <= 2e-3 here (MLLS's default tol is 1e-10)."""
    return max(1e-3 / m, 2e-10)


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
    fw = dot_rows(P, w)
    if np.any(fw <= 0):
        raise InputError(f"weights give zero likelihood to {int(np.sum(fw <= 0))} target row(s) (f_i^T w = 0): "
                         "they are not the MLLS estimate for these target_probs.")
    if weights is not None:
        gap = float(np.max(mlls_gradient(P, w) / p) - 1.0)
        if gap > _mle_gap_tol(m):
            raise InputError(
                f"weights are not the MLLS maximiser for these target_probs (duality gap {gap:.3g} > "
                f"{_mle_gap_tol(m):.3g}); Fisher intervals, the likelihood-ratio test and the Hessian diagnostics "
                "hold at the maximum. Pass MLLS().fit(...).estimate(target_probs).weights for the same rows and "
                "source prior, or weights=None to solve MLLS here.")
    return w
