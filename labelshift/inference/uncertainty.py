"""Uncertainty of an MLLS label-shift estimate (Garg et al., NeurIPS 2020, Sections 4.2 and 5): confidence
intervals on the target prior, a test of "no shift", and an identifiability report.

Notation: f_i = f(x_i), the calibrated source posterior on target row i (i = 1..m, k classes); p_s the source
prior; W = {w >= 0, p_s^T w = 1}; L_m(w) = (1/m) sum_i log f_i^T w, eq. (mlls-sample); w_hat its maximiser; the
target prior is p_t = p_s * w.

* :func:`fisher_interval` -- normal intervals from the constrained Fisher information, Cov(w_hat) =
  (1/m) Z (Z^T H Z)^{-1} Z^T with H the negated Hessian of eq. (proof-hessian); one-sided profile-likelihood
  intervals for classes pinned at w_y = 0.
* :func:`bootstrap_interval` -- percentile intervals from resampling the target rows, for any estimator.
* :func:`no_shift_test` -- H0: w = 1, as a likelihood-ratio test (f and p_s known) or a two-sample test of the mean
  calibrated prediction (source side estimated too).
* :func:`identifiability` -- whether the reported estimate can be trusted, relative to each class's share: for MLLS
  each class's relative error and the pinned classes' bounds (the confusion matrix of a BBSE cross-check is
  information); for BBSE sigma_min(C) sqrt(n_source) >= BBSE_FLAG_SNR; optionally a maximum interval width.

All of them treat f and p_s as known except the two-sample test. The derivations, what each leaves out and the
measured coverage and size are in ``docs/uncertainty.md``.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import eigh as scipy_eigh
from scipy.linalg import null_space
from scipy.stats import chi2, norm
from scipy.stats import f as f_dist

from .. import rows as _rows
from .._numbers import finite_or_none, none_as_nan
from .._validation import as_float_array, check_given_weights, check_level, check_prior, check_probabilities
from ..estimation.diagnostics import confusion_condition
from ..errors import FormatError, IllConditionedWarning, InputError
from ..estimation.estimators import BBSE_FLAG_SNR, MLLS, MLLS_FLAG_M_SIGMA
from .repeats import clustered_covariance
from ..estimation.solvers import PIN_TOL, mlls_gradient, mlls_hessian, mlls_newton, restricted_min_eigenvalue

__all__ = ["PriorInterval", "fisher_interval", "bootstrap_interval", "NoShiftTest", "no_shift_test",
           "Identifiability", "identifiability", "PIN_TOL", "MAX_STANDARD_ERROR",
           "MAX_RELATIVE_ERROR"]

#: the worst standard error of w that still counts as identified: 1 / sqrt(MLLS_FLAG_M_SIGMA) = 1/2
MAX_STANDARD_ERROR = 1.0 / math.sqrt(MLLS_FLAG_M_SIGMA)
#: the largest relative error of a free class's estimate that still counts as identified: the standard error of
#: p_t(y) over max(p_t(y), p_s(y)) (= that of w_y over max(w_y, 1)); how it was chosen: ``docs/uncertainty.md``
MAX_RELATIVE_ERROR = 0.5

# eigenvalues of the tangent information below this fraction of the largest count as zero (no information in that
# direction: the variance there becomes huge and the interval spans the whole range)
_EIG_FLOOR = 1e-14
# classes above which the pinned classes' profile directions share one eigendecomposition on the free set
# (_FreeTangent) instead of one on each grown set (issue 20: 14 pinned classes at k = 1,000 took 58 s)
_SHARED_TANGENT_MIN_CLASSES = 100
# bytes of resampled target rows per estimate call of the bootstrap
_BOOTSTRAP_CHUNK_BYTES = 32 * 2**20
# |p_s^T w - 1| above this: the weights are not in W
_SUM_TOL = 1e-6


# ---------------------------------------------------------------------------------------------------------------
# JSON helpers
# ---------------------------------------------------------------------------------------------------------------
def _nums(a) -> list:
    return [finite_or_none(v) for v in np.asarray(a, dtype=np.float64).ravel()]


def _json_value(v):
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return finite_or_none(v)
    if isinstance(v, np.ndarray):
        return [_json_value(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    return v


def _array(values) -> np.ndarray:
    return np.array([none_as_nan(v) for v in values], dtype=np.float64)


def _require(d, name: str, keys: tuple[str, ...]) -> dict:
    """``d`` if it is a dict with ``keys``; FormatError naming what is missing otherwise."""
    if not isinstance(d, dict):
        raise FormatError(f"{name} must be a dict as written by to_dict(), got {type(d).__name__}.")
    missing = [k for k in keys if k not in d]
    if missing:
        raise FormatError(f"{name} lacks {', '.join(missing)}; pass the dict that to_dict() wrote.")
    return d


# ---------------------------------------------------------------------------------------------------------------
# input checks
# ---------------------------------------------------------------------------------------------------------------
def _check_inputs(target_probs, source_prior):
    P = check_probabilities(target_probs, "target_probs", 2)
    k = P.shape[1]
    p = as_float_array(source_prior, "source_prior", 1)
    if p.shape[0] != k:
        raise InputError(f"source_prior has {p.shape[0]} entries but target_probs has {k} class columns; both must "
                         "describe the same classes of the same classifier.")
    return P, check_prior(p, "source_prior", k)


def _dot(P, w) -> np.ndarray:
    """P @ w in float64; in row blocks for a large set (:mod:`labelshift.rows`)."""
    return _rows.row_dot(P, w) if _rows.is_large(P) else P @ w


def _mean_cov(P) -> tuple[np.ndarray, np.ndarray]:
    """Column means and covariance (ddof 1); in one blocked pass for a large set (:mod:`labelshift.rows`)."""
    if _rows.is_large(P):
        return _rows.mean_cov(P)
    return P.mean(axis=0), np.cov(P, rowvar=False, ddof=1)


def _mle_gap_tol(m: int) -> float:
    """Largest Frank-Wolfe duality gap accepted for 'w is the MLLS maximiser'. The gap bounds L_m(w_hat) - L_m(w),
    so the likelihood-ratio statistic is off by at most 2 m gap: <= 2e-3 here (MLLS's default tol is 1e-10)."""
    return max(1e-3 / m, 2e-10)


def _check_mle(P, weights, p) -> np.ndarray:
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
    fw = _dot(P, w)
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


# ---------------------------------------------------------------------------------------------------------------
# the constrained Fisher information
# ---------------------------------------------------------------------------------------------------------------
def _tangent_covariance(H: np.ndarray, p: np.ndarray, support: np.ndarray) -> np.ndarray:
    """Per-example covariance Z (Z^T H_SS Z)^{-1} Z^T of the MLE restricted to the coordinates S = ``support``
    (others held at 0), Z an orthonormal basis of {d_S : p_S^T d_S = 0}. Zero outside S x S; all zero when
    |S| <= 1 (the constraint then fixes w). Directions without information get a huge variance."""
    k = H.shape[0]
    idx = np.flatnonzero(support)
    cov = np.zeros((k, k))
    if idx.size < 2:
        return cov
    Z = null_space(p[idx][None, :])
    A = Z.T @ H[np.ix_(idx, idx)] @ Z
    lam, V = np.linalg.eigh(0.5 * (A + A.T))
    lam = np.maximum(lam, max(_EIG_FLOOR * float(lam.max()), 1e-300))
    B = Z @ V
    cov[np.ix_(idx, idx)] = (B / lam) @ B.T
    return cov


def _profile_direction(H: np.ndarray, p: np.ndarray, grown: np.ndarray, y: int) -> np.ndarray:
    """The profile direction b of pinned class y on the grown set G = ``grown`` (F + {y}): Cov[:, y] / Cov[y, y] of
    :func:`_tangent_covariance` on G, b_y = 1, 0 outside G."""
    cov = _tangent_covariance(H, p, grown)
    b = cov[:, y] / cov[y, y]
    b[y] = 1.0
    b[~grown] = 0.0
    return b


class _FreeTangent:
    """The tangent information on the free set F, A_F = Z_F^T H_FF Z_F (Z_F an orthonormal basis of
    {d_F : p_F^T d_F = 0}), with its eigendecomposition: shared by the profile directions of all pinned classes
    above _SHARED_TANGENT_MIN_CLASSES classes (:meth:`direction`; ``docs/uncertainty.md``, "Classes at the
    boundary")."""

    def __init__(self, H: np.ndarray, p: np.ndarray, free: np.ndarray):
        self.H, self.p, self.free = H, p, free
        self.idx = np.flatnonzero(free)
        self.Z = null_space(p[self.idx][None, :]) if self.idx.size >= 2 else None
        if self.Z is not None:
            A = self.Z.T @ H[np.ix_(self.idx, self.idx)] @ self.Z
            self.lam, self.V = np.linalg.eigh(0.5 * (A + A.T))

    def direction(self, y: int) -> np.ndarray:
        """The profile direction of :func:`_profile_direction` for pinned y, from A_F and one bordered row: on G the
        basis [Z_F (0 at y), v] with v the unit vector of {p_G^T d = 0} orthogonal to Z_F, so that A_G =
        [[A_F, c], [c^T, a]] and Cov[:, y] / Cov[y, y] = (v - Z_F A_F^{-1} c) / v_y; O(k^2) per class. Exact (to
        rounding) when no eigenvalue of A_G falls under the floor of _tangent_covariance, which is checked by
        bounds on A_G's extreme eigenvalues from A_F's and the Schur complement s = a - c^T A_F^{-1} c; otherwise
        (or with |F| < 2) the eigendecomposition on G, as below _SHARED_TANGENT_MIN_CLASSES classes."""
        grown = self.free.copy()
        grown[y] = True
        if self.Z is None or not self.lam[0] > _EIG_FLOOR * self.lam[-1]:
            return _profile_direction(self.H, self.p, grown, y)
        H, idx, pF = self.H, self.idx, self.p[self.idx]
        vF = -self.p[y] * pF / float(pF @ pF)
        norm = math.sqrt(float(vF @ vF) + 1.0)
        vF, vy = vF / norm, 1.0 / norm
        HvF = H[np.ix_(idx, idx)] @ vF + H[idx, y] * vy
        a = float(vF @ HvF) + vy * (float(H[y, idx] @ vF) + H[y, y] * vy)
        c = self.Z.T @ HvF
        u = self.V @ ((self.V.T @ c) / self.lam)
        s = a - float(c @ u)
        lam_min = 1.0 / (1.0 / self.lam[0] + (1.0 + float(u @ u)) / s) if s > 0 else 0.0
        if not lam_min > _EIG_FLOOR * (max(float(self.lam[-1]), a) + float(np.linalg.norm(c))):
            return _profile_direction(H, self.p, grown, y)
        b = np.zeros(len(self.p))
        b[idx] = (vF - self.Z @ u) / vy
        b[y] = 1.0
        return b


def _pinned_bounds(P, w, H, p, free, z: float, *, rows_dot=None, m: int | None = None) -> np.ndarray:
    """Upper bounds U_y on w_y for the classes pinned at 0 (nan for free ones); ``docs/uncertainty.md``,
    "Classes at the boundary".

    For each pinned y: the profile direction b (b_y = 1; the free coordinates follow the conditional mean of the
    normal approximation on F + {y}, b = Cov[:, y] / Cov[y, y], so p_s^T b = 0), and U_y is where
    2 m [L_m(w_hat) - L_m(w_hat + t b)] reaches z^2, found by bisection on the exact log-likelihood (convex and
    increasing in t >= 0), or the end of the segment inside W if it never does.

    ``rows_dot`` (with ``m``, and P None): v -> (m,) float64 f_i^T v (a (k, c) matrix V: (m, c)) for rows that are
    made block by block (the
    calibrated rows of :func:`labelshift.inference.source_aware.source_aware_interval` on a large target); the bound is
    then computed as for a large set."""
    if rows_dot is None:
        m, k = P.shape
        large = _rows.is_large(P)

        def rows_dot(v):
            return _dot(P, v)
    else:
        k, large = len(w), True
    if k > _SHARED_TANGENT_MIN_CLASSES:
        return _pinned_bounds_shared(rows_dot, w, H, p, free, z, m, large)
    out = np.full(k, np.nan)
    fw = rows_dot(w)
    base = None if large else np.log(fw)         # large: drop(t) = -2 sum log1p(t fb_i / fw_i), one (m,) vector
    for y in np.flatnonzero(~free):
        grown = free.copy()
        grown[y] = True
        b = _profile_direction(H, p, grown, int(y))
        fb = rows_dot(b)
        if large:
            fb /= fw
        out[y] = _profile_bound(_likelihood_drop(fb, fw, base, m, large), _segment_end(w, b, p[y]), z * z, p[y])
    return out


def _pinned_bounds_shared(rows_dot, w, H, p, free, z: float, m: int, large: bool) -> np.ndarray:
    """:func:`_pinned_bounds` above _SHARED_TANGENT_MIN_CLASSES classes: the profile directions from one
    :class:`_FreeTangent` (its decompositions on one BLAS thread), then f_i^T w and every f_i^T b_y in one pass over
    the rows (``rows_dot`` of the (k, 1 + pinned) matrix [w, b_y...]) instead of one pass per pinned class."""
    pinned = np.flatnonzero(~free)
    with _rows.one_blas_thread():
        shared = _FreeTangent(H, p, free)
        B = np.column_stack([w] + [shared.direction(int(y)) for y in pinned])
    FB = rows_dot(B)
    fw = np.ascontiguousarray(FB[:, 0])
    base = None if large else np.log(fw)
    out = np.full(len(w), np.nan)
    for j, y in enumerate(pinned):
        fb = FB[:, j + 1] / fw if large else np.ascontiguousarray(FB[:, j + 1])
        out[y] = _profile_bound(_likelihood_drop(fb, fw, base, m, large), _segment_end(w, B[:, j + 1], p[y]), z * z,
                                p[y])
    return out


def _segment_end(w: np.ndarray, b: np.ndarray, p_y: float) -> float:
    """The largest t with w + t b in W (b_y = 1, p_s^T b = 0)."""
    neg = b < 0
    return float(np.min(w[neg] / -b[neg])) if neg.any() else 1.0 / p_y


def _likelihood_drop(fb: np.ndarray, fw: np.ndarray, base, m: int, large: bool):
    """t -> 2 m [L_m(w_hat) - L_m(w_hat + t b)] from fb = f_i^T b (over f_i^T w when ``large``; then in row blocks,
    no (m,) temporaries) and base = log f_i^T w; inf where not finite."""
    def drop(t):
        with np.errstate(divide="ignore", invalid="ignore"):
            if large:
                val = -2.0 * sum(float(np.sum(np.log1p(t * fb[sl]))) for sl in _rows.blocks(m))
            else:
                val = 2.0 * float(np.sum(base - np.log(fw + t * fb)))
        return val if np.isfinite(val) else np.inf
    return drop


def _profile_bound(drop, t_end: float, target: float, p_y: float) -> float:
    """The t in [0, t_end] where the convex, increasing ``drop`` reaches ``target`` (bisection to 1e-12 relative), or
    t_end if it never does; at most 1 / p_s(y)."""
    if drop(t_end) <= target:
        return t_end
    lo, hi = 0.0, t_end
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if drop(mid) <= target:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return min(lo, 1.0 / p_y)


# ---------------------------------------------------------------------------------------------------------------
# intervals
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PriorInterval:
    """A confidence interval per class on the target prior p_t(y) = w(y) p_s(y) and on the weights w(y).

    Attributes:
        target_prior: the point estimate p_t = w * p_s, shape (k,).
        lower, upper: the interval on p_t(y), within [0, 1].
        weights, weights_lower, weights_upper: the same on w(y) (``lower / p_s`` etc.; lower bounds >= 0).
        std_error: standard error of p_t(y) -- Fisher: sqrt of the diagonal of D Cov(w_hat) D (nan for a class
            pinned at 0, whose interval is one-sided); bootstrap: the standard deviation of the replicates.
        level: the confidence level, e.g. 0.95.
        method: ``"fisher"`` or ``"bootstrap"``.
        pinned: (k,) bools, classes whose estimate is at the boundary w_y = 0 (w_y <= PIN_TOL); their interval is
            one-sided, [0, upper].
        n_target: number of target rows m.
        extra: method details (bootstrap: ``n_bootstrap``, ``seed``, ``estimator``, ``n_ill_conditioned``,
            ``n_not_converged``; Fisher: ``z``).
    """

    target_prior: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    weights: np.ndarray
    weights_lower: np.ndarray
    weights_upper: np.ndarray
    std_error: np.ndarray
    level: float
    method: str
    pinned: np.ndarray = None
    n_target: int | None = None
    extra: dict = field(default_factory=dict)

    def covers(self, target_prior) -> np.ndarray:
        """(k,) bools: whether each p_t(y) of ``target_prior`` lies inside [lower, upper] (ends included)."""
        q = np.asarray(target_prior, dtype=np.float64)
        return (q >= self.lower) & (q <= self.upper)

    @property
    def width(self) -> np.ndarray:
        """upper - lower, per class."""
        return self.upper - self.lower

    def to_dict(self) -> dict:
        """JSON-able: lists of floats (None for nan), the level, the method and the extras."""
        k = len(self.target_prior)
        pinned = np.zeros(k, bool) if self.pinned is None else np.asarray(self.pinned, bool)
        return {"method": self.method, "level": float(self.level),
                "target_prior": _nums(self.target_prior), "lower": _nums(self.lower), "upper": _nums(self.upper),
                "weights": _nums(self.weights), "weights_lower": _nums(self.weights_lower),
                "weights_upper": _nums(self.weights_upper), "std_error": _nums(self.std_error),
                "pinned": [bool(b) for b in pinned], "n_target": None if self.n_target is None else int(self.n_target),
                "extra": _json_value(self.extra)}

    @classmethod
    def from_dict(cls, d: dict) -> "PriorInterval":
        """The interval that :meth:`to_dict` wrote (None read back as nan); ``from_dict(d).to_dict() == d``."""
        d = _require(d, "interval", ("method", "level", "target_prior", "lower", "upper", "weights", "weights_lower",
                                     "weights_upper", "std_error"))
        return cls(target_prior=_array(d["target_prior"]), lower=_array(d["lower"]), upper=_array(d["upper"]),
                   weights=_array(d["weights"]), weights_lower=_array(d["weights_lower"]),
                   weights_upper=_array(d["weights_upper"]), std_error=_array(d["std_error"]),
                   level=float(d["level"]), method=str(d["method"]),
                   pinned=None if d.get("pinned") is None else np.asarray(d["pinned"], dtype=bool),
                   n_target=d.get("n_target"), extra=dict(d.get("extra") or {}))


def _repeats_meat(P: np.ndarray, w: np.ndarray, repeats) -> np.ndarray | None:
    """(k, k) the clustered per-row second moment (1/m) sum_g w_g s_g s_g^T of the MLLS scores s_g = f_g / f_g^T w
    over the distinct target rows (:func:`labelshift.inference.repeats.clustered_covariance`: each distinct row and
    its copies one cluster), or None when ``repeats`` changes nothing."""
    if repeats is None or not repeats.adjusts:
        return None
    repeats.check(P.shape[0])

    def scores(rows: np.ndarray) -> np.ndarray:
        F = np.asarray(P[rows], dtype=np.float64)
        return F / (F @ w)[:, None]

    return clustered_covariance(scores, repeats, P.shape[1])


def fisher_interval(target_probs, weights, source_prior, *, level: float = 0.95, repeats=None) -> PriorInterval:
    """Normal confidence intervals on the target prior from the Fisher information of the MLLS likelihood
    (eq. (mlls-sample); the Hessian of Section 5 / eq. (bound-main)), constrained to p_s^T w = 1.

    Cov(w_hat) = (1/m) Z (Z^T H Z)^{-1} Z^T with H = (1/m) sum_i f_i f_i^T / (f_i^T w_hat)^2 and Z an orthonormal
    basis of the constraint's tangent space on the free coordinates; Cov(p_t) = diag(p_s) Cov(w_hat) diag(p_s);
    interval p_t +- z se with z = Phi^{-1}((1 + level) / 2). Classes pinned at w_y = 0 get a one-sided interval
    [0, U_y] from the profile likelihood (``docs/uncertainty.md``). f and p_s are treated as known.

    Args:
        target_probs: (m, k) calibrated probabilities f(x) on the target set.
        weights: the MLLS estimate w_hat for these rows and this source prior (checked: it must be the maximiser
            to a duality gap of max(1e-3 / m, 2e-10)), or None to solve MLLS here.
        source_prior: (k,) p_s.
        level: confidence level in (0, 1).
        repeats: optional :class:`~labelshift.inference.repeats.Repeats` of these rows: when rows repeat (and are
            counted as repeated items) the covariance is the sandwich T M T / m with the clustered meat M = (1/m)
            sum_g c_g^2 s_g s_g^T over distinct rows (T the per-example covariance above, T H T = T), not T / m
            (``docs/intervals.md``, "Rows that repeat").

    Raises:
        InputError: shapes or classes that do not match, non-probabilities, weights that are not the MLLS estimate.
    """
    level = check_level(level)
    P, p = _check_inputs(target_probs, source_prior)
    w = _check_mle(P, weights, p)
    m, k = P.shape
    H = mlls_hessian(P, w)
    free = w > PIN_TOL
    z = float(norm.ppf(0.5 * (1.0 + level)))
    cov_w = _tangent_covariance(H, p, free)
    meat = _repeats_meat(P, w, repeats)
    cov_w = (cov_w if meat is None else cov_w @ meat @ cov_w) / m
    se_w = np.sqrt(np.clip(np.diag(cov_w), 0.0, None))
    w_max = 1.0 / p
    w_lo = np.clip(w - z * se_w, 0.0, w_max)
    w_hi = np.clip(w + z * se_w, 0.0, w_max)
    se_w = np.where(free, se_w, np.nan)
    if not free.all():
        bound = _pinned_bounds(P, w, H, p, free, z)
        w_lo = np.where(free, w_lo, 0.0)
        w_hi = np.where(free, w_hi, bound)
    prior = p * w
    return PriorInterval(target_prior=prior, lower=np.clip(p * w_lo, 0.0, 1.0), upper=np.clip(p * w_hi, 0.0, 1.0),
                         weights=w, weights_lower=w_lo, weights_upper=w_hi, std_error=p * se_w, level=level,
                         method="fisher", pinned=~free, n_target=m, extra={"z": z})


def _default_estimator(k: int, p: np.ndarray) -> MLLS:
    """MLLS with source prior p. MLLS uses no source outputs beyond p_s, so it is fit on the k vertices of the
    simplex (one example per class) with that prior."""
    return MLLS().fit(np.eye(k), np.arange(k), source_prior=p)


def bootstrap_interval(target_probs, source_prior, *, estimator=None, level: float = 0.95, n_bootstrap: int = 200,
                       seed: int = 0) -> PriorInterval:
    """Percentile bootstrap intervals on the target prior: resample the m target rows with replacement
    ``n_bootstrap`` times, re-estimate each replicate, and take the (1 - level)/2 and (1 + level)/2 quantiles.

    The replicates are solved in batches with the estimator's batched ``estimate`` ((B, m, k) arrays, in chunks of
    about 32 MB). Replicates flagged ill-conditioned or not converged are kept (their counts are in ``extra``)
    without the per-call warnings. Reproducible: the resampling uses ``numpy.random.default_rng(seed)``.

    Args:
        target_probs: (m, k) calibrated probabilities f(x) on the target set.
        source_prior: (k,) p_s.
        estimator: a fitted estimator of :mod:`labelshift.estimation.estimators` with this source prior; default MLLS
            (eq. (mlls-sample)). The point estimate is this estimator on the full target set.
        level: confidence level in (0, 1).
        n_bootstrap: number of resamples (>= 10; 200 or more recommended at level 0.95, 1000 for 0.99).
        seed: seed of the resampling.

    ``std_error`` is the standard deviation of the replicates of p_t. f and p_s are treated as known.
    """
    level = check_level(level)
    P, p = _check_inputs(target_probs, source_prior)
    m, k = P.shape
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, (int, np.integer)) or n_bootstrap < 10:
        raise InputError(f"n_bootstrap must be an integer >= 10 (200 or more recommended), got {n_bootstrap!r}.")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}.")
    if estimator is None:
        estimator = _default_estimator(k, p)
    else:
        if not hasattr(estimator, "estimate") or not hasattr(estimator, "n_classes_"):
            raise InputError(f"estimator must be a fitted label-shift estimator (e.g. MLLS().fit(...)), got "
                             f"{estimator!r}.")
        if estimator.n_classes_ != k:
            raise InputError(f"estimator was fit on {estimator.n_classes_} classes but target_probs has {k} class "
                             "columns.")
        if not np.allclose(estimator.source_prior_, p, rtol=0.0, atol=1e-8):
            raise InputError("estimator was fit with a different source prior than source_prior "
                             f"({np.round(estimator.source_prior_, 6).tolist()} vs {np.round(p, 6).tolist()}); "
                             "pass the prior the estimator uses.")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IllConditionedWarning)
        point = estimator.estimate(P)
    rng = np.random.default_rng(seed)
    per_chunk = max(1, _BOOTSTRAP_CHUNK_BYTES // (8 * m * k))
    weights = np.empty((n_bootstrap, k))
    priors = np.empty((n_bootstrap, k))
    n_ill = n_nc = 0
    for start in range(0, n_bootstrap, per_chunk):
        b = min(per_chunk, n_bootstrap - start)
        rows = rng.integers(0, m, size=(b, m))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", IllConditionedWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            est = estimator.estimate(P[rows])
        weights[start:start + b] = est.weights
        priors[start:start + b] = est.target_prior
        n_ill += int(np.sum(est.ill_conditioned))
        n_nc += int(b - np.sum(est.converged))
    alpha = 0.5 * (1.0 - level)
    lo_q, hi_q = alpha, 1.0 - alpha
    w_lo, w_hi = np.quantile(weights, [lo_q, hi_q], axis=0)
    lo, hi = np.quantile(priors, [lo_q, hi_q], axis=0)
    w_point = np.asarray(point.weights, dtype=np.float64)
    return PriorInterval(
        target_prior=np.asarray(point.target_prior, dtype=np.float64), lower=np.clip(lo, 0.0, 1.0),
        upper=np.clip(hi, 0.0, 1.0), weights=w_point, weights_lower=np.maximum(w_lo, 0.0),
        weights_upper=np.maximum(w_hi, 0.0), std_error=priors.std(axis=0, ddof=1), level=level, method="bootstrap",
        pinned=w_point <= PIN_TOL, n_target=m,
        extra={"n_bootstrap": int(n_bootstrap), "seed": int(seed), "estimator": getattr(estimator, "name", None),
               "n_ill_conditioned": n_ill, "n_not_converged": n_nc})


# ---------------------------------------------------------------------------------------------------------------
# the no-shift test
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NoShiftTest:
    """Result of :func:`no_shift_test`.

    Attributes:
        statistic: the likelihood ratio 2 m [L_m(w_hat) - L_m(1)], or Hotelling's T^2 of the two-sample test; >= 0.
        dof: k - 1 (fewer for the two-sample test when a direction has no variance on either side).
        p_value: P(chi^2_dof >= statistic) for the likelihood ratio; for the two-sample test
            P(F(dof, n + m - dof - 1) >= statistic (n + m - dof - 1) / ((n + m - 2) dof)), Hotelling's law.
        method: ``"likelihood-ratio"`` (f and p_s known) or ``"two-sample"`` (mean prediction, target vs source).
        n_target: m.
        n_source: the labelled source examples behind p_s (two-sample test only).
    """

    statistic: float
    dof: int
    p_value: float
    method: str = "likelihood-ratio"
    n_target: int | None = None
    n_source: int | None = None

    def rejects(self, significance: float = 0.05) -> bool:
        """True when "no shift" is rejected at this significance level (p_value < significance)."""
        significance = check_level(significance, "significance")
        return bool(self.p_value < significance)

    def to_dict(self) -> dict:
        return {"statistic": finite_or_none(self.statistic), "dof": int(self.dof), "p_value": finite_or_none(self.p_value),
                "method": self.method, "n_target": None if self.n_target is None else int(self.n_target),
                "n_source": self.n_source}

    @classmethod
    def from_dict(cls, d: dict) -> "NoShiftTest":
        """The test that :meth:`to_dict` wrote (None read back as nan); ``from_dict(d).to_dict() == d``."""
        d = _require(d, "no_shift_test", ("statistic", "dof", "p_value"))
        return cls(statistic=none_as_nan(d["statistic"]), dof=int(d["dof"]), p_value=none_as_nan(d["p_value"]),
                   method=str(d.get("method", "likelihood-ratio")), n_target=d.get("n_target"),
                   n_source=d.get("n_source"))


def no_shift_test(target_probs, weights, source_prior, *, source_probs=None, repeats=None) -> NoShiftTest:
    """Test of H0: w = 1 (no label shift, p_t = p_s).

    With ``source_probs=None`` f and p_s are taken as known: the likelihood-ratio test against the MLLS estimate
    (eq. mlls-sample), Lambda = 2 m [L_m(w_hat) - L_m(1)], clipped at 0, against chi^2 with k - 1 degrees of
    freedom (asymptotic).

    With ``source_probs`` (the calibrated outputs on the n labelled source examples the calibrator and p_s were fit
    on; what the ``reestimate`` flow uses): the two-sample Hotelling test of the mean calibrated prediction,
    T^2 = d^T [Sigma_pool (1/m + 1/n)]^+ d with d = mu_hat_t - mu_hat_s and Sigma_pool the pooled within-sample
    covariance ((m - 1) Sigma_hat_t + (n - 1) Sigma_hat_s) / (n + m - 2), in an orthonormal basis of the sum-zero
    subspace (``dof`` drops for a direction without variance on either side), referred to Hotelling's law
    (n + m - 2) dof / (n + m - dof - 1) F(dof, n + m - dof - 1). It does not use ``weights``.

    Under H0 and the label-shift assumption target and source rows have one distribution, so one covariance (the
    pooled one estimates it), and the two-sample p-value is close to uniform (exact for Gaussian rows); any label
    shift with an invertible soft confusion matrix moves the mean, so the test is consistent. Derivation, why the
    pooled covariance, measured size and power: ``docs/uncertainty.md`` ("No-shift test").

    Rows that repeat (``repeats``, :class:`~labelshift.inference.repeats.Repeats`, some copies counted as one draw):
    the two-sample form takes the target mean's covariance from its clusters, (1/m^2) sum_g w_g (f_g - mu_hat_t)
    (f_g - mu_hat_t)^T over the distinct rows (w_g = c_g^2 for a collapsed group, :func:`~labelshift.inference.
    repeats.clustered_covariance`), beside Sigma_pool / n for the source mean, and Hotelling's law with the
    effective target size m_eff = m^2 / sum_g w_g in place of m; the likelihood-ratio form scales Lambda by
    m_eff / m.

    Args: as :func:`fisher_interval` (``weights`` = the MLLS estimate, or None to solve it here; used by the
    likelihood-ratio form); ``source_probs``: (n, k) calibrated source outputs.
    """
    repeats = repeats if repeats is not None and repeats.adjusts else None
    P, p = _check_inputs(target_probs, source_prior)
    m, k = P.shape
    if source_probs is None:
        w = _check_mle(P, weights, p)
        sums = _rows.row_dot(P, np.ones(k)) if _rows.is_large(P) else P.sum(axis=1)
        stat = 2.0 * float(np.sum(np.log(_dot(P, w) / sums)))
        stat = max(stat, 0.0) * (1.0 if repeats is None else repeats.effective_rows / m)
        return NoShiftTest(statistic=stat, dof=k - 1, p_value=float(chi2.sf(stat, k - 1)), n_target=m)
    S = check_probabilities(source_probs, "source_probs", 2)
    if S.shape[1] != k:
        raise InputError(f"source_probs has {S.shape[1]} class columns but target_probs has {k}; pass the calibrated "
                         "outputs of the same classifier on its labelled source data.")
    n = S.shape[0]
    if n < 2 or m < 2:
        raise InputError(f"the two-sample test needs at least 2 rows on each side, got n = {n} source and m = {m} "
                         "target rows.")
    # rows sum to 1, so the means and their difference live in the sum-zero subspace: work in an orthonormal basis
    # U (k, k-1) of it; a direction without variance on either side (a class never predicted) carries no test
    U = null_space(np.ones((1, k)))
    mean_t, cov_t = _mean_cov(P)
    mean_s, cov_s = _mean_cov(S)
    diff = U.T @ (mean_t - mean_s)
    total = n + m
    pooled = ((m - 1) * cov_t + (n - 1) * cov_s) / (total - 2)
    if repeats is None:
        cov = U.T @ pooled @ U * (1.0 / m + 1.0 / n)
    else:                                   # the target mean's variance from its clusters of repeated rows
        repeats.check(m)
        cov = U.T @ (pooled / n + clustered_covariance(lambda rows: P[rows], repeats, k, mean_t) / m) @ U
        total = n + max(int(round(repeats.effective_rows)), 2)
    lam, V = np.linalg.eigh(0.5 * (cov + cov.T))
    keep = lam > max(float(lam.max()), 0.0) * 1e-12
    proj = V[:, keep].T @ diff
    stat = float(np.sum(proj ** 2 / lam[keep]))
    dof = int(np.sum(keep))
    # the pooled covariance of n + m rows around two means has rank <= n + m - 2, so dof <= n + m - 2 and the
    # F law's second degrees of freedom, n + m - dof - 1, are >= 1 (the max guards against rounding in the rank)
    if dof > 0:
        df2 = max(total - dof - 1, 1)
        p_value = float(f_dist.sf(stat * df2 / ((total - 2) * dof), dof, df2))
    else:
        p_value = 1.0
    return NoShiftTest(statistic=stat, dof=dof, p_value=p_value, method="two-sample", n_target=m, n_source=n)


# ---------------------------------------------------------------------------------------------------------------
# identifiability
# ---------------------------------------------------------------------------------------------------------------
#: the estimators whose estimate is judged by the MLLS likelihood's own information (the others, BBSE, by the
#: conditioning of the confusion matrix they invert)
_LIKELIHOOD_ESTIMATORS = ("MLLS",)
#: the classes named in a reason about poorly estimated classes (the worst first); the rest are counted
_NAMED_CLASSES = 5


@dataclass(frozen=True)
class Identifiability:
    """Result of :func:`identifiability`: the numbers that say whether the estimate can be trusted.

    Attributes:
        min_hessian_eigenvalue: sigma, the minimum eigenvalue of H = (1/m) sum_i f_i f_i^T / (f_i^T w_hat)^2
            (Section 5, eq. bound-main).
        min_free_eigenvalue: the same on the coordinates with w_y > PIN_TOL.
        confusion_sigma_min, confusion_condition: smallest singular value and condition number of the given
            confusion matrix (None when none was given).
        n_source: labelled source examples behind the confusion matrix (None when not given).
        n_target: m.
        trustworthy: no reason below applies.
        reasons: one sentence per failed check, naming the number and its threshold.
        confusion_snr: sigma_min(C) sqrt(n_source) (None without a confusion matrix).
        pinned_bounds: per class, the one-standard-error upper bound on w_y for classes pinned at 0 (None for
            free classes); ``docs/uncertainty.md``.
        max_weight_width: the widest interval on w (None unless ``max_relative_width`` was given).
        relative_errors: per class, the standard error of w_y over max(w_y, 1) -- that of p_t(y) over the larger
            of its estimate and its source share -- (None for pinned classes; empty when not computed).
        estimator: the estimator judged: ``"MLLS"`` (its relative errors and pinned bounds give the reasons, the
            confusion matrix is information about a BBSE cross-check) or a BBSE one (the confusion matrix's
            conditioning gives the reason).
        notes: information that is not a reason (e.g. the conditioning of the BBSE cross-check's matrix).
    """

    min_hessian_eigenvalue: float
    min_free_eigenvalue: float
    confusion_sigma_min: float | None
    confusion_condition: float | None
    n_source: int | None
    n_target: int
    trustworthy: bool
    reasons: list[str]
    confusion_snr: float | None = None
    pinned_bounds: list = field(default_factory=list)
    max_weight_width: float | None = None
    relative_errors: list = field(default_factory=list)
    estimator: str = "MLLS"
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"min_hessian_eigenvalue": finite_or_none(self.min_hessian_eigenvalue),
                "min_free_eigenvalue": finite_or_none(self.min_free_eigenvalue),
                "confusion_sigma_min": None if self.confusion_sigma_min is None else finite_or_none(self.confusion_sigma_min),
                "confusion_condition": None if self.confusion_condition is None else finite_or_none(self.confusion_condition),
                "confusion_snr": None if self.confusion_snr is None else finite_or_none(self.confusion_snr),
                "n_source": self.n_source, "n_target": int(self.n_target), "trustworthy": bool(self.trustworthy),
                "reasons": list(self.reasons), "pinned_bounds": [None if b is None else finite_or_none(b)
                                                                 for b in self.pinned_bounds],
                "max_weight_width": None if self.max_weight_width is None else finite_or_none(self.max_weight_width),
                "relative_errors": [None if e is None else finite_or_none(e) for e in self.relative_errors],
                "estimator": self.estimator, "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, d: dict) -> "Identifiability":
        """The report that :meth:`to_dict` wrote (a None number read back as nan where one is required, as None
        where it is optional); ``from_dict(d).to_dict() == d``. Dicts written before ``relative_errors``,
        ``estimator`` and ``notes`` existed read back with none, ``"MLLS"`` and none."""
        d = _require(d, "identifiability", ("min_hessian_eigenvalue", "min_free_eigenvalue", "n_target",
                                            "trustworthy"))
        return cls(min_hessian_eigenvalue=none_as_nan(d["min_hessian_eigenvalue"]),
                   min_free_eigenvalue=none_as_nan(d["min_free_eigenvalue"]),
                   confusion_sigma_min=d.get("confusion_sigma_min"), confusion_condition=d.get("confusion_condition"),
                   n_source=d.get("n_source"), n_target=int(d["n_target"]), trustworthy=bool(d["trustworthy"]),
                   reasons=list(d.get("reasons") or []), confusion_snr=d.get("confusion_snr"),
                   pinned_bounds=list(d.get("pinned_bounds") or []), max_weight_width=d.get("max_weight_width"),
                   relative_errors=list(d.get("relative_errors") or []), estimator=str(d.get("estimator", "MLLS")),
                   notes=list(d.get("notes") or []))


def _min_eigenvalue(H: np.ndarray) -> float:
    """The smallest eigenvalue of the symmetric ``H`` (only that one is computed)."""
    return float(scipy_eigh(H, eigvals_only=True, subset_by_index=[0, 0])[0])


def _weight_std_errors(H: np.ndarray, w: np.ndarray, p: np.ndarray, free: np.ndarray, m: int,
                       interval: PriorInterval | None) -> np.ndarray:
    """(k,) the standard error of each free w_y: the MLLS interval's own when given (source-aware: target and
    holdout error together; Fisher or bootstrap: its error on p_t over p_s), else the target-only Fisher one of
    :func:`fisher_interval`; nan for pinned classes."""
    se = getattr(interval, "weights_std_error", None)
    if se is None and interval is not None and interval.std_error is not None:
        se = np.asarray(interval.std_error, dtype=np.float64) / p
    if se is None:
        se = np.sqrt(np.clip(np.diag(_tangent_covariance(H, p, free)), 0.0, None) / m)
    return np.where(free, np.asarray(se, dtype=np.float64), np.nan)


def _poorly_estimated(relative: np.ndarray, w: np.ndarray, p: np.ndarray) -> str | None:
    """The reason naming the free classes whose relative error exceeds MAX_RELATIVE_ERROR (worst first), or None."""
    bad = np.flatnonzero(np.nan_to_num(relative, nan=0.0) > MAX_RELATIVE_ERROR)
    if not bad.size:
        return None
    bad = bad[np.argsort(-relative[bad])]
    named = ", ".join(f"class {y} (source share {p[y]:.2%}, target estimate {p[y] * w[y]:.2%}: relative error "
                      f"{relative[y]:.2f})" for y in bad[:_NAMED_CLASSES])
    more = f" and {bad.size - _NAMED_CLASSES} more" if bad.size > _NAMED_CLASSES else ""
    return (f"{bad.size} of {len(w)} classes too poorly estimated to trust: {named}{more}. Relative error = the "
            f"standard error of the class's target share over the larger of its estimate and its source share; above "
            f"{MAX_RELATIVE_ERROR:g} (MAX_RELATIVE_ERROR) its interval cannot tell the class's share from zero or "
            "from twice as much. More target rows, or more labelled holdout rows of those classes, would narrow it")


def _confusion_check(confusion, n_source, k: int) -> tuple[float, float, float, str | None]:
    """(condition number, sigma_min, snr = sigma_min sqrt(n_source), the sentence when snr < BBSE_FLAG_SNR)."""
    C = as_float_array(confusion, "confusion", 2)
    if C.shape != (k, k):
        raise InputError(f"confusion has shape {C.shape} but there are {k} classes; pass the k x k joint "
                         "confusion matrix of the same classifier.")
    if np.any(C < 0) or abs(C.sum() - 1.0) > 1e-4:
        raise InputError(f"confusion must be the joint confusion matrix (non-negative entries summing to 1, "
                         f"e.g. BBSE().fit(...).confusion_); its entries sum to {C.sum():.6g}.")
    if n_source is None or isinstance(n_source, bool) or not isinstance(n_source, (int, np.integer)) \
            or n_source < 1:
        raise InputError(f"n_source must be the (positive integer) number of labelled source examples the "
                         f"confusion matrix was estimated from, got {n_source!r}.")
    cond, sigma_c = confusion_condition(C)
    snr = sigma_c * math.sqrt(n_source)
    sentence = None
    if not snr >= BBSE_FLAG_SNR:
        sentence = (f"confusion matrix near singular: sigma_min(C) * sqrt(n_source) = {sigma_c:.3g} * "
                    f"sqrt({n_source}) = {snr:.3g} < {BBSE_FLAG_SNR:g} (BBSE_FLAG_SNR; condition number {cond:.3g}), "
                    "so its sampling noise can make it singular")
    return cond, sigma_c, snr, sentence


def _width_check(P, w, p, interval, max_relative_width, level) -> tuple[float, str | None]:
    """(the widest interval on w, the sentence when it exceeds ``max_relative_width``)."""
    if isinstance(max_relative_width, bool) or not isinstance(max_relative_width, (int, float, np.floating)) \
            or not max_relative_width > 0:
        raise InputError(f"max_relative_width must be a positive number, got {max_relative_width!r}.")
    if interval is None:
        interval = fisher_interval(P, w, p, level=level)
    widths = np.asarray(interval.weights_upper) - np.asarray(interval.weights_lower)
    y = int(np.argmax(widths))
    max_width = float(widths[y])
    if max_width <= max_relative_width:
        return max_width, None
    return max_width, (f"interval too wide: the {interval.level:.0%} {interval.method} interval on w_{y} is "
                       f"[{interval.weights_lower[y]:.3g}, {interval.weights_upper[y]:.3g}], width {max_width:.3g} > "
                       f"max_relative_width = {max_relative_width:g}")


def identifiability(target_probs, weights, source_prior, *, confusion=None, n_source: int | None = None,
                    max_relative_width: float | None = None, interval: PriorInterval | None = None,
                    level: float = 0.95, estimator: str = "MLLS", hessian=None) -> Identifiability:
    """Is the reported estimate identified by the data? Judged on the estimate that is reported, relative to each
    class's share (the reasons are in ``docs/uncertainty.md``):

    * ``estimator="MLLS"`` (Section 5 of the paper): each free class's relative error -- the standard error of
      w_y over max(w_y, 1), from ``interval`` when given (the MLLS interval in use) or the Fisher information --
      at most MAX_RELATIVE_ERROR; for each pinned class, its one-standard-error bound on w_y at most
      MAX_STANDARD_ERROR. The confusion matrix, when given, is information about a BBSE cross-check (``notes``).
    * a BBSE estimator: sigma_min(C) sqrt(n_source) >= BBSE_FLAG_SNR (Lipton et al., 2018).
    * either: the interval on w no wider than ``max_relative_width`` (when given).

    Args:
        target_probs, weights, source_prior: as :func:`fisher_interval` (``weights``: the MLLS estimate or None).
        confusion: optional (k, k) *joint* confusion matrix of the classifier on labelled source data (entries sum
            to 1, index [predicted, true]; e.g. ``BBSE().fit(...).confusion_``). Needs ``n_source``.
        n_source: the number of labelled source examples ``confusion`` was estimated from.
        max_relative_width: optional bound on the width of the interval on each w_y (= width on p_t(y) / p_s(y)).
        interval: the MLLS interval in use (source-aware, Fisher or bootstrap); default the Fisher interval.
        level: level of that default interval.
        estimator: the estimator whose estimate is reported, a name of
            :data:`labelshift.estimation.registry.REESTIMATION_ESTIMATORS`.
        hessian: optional (k, k) :func:`~labelshift.estimation.solvers.mlls_hessian` at ``weights`` on these rows,
            already computed (the MLLS estimate's ``extra["hessian"]`` above 100 classes); None computes it.

    Raises:
        InputError: inputs as :func:`fisher_interval`; a confusion matrix that is not a k x k joint one, or without
            ``n_source``; a ``max_relative_width`` that is not positive; an interval for another k.
    """
    P, p = _check_inputs(target_probs, source_prior)
    w = _check_mle(P, weights, p)
    m, k = P.shape
    if interval is not None and len(interval.weights) != k:
        raise InputError(f"interval has {len(interval.weights)} classes but target_probs has {k}.")
    H = mlls_hessian(P, w) if hessian is None else as_float_array(hessian, "hessian", 2)
    if H.shape != (k, k):
        raise InputError(f"hessian has shape {H.shape} but there are {k} classes; pass mlls_hessian(target_probs, "
                         "weights) of these rows, or None.")
    free = w > PIN_TOL
    likelihood = estimator in _LIKELIHOOD_ESTIMATORS
    reasons, notes = [], []
    relative = _weight_std_errors(H, w, p, free, m, interval) / np.maximum(w, 1.0)
    bounds = [None] * k
    if likelihood:
        reasons.append(_poorly_estimated(relative, w, p))
        if not free.all():
            b1 = _pinned_bounds(P, w, H, p, free, 1.0)
            for y in np.flatnonzero(~free):
                bounds[y] = float(b1[y])
                if not b1[y] <= MAX_STANDARD_ERROR:
                    reasons.append(
                        f"class {y} is estimated at w = 0 but not identified: its one-standard-error upper bound on "
                        f"w_{y} is {b1[y]:.3g} > {MAX_STANDARD_ERROR:g} (the likelihood is nearly flat when mass moves "
                        "into that class)")
    sigma_c = cond = snr = None
    if confusion is not None:
        cond, sigma_c, snr, sentence = _confusion_check(confusion, n_source, k)
        if sentence is not None:
            (notes if likelihood else reasons).append(
                sentence if not likelihood else f"BBSE cross-check: {sentence} (information only: the reported MLLS "
                                                "estimate is judged by its own relative errors)")
    elif n_source is not None:
        raise InputError("n_source was given without confusion; pass the joint confusion matrix it belongs to.")
    max_width = None
    if max_relative_width is not None:
        max_width, sentence = _width_check(P, w, p, interval, max_relative_width, level)
        reasons.append(sentence)
    reasons = [r for r in reasons if r is not None]
    return Identifiability(min_hessian_eigenvalue=_min_eigenvalue(H),
                           min_free_eigenvalue=float(restricted_min_eigenvalue(H, free)),
                           confusion_sigma_min=sigma_c, confusion_condition=cond,
                           n_source=None if n_source is None else int(n_source), n_target=m,
                           trustworthy=not reasons, reasons=reasons, confusion_snr=snr, pinned_bounds=bounds,
                           max_weight_width=max_width,
                           relative_errors=[None if not math.isfinite(e) else float(e) for e in relative],
                           estimator=str(estimator), notes=notes)
