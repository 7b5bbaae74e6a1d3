"""Confidence intervals on the target prior of a label-shift estimate (Garg et al., NeurIPS 2020, Section 4.2).

Notation: f_i = f(x_i), the calibrated source posterior on target row i (i = 1..m, k classes); p_s the source
prior; W = {w >= 0, p_s^T w = 1}; L_m(w) = (1/m) sum_i log f_i^T w, eq. (mlls-sample); w_hat its maximiser; the
target prior is p_t = p_s * w.

* :func:`fisher_interval` -- normal intervals from the constrained Fisher information, Cov(w_hat) =
  (1/m) Z (Z^T H Z)^{-1} Z^T with H the negated Hessian of eq. (proof-hessian); one-sided profile-likelihood
  intervals for classes pinned at w_y = 0.
* :func:`bootstrap_interval` -- percentile intervals from resampling the target rows, for any estimator.

Both treat f and p_s as known. The derivations, what each leaves out and the measured coverage are in
``docs/uncertainty.md``.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import null_space
from scipy.stats import norm

from .. import rows as _rows
from .._numbers import finite_list, json_value, nan_array, written_dict
from .._validation import check_level
from ..errors import IllConditionedWarning, InputError
from ..estimation.estimators import MLLS
from ..estimation.solvers import PIN_TOL, mlls_hessian
from ..partitions import NOT_PARTITIONED, add_in_order, is_partitioned
from .mlls_inputs import check_inputs, check_mle, dot_rows
from .repeats import clustered_covariance
# eigenvalues of the tangent information below this fraction of the largest count as zero (no information in that
# direction: the variance there becomes huge and the interval spans the whole range)
_EIG_FLOOR = 1e-14
# classes above which the pinned classes' profile directions share one eigendecomposition on the free set
# (_FreeTangent) instead of one on each grown set (issue 20: 14 pinned classes at k = 1,000 took 58 s)
_SHARED_TANGENT_MIN_CLASSES = 100
# bytes of resampled target rows per estimate call of the bootstrap
_BOOTSTRAP_CHUNK_BYTES = 32 * 2**20


def tangent_covariance(H: np.ndarray, p: np.ndarray, support: np.ndarray) -> np.ndarray:
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
    :func:`tangent_covariance` on G, b_y = 1, 0 outside G."""
    cov = tangent_covariance(H, p, grown)
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
        rounding) when no eigenvalue of A_G falls under the floor of tangent_covariance, which is checked by
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


def pinned_bounds(P, w, H, p, free, z: float, *, rows_dot=None, m: int | None = None) -> np.ndarray:
    """Upper bounds U_y on w_y for the classes pinned at 0 (nan for free ones); ``docs/uncertainty.md``,
    "Classes at the boundary".

    For each pinned y: the profile direction b (b_y = 1; the free coordinates follow the conditional mean of the
    normal approximation on F + {y}, b = Cov[:, y] / Cov[y, y], so p_s^T b = 0), and U_y is where
    2 m [L_m(w_hat) - L_m(w_hat + t b)] reaches z^2 on the exact log-likelihood (convex and increasing in t >= 0;
    bisection, or Newton's method on a large set: :func:`_bound`), or the end of the segment inside W if it never
    does.

    ``rows_dot`` (with ``m``, and P None): v -> (m,) float64 f_i^T v (a (k, c) matrix V: (m, c)) for rows that are
    made block by block (the
    calibrated rows of :func:`labelshift.inference.source_aware.source_aware_interval` on a large target); the bound is
    then computed as for a large set. ``P`` in partitions (:class:`labelshift.partitions.PartitionedRows`): the
    same directions, and each step of Newton's method one pass over the partitions (:func:`_pinned_bounds_partitioned`).
    """
    if is_partitioned(P):
        return _pinned_bounds_partitioned(P, w, H, p, free, z)
    if rows_dot is None:
        m, k = P.shape
        large = _rows.is_large(P)

        def rows_dot(v):
            return dot_rows(P, v)
    else:
        k, large = len(w), True
    if k > _SHARED_TANGENT_MIN_CLASSES:
        return _pinned_bounds_shared(rows_dot, w, H, p, free, z, m, large)
    out = np.full(k, np.nan)
    pinned = np.flatnonzero(~free)
    if pinned.size == 0:
        return out
    directions = [_profile_direction(H, p, _grown(free, int(y)), int(y)) for y in pinned]
    FB = rows_dot(np.column_stack([w, directions[0]]))      # f_i^T w and the first class's f_i^T b: one pass
    fw = FB[:, 0]
    base = None if large else np.log(fw)         # large: drop(t) = -2 sum log1p(t fb_i / fw_i), one (m,) vector
    for j, (y, b) in enumerate(zip(pinned, directions)):
        fb = FB[:, 1] if j == 0 else rows_dot(b)
        if large:
            fb /= fw
        out[y] = _bound(fb, fw, base, m, large, _segment_end(w, b, p[y]), z * z, p[y])
    return out


def _pinned_bounds_shared(rows_dot, w, H, p, free, z: float, m: int, large: bool) -> np.ndarray:
    """:func:`pinned_bounds` above _SHARED_TANGENT_MIN_CLASSES classes: the profile directions from one
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
        out[y] = _bound(fb, fw, base, m, large, _segment_end(w, B[:, j + 1], p[y]), z * z, p[y])
    return out


def _pinned_bounds_partitioned(P, w, H, p, free, z: float) -> np.ndarray:
    """:func:`pinned_bounds` of rows in partitions: the profile directions b_y as for an array of the same k, and
    the root of drop_y(t) = -2 sum_i log(1 + t r_iy) = z^2 (r_iy = f_i^T b_y / f_i^T w_hat) by Newton's method from
    the segment's end (:func:`_newton_roots`), every pinned class at once: each step one pass over the partitions
    (:func:`log1p_ratio_sums`, the value and its derivative), so no (m,) vector is made here, and 7-8 passes serve
    all pinned classes where bisection took about 40 a class (measured; ``docs/architecture.md``)."""
    k = len(w)
    pinned = np.flatnonzero(~free)
    out = np.full(k, np.nan)
    if pinned.size == 0:
        return out
    if k > _SHARED_TANGENT_MIN_CLASSES:
        with _rows.one_blas_thread():
            shared = _FreeTangent(H, p, free)
            B = np.column_stack([shared.direction(int(y)) for y in pinned])
    else:
        B = np.column_stack([_profile_direction(H, p, _grown(free, int(y)), int(y)) for y in pinned])
    ends = np.array([_segment_end(w, B[:, j], p[y]) for j, y in enumerate(pinned)])
    def sums(a, t):
        return add_in_order(P.run(log1p_ratio_sums, w, B[:, a], t))
    out[pinned] = np.minimum(_newton_roots(sums, ends, z * z), 1.0 / p[pinned])
    return out


def _grown(free: np.ndarray, y: int) -> np.ndarray:
    grown = free.copy()
    grown[y] = True
    return grown


def _newton_roots(sums, ends: np.ndarray, target: float, rtol: float = 1e-12, passes: int = 200) -> np.ndarray:
    """For each direction j, the t in [0, ends_j] where the convex increasing drop_j(t) = -2 sum_i log(1 + t r_ij)
    reaches ``target`` (ends_j where it never does), to ``rtol`` relative; ``sums(a, t_a)`` gives
    (sum_i log(1 + t r_ij), sum_i r_ij / (1 + t r_ij)) for the directions ``a`` not yet done, one pass over the rows
    a step.

    Newton's method kept in a bracket [lo, hi] (lo = 0: drop_j(0) = 0 < target). From the right its iterates stay
    at or above the root. A step is replaced by the bracket's midpoint where it is not finite, leaves the bracket,
    or is tiny while drop is still far from the target (near the segment's end a row's 1 + t r_ij can round to
    ~1e-16: a finite, huge drop with a far larger slope). Done when a step is below ``rtol`` with drop within
    1e-9 of the target (Newton's own last error is about 1e-12 of it; the sums' rounding, below 1e-10 even at 1e9
    rows), or when the bracket is below ``rtol``. Columns not done after ``passes`` steps get their ``hi`` (at or
    above the root: a wider, never a narrower bound) and an IllConditionedWarning."""
    t, lo, hi = ends.copy(), np.zeros_like(ends), ends.copy()
    out, active = ends.copy(), np.ones(ends.size, dtype=bool)
    for step in range(passes):
        a = np.flatnonzero(active)
        values, slopes = sums(a, t[a])
        f, d = -2.0 * np.asarray(values) - target, -2.0 * np.asarray(slopes)
        ok = np.isfinite(f) & np.isfinite(d)
        below = ok & (f <= 0.0)
        if step == 0:                        # the segment's end never reaches the target: the bound is the end
            active[a[below]] = False
            a, f, d, ok, below = a[~below], f[~below], d[~below], ok[~below], below[~below]
        lo[a] = np.where(below, t[a], lo[a])
        hi[a] = np.where(below, hi[a], t[a])
        with np.errstate(divide="ignore", invalid="ignore"):
            newton = t[a] - f / d
        small = np.abs(newton - t[a]) <= rtol * t[a]
        close = ok & (np.abs(f) <= 1e-9 * target)
        use = ok & (d > 0.0) & (newton >= lo[a]) & (newton < hi[a]) & (close | ~small)   # >=: f = 0 exactly
        nxt = np.where(use, newton, 0.5 * (lo[a] + hi[a]))
        converged = (use & small) | (hi[a] - lo[a] <= rtol * hi[a])
        t[a] = nxt
        out[a[converged]] = nxt[converged]
        active[a[converged]] = False
        if not active.any():
            return out
    warnings.warn(f"the profile bound of {int(active.sum())} pinned class(es) did not converge in {passes} passes; "
                  "its upper end is the bracket's (wider than the root)", IllConditionedWarning, stacklevel=3)
    out[active] = hi[active]
    return out


def log1p_ratio_sums(P: np.ndarray, w: np.ndarray, B: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sum_i log(1 + t_j r_ij), sum_i r_ij / (1 + t_j r_ij)) per column j, with r_ij = f_i^T b_j / f_i^T w, over
    the (m, k) rows P in row blocks, float64 (nan or -inf where a term is not finite): the per-partition function of
    :func:`_pinned_bounds_partitioned`."""
    def ratios(sl):
        F = P[sl].astype(np.float64)
        return (F @ B) / (F @ w)[:, None]
    return _log1p_sums(ratios, P.shape[0], B.shape[1], t, width=P.shape[1])


def _log1p_sums(ratios, m: int, c: int, t: np.ndarray, width: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(sum_i log(1 + t_j r_ij), sum_i r_ij / (1 + t_j r_ij)), (c,) each, over the row blocks ``sl`` of m rows,
    ``ratios(sl)`` giving the block's (rows, c) r_ij: the value and slope of a Newton step (:func:`_newton_roots`)."""
    values, slopes = np.zeros(c), np.zeros(c)
    with np.errstate(divide="ignore", invalid="ignore"):
        for sl in _rows.blocks(m, width=width):
            r = ratios(sl)
            values += np.sum(np.log1p(t * r), axis=0)
            slopes += np.sum(r / (1.0 + t * r), axis=0)
    return values, slopes


def _segment_end(w: np.ndarray, b: np.ndarray, p_y: float) -> float:
    """The largest t with w + t b in W (b_y = 1, p_s^T b = 0)."""
    neg = b < 0
    return float(np.min(w[neg] / -b[neg])) if neg.any() else 1.0 / p_y


def _bound(fb: np.ndarray, fw: np.ndarray, base, m: int, large: bool, t_end: float, target: float,
           p_y: float) -> float:
    """U_y of one pinned class, at most 1 / p_s(y): on a large set (``fb`` = r_i = f_i^T b / f_i^T w_hat) Newton's
    method (:func:`_newton_roots`: 7-8 passes over r where bisection took about 40); else bisection on the exact
    log-likelihood (:func:`_profile_bound`, from ``fb`` = f_i^T b, ``fw`` and ``base`` = log f_i^T w_hat)."""
    if not large:
        return _profile_bound(_likelihood_drop(fb, fw, base), t_end, target, p_y)

    def sums(a, t):
        return _log1p_sums(lambda sl: fb[sl, None], m, 1, t)
    return min(float(_newton_roots(sums, np.array([t_end]), target)[0]), 1.0 / p_y)


def _likelihood_drop(fb: np.ndarray, fw: np.ndarray, base):
    """t -> 2 m [L_m(w_hat) - L_m(w_hat + t b)] from fb = f_i^T b, fw = f_i^T w_hat and base = log fw; inf where not
    finite."""
    def drop(t):
        with np.errstate(divide="ignore", invalid="ignore"):
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
                "target_prior": finite_list(self.target_prior), "lower": finite_list(self.lower), "upper": finite_list(self.upper),
                "weights": finite_list(self.weights), "weights_lower": finite_list(self.weights_lower),
                "weights_upper": finite_list(self.weights_upper), "std_error": finite_list(self.std_error),
                "pinned": [bool(b) for b in pinned], "n_target": None if self.n_target is None else int(self.n_target),
                "extra": json_value(self.extra)}

    @classmethod
    def from_dict(cls, d: dict) -> "PriorInterval":
        """The interval that :meth:`to_dict` wrote (None read back as nan); ``from_dict(d).to_dict() == d``."""
        d = written_dict(d, "interval", ("method", "level", "target_prior", "lower", "upper", "weights", "weights_lower",
                                     "weights_upper", "std_error"))
        return cls(target_prior=nan_array(d["target_prior"]), lower=nan_array(d["lower"]), upper=nan_array(d["upper"]),
                   weights=nan_array(d["weights"]), weights_lower=nan_array(d["weights_lower"]),
                   weights_upper=nan_array(d["weights_upper"]), std_error=nan_array(d["std_error"]),
                   level=float(d["level"]), method=str(d["method"]),
                   pinned=None if d.get("pinned") is None else np.asarray(d["pinned"], dtype=bool),
                   n_target=d.get("n_target"), extra=dict(d.get("extra") or {}))


def _repeats_meat(P: np.ndarray, w: np.ndarray, repeats) -> np.ndarray | None:
    """(k, k) the clustered per-row second moment (1/m) sum_g w_g s_g s_g^T of the MLLS scores s_g = f_g / f_g^T w
    over the distinct target rows (:func:`labelshift.inference.repeats.clustered_covariance`: each distinct row and
    its copies one cluster), or None when ``repeats`` changes nothing."""
    if repeats is None or not repeats.adjusts:
        return None
    if is_partitioned(P):
        raise TypeError("the clustered covariance of repeated target rows: " + NOT_PARTITIONED)
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
            to a duality gap of :func:`~labelshift.inference.mlls_inputs.accepted_gap`, or re-solved from it when
            the rounding of these rows explains a larger one), or None to solve MLLS here.
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
    P, p = check_inputs(target_probs, source_prior)
    w = check_mle(P, weights, p)
    m, k = P.shape
    H = mlls_hessian(P, w)
    free = w > PIN_TOL
    z = float(norm.ppf(0.5 * (1.0 + level)))
    cov_w = tangent_covariance(H, p, free)
    meat = _repeats_meat(P, w, repeats)
    cov_w = (cov_w if meat is None else cov_w @ meat @ cov_w) / m
    se_w = np.sqrt(np.clip(np.diag(cov_w), 0.0, None))
    w_max = 1.0 / p
    w_lo = np.clip(w - z * se_w, 0.0, w_max)
    w_hi = np.clip(w + z * se_w, 0.0, w_max)
    se_w = np.where(free, se_w, np.nan)
    if not free.all():
        bound = pinned_bounds(P, w, H, p, free, z)
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
    P, p = check_inputs(target_probs, source_prior)
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
