"""The batch conventions of the solvers: one (m, k) set or a padded (S, M, k) batch with row weights, walked in
cache-sized chunks of problems, and the :class:`SolverResult` every iterative solver returns (conventions:
:mod:`labelshift.estimation.solvers`)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class SolverResult(NamedTuple):
    """What the iterative solvers return (leading axis S for a batch, none for a single set).

    weights: the solution w, (k,) or (S, k).
    converged: whether each problem met its tolerance within ``max_iter``.
    iterations: iterations used by each problem.
    optimality: the final value of the solver's optimality measure (see each solver; for MLLS the Frank-Wolfe
        duality gap, for RLLS the duality-gap bound).
    hessian: :func:`mlls_newton_rows` only (and :func:`mlls_newton` on such a set): :func:`mlls_hessian` at
        ``weights``, which its last pass computed there, when it converged by Newton steps; else None.
    """

    weights: np.ndarray
    converged: np.ndarray
    iterations: np.ndarray
    optimality: np.ndarray
    hessian: np.ndarray | None = None


def unbatch(res: SolverResult, single: bool) -> SolverResult:
    if not single:
        return res
    return SolverResult(res.weights[0], bool(res.converged[0]), int(res.iterations[0]), float(res.optimality[0]))


def as_batch(probs, mask=None):
    """(S, M, k) float array, (S, M) row weights, and whether the input was a single (m, k) set."""
    P = np.asarray(probs, dtype=np.float64)
    single = P.ndim == 2
    if single:
        P = P[None]
    if P.ndim != 3:
        raise ValueError(f"probs must be (m, k) or (S, M, k), got shape {np.shape(probs)}")
    S, M, _ = P.shape
    if mask is None:
        c = np.ones((S, M))
    else:
        c = np.asarray(mask, dtype=np.float64)
        c = np.broadcast_to(c[None] if c.ndim == 1 else c, (S, M))
    tot = c.sum(axis=1)
    if np.any(tot <= 0):
        raise ValueError("every set needs at least one row with positive weight")
    return P, c, single


def prior_batch(prior, S: int, k: int) -> np.ndarray:
    p = np.asarray(prior, dtype=np.float64)
    return np.broadcast_to(p, (S, k)).copy()


def weights_batch(weights, S: int, k: int) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    return np.broadcast_to(w if w.ndim == 2 else w[None], (S, k)).copy()


#: The iterative MLLS solvers walk a batch in chunks of problems and run each chunk to convergence before starting
#: the next, so that a chunk's data stays in the CPU caches for all its iterations instead of streaming the whole
#: (S, M, k) array from memory every iteration (S = 100 sets of 5000 x 10 float64 rows are 40 MB; one iteration
#: of the whole batch then costs about 3x more per set than one on cached data). This is the target size of a
#: chunk's float64 data, in bytes. Problems are independent, so chunking changes no result.
CHUNK_BYTES = 4 * 2**20


def chunk_slices(S: int, M: int, k: int, chunk_size) -> list[slice]:
    if chunk_size is None:
        size = max(1, CHUNK_BYTES // (8 * M * k))
    else:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
        size = int(chunk_size)
    return [slice(a, min(a + size, S)) for a in range(0, S, size)]
