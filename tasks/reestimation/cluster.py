"""A target's rows kept on the workers of a Dask cluster, as the domain's
:class:`~labelshift.partitions.PartitionedRows` (issue 41).

Each partition is placed on the cluster once: an array of this process is scattered to a worker, or -- better, as
nothing of it then passes through this process -- a :class:`PartitionSource` names a function and its arguments
that a worker calls to load the partition itself (read a .npy file from a disk every worker sees, read a batch from
the object store and calibrate it). The partitions stay there as futures; every pass of the domain over the rows
(``PartitionedRows.run``) submits its per-partition function to each partition's worker and gathers the small
results (sums of k or k x k numbers) in partition order. A worker lost during a pass has its partitions reloaded by
the scheduler from their sources (scattered arrays cannot be: give sources for long runs).

``distributed`` is imported inside the functions: nothing on the default path of the package loads it, and
the workers import this module only for :func:`load_npy` and :func:`describe_partition`.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from labelshift.errors import InputError, PartitionError, ServiceUnavailableError
from labelshift.partitions import PartitionedRows, arguments_of

__all__ = ["PartitionSource", "PartitionInfo", "npy_partition", "load_npy", "describe_partition", "connect",
           "local_cluster", "ClusterRunner", "cluster_rows", "cluster_rows_setting_aside", "PlacedRows", "SetAside",
           "load_setting_aside", "kept_rows", "CONNECT_S", "LOAD_S", "FAST_PASSES"]

#: seconds to wait for a Dask scheduler to accept the client
CONNECT_S = 20.0
#: seconds to wait for every partition to be loaded on the workers
LOAD_S = 600.0


#: Dask's nanny starts each worker with MALLOC_TRIM_THRESHOLD_=65536 (memory handed back to the system at once);
#: glibc then maps every block temporary of a pass afresh, and a pass over the rows costs 1.55x-2.24x as much
#: (10M and 100M rows, idle and loaded; benchmarks/README.md, "Rows on a cluster"). The workers this module starts
#: go without it; infra/dask/labelshift.yaml does the same for workers started by hand (docs/operations.md).
_TRIM = "MALLOC_TRIM_THRESHOLD_"
FAST_PASSES = {f"distributed.nanny.pre-spawn-environ.{_TRIM}": None}


class PartitionSource(NamedTuple):
    """How a worker gets one partition: ``load(*args)`` returns its (m_p, k) float32 or float64 probabilities.
    ``load`` must be importable by name on the workers (a module-level function); ``name`` is said in messages."""

    load: Callable[..., Any]
    args: tuple = ()
    name: str = ""


class PartitionInfo(NamedTuple):
    """What a loaded partition is: its shape and dtype, as a worker saw it."""

    shape: tuple[int, ...]
    dtype: str


def load_npy(path: str) -> np.ndarray:
    """The array of a .npy file (no pickled objects), memory-mapped: what a worker reads for :func:`npy_partition`."""
    return np.load(path, mmap_mode="r", allow_pickle=False)


def npy_partition(path) -> PartitionSource:
    """A partition that each worker reads from a .npy file at ``path`` (on a disk the workers share)."""
    return PartitionSource(load_npy, (str(path),), str(path))


class SetAside(NamedTuple):
    """What a partition's load returns in place of rows when it raised an error of the kinds set aside: the error,
    returned as a value (a task's error would be logged by the worker as a failure, and Dask rebuilds a long one)."""

    error: BaseException


def load_setting_aside(load: Callable, kinds: tuple, *args):
    """``load(*args)``, or :class:`SetAside` of its error when that is one of ``kinds`` (run on a worker)."""
    try:
        return load(*args)
    except kinds as exc:
        return SetAside(exc)


def describe_partition(part) -> PartitionInfo | SetAside:
    """The shape and dtype of what a partition's source returned (run on the worker holding it); a load set aside as
    it is."""
    if isinstance(part, SetAside):
        return part
    return PartitionInfo(tuple(int(s) for s in np.shape(part)), str(getattr(part, "dtype", type(part).__name__)))


def connect(address: str, timeout: float = CONNECT_S):
    """A ``distributed.Client`` of the scheduler at ``address`` (``tcp://host:8786``), or a ServiceUnavailableError
    naming the address and the fix."""
    from distributed import Client

    try:
        return Client(address, timeout=timeout)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ServiceUnavailableError(
            f"could not reach the Dask scheduler at {address!r} within {timeout:g} s ({type(exc).__name__}: {exc}). "
            "Fix: start one (`dask scheduler`, then `dask worker ADDRESS` on each machine) or pass the address it "
            "prints.") from None


def local_cluster(workers: int):
    """A ``distributed.LocalCluster`` of ``workers`` single-threaded worker processes on this machine, started with
    :data:`FAST_PASSES` (no dashboard). MALLOC_TRIM_THRESHOLD_ in this process's environment (a default
    LocalCluster's nanny puts it there) is left out while the workers start and put back after: a worker its nanny
    restarts later (after a crash) starts from the environment of then."""
    import dask
    from distributed import LocalCluster

    inherited = os.environ.pop(_TRIM, None)       # a default LocalCluster's nanny leaves it in this process
    try:
        with dask.config.set(FAST_PASSES):
            return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                                worker_dashboard_address=None)
    finally:
        if inherited is not None:
            os.environ[_TRIM] = inherited


class ClusterRunner:
    """``run`` of a :class:`PartitionedRows` on a cluster: ``fn(B, *args)`` submitted to the worker of each
    partition future B (a :class:`~labelshift.partitions.PerPartition` argument giving partition i its own value),
    the results gathered in partition order."""

    def __init__(self, client, futures: Sequence):
        self.client = client
        self.futures = tuple(futures)

    def __call__(self, fn, *args) -> list:
        from distributed import wait

        tasks = [self.client.submit(fn, part, *arguments_of(args, i), pure=False)
                 for i, part in enumerate(self.futures)]
        wait(tasks)     # every call ended before any error is raised: a failed pass leaves no write in flight
        return self.client.gather(tasks)


def cluster_rows(client, partitions: Sequence[np.ndarray | PartitionSource], *, timeout: float = LOAD_S,
                 ) -> PartitionedRows:
    """The rows of ``partitions`` -- arrays of this process, scattered, or :class:`PartitionSource` s, loaded by
    the workers -- kept on the workers of ``client``'s cluster, as a :class:`PartitionedRows` for the domain.

    Waits until every partition is loaded and checked to be an (m_p, k) float32 or float64 array of one k and one
    dtype. Raises ServiceUnavailableError for a closed client or a cluster without workers, PartitionError naming
    the first partition that failed to load (with the source's exception) or did not load within ``timeout``
    seconds, InputError naming a partition of the wrong shape or dtype.
    """
    return cluster_rows_setting_aside(client, partitions, (), timeout=timeout).rows


class PlacedRows(NamedTuple):
    """What :func:`cluster_rows_setting_aside` placed: the rows of the partitions that loaded (None when none did),
    their positions among those given, and the partitions set aside with their load's exception."""

    rows: PartitionedRows | None
    kept: tuple[int, ...]
    set_aside: dict[int, BaseException]


def cluster_rows_setting_aside(client, partitions: Sequence[np.ndarray | PartitionSource],
                               set_aside: tuple[type[BaseException], ...], *, timeout: float = LOAD_S) -> PlacedRows:
    """:func:`cluster_rows`, except that a source whose load raises an error of the kinds ``set_aside`` is left out
    (its error returned, as a value from the worker) instead of failing the placing: a batch that fails its checks,
    quarantined as one process quarantines it. Any other failed load raises the PartitionError of cluster_rows."""
    if not partitions:
        raise InputError("no partitions: pass at least one array or PartitionSource.")
    _check_client(client)
    names = tuple((p.name if isinstance(p, PartitionSource) else "") or f"partition {i}"
                  for i, p in enumerate(partitions))
    futures = _place(client, partitions, names, tuple(set_aside))
    outcomes = _load_outcomes(client, futures, names, timeout)
    for name, outcome in zip(names, outcomes):
        if isinstance(outcome, BaseException):
            raise PartitionError(f"{name} could not be loaded on the cluster ({type(outcome).__name__}: {outcome}). "
                                 "Fix: make its source readable from every worker (a path on a disk they share, or an "
                                 "object store URI with the workers' credentials), or leave the partition out.")
    aside = {i: o.error for i, o in enumerate(outcomes) if isinstance(o, SetAside)}
    kept = tuple(i for i in range(len(partitions)) if i not in aside)
    if not kept:
        return PlacedRows(None, kept, aside)
    infos, kept_names = [outcomes[i] for i in kept], tuple(names[i] for i in kept)
    k, dtype = _check_infos(infos, kept_names)
    rows = PartitionedRows(shape=(sum(i.shape[0] for i in infos), k), dtype=dtype,
                           run=ClusterRunner(client, [futures[i] for i in kept]),
                           partition_rows=tuple(i.shape[0] for i in infos), names=kept_names)
    return PlacedRows(rows, kept, aside)


def _check_client(client) -> None:
    if getattr(client, "status", None) != "running":
        raise ServiceUnavailableError(f"the Dask client is {getattr(client, 'status', 'not a client')}: connect one "
                                      "(tasks.reestimation.cluster.connect(address)) before placing partitions.")
    if not client.scheduler_info().get("workers"):
        raise ServiceUnavailableError(f"the Dask scheduler at {client.scheduler.address} has no workers: start some "
                                      "(`dask worker ADDRESS`) before placing partitions.")


def _place(client, partitions, names, set_aside: tuple = ()) -> list:
    """One future per partition: arrays scattered, sources submitted as load tasks named after the partition (through
    :func:`load_setting_aside` when errors are to be set aside)."""
    run_id = uuid.uuid4().hex[:8]
    futures = []
    for i, (part, name) in enumerate(zip(partitions, names)):
        if isinstance(part, PartitionSource):
            call = (load_setting_aside, part.load, set_aside, *part.args) if set_aside else (part.load, *part.args)
            futures.append(client.submit(*call, pure=False, key=f"labelshift-partition-{i}-{run_id}"))
        elif isinstance(part, np.ndarray):
            futures.append(client.scatter(part, hash=False))
        else:
            raise InputError(f"{name} is a {type(part).__name__}; pass a numpy array or a PartitionSource(load, args, "
                             "name) that a worker calls to load it.")
    return futures


def _load_outcomes(client, futures, names, timeout: float) -> list:
    """Each partition's :class:`PartitionInfo` (or :class:`SetAside`), or the exception its load raised, once all
    have ended; PartitionError for partitions still loading after ``timeout`` seconds."""
    from distributed import wait

    described = [client.submit(describe_partition, f, pure=False) for f in futures]
    try:
        wait(described, timeout=timeout)
    except TimeoutError:
        late = [n for n, d in zip(names, described) if d.status == "pending"]
        raise PartitionError(f"{len(late)} partition(s) not loaded within {timeout:g} s, first {late[0]}: the workers "
                             "are busy, too few, or the source hangs. Fix: add workers, or raise timeout.") from None
    return [d.exception() if d.status == "error" else d.result() for d in described]


def _check_infos(infos: Sequence[PartitionInfo], names) -> tuple[int, np.dtype]:
    """The k and the dtype every partition shares; InputError naming the first that does not."""
    first = infos[0]
    for name, info in zip(names, infos):
        if len(info.shape) != 2 or info.dtype not in ("float32", "float64"):
            raise InputError(f"{name} loaded as {info.dtype} of shape {info.shape}; its source must return an "
                             "(m, k) float32 or float64 array of calibrated probabilities.")
        if info.shape[1] != first.shape[1] or info.dtype != first.dtype:
            raise InputError(f"{name} is {info.dtype} with {info.shape[1]} classes but {names[0]} is {first.dtype} "
                             f"with {first.shape[1]}: every partition must come from the same classifier, in one "
                             "dtype.")
    return first.shape[1], np.dtype(first.dtype)


def kept_rows(R: PartitionedRows, transform: Callable, *args, dtype=None, timeout: float = LOAD_S
              ) -> PartitionedRows:
    """The rows of ``R.derived(transform, *args, dtype=dtype)``, made once where each partition of ``R`` lives and
    kept there beside it, so that every later pass reads them instead of transforming again (for raw outputs ->
    calibrated probabilities a BCTS costs about 11 passes' reading a row: benchmarks/README.md, "Rows on a cluster").
    The workers then hold both (twice the memory of ``R``); a worker lost has both rebuilt from the sources of
    ``R``'s partitions (not for scattered arrays). ``R`` must be placed by :func:`cluster_rows` (its ``run`` a
    :class:`ClusterRunner`). PartitionError naming the first partition whose transform failed, or that was not
    done within ``timeout`` seconds (nothing is kept then)."""
    from distributed import wait

    runner = R.run
    if not isinstance(runner, ClusterRunner):
        raise TypeError(f"kept_rows needs rows placed by cluster_rows, not {type(runner).__name__}")
    futures = [runner.client.submit(transform, part, *arguments_of(args, i), pure=False)
               for i, part in enumerate(runner.futures)]
    try:
        wait(futures, timeout=timeout)
    except TimeoutError:
        runner.client.cancel(futures)
        raise PartitionError(f"the rows of {R.names[0]} and the others were not transformed within {timeout:g} s: "
                             "the workers are busy or too few. Fix: add workers, or raise timeout.") from None
    failed = [(name, f.exception()) for name, f in zip(R.names, futures) if f.status == "error"]
    if failed:
        runner.client.cancel(futures)
        name, exc = failed[0]
        raise PartitionError(f"{name}: {getattr(transform, '__name__', 'the transform')} failed on its worker "
                             f"({type(exc).__name__}: {exc}).")
    return replace(R, run=ClusterRunner(runner.client, futures), dtype=np.dtype(R.dtype if dtype is None else dtype))
