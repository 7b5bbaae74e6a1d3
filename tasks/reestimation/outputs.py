"""Writing a re-estimation's outputs: corrected predictions p_t(y|x) proportional to w_y f_y(x) (Saerens et al.
2002) beside each target batch, with its summary JSON (:func:`write_for_reestimation`; .npy batches through
:func:`write_outputs`).
"""
from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from labelshift import rows as rows_mod
from labelshift.estimation.diagnostics import correct_predictions
from labelshift.errors import FormatError
from labelshift.monitoring.batches import iter_ids
from labelshift.monitoring.layout import TargetBatch
from labelshift.monitoring.outputs import write_batch_outputs, write_corrected_file, write_corrected_parquet
from labelshift.storage import open_store
from labelshift.inference.segments import usable_cpus
from tasks.reestimation.scoring import download_batch, mapped, threads_for

__all__ = ["write_outputs", "write_for_reestimation", "write_corrected_partition"]


def _batch_summary(summary: dict, store, b: TargetBatch, rows: int) -> dict:
    """The run's summary with this batch's entry (its key, checksum, rows and corrected file), stored beside it."""
    return dict(summary, batch={"key": b.key, "checksum": b.checksum, "rows": int(rows),
                                "corrected": store.url(b.corrected_key)})


def write_outputs(target_uri: str, batches: list[TargetBatch], probs: list[np.ndarray], weights: list[float],
                  summary: dict) -> list[str]:
    """Corrected predictions p_t(y|x) proportional to w_y f_y(x) (Saerens et al. 2002) beside each batch, then its
    summary JSON; each write atomic. Returns the URIs of the corrected arrays. (A plain function: the ``.npy`` case
    of the task :func:`write_for_reestimation`.)"""
    store = open_store(target_uri)
    urls = []
    for b, p in zip(batches, probs):
        corrected = correct_predictions(p, np.asarray(weights)).astype(np.float32)
        batch_summary = _batch_summary(summary, store, b, len(p))
        write_batch_outputs(store, b, corrected, batch_summary)
        urls.append(store.url(b.corrected_key))
    return urls


def _take(ids, pending: list, n: int):
    """The next ``n`` ids from the chunk iterator ``ids`` (whose chunks need not be n long); None without ids."""
    import pyarrow as pa

    have = sum(len(a) for a in pending)
    while have < n:
        chunk = next(ids, None)
        if chunk is None:
            if not pending:
                return None
            raise FormatError(f"the id column holds {have} rows fewer than the outputs; write the batch again.")
        pending.append(chunk)
        have += len(chunk)
    joined = pa.concat_arrays(pending) if len(pending) > 1 else pending[0]
    pending[:] = [joined.slice(n)] if len(joined) > n else []
    return joined.slice(0, n)


def _corrected_chunks(probs: np.ndarray, weights: np.ndarray, ids, chunk_rows: int):
    pending: list = []
    for sl in rows_mod.blocks(len(probs), chunk_rows):
        block = probs[sl]
        yield correct_predictions(block, weights).astype(np.float32), _take(ids, pending, len(block))


#: batches whose corrected outputs are made and uploaded at once, up to 100 classes (a thread per core the run may
#: use, at most 2: the arithmetic, Parquet writing, hashing and uploads release the GIL)
WRITE_THREADS = max(1, min(2, usable_cpus()))


#: in place of a batch's ids: read them from a second download of the batch
READ_AGAIN = object()


def _id_chunks(store, b: TargetBatch, id_column, ids, folder: Path, chunk_rows: int):
    """The batch's ids in chunks: ``ids`` itself (read with the outputs: a pyarrow array, or None for a batch
    without the column), or with :data:`READ_AGAIN` streamed from a copy downloaded into ``folder``; an endless run
    of None without ids."""
    if ids is not READ_AGAIN:
        return itertools.repeat(None) if ids is None else iter([ids])
    if not id_column:
        return itertools.repeat(None)
    source = download_batch(store, b, folder, "batch")
    return iter_ids(source, store.url(b.key), id_column, chunk_rows=chunk_rows)


def _write_corrected_parquet(names, id_column, store, b: TargetBatch, p: np.ndarray, w: np.ndarray,
                             summary: dict, ids=READ_AGAIN) -> str:
    """One Parquet batch's corrected outputs (columns ``names``, and the batch's ``id_column`` when not None) written
    row group by row group to a temporary file (the ids given, else streamed from a downloaded copy of the
    batch), uploaded with the batch's summary; its URI."""
    chunk_rows = rows_mod.ROW_BLOCK
    with tempfile.TemporaryDirectory(prefix="labelshift-corrected-") as tmp:
        folder = Path(tmp)
        chunks = _id_chunks(store, b, id_column, ids, folder, chunk_rows)
        out = folder / "corrected.parquet"
        write_corrected_parquet(out, _corrected_chunks(p, w, chunks, chunk_rows), names, id_column)
        batch_summary = _batch_summary(summary, store, b, len(p))
        write_corrected_file(store, b, out, b.corrected_key, batch_summary, rows=len(p), classes=len(names))
    return store.url(b.corrected_key)


@task(name="write-outputs", cache_policy=NO_CACHE, persist_result=False)
def write_for_reestimation(bundle, target_uri: str, batches: list[TargetBatch], probs: list[np.ndarray],
                           weights: list[float], summary: dict, ids: list | None = None) -> list[str]:
    """Corrected predictions beside each batch: ``.corrected.npy`` for .npy batches (as for PyTorch models),
    ``.corrected.parquet`` with one column per class name (and the batch's id column) for Parquet batches, written
    row group by row group to a temporary file, then uploaded; :data:`WRITE_THREADS` batches at once. ``ids``: each
    batch's ids as scoring read them (:attr:`~tasks.reestimation.scoring.ScoredBatches.ids`); without them a batch's
    id column is streamed from a downloaded copy. Returns their URIs in the batches' order. A failure (or a
    stop) raises at once: batches not started are not written, the ones under way may still land (the run commits
    nothing, and the next run writes them again)."""
    if all(b.key.endswith(".npy") for b in batches):
        return write_outputs(target_uri, batches, probs, weights, summary)
    store = open_store(target_uri)
    w = np.asarray(weights, dtype=np.float64)
    if ids and len(ids) != len(batches):
        raise ValueError(f"ids of {len(ids)} batches for {len(batches)} batches: pass one entry a batch, or none.")
    each = ids or [READ_AGAIN] * len(batches)
    with rows_mod.one_blas_thread():
        return mapped(threads_for(len(w), WRITE_THREADS),
                      lambda b, p, i: _write_corrected_parquet(bundle.holdout.names, getattr(bundle, "id_column", None),
                                                               store, b, p, w, summary, i), batches, probs, each)


def write_corrected_partition(probs: np.ndarray, batch: TargetBatch, target_uri: str, weights: list[float],
                              summary: dict, names: list[str], id_column: str | None) -> str:
    """One batch's corrected predictions p_t(y|x) proportional to w_y f_y(x) and its summary, written beside it from
    its calibrated ``probs`` -- run on the Dask worker that holds the batch (a module-level function the workers
    import), as :func:`write_for_reestimation` writes each batch in one process: ``.corrected.npy`` for a .npy batch,
    ``.corrected.parquet`` (columns ``names``, and ``id_column`` when not None) for a Parquet one. Its URI."""
    if batch.key.endswith(".npy"):
        return write_outputs(target_uri, [batch], [probs], weights, summary)[0]
    with rows_mod.one_blas_thread():
        return _write_corrected_parquet(names, id_column, open_store(target_uri), batch, np.asarray(probs),
                                        np.asarray(weights, dtype=np.float64), summary)
