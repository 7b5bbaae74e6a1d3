"""One re-estimation with its rows on a Dask cluster (issue 41; the ``dask`` setting of the ``reestimate`` flow).

What runs where. On the workers: each new batch is read from the target store by a worker (:func:`load_log_partition`,
a module-level function they import; they see the same store settings as the flow), checked as one process checks it,
and kept there as the raw outputs of one partition, with its calibrated probabilities made once beside them; every
pass of the assessment reads the partition where it lives and sends back sums of k or k x k numbers; the corrected
outputs of each batch are calibrated, corrected and written beside it by the worker holding it
(:func:`write_on_cluster`). On the flow's process: the holdout, the sums added in partition order, the report, the
MLflow logging and the watermark's one commit, after every kept partition succeeded. A batch that fails its checks is
quarantined as one process quarantines it.

Not yet on a cluster: models scored from their inputs (only prediction logs, whose rows are the model's outputs),
targets whose repeated rows are collapsed, segments, the bootstrap interval.
``distributed`` is imported inside the functions, as in :mod:`tasks.reestimation.cluster`.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np

from labelshift.errors import FormatError, InputError, ObjectNotFoundError, PartitionError
from labelshift.inference.holdout import Target, calibrated_probs
from labelshift.monitoring.batches import batch_format, check_one_format, iter_output_chunks
from labelshift.monitoring.layout import ChangedBatchError, TargetBatch
from labelshift.partitions import NOT_PARTITIONED, PartitionedRows, PerPartition
from labelshift.storage import open_store
from labelshift_mlflow.references import ReferenceBundle
from tasks.reestimation import cluster as adapter
from tasks.reestimation.cluster import PartitionSource, cluster_rows_setting_aside, kept_rows
from tasks.reestimation.outputs import write_corrected_partition
from tasks.reestimation.scoring import ScoredBatches, download_batch, reject_batch, skip_batch

__all__ = ["cluster_client", "check_clusterable", "load_log_partition", "cluster_target", "calibrated_target",
           "not_partitioned_yet",
           "write_on_cluster", "WITHOUT_DASK"]

#: the fix every refusal of the cluster path names
WITHOUT_DASK = "run without dask (CLI: without --dask) to run it in one process"


@contextmanager
def cluster_client(address: str) -> Iterator:
    """A ``distributed.Client`` of the scheduler at ``address`` (:func:`~tasks.reestimation.cluster.connect`:
    ServiceUnavailableError naming the address and the fix), or of a ``LocalCluster`` of this machine for ``"local"``
    (a single-threaded worker process per core, :func:`~tasks.reestimation.cluster.local_cluster`); closed when
    the block ends. A worker lost for good inside the block (``KilledWorker``, a closed connection) is raised as a
    PartitionError naming the cluster and the fix."""
    from distributed import KilledWorker
    from distributed.comm.core import CommClosedError

    cluster = client = None
    try:
        if address == "local":
            cluster = adapter.local_cluster(max(1, os.cpu_count() or 1))
        client = adapter.connect(cluster.scheduler_address if cluster else address, timeout=adapter.CONNECT_S)
        yield client
    except (KilledWorker, CommClosedError) as exc:
        raise PartitionError(f"a worker of the Dask cluster at {address} died or was cut off during the run "
                             f"({type(exc).__name__}: {exc}); nothing was committed. Fix: give the workers more "
                             f"memory or restart them (`dask worker ADDRESS`) and run again, or {WITHOUT_DASK}.") \
            from None
    finally:       # a close that fails (the scheduler gone already) neither hides the run's error nor fails the run
        for opened in (client, cluster):
            if opened is not None:
                with suppress(Exception):
                    opened.close()


def check_clusterable(bundle, target_uri: str, batches: Sequence[TargetBatch], interval: str = "source-aware"
                      ) -> None:
    """InputError, before anything is written, unless ``bundle`` is a registered reference of prediction logs (the
    batches are the model's outputs, which the workers read themselves), ``batches`` share one format and the
    interval runs over partitions (the bootstrap resamples rows: not yet); also when Dask's ``distributed`` is not
    installed."""
    try:
        import distributed  # noqa: F401
    except ImportError as exc:
        raise InputError(f"dask needs Dask's distributed package, which is not installed ({exc}): pip install "
                         f"'labelshift[dask]', or {WITHOUT_DASK}.") from None
    if interval == "bootstrap":
        raise InputError("interval='bootstrap' resamples the target's rows, which does not run on a Dask cluster yet; "
                         f"nothing was written. Fix: interval='source-aware' or 'fisher', or {WITHOUT_DASK}.")
    check_one_format([b.key for b in batches], target_uri)
    if not (isinstance(bundle, ReferenceBundle) and bundle.mode == "outputs"):
        kind = getattr(bundle, "mode", "pytorch")
        raise InputError(f"{bundle.uri} is a {kind} model scored from its inputs; on a Dask cluster the re-estimation "
                         f"takes prediction logs only (a registered reference, whose batches under {target_uri} are "
                         f"the model's outputs). Fix: {WITHOUT_DASK}.")


def load_log_partition(target_uri: str, batch: TargetBatch, spec) -> np.ndarray:
    """The raw outputs of one prediction-log batch, (n, k) float32, read from the store by the worker that calls it:
    downloaded (checked against the checksum the run listed) and every chunk checked as one process checks it
    (:func:`~labelshift.monitoring.batches.iter_output_chunks`). Raises what those checks raise."""
    store = open_store(target_uri)
    uri = store.url(batch.key)
    with tempfile.TemporaryDirectory(prefix="labelshift-partition-") as tmp:
        path = download_batch(store, batch, Path(tmp), "batch")
        chunks = list(iter_output_chunks(path, batch_format(batch.key), spec, uri))
    return np.concatenate(chunks) if chunks else np.empty((0, len(spec.class_names)), dtype=np.float32)


def cluster_target(client, bundle: ReferenceBundle, store, batches: Sequence[TargetBatch], logger,
                   log_rejections: bool = True) -> tuple[PartitionedRows | None, ScoredBatches]:
    """The raw outputs of ``batches`` placed on ``client``'s workers, one partition per batch read there
    (:func:`load_log_partition`, from ``store.uri``), and what became of each batch, as one process's scoring says
    it (:class:`~tasks.reestimation.scoring.ScoredBatches`, no rows): a batch that fails its checks is rejected
    with its reason (logged when ``log_rejections``), one deleted or replaced since the listing skipped, the others
    kept (the partitions, in order; None when none is). Any other failure to read a batch -- and a batch the workers
    cannot find or read unchanged while this process can: they do not see the store as the flow does -- raises a
    PartitionError naming it. :func:`calibrated_target` makes the target of the kept rows."""
    sources = [PartitionSource(load_log_partition, (store.uri, b, bundle.spec), store.url(b.key)) for b in batches]
    try:
        placed = cluster_rows_setting_aside(client, sources, _SET_ASIDE)
    except PartitionError as exc:
        raise PartitionError(f"{exc} Nothing was counted: fix the batch or the workers' access to it and run again, "
                             f"or {WITHOUT_DASK}.") from None
    scored = ScoredBatches([batches[i] for i in placed.kept], [])
    for i, exc in sorted(placed.set_aside.items()):
        b = batches[i]
        if isinstance(exc, (ObjectNotFoundError, ChangedBatchError)):
            _check_gone_here_too(store, b, exc)
            skip_batch(scored, b, exc, logger)
        else:
            reject_batch(scored, b, exc, logger if log_rejections else None)
    logger.info("%d batch(es) read on the cluster, %d rejected, %d skipped", len(scored.batches),
                len(scored.rejected), len(scored.skipped))
    return placed.rows, scored


def _check_gone_here_too(store, b: TargetBatch, exc: BaseException) -> None:
    """PartitionError when a batch a worker could not find, or found changed, is here unchanged."""
    try:
        here = store.exists(b.key) and store.checksum(b.key) == b.checksum
    except Exception:          # this process cannot tell either: the batch is skipped, as one process would
        return
    if here:
        raise PartitionError(f"a worker could not read {store.url(b.key)} as listed ({type(exc).__name__}: {exc}), "
                             "but this process reads it unchanged: the workers do not see the store as the flow does "
                             "(another endpoint, bucket or credentials, or a folder not on a disk they share). "
                             f"Nothing was counted. Fix: give the workers the flow's store settings, or {WITHOUT_DASK}.")


def calibrated_target(R: PartitionedRows, bundle: ReferenceBundle) -> Target:
    """The target of raw outputs ``R`` on the cluster, with their calibrated probabilities made once where they live
    and kept there (:func:`~tasks.reestimation.cluster.kept_rows`: the rows of ``Target.from_partitioned_outputs``,
    which would calibrate them again in every pass)."""
    return Target(kept_rows(R, calibrated_probs, bundle.calibrator, dtype=np.float32), R)


#: what a worker's read of a batch may raise and still leave the run going, as one process's scoring: gone or
#: replaced since the listing (skipped), or failing its checks (rejected)
_SET_ASIDE = (ObjectNotFoundError, ChangedBatchError, FormatError, InputError)


@contextmanager
def not_partitioned_yet() -> Iterator[None]:
    """A pass of the assessment that does not run over partitions yet (its TypeError ends in
    :data:`~labelshift.partitions.NOT_PARTITIONED`: the target's repeated rows collapsed) raised as an InputError
    naming what and the fix; any other TypeError as it is."""
    try:
        yield
    except TypeError as exc:
        if NOT_PARTITIONED not in str(exc):
            raise
        what = str(exc).replace(NOT_PARTITIONED, "").strip().rstrip(":")
        raise InputError(f"{what}: this pass does not run on a Dask cluster yet (the interval and tests of collapsed "
                         f"repeated rows are the usual one); nothing was written. Fix: {WITHOUT_DASK}.") from None


def write_on_cluster(target: Target, bundle: ReferenceBundle, target_uri: str, batches: Sequence[TargetBatch],
                     weights: list[float], summary: dict) -> list[str]:
    """Corrected predictions and a summary beside each batch, written by the worker holding it from its rows
    calibrated there (:func:`~tasks.reestimation.outputs.write_corrected_partition`); their URIs in the batches'
    order. A failure raises (the run commits nothing; batches already written are written again next time)."""
    return target.probs.run(write_corrected_partition, PerPartition(tuple(batches)), target_uri, list(weights),
                            summary, list(bundle.holdout.names), bundle.id_column)
