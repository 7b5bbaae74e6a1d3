"""The log-odds part of the label-shift test: do the target's output *profiles* match the holdout's, reweighted by
class?

Under label shift every fixed function h of the output has E_t[h(f)] = sum_y p_t(y) E_s[h(f) | y] (Garg et al. 2020,
Section 2). The region test of :mod:`labelshift.label_shift_test` takes h = region indicators (predicted class x
confidence bin). This part takes, for the row's predicted class c = argmax f, the indicator of c and the k - 1
log-odds log f_j - log f_c (clipped to [-30, 0]) placed in c's block: d <= k + k (k - 1) moments that see *where
inside* a predicted class the outputs lie -- which other classes a row leans towards and by how much. A class mean
that moves, or a new class whose rows lean towards two known ones, changes those profiles even where the
confidence histogram stays put.

Statistic: with f_bar the target mean of the moments, M[:, y] the holdout mean within class y and W the inverse of
their variances (target variance / m + sum_y q_y^2 (holdout variance within y) / n_y, one diagonal),

    S = min over q with sum q = 1 of  sum_j W_j (f_bar_j - (M q)_j)^2,

the class proportions profiled out by weighted least squares (closed form); each class's variance is smoothed
by SMOOTH pseudo-rows of the whole holdout, so that a moment a class never showed is not taken as known exactly.
Its law under H0 comes from a bootstrap that draws both samples from the holdout itself, each class smoothed the
same way: the holdout rows resampled within each class (the class sizes kept), the target as m rows whose classes
are drawn from the fitted q and whose outputs are holdout rows of that class; each draw recomputes its own weights
and refits q (a studentised bootstrap). Because the draws carry the holdout's own rows with their labels, the law does not
assume the outputs are calibrated. Measured size and power: docs/label_shift_test.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import chi2

from . import rows as _rows

LOG_ODDS_FLOOR = -30.0
_W_FLOOR = 1e-6          # variances below this fraction of the largest are raised to it (near-constant moments)
SMOOTH = 1.0             # pseudo-rows of the whole holdout added to each class (its variance and the bootstrap world)


@dataclass(frozen=True)
class LogOddsPart:
    """Result of :func:`log_odds_test`: the statistic S, its bootstrap p-value, and per predicted class the part
    of S its block carries (which class's outputs look most unlike the reweighted holdout)."""

    statistic: float
    p_value: float
    class_share: np.ndarray
    moments: int


def _features(Z: np.ndarray, k: int) -> np.ndarray:
    """(rows, k + k * k): the indicator of the predicted class, then its block of clipped log-odds."""
    rows = Z.shape[0]
    c = np.argmax(Z, axis=1)
    at = np.arange(rows)
    with np.errstate(divide="ignore"):
        lz = np.log(np.asarray(Z, dtype=np.float64))
    odds = np.clip(lz - lz[at, c][:, None], LOG_ODDS_FLOOR, 0.0)
    out = np.zeros((rows, k + k * k))
    out[at, c] = 1.0
    cols = k + c[:, None] * k + np.arange(k)[None, :]
    out[at[:, None], cols] = odds
    return out


def _target_moments(P, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of the moments over the target rows, accumulated per predicted class in row blocks: memory
    of one block of (rows, k) log-odds, never the (m, k + k^2) moment matrix."""
    m = P.shape[0]
    count = np.zeros(k)
    total = np.zeros((k, k))
    squares = np.zeros((k, k))
    for sl in _rows.blocks(m):
        Z = np.asarray(P[sl], dtype=np.float64)
        c = np.argmax(Z, axis=1)
        with np.errstate(divide="ignore"):
            lz = np.log(Z)
        odds = np.clip(lz - lz[np.arange(Z.shape[0]), c][:, None], LOG_ODDS_FLOOR, 0.0)
        count += np.bincount(c, minlength=k)
        for j in range(k):                       # row c of total gets the rows predicted c (bincount: fast)
            total[:, j] += np.bincount(c, weights=odds[:, j], minlength=k)
            squares[:, j] += np.bincount(c, weights=np.square(odds[:, j]), minlength=k)
    mean = np.concatenate([count, total.ravel()]) / m
    second = np.concatenate([count, squares.ravel()]) / m
    return mean, np.maximum(second - mean ** 2, 0.0)


def _profile(f: np.ndarray, M: np.ndarray, W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """min over q (sum q = 1) of sum_j W_j (f_j - (M q)_j)^2 for B data sets at once: f (B, d), M (B, d, k).
    Returns the minima (B,) and the minimisers (B, k) (unconstrained in sign: a least-squares fit)."""
    W = np.atleast_2d(W)                                   # (1, d) for all draws, or (B, d): one per draw
    MW = M * W[:, :, None]
    A = np.matmul(M.transpose(0, 2, 1), MW)
    b = np.matmul(MW.transpose(0, 2, 1), f[..., None])[..., 0]
    k = A.shape[-1]
    scale = np.trace(A, axis1=1, axis2=2) / k
    A = A + (1e-10 * np.maximum(scale, 1e-300))[:, None, None] * np.eye(k)
    Ab = np.linalg.solve(A, b[..., None])[..., 0]
    A1 = np.linalg.solve(A, np.ones_like(b)[..., None])[..., 0]
    q = Ab + ((1.0 - Ab.sum(axis=1)) / A1.sum(axis=1))[:, None] * A1
    resid = f - np.matmul(M, q[..., None])[..., 0]
    return np.sum(W * resid ** 2, axis=1), q


def _studentised(f, var_t, M, E2, n_y, m, pooled):
    """S for B data sets (f, var_t: (B, d) the target's moment means and variances; M, E2: (B, d, k) the holdout's
    per-class first and second moments), each with its own weights. Each class's variance is that of its rows
    smoothed by SMOOTH pseudo-rows of the whole holdout (``pooled``: its first and second moments, (d,) each), so
    that a moment a class never showed on the holdout is not treated as known exactly. The variances depend on q:
    a first fit with the holdout's proportions gives q, then the weights of the fit that is tested. Returns (S (B,),
    q (B, k), W (B, d)). Every bootstrap draw goes through the same steps as the data, so that the law includes
    how the weights vary with the sample."""
    n = n_y.sum()
    a = (n_y / (n_y + SMOOTH))[None, None, :]
    mean = a * M + (1 - a) * pooled[0][None, :, None]
    V = np.maximum(a * E2 + (1 - a) * pooled[1][None, :, None] - mean ** 2, 0.0)

    def weights(q):
        v = var_t / m + np.einsum("bdk,bk->bd", V, q ** 2 / n_y)
        return 1.0 / np.maximum(v, _W_FLOOR * np.maximum(v.max(axis=1, keepdims=True), 1e-300))

    _, q = _profile(f, M, weights(np.broadcast_to(n_y / n, (f.shape[0], n_y.size))))
    q = np.maximum(q, 0.0)
    q = q / np.maximum(q.sum(axis=1, keepdims=True), 1e-300)
    W = weights(q)
    stat, q = _profile(f, M, W)
    return stat, q, W


def _draw_class(rng, total: np.ndarray, idx: np.ndarray, n: int) -> np.ndarray:
    """Counts over the n holdout rows of ``total[b]`` rows drawn, for each draw b, from class y's smoothed
    distribution: each row one of the class's rows (``idx``) with probability n_y / (n_y + SMOOTH), else any
    holdout row. Returns (B, n)."""
    out = np.zeros((total.size, n))
    pooled = rng.binomial(total, SMOOTH / (idx.size + SMOOTH))
    own = np.full(idx.size, 1.0 / idx.size)
    anyrow = np.full(n, 1.0 / n)
    for b, (t, p) in enumerate(zip(total, pooled)):
        out[b, idx] = rng.multinomial(t - p, own)
        if p:
            out[b] += rng.multinomial(p, anyrow)
    return out


def log_odds_test(S: np.ndarray, y: np.ndarray, P, draws: int, seed: int) -> LogOddsPart:
    """The log-odds part (module docstring). S (n, k) holdout outputs, y its labels (every class present), P the
    target outputs (m, k; read in row blocks), ``draws`` bootstrap draws from ``seed``. p = (1 + #{S* >= S}) /
    (draws + 1); beyond every draw, the smaller of that and the
    tail of a scaled chi^2 matched to the draws' mean and variance."""
    n, k = S.shape
    m = P.shape[0]
    n_y = np.bincount(y, minlength=k)
    members = [np.flatnonzero(y == c) for c in range(k)]
    Fh = _features(S, k)
    keep = np.any(Fh != 0.0, axis=0)              # moments the holdout never takes carry no comparison
    if not keep.any():
        return LogOddsPart(statistic=0.0, p_value=1.0, class_share=np.zeros(k), moments=0)
    Fh = Fh[:, keep]
    F2 = np.square(Fh)
    f, var_t = _target_moments(P, k)
    f, var_t = f[keep], var_t[keep]
    pooled = (Fh.mean(axis=0), F2.mean(axis=0))
    M = np.stack([Fh[idx].mean(axis=0) for idx in members], axis=1)            # (d, k)
    E2 = np.stack([F2[idx].mean(axis=0) for idx in members], axis=1)
    stat, q, W = _studentised(f[None], var_t[None], M[None], E2[None], n_y, m, pooled)
    q_draw = np.maximum(q[0], 0.0)
    q_draw /= q_draw.sum()

    # the bootstrap world: class y's outputs are its holdout rows plus SMOOTH pseudo-rows of the whole holdout
    # (so that it, too, has the rare rows of y that this holdout happened not to show); both samples drawn from it
    rng = np.random.default_rng([seed, 0x10DD5])
    per_class_target = rng.multinomial(m, q_draw, size=draws)                  # (B, k)
    d = Fh.shape[1]
    fb, fb2 = np.zeros((draws, d)), np.zeros((draws, d))
    Mb, E2b = np.zeros((draws, d, k)), np.zeros((draws, d, k))
    for c, idx in enumerate(members):
        held = _draw_class(rng, np.full(draws, n_y[c]), idx, n)
        Mb[:, :, c] = held @ Fh / n_y[c]
        E2b[:, :, c] = held @ F2 / n_y[c]
        taken = _draw_class(rng, per_class_target[:, c], idx, n)
        fb += taken @ Fh
        fb2 += taken @ F2
    fb /= m
    var_b = np.maximum(fb2 / m - fb ** 2, 0.0)
    boot = _studentised(fb, var_b, Mb, E2b, n_y, m, pooled)[0]
    s = float(stat[0])
    exceed = int(np.sum(boot >= s - 1e-9 * max(1.0, s)))
    p_value = (1 + exceed) / (draws + 1)
    if exceed == 0:
        # beyond every draw: the draws resolve nothing below 1/(B+1); a scaled chi^2 matched to their mean and
        # variance (Satterthwaite) says how far out, so that levels below 1/(B+1) can still reject
        mean, var = float(boot.mean()), float(boot.var())
        if mean > 0 and var > 0:
            p_value = min(p_value, float(chi2.sf(s / (var / (2 * mean)), 2 * mean ** 2 / var)))

    # evidence: the statistic's parts by predicted-class block (the indicator of c and its log-odds)
    resid = f - M @ q[0]
    block = np.concatenate([np.arange(k), np.repeat(np.arange(k), k)])[keep]
    share = np.bincount(block, weights=W[0] * resid ** 2, minlength=k)
    share = share / share.sum() if share.sum() > 0 else share
    return LogOddsPart(statistic=s, p_value=float(p_value), class_share=share, moments=int(keep.sum()))
