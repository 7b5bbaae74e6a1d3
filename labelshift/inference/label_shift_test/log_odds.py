"""The log-odds part of the label-shift test: do the target's output *profiles* match the holdout's, reweighted by
class?

Under label shift every fixed function h of the output has E_t[h(f)] = sum_y p_t(y) E_s[h(f) | y] (Garg et al. 2020,
Section 2). The region test of :mod:`labelshift.inference.label_shift_test` takes h = region indicators (predicted class
x confidence bin). This part takes, for the row's predicted class c = argmax f, the indicator of c and the k - 1
log-odds log f_j - log f_c (clipped to [-30, 0]) placed in c's block: d <= k + k (k - 1) moments that see *where inside*
a predicted class the outputs lie -- which other classes a row leans towards and by how much. A class mean that moves,
or a new class whose rows lean towards two known ones, changes those profiles even where the confidence histogram stays
put.

Statistics (on the same bootstrap draws): S, the weighted least-squares distance between the target's mean moments
and the holdout's class means mixed by q (q profiled out, class variances smoothed by SMOOTH pseudo-rows); the block
statistic (each predicted class's block weighted by its shrunk covariance: a few log-odds moving against the rest);
the sum statistic (all log-odds moving together). The part's p-value is their smallest p-value over its
STATISTIC_WEIGHTS share, calibrated by the draws (:func:`_combined`) -- or, when the bootstrap stops early because
each statistic has 10 draws reaching it, their sequential p-values' weighted Bonferroni (:func:`_stopped_early`;
``docs/label_shift_test.md``, "Stopping the bootstrap early"). The draws come from a studentised bootstrap in
the completed data of the null fit (holdout rows and WORLD_TARGET_ROWS target rows in the classes' fitted shares,
:func:`.goodness_of_fit._world_shares`), so the law does not assume calibrated outputs.
Derivation, how the weights were chosen, measured size and power: ``docs/label_shift_test.md`` ("The second look:
log-odds profiles").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy import sparse
from scipy.stats import chi2

from ... import rows as _rows
from ...partitions import is_partitioned, take_rows
from .holdout_noise import drawn_rows
from .sequential import DRAW_BATCH, STOP_EXCEEDANCES, stopping_draw

LOG_ODDS_FLOOR = -30.0
_W_FLOOR = 1e-6          # variances below this fraction of the largest are raised to it (near-constant moments)
SMOOTH = 1.0             # pseudo-rows of the whole holdout added to each class (its variance and the bootstrap world)
WORLD_TARGET_ROWS = 5000  # target rows (a uniform subsample) that stand for the target in the bootstrap world
WORLD_TARGET_WEIGHT = 1.0  # the target rows' total weight in the world, a share of m (1: the null fit's completed data)
BLOCK_SHRINK = 0.1        # the block statistic's covariance: (1 - this) x the full block + this x its diagonal
BLOCK_MAX_CLASSES = 20    # above this many classes only the diagonal statistic runs (the block one costs k^4 a draw)
#: above BLOCK_MAX_CLASSES classes each predicted class's block keeps the log-odds of this many other classes only:
#: those its holdout rows lean towards most (the k^2 moments and the draws' (d, k) class means would cost k^3)
NEIGHBOURS = 4
#: the statistics' shares of the part's level (renormalised over those computed): the smallest p / share decides
STATISTIC_WEIGHTS = {"diagonal": 0.2, "block": 0.5, "sum": 0.3}
_BLOCK_CHUNK = 4_000_000  # draws x k^4 numbers per chunk of the block statistic's draws (32 MB of float64)
_TARGET_CHUNK = 400_000   # draws x world rows per chunk of the target's draws in float64 (3.2 MB)


@dataclass(frozen=True)
class LogOddsPart:
    """Result of :func:`log_odds_test`: the statistic S, its bootstrap p-value, and per predicted class the part
    of S its block carries (which class's outputs look most unlike the reweighted holdout)."""

    statistic: float
    p_value: float
    class_share: np.ndarray
    moments: int
    block_statistic: float = float("nan")
    sum_statistic: float = float("nan")
    p_value_diagonal: float = float("nan")
    p_value_block: float = float("nan")
    p_value_sum: float = float("nan")
    draws_used: int = 0


def _log_odds(Z) -> tuple[np.ndarray, np.ndarray]:
    """Each row's predicted class c = argmax and its log-odds log f_j - log f_c, clipped to [LOG_ODDS_FLOOR, 0]
    (rows, k; float64, 0 in slot c)."""
    Z = np.asarray(Z, dtype=np.float64)
    c = np.argmax(Z, axis=1)
    with np.errstate(divide="ignore"):
        lz = np.log(Z)
    return c, np.clip(lz - lz[np.arange(Z.shape[0]), c][:, None], LOG_ODDS_FLOOR, 0.0)


def _features(Z: np.ndarray, k: int) -> sparse.csr_matrix:
    """(rows, k + k * k), sparse: the indicator of the predicted class, then its block of clipped log-odds -- at most
    k + 1 non-zeros a row, so that the bootstrap's draws cost rows x k, not rows x k^2."""
    rows = Z.shape[0]
    c, odds = _log_odds(Z)
    cols = np.concatenate([c[:, None], k + c[:, None] * k + np.arange(k)[None, :]], axis=1)    # sorted in each row
    values = np.concatenate([np.ones((rows, 1)), odds], axis=1)
    F = sparse.csr_matrix((values.ravel(), cols.ravel(), np.arange(rows + 1) * (k + 1)), shape=(rows, k + k * k))
    F.eliminate_zeros()
    return F


def _block_vectors(Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's predicted class c and its block vector u (rows, k): the clipped log-odds log f_j - log f_c, with
    1 (the indicator of c) in slot c. The block statistic's moments are u placed in c's block."""
    c, odds = _log_odds(Z)
    return c, _indicator_in_slot(c, odds)


def _indicator_in_slot(c: np.ndarray, odds: np.ndarray) -> np.ndarray:
    """The block vectors from the clipped log-odds (:func:`_log_odds`), in place: 1 in each row's slot c."""
    odds[np.arange(odds.shape[0]), c] = 1.0
    return odds


def _products(Z: np.ndarray, k: int) -> sparse.csr_matrix:
    """(rows, k^3), sparse: the outer product u u' of each row's block vector (:func:`_block_vectors`), placed in its
    predicted class's (k, k) block -- k^2 non-zeros a row; summed over rows they give each block's second moments."""
    c, u = _block_vectors(Z)
    rows = u.shape[0]
    cols = c[:, None] * k * k + np.arange(k * k)[None, :]
    values = (u[:, :, None] * u[:, None, :]).reshape(rows, k * k)
    return sparse.csr_matrix((values.ravel(), cols.ravel(), np.arange(rows + 1) * k * k), shape=(rows, k ** 3))


class TargetMomentSums(NamedTuple):
    """Unnormalised sums of the log-odds moments over some target rows, per predicted class c: rows predicted c
    (k,), sums of their clipped log-odds (c, j) and of their squares (k, k), and with ``products`` the sums of
    their block vectors' u u' (c, a, a'), else None; ``rows`` counted."""
    count: np.ndarray
    total: np.ndarray
    squares: np.ndarray
    second: np.ndarray | None
    rows: int


def target_moment_sums(P: np.ndarray, k: int, products: bool = False) -> TargetMomentSums:
    """:class:`TargetMomentSums` of the (m, k) rows P in row blocks, float64: memory of one block of (rows, k)
    log-odds, never the (m, k + k^2) moment matrix. Also the per-partition function of :func:`target_moments`."""
    m = P.shape[0]
    count = np.zeros(k)
    total = np.zeros((k, k))
    squares = np.zeros((k, k))
    second = np.zeros((k, k, k))
    for sl in _rows.blocks(m, width=k):
        c, odds = _log_odds(P[sl])
        count += np.bincount(c, minlength=k)
        for j in range(k):                       # row c of total gets the rows predicted c (bincount: fast)
            total[:, j] += np.bincount(c, weights=odds[:, j], minlength=k)
            squares[:, j] += np.bincount(c, weights=np.square(odds[:, j]), minlength=k)
        if products:
            u = _indicator_in_slot(c, odds)      # the block vectors (odds is not used again)
            for b in np.unique(c):
                U = u[c == b]
                second[b] += U.T @ U
    return TargetMomentSums(count, total, squares, second if products else None, m)


def _added_sums(parts: list) -> TargetMomentSums:
    """The :class:`TargetMomentSums` of the union of the partitions' rows, added in partition order (the counts
    are whole numbers below 2^53: exact in any order)."""
    first = parts[0]
    count, total, squares = np.zeros_like(first.count), np.zeros_like(first.total), np.zeros_like(first.squares)
    second = None if first.second is None else np.zeros_like(first.second)
    for part in parts:
        count += part.count
        total += part.total
        squares += part.squares
        if second is not None:
            second += part.second
    return TargetMomentSums(count, total, squares, second, sum(part.rows for part in parts))


def target_moments(P, k: int, products: bool = False):
    """Mean and variance of the moments over the target rows (:func:`target_moment_sums` / m), and with
    ``products`` each block's mean second-moment matrix of the block vectors, (k, k, k). Rows in partitions: each
    partition's sums where it lives, added here (:func:`_added_sums`)."""
    m = P.shape[0]
    if is_partitioned(P):
        sums = _added_sums(P.single().run(target_moment_sums, k, products))
    else:
        sums = target_moment_sums(P, k, products)
    mean = np.concatenate([sums.count, sums.total.ravel()]) / m
    moments = np.concatenate([sums.count, sums.squares.ravel()]) / m
    if products:
        return mean, np.maximum(moments - mean ** 2, 0.0), sums.second / m
    return mean, np.maximum(moments - mean ** 2, 0.0)


def _neighbour_columns(Fs: sparse.csr_matrix, k: int, neighbours: int) -> np.ndarray:
    """The moments kept above BLOCK_MAX_CLASSES classes, as columns of the full layout (k indicators, then k blocks
    of k log-odds): every indicator, and in block c the log-odds of the ``neighbours`` classes j != c with the
    largest holdout mean log f_j - log f_c over the rows predicted c (ties to the smaller j) -- fixed by the holdout,
    so the same moments in the data and in every draw; d = k (1 + neighbours), not k + k^2."""
    counts = np.asarray(Fs[:, :k].sum(axis=0)).ravel()
    means = (np.asarray(Fs[:, k:].sum(axis=0)).ravel().reshape(k, k) / np.maximum(counts, 1.0)[:, None])
    means[counts == 0] = LOG_ODDS_FLOOR                           # a block the holdout never shows: any order
    means[np.arange(k), np.arange(k)] = -np.inf                   # slot c of block c is the indicator's
    top = np.argsort(-means, axis=1, kind="stable")[:, :min(neighbours, k - 1)]
    return np.concatenate([np.arange(k), (k + np.arange(k)[:, None] * k + np.sort(top, axis=1)).ravel()])


def _profile(f: np.ndarray, M: np.ndarray, W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """min over q (sum q = 1) of sum_j W_j (f_j - (M q)_j)^2 for B data sets at once: f (B, d), M (B, d, k).
    Returns the minima (B,) and the minimisers (B, k) (unconstrained in sign: a least-squares fit)."""
    W = np.atleast_2d(W)                                   # (1, d) for all draws, or (B, d): one per draw
    MW = M * W[:, :, None]
    if M.shape[2] <= BLOCK_MAX_CLASSES:
        A = np.einsum("bdk,bdl->bkl", M, MW, optimize=True)  # one BLAS product a draw (a strided matmul is not)
    else:                        # class y's means are 0 outside the blocks its rows are predicted in: sparse
        A = np.stack([(Ms.T @ sparse.csr_matrix(MWb)).toarray()
                      for Ms, MWb in ((sparse.csr_matrix(Mb), MWb) for Mb, MWb in zip(M, MW))])
    b = np.einsum("bdk,bd->bk", MW, f, optimize=True)
    q = _sum_to_one(A, b)
    resid = f - np.matmul(M, q[..., None])[..., 0]
    return np.sum(W * resid ** 2, axis=1), q


def _sum_to_one(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin over q with sum q = 1 of q' A q - 2 b' q for B systems at once (A (B, k, k) positive semi-definite,
    b (B, k)), A ridged by 1e-10 of its mean diagonal: the normal equations' solution plus the multiple of A^-1 1
    that brings it onto sum q = 1 (Lagrange)."""
    k = A.shape[-1]
    scale = np.trace(A, axis1=1, axis2=2) / k
    A = A + (1e-10 * np.maximum(scale, 1e-300))[:, None, None] * np.eye(k)
    if k <= BLOCK_MAX_CLASSES:            # as measured for the size and power tables (bit for bit)
        Ab = np.linalg.solve(A, b[..., None])[..., 0]
        A1 = np.linalg.solve(A, np.ones_like(b)[..., None])[..., 0]
    else:                                 # one factorisation for both right sides
        both = np.linalg.solve(A, np.stack([b, np.ones_like(b)], axis=-1))
        Ab, A1 = both[..., 0], both[..., 1]
    return Ab + ((1.0 - Ab.sum(axis=1)) / A1.sum(axis=1))[:, None] * A1


def _on_simplex(q: np.ndarray) -> np.ndarray:
    """q (B, k) with negative entries set to 0, rescaled to sum 1: the proportions the second fit's weights use."""
    q = np.maximum(q, 0.0)
    return q / np.maximum(q.sum(axis=1, keepdims=True), 1e-300)


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
    W = weights(_on_simplex(q))
    stat, q = _profile(f, M, W)
    return stat, q, W


def _block_statistic(f, T2, M, E2, n_y, m: int, pooled) -> tuple[np.ndarray, np.ndarray]:
    """The block statistic for B data sets: the moments of :func:`_studentised`, weighted by the inverse of their
    covariance within each predicted class's block instead of their variances alone, so that a few log-odds that
    move together against the rest (rows leaning towards one other class) are not diluted by the block's common
    spread. f (B, c, a): the target's block means; T2 (B, c, a, a): its block second moments; M (B, c, a, k):
    the holdout's per-class block means; E2 (B, k, c, a, a): their second moments (c: the blocks kept, a: the k
    slots of a block). The covariance, target / m + sum_y q_y^2 (class y's, smoothed as in _studentised) / n_y, is
    shrunk by BLOCK_SHRINK towards its diagonal (a class of 50 holdout rows estimates a k x k block poorly);
    blocks are uncorrelated in it (the cross terms -E[u_c] E[u_c'] are left out: a weight, not a law -- the
    bootstrap gives the law). q is profiled out by generalised least squares as in _studentised. Returns S (B,) and
    each block's part of it (B, c)."""
    k = n_y.size
    a = n_y / (n_y + SMOOTH)
    mean = a * M + (1 - a) * pooled[0][None, :, :, None]                                   # (B, c, a, k)
    second = a[None, :, None, None, None] * E2 + (1 - a)[None, :, None, None, None] * pooled[1][None, None]
    mean_y = np.moveaxis(mean, 3, 1)                                                       # (B, k, c, a)
    V = second - mean_y[..., :, None] * mean_y[..., None, :]                               # (B, k, c, a, a)
    cov_t = T2 - f[..., :, None] * f[..., None, :]
    eye = np.eye(f.shape[2])

    def covariance(q):
        C = cov_t / m + np.einsum("bycij,by->bcij", V, q ** 2 / n_y)
        diagonal = np.einsum("bcii->bci", C)
        C = (1 - BLOCK_SHRINK) * C + BLOCK_SHRINK * diagonal[..., None] * eye
        top = np.maximum(diagonal.max(axis=(1, 2)), 1e-300)[:, None, None, None]
        return C + _W_FLOOR * top * eye

    def profile(C):
        CiM = np.linalg.solve(C, M)                                                        # (B, c, a, k)
        Cif = np.linalg.solve(C, f[..., None])[..., 0]
        q = _sum_to_one(np.einsum("bcay,bcaz->byz", M, CiM), np.einsum("bcay,bca->by", M, Cif))
        r = f - np.einsum("bcay,by->bca", M, q)
        parts = np.einsum("bca,bca->bc", r, np.linalg.solve(C, r[..., None])[..., 0])
        return parts, q

    _, q = profile(covariance(np.broadcast_to(n_y / n_y.sum(), (f.shape[0], k))))
    parts, _ = profile(covariance(_on_simplex(q)))
    return parts.sum(axis=1), parts


def _p_value(stat: float, boot: np.ndarray) -> tuple[float, float]:
    """(1 + #{draws >= stat}) / (draws + 1), and where no draw reaches the statistic, the tail of a scaled chi^2
    matched to the draws' mean and variance (Satterthwaite; nan otherwise): the draws resolve nothing below
    1/(B+1), the tail says how far out."""
    exceed = int(np.sum(boot >= stat - 1e-9 * max(1.0, stat)))
    tail = float("nan")
    if exceed == 0:
        mean, var = float(boot.mean()), float(boot.var())
        if mean > 0 and var > 0:
            tail = float(chi2.sf(stat / (var / (2 * mean)), 2 * mean ** 2 / var))
    return (1 + exceed) / (boot.size + 1), tail


def _with_tail(p: float, tail: float) -> float:
    return float(p if np.isnan(tail) else min(p, tail))


def _ranks(stat: float, boot: np.ndarray) -> np.ndarray:
    """Each draw's p-value as if it were the data: (#{draws >= it} (itself included) + [statistic >= it]) / (B + 1),
    the observed statistic taking the draw's place among the B + 1 -- so that the draws and the data are
    exchangeable under H0 and the min-p calibration is exact up to the world's law (a draw counted twice instead of
    the data made it liberal: ``docs/label_shift_test.md``)."""
    order = np.sort(boot)
    above = boot.size - np.searchsorted(order, boot, side="left")
    return (above + (stat >= boot - 1e-9 * np.maximum(1.0, np.abs(boot)))) / (boot.size + 1)


def _world(Fs, y, Ft, resp, m: int):
    """The bootstrap world: the completed data of the null fit. Rows: the n holdout rows (features ``Fs``), then T
    target rows (features ``Ft``; a uniform subsample of the target). Class y's weights: 1 for each holdout row of
    class y, SMOOTH / n for every holdout row (SMOOTH pseudo-rows of the whole holdout), and WORLD_TARGET_WEIGHT x
    m / T x ``resp[:, y]`` (the null fit's share of class y) for each target row, so that the target's rows weigh
    WORLD_TARGET_WEIGHT x m in all. Returns the features (CSR, rows x moments), their squares, and the normalised
    weights (k, rows)."""
    n, T = Fs.shape[0], Ft.shape[0]
    F = sparse.vstack([Fs, Ft]).tocsr()
    weights = np.zeros((resp.shape[1], n + T))
    weights[y, np.arange(n)] = 1.0
    weights[:, :n] += SMOOTH / n
    weights[:, n:] = WORLD_TARGET_WEIGHT * (m / T) * resp.T
    weights /= weights.sum(axis=1, keepdims=True)
    return F, F.multiply(F).tocsr(), weights


def _draw_rows(rng, cdf: np.ndarray, rows: int, draws: int) -> np.ndarray:
    """``draws`` samples of ``rows`` world rows each (inverse-cdf sampling from ``cdf``): their indices, (draws,
    rows) int32. The uniforms are looked up in ascending order (the same positions, found faster)."""
    u = (rng.random((draws, rows)) * cdf[-1]).ravel()
    order = np.argsort(u)
    idx = np.empty(u.size, dtype=np.int64)
    idx[order] = np.searchsorted(cdf, u[order], side="right")
    return np.minimum(idx, cdf.size - 1).astype(np.int32).reshape(draws, rows)


def _counts(picked: np.ndarray, size: int) -> sparse.csr_matrix:
    """The (draws, world rows) matrix of counts of the rows ``picked`` (:func:`_draw_rows`): its product with the
    world's features gives each draw's sums."""
    draws, rows = picked.shape
    return sparse.csr_matrix((np.ones(draws * rows), picked.ravel(), np.arange(draws + 1) * rows),
                             shape=(draws, size))


class HoldoutSide(NamedTuple):
    """What the part computes from the labelled holdout alone (:func:`holdout_side`), the same for every target it
    is tested against: the moments compared (``cols`` of the full layout, ``keep`` of those the holdout takes),
    their per-class means and second moments, and what the block statistic takes from the holdout."""
    n_y: np.ndarray             # (k,) holdout rows per class
    Fs: sparse.csr_matrix       # (n, len(cols)) the holdout's features
    Fh: np.ndarray              # Fs as a dense array
    cols: np.ndarray
    keep: np.ndarray
    block: bool                 # k <= BLOCK_MAX_CLASSES: the full layout and the block statistic
    pooled: tuple               # the whole holdout's means and second moments of the kept moments
    M_full: np.ndarray          # (len(cols), k) per-class means
    M: np.ndarray               # M_full on the kept moments
    E2: np.ndarray              # per-class second moments of the kept moments
    blocks: tuple | None        # the block statistic's (kept, layout, E2 by class, pooled, the holdout's (c, u))


class _HoldoutMoments(NamedTuple):
    """The holdout's side of the statistic (:class:`HoldoutSide`) and the target's moments."""
    n_y: np.ndarray
    Fs: sparse.csr_matrix
    Fh: np.ndarray
    cols: np.ndarray
    keep: np.ndarray
    block: bool
    pooled: tuple
    M_full: np.ndarray
    M: np.ndarray
    E2: np.ndarray
    blocks: tuple | None
    moments: tuple              # target_moments of the target rows
    f: np.ndarray               # the target's means of the kept moments
    var_t: np.ndarray           # and their variances


class _WorldDraws(NamedTuple):
    """The bootstrap world (:func:`_world`) and the random streams of its draws: each draw's rows are made when its
    batch is computed (:func:`_draw_batch`), yet are exactly the rows that drawing all of them up front would give
    -- the holdout rows by jumping ahead in their stream, the target's by drawing batch after batch in order -- so
    that a draw's statistics do not depend on the batching, and draws after an early stop are never made."""
    Zt: np.ndarray              # the target rows that stand for the target in the world
    Fw: sparse.csr_matrix       # the world's features
    F2w: sparse.csr_matrix      # and their squares
    F2k: sparse.csr_matrix      # the squares of the kept moments
    cdfs: list                  # per class the cumulative world weights its holdout rows are drawn by
    n_y: np.ndarray             # (k,) rows a draw takes of each class (holdout_noise.drawn_rows)
    draws: int                  # B
    picks: dict                 # the state of the holdout rows' stream (one uniform a row, class by class)
    target: np.random.Generator  # the target's stream, positioned after every holdout row of every draw
    mix: np.ndarray             # the target's probabilities of the world rows
    m: int                      # target rows a draw takes
    next_draw: list             # [the first draw of the next batch]: batches must come in order (the target stream)


class _Draws(NamedTuple):
    """The moments of a batch of draws from the world: the holdout's per-class moments (and, for the block
    statistic, their block sums), the target's draws as counts of world rows, and the draws' moments."""
    Mb: np.ndarray              # (draws, d, k) per-class means of the kept moments
    E2b: np.ndarray             # (draws, d, k) and their second moments
    held: np.ndarray | None     # (draws, k, kept blocks, k, k) per class the sums of u u' by block (block statistic)
    counts_t: np.ndarray        # (draws, world rows) the target's draws
    fb_full: np.ndarray         # (draws, moments) the target draws' means
    fb: np.ndarray              # fb_full on the kept moments
    var_b: np.ndarray           # and their variances
    rows: np.ndarray            # (k,) the holdout rows each class's draws took


class _BlockData(NamedTuple):
    """The block statistic's side of the data: its value and parts, the blocks kept, the layout of their moments,
    the pooled holdout's block moments, and the world's products u u' (rows sorted by predicted class)."""
    stat: float
    parts: np.ndarray
    kept: np.ndarray
    layout: np.ndarray
    pooled: tuple
    order: np.ndarray           # (world rows,) the world's rows by predicted class
    starts: np.ndarray          # (k + 1,) where each predicted class's rows begin in that order
    U2: np.ndarray              # (world rows, k * k) each row's u u', in that order
    U2_upper: np.ndarray        # (world rows, k (k + 1) / 2) its upper triangle (u u' is symmetric)
    rank: np.ndarray            # (world rows,) each world row's place in that order
    block_of: np.ndarray        # (world rows,) in that order: the place in ``kept`` of the row's block, -1 if none


def holdout_side(S: np.ndarray, y: np.ndarray, k: int) -> HoldoutSide | None:
    """The part's work on the holdout alone (S (n, k) outputs, y labels, every class present), for
    :func:`log_odds_test` against any number of targets; None when the holdout takes no moment."""
    n_y = np.bincount(y, minlength=k)
    members = [np.flatnonzero(y == c) for c in range(k)]
    Fs = _features(S, k)
    block = k <= BLOCK_MAX_CLASSES
    # the moments' columns of the full layout: all of them, or above BLOCK_MAX_CLASSES the neighbours' only
    cols = np.arange(k + k * k) if block else _neighbour_columns(Fs, k, NEIGHBOURS)
    if not block:
        Fs = Fs[:, cols]
    keep = np.bincount(Fs.indices, minlength=Fs.shape[1]) > 0    # moments the holdout never takes compare nothing
    if not keep.any():
        return None
    Fh = Fs.toarray()
    F2 = np.square(Fh)
    pooled = (Fh[:, keep].mean(axis=0), F2[:, keep].mean(axis=0))
    M_full = np.stack([Fh[idx].mean(axis=0) for idx in members], axis=1)          # (k + k^2, k)
    E2 = np.stack([F2[idx][:, keep].mean(axis=0) for idx in members], axis=1)
    return HoldoutSide(n_y=n_y, Fs=Fs, Fh=Fh, cols=cols, keep=keep, block=block, pooled=pooled, M_full=M_full,
                       M=M_full[keep], E2=E2, blocks=_holdout_blocks(S, y, k, n_y, keep, Fh) if block else None)


def _holdout_blocks(S: np.ndarray, y: np.ndarray, k: int, n_y: np.ndarray, keep: np.ndarray, Fh: np.ndarray):
    """The block statistic's side of the holdout: the blocks kept (predicted classes the holdout shows), the layout
    of their moments, per class their second moments (y, c, a, a), the pooled holdout's block moments, and the
    holdout rows' (c, u) (:func:`_block_vectors`)."""
    # block layout (c, a) = slot a of block c, the indicator in slot c
    kept = np.flatnonzero(keep[:k])
    layout = k + np.arange(k)[:, None] * k + np.arange(k)[None, :]
    layout[np.arange(k), np.arange(k)] = np.arange(k)
    layout = layout[kept]                                         # (c, a) -> column of the full moment layout
    Ps = _products(S, k)
    Y = sparse.csr_matrix((1.0 / n_y[y], (y, np.arange(y.size))), shape=(k, y.size))
    E2_hold = (Y @ Ps).toarray().reshape(k, k, k, k)[:, kept]   # (y, c, a, a)
    pooled_block = (Fh.mean(axis=0)[layout], np.asarray(Ps.mean(axis=0)).reshape(k, k, k)[kept])
    return kept, layout, E2_hold, pooled_block, _block_vectors(S)


def _holdout_moments(S: np.ndarray, y: np.ndarray, P, k: int,
                     side: HoldoutSide | None = None) -> _HoldoutMoments | None:
    """The holdout's side (``side``, else computed here) and the target's moments; None when the holdout takes no
    moment."""
    side = holdout_side(S, y, k) if side is None else side
    if side is None:
        return None
    moments = target_moments(P, k, products=side.block)
    return _HoldoutMoments(*side, moments=moments, f=moments[0][side.cols][side.keep],
                           var_t=moments[1][side.cols][side.keep])


def _world_draws(hm: _HoldoutMoments, y: np.ndarray, P, draws: int, seed: int, responsibilities,
                 q_world: np.ndarray, inflation=1.0) -> _WorldDraws:
    """The bootstrap world and the random streams of its draws (seeded by ``seed``; :func:`_draw_batch` makes the
    draws: each class's r_y = drawn_rows(n_y, inflation) holdout rows -- n_y at inflation 1 -- and the target's m
    rows, classes from ``q_world``)."""
    # the bootstrap world (_world): class y's rows are its holdout rows plus the target rows in the share the null
    # fit gives y, so that a (class, output) pair the holdout shows a handful of times enters at the target's rate;
    # the holdout's n_y rows of each class and the target's m rows (classes from q_world) are drawn from it
    k, m, n_y = hm.n_y.size, P.shape[0], drawn_rows(hm.n_y, inflation)
    rng = np.random.default_rng([seed, 0x10DD5])
    sub = np.sort(rng.choice(m, size=min(m, WORLD_TARGET_ROWS), replace=False))
    Zt = np.asarray(take_rows(P, sub) if is_partitioned(P) else P[sub], dtype=np.float64)     # the same rows
    Ft = _features(Zt, k) if hm.block else _features(Zt, k)[:, hm.cols]
    Fw, F2w, world = _world(hm.Fs, y, Ft, np.asarray(responsibilities(Zt), dtype=np.float64), m)
    picks = rng.bit_generator.state
    rng.bit_generator.advance(int(draws * n_y.sum()))          # the holdout rows' uniforms come first
    qw = np.maximum(np.asarray(q_world, dtype=np.float64), 0.0)
    return _WorldDraws(Zt=Zt, Fw=Fw, F2w=F2w, F2k=F2w[:, hm.keep], cdfs=[np.cumsum(world[c]) for c in range(k)],
                       n_y=n_y, draws=draws, picks=picks, target=rng, mix=(qw / qw.sum()) @ world, m=m,
                       next_draw=[0])


def _draw_batch(wd: _WorldDraws, sl: slice) -> tuple[list, np.ndarray]:
    """The rows of the draws ``sl`` (batches asked for in order): per class the world rows its holdout rows are
    (draws, n_y) int32, and the target's counts of world rows (draws, rows)."""
    if sl.start != wd.next_draw[0]:
        raise ValueError(f"draws {sl.start}-{sl.stop} asked for before draw {wd.next_draw[0]}: batches come in order")
    wd.next_draw[0] = sl.stop
    picked, offset = [], 0
    for c, cdf in enumerate(wd.cdfs):
        stream = np.random.Generator(np.random.PCG64(0))        # its state is replaced just below
        stream.bit_generator.state = wd.picks
        stream.bit_generator.advance(int(offset + sl.start * wd.n_y[c]))    # a uniform is one 64-bit output
        picked.append(_draw_rows(stream, cdf, int(wd.n_y[c]), sl.stop - sl.start))
        offset += wd.draws * int(wd.n_y[c])
    return picked, wd.target.multinomial(wd.m, wd.mix, size=sl.stop - sl.start)


def _draw_moments(hm: _HoldoutMoments, wd: _WorldDraws, sl: slice, m: int, bd: _BlockData | None = None) -> _Draws:
    """The moments of the draws ``sl``: the holdout's per-class means and second moments, the target's means and
    variances. With ``bd`` (the block statistic) the holdout's moments are read off its block sums of u u', which
    hold them (row c of block c: the indicator and the log-odds; the diagonal: their squares)."""
    k, n_y, keep, Fw = hm.n_y.size, wd.n_y, hm.keep, wd.Fw        # means over the rows drawn
    picked, counts_t = _draw_batch(wd, sl)
    b, d = counts_t.shape[0], int(keep.sum())
    held = None
    if bd is not None:
        held = _held_block_sums(bd, picked)
        sums, squares = _layout_sums(bd, held, Fw.shape[1])
        Mb, E2b = sums[:, keep] / n_y, squares[:, keep] / n_y
    else:
        Mb, E2b = np.zeros((b, d, k)), np.zeros((b, d, k))
        for c in range(k):
            counts = _counts(picked[c], Fw.shape[0])
            Mb[:, :, c] = (counts @ Fw).toarray()[:, keep] / n_y[c]
            E2b[:, :, c] = (counts @ wd.F2w).toarray()[:, keep] / n_y[c]
    fb_full = np.zeros((b, Fw.shape[1]))
    second = np.zeros((b, d))
    F2k = wd.F2k
    for part in _rows.blocks(b, max(1, _TARGET_CHUNK // Fw.shape[0])):       # float64 a chunk of draws at a time
        ct = counts_t[part].astype(np.float64).T
        fb_full[part] = np.asarray(Fw.T @ ct).T / m
        second[part] = np.asarray(F2k.T @ ct).T / m
    fb = fb_full[:, keep]
    return _Draws(Mb=Mb, E2b=E2b, held=held, counts_t=counts_t, fb_full=fb_full, fb=fb,
                  var_b=np.maximum(second - fb ** 2, 0.0), rows=n_y)


def _held_block_sums(bd: _BlockData, picked: list) -> np.ndarray:
    """(draws, k, kept blocks, k, k): for each class y's holdout draws (``picked[y]``: (draws, n_y) world rows), the
    sums of u u' over the rows drawn, by the predicted class's block -- one sparse product: a row per (class,
    draw, block) counting the world rows drawn (a row of a block not kept adds nothing)."""
    k, b, size, kept = len(picked), picked[0].shape[0], bd.rank.size, bd.kept.size
    key = np.sort(np.concatenate([((y * b + np.arange(b))[:, None] * size + bd.rank[p]).ravel()
                                  for y, p in enumerate(picked)]))          # by (class, draw), then world row
    row, at = np.divmod(key, size)
    place = bd.block_of[at]
    take = place >= 0
    row = row[take] * kept + place[take]                                    # ascending: blocks follow the order
    indptr = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=k * b * kept))])
    counts = sparse.csr_matrix((np.ones(row.size), at[take], indptr), shape=(k * b * kept, size))
    upper = counts @ bd.U2_upper                                            # the upper triangles, then mirrored
    out = np.empty((k * b * kept, k, k))
    i, j = np.triu_indices(k)
    out[:, i, j] = upper
    out[:, j, i] = upper
    return np.swapaxes(out.reshape(k, b, kept, k, k), 0, 1)


def _layout_sums(bd: _BlockData, held: np.ndarray, moments: int) -> tuple[np.ndarray, np.ndarray]:
    """(draws, moments, k) each: the sums of every moment of the full layout and of its square, per class, from
    the block sums ``held`` (:func:`_held_block_sums`); 0 in the blocks not kept."""
    b, k, kept = held.shape[0], held.shape[1], bd.kept.size
    sums, squares = np.zeros((b, moments, k)), np.zeros((b, moments, k))
    rows = held[:, :, np.arange(kept), bd.kept, :]                          # (b, y, c, a): row c of block c
    diagonal = np.einsum("bycaa->byca", held)
    sums[:, bd.layout, :] = np.moveaxis(rows, 1, -1)
    squares[:, bd.layout, :] = np.moveaxis(diagonal, 1, -1)
    return sums, squares


def _block_data(hm: _HoldoutMoments, Zt: np.ndarray, m: int) -> _BlockData:
    """The block statistic on the data, and what its draws need."""
    k, n_y = hm.n_y.size, hm.n_y
    kept, layout, E2_hold, pooled_block, (c_s, u_s) = hm.blocks
    t_block = hm.moments[2][kept]
    b_stat, b_parts = _block_statistic(hm.moments[0][layout][None], t_block[None], hm.M_full[layout][None],
                                       E2_hold[None], n_y, m, pooled_block)
    c_t, u_t = _block_vectors(Zt)
    c, u = np.concatenate([c_s, c_t]), np.vstack([u_s, u_t])     # the world's rows: the holdout's, then Zt's
    order = np.argsort(c, kind="stable")
    u = u[order]
    U2 = (u[:, :, None] * u[:, None, :]).reshape(order.size, k * k)
    i, j = np.triu_indices(k)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    place = np.full(k, -1)
    place[kept] = np.arange(kept.size)
    return _BlockData(stat=float(b_stat[0]), parts=b_parts[0], kept=kept, layout=layout, pooled=pooled_block,
                      order=order, starts=np.searchsorted(c[order], np.arange(k + 1)), U2=U2,
                      U2_upper=u[:, i] * u[:, j], rank=rank,
                      block_of=place[c[order]])


def _block_sums(bd: _BlockData, C: np.ndarray) -> np.ndarray:
    """(draws, kept blocks, k, k): for draws given as counts of the world's rows in ``bd.order`` (draws, world rows;
    float64), the sums of u u' over the rows drawn, by the predicted class's block -- one dense product per block
    (a block's rows are contiguous in that order)."""
    k = bd.starts.size - 1
    out = np.empty((C.shape[0], bd.kept.size, k * k))
    for i, block in enumerate(bd.kept):
        lo, hi = bd.starts[block], bd.starts[block + 1]
        out[:, i] = C[:, lo:hi] @ bd.U2[lo:hi]
    return out.reshape(C.shape[0], bd.kept.size, k, k)


def _block_draws(bd: _BlockData, hm: _HoldoutMoments, dr: _Draws, m: int) -> np.ndarray:
    """The block statistic on a batch of draws."""
    k, n_y, layout, rows = hm.n_y.size, hm.n_y, bd.layout, bd.order.size
    b_boot = np.empty(dr.counts_t.shape[0])
    for sl in _rows.blocks(b_boot.size, max(1, min(_BLOCK_CHUNK // k ** 4, _TARGET_CHUNK // rows))):
        E2c = dr.held[sl] / dr.rows[None, :, None, None, None]                   # (b, y, c, a, a)
        Mc = np.moveaxis(dr.held[sl][:, :, np.arange(bd.kept.size), bd.kept, :] / dr.rows[None, :, None, None],
                         1, -1)                                                  # (b, c, a, y): row c of block c
        T2c = _block_sums(bd, dr.counts_t[sl][:, bd.order].astype(np.float64)) / m
        b_boot[sl] = _block_statistic(dr.fb_full[sl][:, layout], T2c, Mc, E2c, n_y, m, bd.pooled)[0]
    return b_boot


def _draw_statistics(hm: _HoldoutMoments, wd: _WorldDraws, bd: _BlockData | None, sl: slice, m: int,
                     odds: np.ndarray) -> dict:
    """The part's statistics on the draws ``sl``: {name: (draws,)}, computed as on the data."""
    dr = _draw_moments(hm, wd, sl, m, bd)
    boot, q_b, W_b = _studentised(dr.fb, dr.var_b, dr.Mb, dr.E2b, hm.n_y, m, hm.pooled)
    z_b = np.sqrt(W_b) * (dr.fb - np.einsum("bdk,bk->bd", dr.Mb, q_b))
    out = {"diagonal": boot, "sum": np.abs(np.sum(z_b[:, odds], axis=1))}
    if bd is not None:
        out["block"] = _block_draws(bd, hm, dr, m)
    return out


def log_odds_test(S: np.ndarray, y: np.ndarray, P, draws: int, seed: int, responsibilities,
                  q_world: np.ndarray, side: HoldoutSide | None = None, inflation=1.0) -> LogOddsPart:
    """The log-odds part (module docstring). S (n, k) holdout outputs, y its labels (every class present), P the
    target outputs (m, k; read in row blocks), at most ``draws`` bootstrap draws from ``seed``. The bootstrap world
    is the completed data of a null fit: ``responsibilities(rows)`` gives, for target output rows (T, k), each
    class's share of every row (T, k; rows sum to 1 or are 0), ``q_world`` the fit's class proportions (the
    target's classes in the draws). Three statistics are computed on the same draws: the diagonal S, the sum
    statistic (the absolute sum of S's log-odds z-scores) and, for k <= BLOCK_MAX_CLASSES, the block statistic.
    The draws are computed DRAW_BATCH at a time; once each statistic has STOP_EXCEEDANCES draws reaching it, the
    bootstrap stops and the part's p-value is the weighted Bonferroni min_j (p_j / share_j) of their sequential
    p-values (:mod:`.sequential`; at least 0.05 / the largest share: 0.1 with the block
    statistic, 0.083 without; ``draws_used`` the draws computed); otherwise, after all the draws, each gets
    p = (1 + #{draws >= it}) / (draws + 1) and the part's p-value is their smallest p / STATISTIC_WEIGHTS share,
    calibrated by the same draws (:func:`_combined`). ``side``: :func:`holdout_side` of (S, y), when already
    computed (the same result). ``inflation``: kappa (one number, or one per class), each class's holdout rows in a
    draw are drawn_rows(n_y, kappa) (:mod:`.holdout_noise`), the studentisation keeps n_y: the law carries class
    y's holdout error kappa_y times."""
    k = S.shape[1]
    m = P.shape[0]
    hm = _holdout_moments(S, y, P, k, side)
    if hm is None:
        return LogOddsPart(statistic=0.0, p_value=1.0, class_share=np.zeros(k), moments=0)
    stat, q, W = _studentised(hm.f[None], hm.var_t[None], hm.M[None], hm.E2[None], hm.n_y, m, hm.pooled)
    s, d, cols, keep = float(stat[0]), int(hm.keep.sum()), hm.cols, hm.keep
    # the sum statistic: |sum of the log-odds moments' z-scores| (the indicators left out), the same fits
    odds = cols[keep] >= k
    z = np.sqrt(W[0]) * (hm.f - hm.M @ q[0])
    t_sum = float(abs(np.sum(z[odds])))
    # evidence: the statistic's parts by predicted-class block (the indicator of c and its log-odds)
    owner = np.concatenate([np.arange(k), np.repeat(np.arange(k), k)])[cols][keep]
    shares = {"diagonal": np.bincount(owner, weights=z ** 2, minlength=k),
              "sum": np.maximum(np.sign(np.sum(z[odds])) * np.bincount(owner, weights=z * odds, minlength=k), 0)}
    statistics = {"diagonal": s, "sum": t_sum}
    fields = {"statistic": s, "moments": d, "sum_statistic": t_sum}
    wd = _world_draws(hm, y, P, draws, seed, responsibilities, q_world, inflation)
    bd = _block_data(hm, wd.Zt, m) if hm.block else None
    if bd is not None:
        statistics["block"] = fields["block_statistic"] = bd.stat
        shares["block"] = np.zeros(k)
        shares["block"][bd.kept] = bd.parts
    found = {name: [] for name in statistics}
    for sl in _rows.blocks(draws, DRAW_BATCH):
        for name, values in _draw_statistics(hm, wd, bd, sl, m, odds).items():
            found[name].append(values)
        early = _stopped_early(statistics, found, shares, sl.stop, fields)
        if early is not None:
            return early
    laws = {name: (statistics[name], np.concatenate(found[name])) for name in statistics}
    return _combined(laws, shares, draws, draws_used=draws, **fields)


def _shares_of_level(names) -> np.ndarray:
    """The STATISTIC_WEIGHTS of these statistics, renormalised to sum 1."""
    w = np.array([STATISTIC_WEIGHTS[name] for name in names])
    return w / w.sum()


def _stopped_early(statistics: dict, found: dict, shares: dict, used: int, fields: dict) -> LogOddsPart | None:
    """When every statistic has STOP_EXCEEDANCES draws reaching it among the draws so far: the part with each
    statistic's sequential p-value and their weighted Bonferroni combination min(1, min_j p_j / share_j) (valid for
    any dependence between them; at least STOP_EXCEEDANCES / draws / the largest share, above every fixed-B value
    it replaces, 11 / 201); else None."""
    names = list(statistics)
    stops = [stopping_draw(statistics[name], np.concatenate(found[name])) for name in names]
    if any(stop is None for stop in stops):
        return None
    w = _shares_of_level(names)
    own = {f"p_value_{name}": STOP_EXCEEDANCES / stop for name, stop in zip(names, stops)}
    scaled = np.array([own[f"p_value_{name}"] for name in names]) / w
    share = shares[names[int(np.argmin(scaled))]]
    share = share / share.sum() if share.sum() > 0 else share
    return LogOddsPart(p_value=float(min(1.0, scaled.min())), class_share=share, draws_used=used, **fields, **own)


def _combined(laws: dict, shares: dict, draws: int, **fields) -> LogOddsPart:
    """The part's p-value from its statistics' laws ({name: (statistic, draws)}): the smallest of their p-values
    divided by their STATISTIC_WEIGHTS (renormalised over those present), calibrated by the same draws -- the share
    of draws whose own smallest weighted p-value (:func:`_ranks`) is as small. It is at least the smallest p-value
    and at most the smallest p / weight + 1/(B+1) (a weighted Bonferroni bound, one draw's step). Where a statistic
    lies beyond every draw, its matched chi^2 tail / weight caps it (weighted Bonferroni of the tails). The evidence
    is the shares of the statistic with the smallest weighted p-value (its tail included)."""
    names = list(laws)
    w = _shares_of_level(names)
    found = {name: _p_value(*laws[name]) for name in names}
    scaled = np.array([found[name][0] for name in names]) / w
    ranks = np.stack([_ranks(*laws[name]) for name in names]) / w[:, None]
    p_value = (1 + int(np.sum(ranks.min(axis=0) <= scaled.min() * (1 + 1e-12)))) / (draws + 1)
    tails = [found[name][1] / wj for name, wj in zip(names, w) if not np.isnan(found[name][1])]
    if tails:                  # a statistic beyond every draw: its tail, weighted as its share of the level
        p_value = min(p_value, min(tails))
    own = {f"p_value_{name}": _with_tail(*found[name]) for name in names}
    # the evidence follows the statistic that sets the p-value: its tail counts where it lies beyond every draw
    share = shares[names[int(np.argmin([own[f"p_value_{name}"] / wj for name, wj in zip(names, w)]))]]
    share = share / share.sum() if share.sum() > 0 else share
    return LogOddsPart(p_value=float(p_value), class_share=share, **fields, **own)
