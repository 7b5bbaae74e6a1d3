"""The data layout of the iterative MLLS solvers: the batch arrays they start from, each chunk of problems
(:data:`~labelshift.estimation.solvers.CHUNK_BYTES`) transposed to (k, M) per set, the per-problem working arrays
compacted as problems finish, and the outcomes recorded."""
from __future__ import annotations

import numpy as np

from .batch import as_batch, prior_batch, weights_batch
from .mlls_objective import normalised_mask, weighted_inverse


def transposed_rows(P, dtype):
    """A contiguous (C, k, M) copy of (C, M, k) rows. The two EM passes, f_i^T w for all i and sum_i r_i f_i, are
    then a length-M axpy per class and k dot products of length M (BLAS-friendly, ~2x faster than M dot products
    of length k on the row layout); in float32 they move half the bytes again."""
    return P.transpose(0, 2, 1).astype(dtype, order="C")


def hessianT(PT, cn, fw):
    """(1/m) sum_i f_i f_i^T / (f_i^T w)^2 from the transposed layout, formed in PT's precision (float32 for the
    Newton solvers: the Hessian only steers their steps, the solution is fixed by the float64 gradient)."""
    v2 = weighted_inverse(cn, fw, 2).astype(PT.dtype)
    return np.matmul(PT * v2[:, None, :], PT.transpose(0, 2, 1)).astype(np.float64)


class Work:
    """Working copies of the per-problem arrays of a batched iterative solver, compacted as problems finish.

    Computing on finished problems wastes work but copying the arrays every time one finishes costs more;
    the arrays are compacted when fewer than ``fraction`` (default 3/4) of their rows are still live.
    """

    def __init__(self, ids, **arrays):
        self.ids = ids
        self.live = np.ones(ids.shape[0], dtype=bool)
        self.arrays = arrays

    def __getattr__(self, name):
        try:
            return self.__dict__["arrays"][name]
        except KeyError:
            raise AttributeError(name) from None

    def set(self, name, value):
        self.arrays[name] = value

    def maybe_compact(self, fraction: float = 0.75):
        n_live = int(self.live.sum())
        if n_live == 0 or n_live >= fraction * self.live.shape[0]:
            return
        keep = self.live
        self.ids = self.ids[keep]
        self.arrays = {k: v[keep] for k, v in self.arrays.items()}
        self.live = np.ones(self.ids.shape[0], dtype=bool)


class Outcome:
    """The per-problem results of a chunk solver -- w, converged, iterations, gap -- filled in as its problems run."""

    def __init__(self, w: np.ndarray):
        A = w.shape[0]
        self.w = w
        self.conv = np.zeros(A, dtype=bool)
        self.iters = np.zeros(A, dtype=np.int64)
        self.gap = np.full(A, np.inf)

    def record(self, work: Work, it: int, w_new, gap, finished, converged=None) -> bool:
        """Store the live problems' iterate ``w_new``, iteration ``it`` and ``gap``; mark ``converged`` (default:
        ``finished``) as converged and retire ``finished``. Returns whether no problem is left live."""
        live = work.live
        ids = work.ids[live]
        self.w[ids] = w_new[live]
        self.iters[ids] = it
        self.gap[ids] = gap[live]
        self.conv[work.ids[finished if converged is None else converged]] = True
        work.live = live & ~finished
        return not work.live.any()

    def result(self):
        return self.w, self.conv, self.iters, self.gap


def prepare(probs, source_prior, mask, init):
    """Batch arrays of the MLLS solvers: P (S, M, k), normalised row weights (S, M), p_s (S, k), the starting
    point in W (S, k) and whether the input was a single set."""
    P, c, single = as_batch(probs, mask)
    S, M, k = P.shape
    ps = prior_batch(source_prior, S, k)
    w = np.ones((S, k)) if init is None else weights_batch(init, S, k)
    w = w / np.einsum("sk,sk->s", w, ps)[:, None]
    return P, normalised_mask(P, c), ps, w, single
