"""Rows of one target set held in partitions elsewhere (on the workers of a cluster), and the reduce side of the
row passes of :mod:`labelshift.rows` over them.

A :class:`PartitionedRows` stands for an (m, k) array of calibrated probabilities cut into partitions that this
process never holds. What it knows is the shape, the dtype, the rows of each partition and a ``run`` callable:
``run(fn, *args)`` applies the pure function ``fn(B, *args)`` to every partition B (a numpy (m_p, k) array, float32
or float64) wherever the partition lives, and returns the list of results in partition order. The engine that
provides ``run`` (a Dask cluster: ``tasks/reestimation/cluster.py``; a list of local arrays: :func:`local_rows`) is
not the domain's business; the domain only asks for small per-partition results (sums of k or k x k numbers) and
combines them here.

The per-partition functions are those of :mod:`labelshift.rows` that return unnormalised sums
(:func:`labelshift.rows.mlls_sums`, :func:`labelshift.rows.moments`, ...); :func:`labelshift.rows.mlls_pass`,
``mean_cov``, ``column_sums`` and ``argmax_counts`` take a :class:`PartitionedRows` in place of an array and give
the numbers of the concatenated array up to the rounding of the summation order. Combining partitions in their
fixed order makes a result the same from one run to the next, whichever worker answers first.

This module imports nothing of the rest of the package, so that :mod:`labelshift.rows` can import it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

__all__ = ["PartitionedRows", "is_partitioned", "local_rows", "MllsSums", "Moments", "add_mlls_sums",
           "combine_moments", "NOT_PARTITIONED", "PerPartition", "arguments_of", "take_rows", "rows_at",
           "apply_derived", "add_in_order"]

#: the end of the message of a pass that does not run over partitions yet (issue 41)
NOT_PARTITIONED = ("this pass over the target's rows does not run over partitions yet (issue 41: MLLS, BBSE, the "
                   "no-shift and the label-shift tests, the source-aware interval and the accuracy estimate do); "
                   "pass the rows as one numpy array instead.")


@dataclass(frozen=True, eq=False)
class PartitionedRows:
    """An (m, k) set of probability rows in partitions held elsewhere (or a batch of one such set, ``batch()``).

    Attributes:
        shape: (m, k), or (1, m, k) for the batch of one set the estimators pass around.
        dtype: the partitions' dtype, float32 or float64 (every partition has it).
        run: ``run(fn, *args) -> list``: ``fn(B, *args)`` for every partition B in order, B an (m_p, k) array.
            ``fn`` must be a pure function importable by name (it may run in another process). An argument that is
            a :class:`PerPartition` gives partition i its i-th value (:func:`arguments_of`).
        partition_rows: m_p of each partition (their sum is m; a partition may have 0 rows).
        names: a name for each partition (a path, a batch id) for messages; default ``partition 0``, ...

    Indexing it, or turning it into an array, raises a TypeError: passes that need the rows themselves do not run
    over partitions (yet) and must say so rather than gather m rows into this process.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    run: Callable[..., list]
    partition_rows: tuple[int, ...]
    names: tuple[str, ...] = ()

    def __post_init__(self):
        shape = tuple(int(s) for s in self.shape)
        if len(shape) not in (2, 3) or (len(shape) == 3 and shape[0] != 1):
            raise ValueError(f"shape must be (m, k) or (1, m, k), got {shape}")
        if sum(self.partition_rows) != shape[-2]:
            raise ValueError(f"the partitions hold {sum(self.partition_rows)} rows, not m = {shape[-2]}")
        names = tuple(self.names) or tuple(f"partition {i}" for i in range(len(self.partition_rows)))
        if len(names) != len(self.partition_rows):
            raise ValueError(f"{len(names)} names for {len(self.partition_rows)} partitions")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "partition_rows", tuple(int(r) for r in self.partition_rows))
        object.__setattr__(self, "names", names)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def batch(self) -> "PartitionedRows":
        """The batch of this one set, shape (1, m, k) (as ``P[None]`` of an array)."""
        return self if self.ndim == 3 else replace(self, shape=(1,) + self.shape)

    def single(self) -> "PartitionedRows":
        """The one (m, k) set (as ``P[0]`` of a batch of one)."""
        return self if self.ndim == 2 else replace(self, shape=self.shape[1:])

    def derived(self, transform: Callable, *args, dtype=None) -> "PartitionedRows":
        """The rows ``transform(B, *args)`` of every partition B, kept where B lives: a PartitionedRows of the same
        shape whose ``run(fn, *more)`` applies ``fn(transform(B, *args), *more)`` on the partition's worker, so the
        transformed rows never travel (e.g. raw outputs -> calibrated probabilities, the calibrator sent as an
        argument). ``transform`` must be a pure function importable by name that maps an (m_p, k) array to an
        (m_p, k) array of ``dtype`` (default: this one's); :class:`PerPartition` arguments are allowed. Nothing is
        stored: each pass transforms its partition again (a BCTS calibration costs about 11 times a pass's reading
        of a row; an engine that can keep the transformed rows where they live does so once:
        ``tasks.reestimation.cluster.kept_rows``)."""
        base_run, count = self.run, len(args)

        def run(fn, *more):
            return base_run(apply_derived, transform, count, *args, fn, *more)

        return replace(self, run=run, dtype=np.dtype(self.dtype if dtype is None else dtype))

    def __getitem__(self, item):
        raise TypeError(f"rows held in {len(self.partition_rows)} partitions cannot be indexed here: "
                        + NOT_PARTITIONED)

    def __array__(self, dtype=None, copy=None):
        raise TypeError(f"rows held in {len(self.partition_rows)} partitions are not gathered into one array: "
                        + NOT_PARTITIONED)


def is_partitioned(probs) -> bool:
    """Whether ``probs`` is a :class:`PartitionedRows` (a set or a batch of one)."""
    return isinstance(probs, PartitionedRows)


def local_rows(parts: Sequence[np.ndarray], names: Sequence[str] = ()) -> PartitionedRows:
    """A :class:`PartitionedRows` over arrays of this process, ``fn`` applied in a loop: the reference engine, for
    tests and for a process that reads its partitions one at a time."""
    parts = [np.asarray(p) for p in parts]
    if not parts or any(p.ndim != 2 or p.shape[1] != parts[0].shape[1] or p.dtype != parts[0].dtype for p in parts):
        raise ValueError("local_rows needs (m_p, k) arrays of one k and one dtype")
    return PartitionedRows(shape=(sum(p.shape[0] for p in parts), parts[0].shape[1]), dtype=parts[0].dtype,
                           run=lambda fn, *args: [fn(p, *arguments_of(args, i)) for i, p in enumerate(parts)],
                           partition_rows=tuple(p.shape[0] for p in parts), names=tuple(names))


class PerPartition(NamedTuple):
    """An argument of ``PartitionedRows.run`` with one value per partition, in partition order: the engine passes
    partition i its ``values[i]`` (e.g. the rows wanted from each partition) in place of the whole."""

    values: tuple


def arguments_of(args: tuple, i: int) -> tuple:
    """The arguments of partition i: each :class:`PerPartition` among ``args`` replaced by its i-th value, the
    others as they are. What every engine of ``run`` applies before calling ``fn`` on partition i."""
    return tuple(a.values[i] if isinstance(a, PerPartition) else a for a in args)


def apply_derived(B: np.ndarray, transform: Callable, count: int, *rest):
    """``fn(transform(B, *rest[:count]), *rest[count + 1:])`` with ``fn = rest[count]``: the per-partition function
    that :meth:`PartitionedRows.derived` hands the engine (its arguments flat, so that the engine resolves every
    :class:`PerPartition` among them)."""
    return rest[count](transform(B, *rest[:count]), *rest[count + 1:])


def add_in_order(parts: Sequence):
    """The sum of the partitions' results (numbers, arrays or tuples of them, all alike) added in partition order,
    element by element for tuples: the reduce of a pass whose per-partition sums are plain sums."""
    parts = list(parts)
    if isinstance(parts[0], tuple):
        return tuple(add_in_order([p[j] for p in parts]) for j in range(len(parts[0])))
    total = np.zeros(np.shape(parts[0])) if isinstance(parts[0], np.ndarray) else 0.0
    for p in parts:
        total = total + p
    return total


def rows_at(B: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The rows ``index`` (local, sorted) of one partition, copied: the per-partition function of
    :func:`take_rows`."""
    return np.array(B[index])


def take_rows(R: PartitionedRows, index) -> np.ndarray:
    """The rows of ``R`` at the sorted global row numbers ``index`` (0 <= index < m), gathered into one array in
    that order, with their values and dtype unchanged: for a small subsample (a few thousand rows) of a target
    whose other rows stay where they are. Each partition sends only its wanted rows."""
    R = R.single()
    index = np.asarray(index, dtype=np.int64)
    if index.ndim != 1 or (index.size and (index[0] < 0 or index[-1] >= R.shape[0] or np.any(np.diff(index) < 0))):
        raise ValueError(f"take_rows needs sorted row numbers in 0..{R.shape[0] - 1}")
    ends = np.cumsum((0,) + R.partition_rows)
    cut = np.searchsorted(index, ends)
    local = PerPartition(tuple(index[cut[i]:cut[i + 1]] - ends[i] for i in range(len(R.partition_rows))))
    parts = R.run(rows_at, local)
    return np.concatenate(parts, axis=0) if parts else np.empty((0, R.shape[1]), R.dtype)


class MllsSums(NamedTuple):
    """The unnormalised MLLS sums of some rows at w, eq. (mlls-sample): sum_i log f_i^T w, sum_i f_i / f_i^T w,
    sum_i f_i f_i^T / (f_i^T w)^2 (None when not asked for), over the rows with f_i^T w > 0; the number of rows with
    f_i^T w <= 0 (``dead``) and of all rows."""

    objective: float
    gradient: np.ndarray
    hessian: np.ndarray | None
    dead: int
    rows: int


def add_mlls_sums(parts: Sequence[MllsSums]) -> MllsSums:
    """The sums of the union of the partitions' rows, added in partition order (:func:`add_in_order`)."""
    obj, grad, dead, rows = add_in_order([(s.objective, s.gradient, s.dead, s.rows) for s in parts])
    H = None if parts[0].hessian is None else add_in_order([s.hessian for s in parts])
    return MllsSums(obj, grad, H, int(dead), int(rows))


class Moments(NamedTuple):
    """Row count, column means and centred cross-products sum_i (f_i - mean)(f_i - mean)^T of some rows (k x k)."""

    rows: int
    mean: np.ndarray
    cross: np.ndarray


def combine_moments(parts: Sequence[Moments]) -> Moments:
    """The moments of the union of the partitions' rows by the pairwise update of Chan, Golub and LeVeque (1979):
    with delta = mean_b - mean_a, mean = mean_a + delta n_b / n and cross = cross_a + cross_b + delta delta^T
    n_a n_b / n. Only centred quantities are added, so nothing cancels the way raw sums of squares would."""
    total = None
    for part in parts:
        if part.rows == 0:
            continue
        if total is None:
            total = part
            continue
        n = total.rows + part.rows
        delta = part.mean - total.mean
        total = Moments(n, total.mean + delta * (part.rows / n),
                        total.cross + part.cross + np.outer(delta, delta) * (total.rows * (part.rows / n)))
    if total is None:
        raise ValueError("the moments of no rows")
    return total
