"""The regions part of the label-shift test on a restricted support, for many classes.

:func:`.null_fit.fit_under_null` maximises the null likelihood of the region counts over every
class histogram pi_y on all J regions, and its bootstrap refits B draws on the dense (B, k, J) table: with J about 4 k
regions that is k^2 numbers a pass per draw (8e6 a pass for B = 200 at k = 100, 8e8 at k = 1,000), and the EM crawls
where most entries head for 0 (measured: ``docs/label_shift_test.md``, "Many classes").

Above DENSE_MAX_CLASSES classes the null model is restricted instead: class y's histogram lives on the support

    S(N) = {(y, r): the holdout has a row of class y predicted as r's class}  u  {(y, r): r is a region of y's own
           predicted class (or of y's pooled group)},

every confidence bin of each predicted class the holdout saw class y predicted as (a bin where class y was not seen
by chance is not taken away from it: a target whose prior moves towards y fills such bins), and the bins of y's
own predictions (so that every region can take target mass). The data and every bootstrap draw are fitted by the same
rule -- a draw's support is S(N*) of its own holdout counts, inside the world's -- so the parametric bootstrap
calibrates the restricted statistic 2 (l_1 - l_0) as the dense one calibrates the full one. The EM (SQUAREM-accelerated,
extrapolations kept only where they raise the likelihood) runs on the s entries of the support, B s numbers a pass, with
s below n + J. Measured size and power at k = 100: ``docs/label_shift_test.md``.
"""
from __future__ import annotations

import numpy as np
from scipy import sparse

from ... import rows as _rows
from .holdout_noise import drawn_rows
from .squarem import squarem_batch


class _Support:
    """The entries (class, region) of a support and the sums over them by region and by class."""

    def __init__(self, mask: np.ndarray):
        self.y, self.r = np.nonzero(mask)                    # row-major (class, region) order
        self.k, self.J = mask.shape
        self.first = np.searchsorted(self.y, np.arange(self.k + 1))     # class c's entries: first[c]:first[c+1]
        self.by_r = np.argsort(self.r, kind="stable")                   # the entries in region order
        self.r_first = np.searchsorted(self.r[self.by_r], np.arange(self.J + 1))
        s = self.y.size
        self.by_class = sparse.csr_matrix((np.ones(s), (np.arange(s), self.y)), shape=(s, self.k))

    def region_sums(self, X: np.ndarray) -> np.ndarray:
        """(B, J): sums of X (B, s) over the entries of each region (0 for a region without entries)."""
        return _segment_sums(X[:, self.by_r], self.r_first)

    def class_sums(self, X: np.ndarray) -> np.ndarray:
        """(B, k): sums of X (B, s) over the entries of each class (0 for a class without entries)."""
        return _segment_sums(X, self.first)

    def normalised(self, X: np.ndarray) -> np.ndarray:
        return X / np.maximum(self.class_sums(X), 1e-300)[:, self.y]


def _segment_sums(X: np.ndarray, first: np.ndarray) -> np.ndarray:
    """(B, len(first) - 1): sums of X's columns first[j]:first[j+1] (empty segments 0)."""
    out = np.zeros((X.shape[0], first.size - 1))
    full = first[1:] > first[:-1]
    if X.shape[1]:
        out[:, full] = np.add.reduceat(X, first[:-1][full], axis=1)
    return out


def own_regions(group: np.ndarray, region_group: np.ndarray) -> np.ndarray:
    """(k, J): whether region r belongs to class y's predicted-class group (``group`` (k,): each class's group,
    ``region_group`` (J,): each region's)."""
    return group[:, None] == region_group[None, :]


def support(N: np.ndarray, own: np.ndarray, region_group: np.ndarray) -> np.ndarray:
    """(k, J): S(N) of the module docstring -- every region of a group in which the holdout counts N show class y,
    and y's own regions."""
    seen = np.zeros((N.shape[0], int(region_group.max()) + 1))
    np.add.at(seen, (slice(None), region_group), N)
    return (seen > 0)[:, region_group] | own


def sparse_null_fit(N: np.ndarray, T: np.ndarray, q0: np.ndarray, own: np.ndarray, region_group: np.ndarray,
                    tol: float = 1e-12, max_iter: int = 20_000):
    """The null fit of ``fit_under_null`` (holdout N[y, r] ~ Multinomial(n_y, pi_y), target T ~ Multinomial(m, sum_y
    q_y pi_y)) with pi_y restricted to the support S(N) (module docstring), started as ``fit_under_null`` (the pooled
    pseudo-count, on the support). Returns (pi (k, J), q, 2 (l_1 - l_0), iterations)."""
    k, J = N.shape
    sup = _Support(support(N, own, region_group))
    n_y = N.sum(axis=1)
    pooled = (N.sum(axis=0) + T) / (n_y.sum() + T.sum())
    start = sup.normalised(((N + pooled[None, :]) / (n_y[:, None] + 1.0))[sup.y, sup.r][None])
    q = np.maximum(np.asarray(q0, dtype=np.float64), 1e-3 / k)
    stat, pi_s, q, it = _fit(N[sup.y, sup.r][None], T[None], sup, start, (q / q.sum())[None], None, tol, max_iter)
    pi = np.zeros((k, J))
    pi[sup.y, sup.r] = pi_s[0]
    return pi, q[0], float(stat[0]), it


def sparse_bootstrap_null(pi: np.ndarray, q: np.ndarray, n_y: np.ndarray, m: int, draws: int, seed: int,
                          own: np.ndarray, region_group: np.ndarray, batch: int | None = None, tol: float = 1e-9,
                          max_iter: int = 500, inflation=1.0):
    """The parametric bootstrap of :func:`sparse_null_fit`'s statistic from its fit (pi, q): per class y,
    N*_y ~ (n_y / r_y) Multinomial(r_y, pi_y) (on pi's support; r_y = holdout_noise.drawn_rows(n_y, inflation), kappa_y one number or one per class), T* ~ Multinomial(m, sum_y q_y pi_y); each draw refitted on
    its own support S(N*) (started at the fit, masked to it) by the batched EM. Yields the statistics of ``batch``
    draws at a time (all at once when None), in draw order; the draws are made up front, so that a draw's
    statistic does not depend on the batching."""
    rng = np.random.default_rng([seed, 0x15, 0x5])
    k = pi.shape[0]
    sup = _Support(pi > 0)
    start = sup.normalised(pi[sup.y, sup.r][None])[0]
    N = np.zeros((draws, start.size))
    rows = drawn_rows(n_y, inflation)
    for c in range(k):
        sl = slice(sup.first[c], sup.first[c + 1])
        N[:, sl] = rng.multinomial(int(rows[c]), start[sl] / start[sl].sum(), size=draws) * (n_y[c] / rows[c])
    qs = np.maximum(np.asarray(q, dtype=np.float64), 1e-3 / k)
    qs = qs / qs.sum()
    mix = sup.region_sums((qs[sup.y] * start)[None])[0]
    T = rng.multinomial(int(m), mix / mix.sum(), size=draws).astype(np.float64)
    for sl in _rows.blocks(draws, batch or draws):
        mask = np.stack([support(_dense(sup, row), own, region_group)[sup.y, sup.r] for row in N[sl]])
        pi0 = sup.normalised(np.where(mask, np.maximum(start, 1e-8)[None, :], 0.0))
        yield _fit(N[sl], T[sl], sup, pi0, np.broadcast_to(qs, (mask.shape[0], k)).copy(), mask, tol, max_iter)[0]


#: classes above which the per-class z of the evidence sums the diagonal blocks of the regions' covariance
#: (:func:`class_block_z`) instead of one quadratic form a^T sigma a over all J regions per class
CLASS_Z_BLOCK_CLASSES = 100


def class_block_z(owner: np.ndarray, members, D: np.ndarray, sigma: np.ndarray, k: int) -> np.ndarray:
    """(k,) z of each predicted class's regions together: a^T D / sqrt(a^T sigma a), a the indicator of the regions
    whose predicted class (group) is g (nan for a class in a pooled group, or where a^T sigma a <= 0), from the
    (|R_g| x |R_g|) diagonal blocks of sigma -- sum_g |R_g|^2 work where the k quadratic forms over J x J cost
    k J^2 (8 s at k = 1,000, J about 4,000). ``owner``: (J,) each region's group; ``members``: each group's classes."""
    class_z = np.full(k, np.nan)
    order = np.argsort(owner, kind="stable")
    first = np.searchsorted(owner[order], np.arange(len(members) + 1))
    for g, mem in enumerate(members):
        if len(mem) != 1:
            continue
        idx = order[first[g]:first[g + 1]]
        v = float(sigma[np.ix_(idx, idx)].sum())
        class_z[mem[0]] = float(D[idx].sum()) / np.sqrt(v) if v > 0 else np.nan
    return class_z


def _dense(sup: _Support, values: np.ndarray) -> np.ndarray:
    """(k, J): values (s,) on the support, 0 elsewhere."""
    out = np.zeros((sup.k, sup.J))
    out[sup.y, sup.r] = values
    return out


def _fit(N, T, sup: _Support, pi, q, mask, tol: float, max_iter: int):
    """Maximise the null likelihood of B data sets (N (B, s) on the support, T (B, J)) from (pi (B, s), q (B, k)),
    entries outside ``mask`` (B, s; None: all in) held at 0: the SQUAREM-accelerated EM of ``_null_fit_batch``,
    each data set stopping on its own. Returns (2 (l_1 - l_0) (B,), pi, q, iterations)."""
    n_y = sup.class_sums(N)
    m = T.sum(axis=1)
    Npos, Tpos = N > 0, T > 0
    l1 = np.where(Npos, N * np.log(np.where(Npos, N, 1.0) / np.maximum(n_y, 1.0)[:, sup.y]), 0.0).sum(axis=1) \
        + np.where(Tpos, T * np.log(np.where(Tpos, T, 1.0) / m[:, None]), 0.0).sum(axis=1)
    pi, q = pi.copy(), q.copy()

    def loglik(pi, q, a):
        mix = sup.region_sums(q[:, sup.y] * pi)
        Np, Tp = Npos[a], Tpos[a]
        x = np.where(Np, N[a] * np.log(np.where(Np, pi, 1.0)), 0.0).sum(axis=1)
        return x + np.where(Tp, T[a] * np.log(np.where(Tp, np.maximum(mix, 1e-300), 1.0)), 0.0).sum(axis=1)

    def em(pi, q, Na, Ta, nya, ma):
        joint = q[:, sup.y] * pi
        mix = sup.region_sums(joint)
        resp = joint * np.where(mix > 0, Ta / np.where(mix > 0, mix, 1.0), 0.0)[:, sup.r]
        tq = sup.class_sums(resp)
        return (Na + resp) / np.maximum(nya + tq, 1e-300)[:, sup.y], tq / ma[:, None]

    it = squarem_batch(pi, q, (N, T, n_y, m), em, loglik, sup.normalised, tol, max_iter, mask)
    return np.maximum(2.0 * (l1 - loglik(pi, q, slice(None))), 0.0), pi, q, it
