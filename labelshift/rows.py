"""Passes over the rows of one large (m, k) array of probabilities in blocks, accumulating in float64.

A target of 10 million rows and 10 classes is 400 MB as float32 and 800 MB as float64; a whole-array float64
temporary (``P.astype(float64)``, ``P * v[:, None]``, ``np.cov(P)``) doubles or triples that. The functions here
read ``P`` in blocks of :data:`ROW_BLOCK` rows, convert each block to float64 and add its contribution to float64
sums, so that their memory is one block whatever m is, and ``P`` may stay float32. Their results equal the
whole-array formulas up to the rounding of the summation order (relative 1e-12 or better at m = 10^7).

:func:`is_large` decides where the library switches to them: a single (m, k) set (or a batch of one set with
uniform row weights) of more than :data:`LARGE_ROWS` rows; such a set is also kept in float32 when given so
(:func:`labelshift._validation.check_probabilities`). Below that the whole-array formulas run as before, so results
on smaller inputs are unchanged to the bit. Many classes make a set large at fewer rows: more than
:data:`LARGE_ENTRIES` entries (k = 1,000 classes: from 33,555 rows), and a block then holds at most
:data:`BLOCK_ENTRIES` entries (rows of more than 64 classes: fewer than ROW_BLOCK rows a block; ``blocks(m, width=k)``).
Up to 32 classes LARGE_ROWS decides first and blocks are ROW_BLOCK rows, as before.

Rows held in partitions elsewhere (:class:`labelshift.partitions.PartitionedRows`) always count as large: the passes
marked so below take them in place of an array, run their per-partition sums where the partitions live (the same
blocked functions, on each partition) and add the results here in partition order.
"""
from __future__ import annotations

import contextlib
import functools

import numpy as np

from .partitions import MllsSums, Moments, add_mlls_sums, combine_moments, is_partitioned

__all__ = ["ROW_BLOCK", "LARGE_ROWS", "is_large", "single_set", "blocks", "row_dot", "column_sums", "mean_cov",
           "moments", "argmax_counts", "mlls_pass", "mlls_sums", "mlls_total", "log_ratio_sum", "one_blas_thread",
           "one_blas_thread_for_life", "pass_threads", "decomposition_threads", "joined"]

#: rows per block (2.5 MB of float32, 5 MB of float64 at k = 10: the float64 temporaries of a block stay in cache)
ROW_BLOCK = 65536
#: single sets with more rows than this use the blocked passes
LARGE_ROWS = 1 << 20
#: ... and so do single sets with more entries (rows x classes) than this: 268 MB as float64 (issue 20: at k = 1,000
#: a target of 100,000 rows is 800 MB as float64, and each whole-array temporary of it as much again)
LARGE_ENTRIES = 1 << 25
#: entries of a block at most, when the callers say how wide the rows are (``blocks(m, width=k)``): 34 MB as float64
BLOCK_ENTRIES = ROW_BLOCK * 64
#: classes above which :func:`mlls_pass` forms its (k, k) Hessian from float32 blocks (the k^2 m product is most of a
#: pass there; the gradient, which fixes the solution, stays float64; as the in-memory solver does at every k)
WIDE_HESSIAN_CLASSES = 64


#: classes above which the k x k decompositions of the default path (eigh, pinv, svd: O(k^3) LAPACK calls) run on one
#: BLAS thread (:func:`decomposition_threads`): at k = 1,000 on the shared 2-core machine (load about 12) one eigh
#: took 17.6 s on OpenBLAS's two threads and 1.1 s on one, while a (20,000 x 1,000) product took 2.2 s and 3.8 s
#: (benchmarks/HISTORY.md, "k = 1,000: session 11"); at k <= 100 nothing changes
DECOMPOSITION_ONE_THREAD_CLASSES = 100
#: classes above which the row-block passes below (:func:`mlls_pass`, :func:`mean_cov`, ...) keep BLAS's threads
THREADED_PASS_CLASSES = 100


@functools.lru_cache(maxsize=1)
def _controller():
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:        # pragma: no cover - threadpoolctl comes with scikit-learn
        return None
    return ThreadpoolController()


def one_blas_thread():
    """A context in which BLAS runs on one thread. The products of a block are small (65536 x k): threads gain
    little on them, and on a busy machine OpenBLAS threads waiting for each other slow a pass down many times
    (measured: ``docs/solvers.md``)."""
    ctl = _controller()
    _ambient_threads()
    return ctl.limit(limits=1, user_api="blas") if ctl is not None else contextlib.nullcontext()


def one_blas_thread_for_life() -> None:
    """BLAS on one thread in this process from now on, :func:`pass_threads` included (its "process's own number"
    becomes 1): for worker processes whose parallelism is the processes themselves."""
    ctl = _controller()
    if ctl is None:           # pragma: no cover - threadpoolctl comes with scikit-learn
        return
    ctl.limit(limits=1, user_api="blas")     # stays: threadpoolctl restores only on leaving a ``with``
    _ambient_threads.cache_clear()
    _ambient_threads()


@functools.lru_cache(maxsize=1)
def _ambient_threads() -> int:
    """BLAS threads of this process as first seen (before any limit of this module: :func:`one_blas_thread` and
    :func:`pass_threads` ask for the controller first)."""
    ctl = _controller()
    counts = [d.get("num_threads", 1) for d in ctl.select(user_api="blas").info()] if ctl is not None else []
    return max(counts, default=1)


def pass_threads(k: int):
    """BLAS threads for a pass over row blocks k wide: one up to :data:`THREADED_PASS_CLASSES` classes (the block
    products are small; see :func:`one_blas_thread`), the process's own number above -- also inside a
    :func:`decomposition_threads` or :func:`one_blas_thread` context -- because wide blocks' products are large: at
    k = 1,000 two threads made a pass 1.3-1.6x faster on the idle 2-core machine, with the same numbers
    (benchmarks/HISTORY.md, "k = 1,000: session 11")."""
    ctl = _controller()
    if ctl is None:           # pragma: no cover - threadpoolctl comes with scikit-learn
        return contextlib.nullcontext()
    threads = _ambient_threads() if k > THREADED_PASS_CLASSES else 1
    return ctl.limit(limits=threads, user_api="blas")


def decomposition_threads(k: int):
    """:func:`one_blas_thread` above :data:`DECOMPOSITION_ONE_THREAD_CLASSES` classes, else a context that changes
    nothing: for the parts of the default path whose cost is k x k decompositions."""
    return one_blas_thread() if k > DECOMPOSITION_ONE_THREAD_CLASSES else contextlib.nullcontext()


def _pass_threaded(fn):
    """``fn(P, ...)`` with :func:`pass_threads` of P's width: one BLAS thread up to :data:`THREADED_PASS_CLASSES`
    classes, the process's own number above."""
    @functools.wraps(fn)
    def wrapper(P, *args, **kwargs):
        with pass_threads(np.shape(P)[-1] if np.ndim(P) == 2 else 0):
            return fn(P, *args, **kwargs)
    return wrapper


def single_set(probs, mask=None) -> np.ndarray | None:
    """The (m, k) rows of ``probs`` when it is one set with uniform row weights -- an (m, k) array, or a (1, M, k)
    batch whose mask is None or all equal -- else None. No copy. Rows in partitions give their (m, k) set."""
    if is_partitioned(probs):
        P = probs.single()
    elif not isinstance(probs, np.ndarray) or probs.dtype not in (np.float32, np.float64):
        return None
    elif probs.ndim == 3 and probs.shape[0] == 1:
        P = probs[0]
    elif probs.ndim == 2:
        P = probs
    else:
        return None
    if mask is not None:
        c = np.asarray(mask)
        if c.size != P.shape[0] or not np.all(c.ravel() == c.ravel()[0]) or not c.ravel()[0] > 0:
            return None
    return P


def is_large(probs, mask=None) -> bool:
    """Whether the blocked passes apply: one set (:func:`single_set`) of more than :data:`LARGE_ROWS` rows or more
    than :data:`LARGE_ENTRIES` entries, or rows held in partitions (whatever their number)."""
    P = single_set(probs, mask)
    return P is not None and (is_partitioned(P) or P.shape[0] > LARGE_ROWS or P.size > LARGE_ENTRIES)


def blocks(m: int, size: int | None = None, width: int | None = None):
    """Slices of ``size`` consecutive rows covering 0..m-1; by default ROW_BLOCK rows, fewer for rows ``width``
    entries wide when ROW_BLOCK of them would hold more than BLOCK_ENTRIES."""
    if size is None:
        size = ROW_BLOCK if width is None else max(1, min(ROW_BLOCK, BLOCK_ENTRIES // max(int(width), 1)))
    size = int(size)
    for a in range(0, m, size):
        yield slice(a, min(a + size, m))


@_pass_threaded
def row_dot(P: np.ndarray, w) -> np.ndarray:
    """f_i^T w for every row, float64 (m,); a (k, c) matrix w gives (m, c)."""
    w = np.asarray(w, dtype=np.float64)
    out = np.empty(P.shape[:1] + w.shape[1:])
    for sl in blocks(P.shape[0], width=P.shape[1]):
        np.matmul(P[sl].astype(np.float64, copy=False), w, out=out[sl])
    return out


@_pass_threaded
def column_sums(P: np.ndarray) -> np.ndarray:
    """sum_i f_i, float64 (k,); rows in partitions: the partitions' sums added in order."""
    total = np.zeros(P.shape[1])
    if is_partitioned(P):
        for part in P.run(column_sums):
            total += part
        return total
    for sl in blocks(P.shape[0], width=P.shape[1]):
        total += P[sl].sum(axis=0, dtype=np.float64)
    return total


@_pass_threaded
def mean_cov(P: np.ndarray, ddof: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Column means and covariance (as ``np.cov(P, rowvar=False, ddof=ddof)``) in one pass (:func:`moments`); rows
    in partitions: the partitions' moments combined by :func:`labelshift.partitions.combine_moments`."""
    mom = combine_moments(P.run(moments)) if is_partitioned(P) else _moments(P)
    cov = mom.cross / (mom.rows - ddof)
    return mom.mean, 0.5 * (cov + cov.T)


@_pass_threaded
def moments(P: np.ndarray) -> Moments:
    """Row count, column means and centred cross-products of (m, k) rows in one pass: each block is centred on the
    first block's mean before its cross-products are added (shifted data, so no cancellation). The per-partition
    function of :func:`mean_cov`."""
    return _moments(P)


def _moments(P: np.ndarray) -> Moments:
    m, k = P.shape
    if m == 0:
        return Moments(0, np.zeros(k), np.zeros((k, k)))
    shift = P[:min(m, ROW_BLOCK)].mean(axis=0, dtype=np.float64)
    s = np.zeros(k)
    ss = np.zeros((k, k))
    for sl in blocks(m, width=k):
        B = P[sl].astype(np.float64) - shift
        s += B.sum(axis=0)
        ss += B.T @ B
    d = s / m
    return Moments(m, shift + d, ss - m * np.outer(d, d))


@_pass_threaded
def argmax_counts(P: np.ndarray) -> np.ndarray:
    """Counts of the argmax prediction per class, float64 (k,); rows in partitions: their counts added."""
    k = P.shape[1]
    counts = np.zeros(k)
    if is_partitioned(P):
        for part in P.run(argmax_counts):
            counts += part
        return counts
    for sl in blocks(P.shape[0], width=P.shape[1]):
        counts += np.bincount(np.argmax(P[sl], axis=1), minlength=k)
    return counts


def mlls_pass(P: np.ndarray, w, *, hessian: bool = False, precision=np.float64):
    """One pass of the MLLS quantities at w: (objective, gradient, Hessian or None, whether some row has
    f_i^T w <= 0), all (1/m)-normalised as :func:`labelshift.estimation.solvers.mlls_objective`, ``mlls_gradient`` and
    ``mlls_hessian``. Rows with f_i^T w <= 0 contribute nothing to the gradient and Hessian and make the
    objective -inf. ``precision=np.float32`` computes the blocks in single precision (the sums stay float64):
    the EM warm start of the row solver, which only needs to locate the optimum. ``P`` may be rows in partitions
    (:func:`mlls_total`)."""
    s = mlls_total(P, w, hessian=hessian, precision=precision)
    m = s.rows
    obj = -np.inf if s.dead else s.objective / m
    return obj, s.gradient / m, (s.hessian / m if hessian else None), bool(s.dead)


def mlls_total(P, w, *, hessian: bool = False, precision=np.float64) -> MllsSums:
    """:func:`mlls_sums` of all rows of ``P``: an array, or rows in partitions (each partition's sums where it lives,
    added here in partition order by :func:`labelshift.partitions.add_mlls_sums`)."""
    w = np.asarray(w, dtype=np.float64)
    if is_partitioned(P):
        return add_mlls_sums(P.run(mlls_sums, w, hessian, precision))
    return mlls_sums(P, w, hessian, precision)


@_pass_threaded
def mlls_sums(P: np.ndarray, w, hessian: bool = False, precision=np.float64) -> MllsSums:
    """The unnormalised sums of eq. (mlls-sample) over the (m, k) rows P at w, in row blocks: sum_i log f_i^T w,
    sum_i f_i / f_i^T w and (``hessian``) sum_i f_i f_i^T / (f_i^T w)^2 over the rows with f_i^T w > 0, in
    float64, with the count of the others (``dead``) and m. The per-partition function of :func:`mlls_pass`."""
    m, k = P.shape
    w = np.asarray(w, dtype=np.float64)
    wp = w.astype(precision)
    obj, grad = 0.0, np.zeros(k)
    H = np.zeros((k, k)) if hessian else None
    dead = 0
    for sl in blocks(P.shape[0], width=P.shape[1]):
        B = P[sl].astype(precision, copy=False)
        fw = B @ wp
        bad = fw <= 0
        if bad.any():
            dead += int(np.count_nonzero(bad))
            fw = np.where(bad, 1.0, fw).astype(precision)
            inv = np.where(bad, 0.0, 1.0 / fw).astype(precision)
        else:
            inv = 1.0 / fw
        obj += float(np.log(fw).sum(dtype=np.float64))
        grad += (inv @ B).astype(np.float64)
        if hessian:
            Bv = B * inv[:, None]
            if k > WIDE_HESSIAN_CLASSES:     # the Hessian only steers Newton's step: a float32 product (half the time)
                Bv = Bv.astype(np.float32)
            H += (Bv.T @ Bv).astype(np.float64)
    return MllsSums(obj, grad, H, dead, m)


@_pass_threaded
def log_ratio_sum(P, w, v) -> float:
    """sum_i log(f_i^T w / f_i^T v) over the rows of P in float64 (rows in partitions: their sums added in order);
    the likelihood ratio of two weight vectors, each row's ratio taken before the sum so that nothing cancels."""
    if is_partitioned(P):
        return float(sum(P.run(log_ratio_sum, w, v)))
    w = np.asarray(w, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    total = 0.0
    for sl in blocks(P.shape[0], width=P.shape[1]):
        B = P[sl].astype(np.float64, copy=False)
        total += float(np.sum(np.log((B @ w) / (B @ v))))
    return total


def _owner(a: np.ndarray):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a.base if a.base is not None else a


def joined(parts) -> np.ndarray:
    """The rows of ``parts`` (a list of (m_b, k) arrays) as one array: a read-only view without a copy when they
    are consecutive C-contiguous pieces of one buffer (as a streamed reader fills them), else concatenated."""
    parts = list(parts)
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if all(isinstance(p, np.ndarray) and p.ndim == 2 and p.flags.c_contiguous and p.dtype == first.dtype
           and p.shape[1] == first.shape[1] for p in parts) and len({id(_owner(p)) for p in parts}) == 1:
        at = first.__array_interface__["data"][0]
        for p in parts:
            if p.__array_interface__["data"][0] != at:
                break
            at += p.nbytes
        else:
            total = sum(p.shape[0] for p in parts)
            return np.lib.stride_tricks.as_strided(first, shape=(total, first.shape[1]), strides=first.strides,
                                                   writeable=False)
    return np.concatenate(parts)
