"""The MLLS objective of Garg et al. (NeurIPS 2020), eq. (mlls-sample), L_m(w) = (1/m) sum_i log f_i^T w: its
value, gradient and Hessian, the Hessian's minimum eigenvalues and the Frank-Wolfe duality gap that certifies a
solution (batched; conventions: :mod:`labelshift.estimation.solvers`)."""
from __future__ import annotations

import numpy as np

from ... import rows as _rows
from .batch import as_batch, chunk_slices, weights_batch

#: MLLS weights at or below this value count as "at the boundary" w_y = 0 when diagnostics need to know which
#: coordinates are pinned by the constraint w >= 0 (EM approaches 0 geometrically, the interior-point Newton method to
#: ~1e-15; neither returns exact zeros).
PIN_TOL = 1e-8


def batched_fw(P, w):
    return np.matmul(P, w[:, :, None])[:, :, 0]


def _objective(P, cn, w):
    fw = batched_fw(P, w)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(cn > 0, np.log(np.where(fw > 0, fw, 1.0)), 0.0)
    val = np.einsum("sm,sm->s", cn, logs)
    dead = np.any((cn > 0) & (fw <= 0), axis=1)
    return np.where(dead, -np.inf, val)


def weighted_inverse(c, fw, power: int = 1):
    """c / fw**power, with 0 where the row weight c is 0. Rows of zero weight (padding, or confusion-matrix rows of
    a class never predicted on the target) may have f_i^T w = 0 once some w_y reach 0; they contribute nothing to
    the objective, so they must contribute 0 (not 0/0 = NaN) to its gradient and Hessian."""
    den = fw if power == 1 else fw ** power
    return np.divide(c, den, out=np.zeros(np.broadcast_shapes(np.shape(c), np.shape(den)), dtype=den.dtype),
                     where=np.broadcast_to(c, np.broadcast_shapes(np.shape(c), np.shape(den))) != 0)


def batched_gradient(P, cn, fw):
    return np.matmul(weighted_inverse(cn, fw)[:, None, :], P)[:, 0, :]


def batched_hessian(P, cn, fw):
    """(1/m) sum_i f_i f_i^T / (f_i^T w)^2 = P^T diag(c / fw^2) P, batched, in float64."""
    return np.matmul((P * weighted_inverse(cn, fw, 2)[:, :, None]).transpose(0, 2, 1), P)


def normalised_mask(P, c):
    return c / c.sum(axis=1, keepdims=True)


def mlls_objective(probs, weights, mask=None) -> np.ndarray:
    """The MLLS log-likelihood L_m(w) = (1/m) sum_i log f(x_i)^T w, eq. (mlls-sample); -inf outside its domain."""
    if _rows.is_large(probs, mask):
        val = _rows.mlls_pass(_rows.single_set(probs, mask), np.asarray(weights, np.float64).reshape(-1))[0]
        return val if np.ndim(probs) == 2 else np.array([val])
    P, c, single = as_batch(probs, mask)
    w = weights_batch(weights, P.shape[0], P.shape[2])
    val = _objective(P, normalised_mask(P, c), w)
    return val[0] if single else val


def mlls_gradient(probs, weights, mask=None) -> np.ndarray:
    """Gradient of L_m: (1/m) sum_i f_i / (f_i^T w), eq. (proof-gradient) of Garg et al. Batched. One large set
    (:func:`labelshift.rows.is_large`) is summed in row blocks."""
    if _rows.is_large(probs, mask):
        g = _rows.mlls_pass(_rows.single_set(probs, mask), np.asarray(weights, np.float64).reshape(-1))[1]
        return g if np.ndim(probs) == 2 else g[None]
    P, c, single = as_batch(probs, mask)
    w = weights_batch(weights, P.shape[0], P.shape[2])
    g = batched_gradient(P, normalised_mask(P, c), batched_fw(P, w))
    return g[0] if single else g


def mlls_hessian(probs, weights, mask=None) -> np.ndarray:
    """The negated Hessian of the MLLS objective, (1/m) sum_i f_i f_i^T / (f_i^T w)^2 (eq. proof-hessian of Garg
    et al., NeurIPS 2020, Appendix B): positive semi-definite, shape (k, k) or (S, k, k) for a batch.

    Args:
        probs: (m, k) calibrated predictions f(x_i) on the target set, or an (S, M, k) padded batch.
        weights: w, shape (k,) or (S, k).
        mask: optional (m,) or (S, M) row weights (0 for padding; counts for repeated rows).

    One large set (:func:`labelshift.rows.is_large`: over a million rows) is summed in row blocks
    in float64, without a whole-array temporary.
    """
    if _rows.is_large(probs, mask):
        H = _rows.mlls_pass(_rows.single_set(probs, mask), np.asarray(weights, np.float64).reshape(-1),
                            hessian=True)[2]
        return H if np.ndim(probs) == 2 else H[None]
    P, c, single = as_batch(probs, mask)
    S, M, k = P.shape
    w = weights_batch(weights, S, k)
    cn = normalised_mask(P, c)
    H = np.empty((S, k, k))
    for sl in chunk_slices(S, M, k, None):     # in cache-sized chunks (see CHUNK_BYTES)
        H[sl] = batched_hessian(P[sl], cn[sl], batched_fw(P[sl], w[sl]))
    return H[0] if single else H


def hessian_min_eigenvalue(probs, weights, mask=None):
    """sigma_{f, w}: the minimum eigenvalue of :func:`mlls_hessian` (Section 5 of Garg et al., the sigma of
    eq. (bound-main)); the error of MLLS scales like sigma^{-1} m^{-1/2}. A float, or (S,) for a batch."""
    H = mlls_hessian(probs, weights, mask)
    ev = np.linalg.eigvalsh(H)[..., 0]
    return float(ev) if np.ndim(ev) == 0 else ev


def restricted_min_eigenvalue(hessian, free) -> np.ndarray:
    """Minimum eigenvalue of the principal sub-matrix of ``hessian`` (k, k) / (S, k, k) on the coordinates where
    ``free`` is True; nan where no coordinate is free. Batched."""
    H = np.asarray(hessian, dtype=np.float64)
    F = np.asarray(free, dtype=bool)
    single = H.ndim == 2
    if single:
        H, F = H[None], F[None]
    big = np.einsum("sii->s", H) + 1.0  # exceeds every eigenvalue of H: pinned coordinates never attain the min
    ff = F[:, :, None] & F[:, None, :]
    Hr = np.where(ff, H, 0.0) + (~F)[:, :, None] * np.eye(H.shape[-1])[None] * big[:, None, None]
    ev = np.linalg.eigvalsh(Hr)[:, 0]
    ev = np.where(F.any(axis=1), ev, np.nan)
    return float(ev[0]) if single else ev


def mlls_optimality(probs, weights, source_prior, mask=None) -> np.ndarray:
    """Frank-Wolfe duality gap of MLLS at w: max_y grad_y / p_s(y) - 1 = max_{v in W} grad^T (v - w) >= 0.

    W = {w >= 0, sum_y w_y p_s(y) = 1} has vertices e_y / p_s(y) and grad^T w = 1 for any w, so this is the
    largest first-order gain available in W; by concavity it bounds L_m(w*) - L_m(w) from above and is 0 exactly
    at the optimum (it combines stationarity on the support of w and dual feasibility off it).
    """
    g = mlls_gradient(probs, weights, mask)
    return np.max(g / np.asarray(source_prior, dtype=np.float64), axis=-1) - 1.0
