"""The batched SQUAREM-accelerated EM of the label-shift test's null fits (dense and restricted-support)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np


def squarem_batch(pi: np.ndarray, q: np.ndarray, data: tuple, em: Callable, loglik: Callable,
                  normalise: Callable, tol: float, max_iter: int, mask: np.ndarray | None = None) -> int:
    """Maximise B likelihoods in place from (pi (B, ...), q (B, k)) by EM accelerated by SQUAREM (Varadhan & Roland
    2008, step S3), the extrapolation kept only where it raises ``loglik(pi, q, rows)``, each data set stopping on
    its own; ``em(pi, q, *rows_of_data)`` is one EM step, ``normalise`` puts pi's histograms back on the simplex,
    ``mask`` (B, ...) holds entries of pi at 0. Returns the iterations run."""
    axes = tuple(range(1, pi.ndim))
    col = (slice(None),) + (None,) * (pi.ndim - 1)
    prev = loglik(pi, q, slice(None))
    active = np.ones(pi.shape[0], dtype=bool)
    it = 0
    while it < max_iter and active.any():
        a = np.flatnonzero(active)
        sub = tuple(x[a] for x in data)
        p0, q0 = pi[a], q[a]
        p1, q1 = em(p0, q0, *sub)
        p2, q2 = em(p1, q1, *sub)
        r_pi, r_q = p1 - p0, q1 - q0
        v_pi, v_q = p2 - p1 - r_pi, q2 - q1 - r_q
        nr = np.sqrt((r_pi ** 2).sum(axis=axes) + (r_q ** 2).sum(axis=1))
        nv = np.sqrt((v_pi ** 2).sum(axis=axes) + (v_q ** 2).sum(axis=1))
        alpha = -nr / np.where(nv > 0, nv, 1.0)
        alpha = np.where((nv > 0) & (alpha < -1.0), alpha, -1.0)
        p3 = np.maximum(p0 - 2 * alpha[col] * r_pi + alpha[col] ** 2 * v_pi, 1e-300)
        if mask is not None:
            p3 = np.where(mask[a], p3, 0.0)                       # the extrapolation keeps the support
        q3 = np.maximum(q0 - 2 * alpha[:, None] * r_q + alpha[:, None] ** 2 * v_q, 0.0)
        p3, q3 = em(normalise(p3), q3 / q3.sum(axis=1, keepdims=True), *sub)
        it += 3
        l2, l3 = loglik(p2, q2, a), loglik(p3, q3, a)
        better = l3 > l2
        pi[a] = np.where(better[col], p3, p2)
        q[a] = np.where(better[:, None], q3, q2)
        cur = np.where(better, l3, l2)
        active[a[cur - prev[a] <= tol * np.maximum(1.0, np.abs(cur))]] = False
        prev[a] = cur
    return it
