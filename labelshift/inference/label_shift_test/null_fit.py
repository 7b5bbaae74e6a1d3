"""The regions part's null fit on the dense (classes, regions) table: the maximum likelihood under label shift of the
region counts by EM accelerated by SQUAREM, its batched form, and the parametric bootstrap of the likelihood ratio
from the fitted null (above DENSE_MAX_CLASSES classes, :mod:`.sparse_null` instead)."""
from __future__ import annotations

import numpy as np

from ... import rows as _rows
from .holdout_noise import drawn_rows
from .log_odds import BLOCK_MAX_CLASSES
from .squarem import squarem_batch
#: up to this many classes the regions' null fit and its bootstrap run on the dense (classes, regions) table (where
#: the measured size and power tables were made); above, on a support fixed by the holdout (sparse_null.py) -- the
#: same limit as the log-odds part's block statistic, so that one number says where the many-class forms begin
DENSE_MAX_CLASSES = BLOCK_MAX_CLASSES


def fit_under_null(N: np.ndarray, T: np.ndarray, q0: np.ndarray, tol: float = 1e-12, max_iter: int = 20_000):
    """Maximum likelihood under H0 of the region counts: holdout N[y, r] ~ Multinomial(n_y, pi_y), target
    T[r] ~ Multinomial(m, sum_y q_y pi_y), jointly over pi (k x J, rows in the simplex) and q (the simplex), by
    EM (the target rows' classes are the missing data). Returns (pi, q, 2 (l_1 - l_0), iterations), l_1 the
    unrestricted maximum (pi_y = N_y / n_y, target frequencies T / m)."""
    k, J = N.shape
    n_y = N.sum(axis=1)
    m = T.sum()
    pooled = (N.sum(axis=0) + T) / (n_y.sum() + m)
    pi = (N + pooled[None, :]) / (n_y[:, None] + 1.0)          # strictly positive start (EM keeps zeros at zero)
    q = np.maximum(np.asarray(q0, dtype=np.float64), 1e-3 / k)
    q /= q.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        l1 = float(np.sum(np.where(N > 0, N * np.log(N / n_y[:, None]), 0.0))
                   + np.sum(np.where(T > 0, T * np.log(T / m), 0.0)))

    def loglik(pi, q):
        mix = q @ pi
        with np.errstate(divide="ignore"):
            a = np.where(N > 0, N * np.log(np.where(N > 0, pi, 1.0)), 0.0).sum()
            b = np.where(T > 0, T * np.log(np.where(T > 0, mix, 1.0)), 0.0).sum()
        return float(a + b)

    def em(pi, q):
        joint = q[:, None] * pi                                 # (k, J)
        mix = joint.sum(axis=0)
        resp = joint * np.where(mix > 0, T / np.where(mix > 0, mix, 1.0), 0.0)[None, :]   # T_r * rho[y, r]
        tq = resp.sum(axis=1)
        return (N + resp) / (n_y + tq)[:, None], tq / m

    # EM accelerated by SQUAREM (Varadhan & Roland 2008, step S3), each extrapolation checked to increase the
    # likelihood (else the plain double EM step is kept)
    prev = loglik(pi, q)
    it = 0
    while it < max_iter:
        pi1, q1 = em(pi, q)
        pi2, q2 = em(pi1, q1)
        it += 2
        r = np.concatenate([(pi1 - pi).ravel(), q1 - q])
        v = np.concatenate([(pi2 - pi1).ravel(), q2 - q1]) - r
        nv = float(np.linalg.norm(v))
        best = (pi2, q2, loglik(pi2, q2))
        if nv > 0:
            alpha = -float(np.linalg.norm(r)) / nv
            if alpha < -1.0:
                th = np.concatenate([pi.ravel(), q]) - 2 * alpha * r + alpha ** 2 * v
                pi3 = np.maximum(th[:k * J].reshape(k, J), 1e-300)
                q3 = np.maximum(th[k * J:], 0.0)
                pi3 /= pi3.sum(axis=1, keepdims=True)
                q3 /= q3.sum()
                pi3, q3 = em(pi3, q3)
                it += 1
                l3 = loglik(pi3, q3)
                if l3 > best[2]:
                    best = (pi3, q3, l3)
        pi, q, cur = best
        if cur - prev <= tol * max(1.0, abs(cur)):
            break
        prev = cur
    stat = max(2.0 * (l1 - loglik(pi, q)), 0.0)
    return pi, q, stat, it


def _null_fit_batch(N: np.ndarray, T: np.ndarray, q0: np.ndarray, pi0: np.ndarray | None = None,
                    tol: float = 1e-9, max_iter: int = 500) -> np.ndarray:
    """:func:`fit_under_null` for B data sets at once (N: (B, k, J), T: (B, J), q0: (k,)): the same SQUAREM-accelerated
    EM (extrapolation kept only where it raises the likelihood), vectorised over the batch, each draw stopping on
    its own; started at (pi0, q0) when pi0 (k, J) is given (the bootstrap: the draws lie near the fit they come
    from), else as :func:`fit_under_null`. Returns the B statistics 2 (l_1 - l_0)."""
    B, k, J = N.shape
    n_y = N.sum(axis=2)                                          # (B, k)
    m = T.sum(axis=1)                                            # (B,)
    Npos, Tpos = N > 0, T > 0
    l1 = np.where(Npos, N * np.log(np.where(Npos, N, 1.0) / np.maximum(n_y, 1.0)[:, :, None]), 0.0).sum(axis=(1, 2)) \
        + np.where(Tpos, T * np.log(np.where(Tpos, T, 1.0) / m[:, None]), 0.0).sum(axis=1)
    if pi0 is None:
        pooled = (N.sum(axis=1) + T) / (n_y.sum(axis=1) + m)[:, None]
        pi = (N + pooled[:, None, :]) / (n_y[:, :, None] + 1.0)
    else:
        pi = np.maximum(np.asarray(pi0, dtype=np.float64), 1e-8)
        pi = np.broadcast_to(pi / pi.sum(axis=1, keepdims=True), (B, k, J)).copy()
    q = np.maximum(np.asarray(q0, dtype=np.float64), 1e-3 / k)
    q = np.broadcast_to(q / q.sum(), (B, k)).copy()

    def loglik(pi, q, a):
        mix = np.einsum("bk,bkj->bj", q, pi)
        Np, Tp = Npos[a], Tpos[a]
        x = np.where(Np, N[a] * np.log(np.where(Np, pi, 1.0)), 0.0).sum(axis=(1, 2))
        return x + np.where(Tp, T[a] * np.log(np.where(Tp, np.maximum(mix, 1e-300), 1.0)), 0.0).sum(axis=1)

    def em(pi, q, Na, Ta, nya, ma):
        joint = q[:, :, None] * pi
        mix = joint.sum(axis=1)
        resp = joint * np.where(mix > 0, Ta / np.where(mix > 0, mix, 1.0), 0.0)[:, None, :]
        tq = resp.sum(axis=2)
        return (Na + resp) / (nya + tq)[:, :, None], tq / ma[:, None]

    squarem_batch(pi, q, (N, T, n_y, m), em, loglik, lambda p3: p3 / p3.sum(axis=2, keepdims=True), tol,
                  max_iter)
    return np.maximum(2.0 * (l1 - loglik(pi, q, slice(None))), 0.0)


def bootstrap_null(pi: np.ndarray, q: np.ndarray, n_y: np.ndarray, m: int, draws: int, seed: int,
                    batch: int | None = None, inflation=1.0):
    """Parametric bootstrap of the likelihood ratio from the fitted null: holdout counts N*_y = (n_y / r_y)
    Multinomial(r_y, pi_y), r_y = :func:`drawn_rows` (n_y, inflation) -- the holdout's class sizes and, at
    inflation kappa_y > 1 (one number, or one per class), kappa_y times class y's sampling variance --, target counts T* ~ Multinomial(m, sum_y q_y pi_y),
    each refitted by the batched EM. Yields the statistics of ``batch`` draws at a time (all ``draws`` at once when
    None), in draw order: the draws are made up front, so that each draw's statistic does not depend on the
    batching and a consumer that stops early (:func:`sequential_p_value`) leaves the later draws unfitted."""
    rng = np.random.default_rng([seed, 0x15])
    k, J = pi.shape
    pi = np.maximum(pi, 0.0)
    pi = pi / pi.sum(axis=1, keepdims=True)
    mix = q @ pi
    mix = mix / mix.sum()
    rows = drawn_rows(n_y, inflation)
    Nb = rng.multinomial(rows, pi, size=(draws, k)).astype(np.float64)
    if np.any(rows != np.asarray(n_y)):
        Nb *= (np.asarray(n_y, dtype=np.float64) / rows)[None, :, None]
    Tb = rng.multinomial(int(m), mix, size=draws).astype(np.float64)
    for sl in _rows.blocks(draws, batch or draws):
        yield _null_fit_batch(Nb[sl], Tb[sl], q, pi)
