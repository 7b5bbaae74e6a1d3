"""Scoring the target's new batches for re-estimation: calibrated probabilities (and the raw outputs they came from)
of every row of every batch, in every mode (a PyTorch model, a scikit-learn or pyfunc model, prediction logs) and
format (.npy, Parquet), in one pass that sets bad batches aside (:func:`score_for_reestimation`). The model's raw
scores of a batch (:func:`forward`, :func:`model_scores`) are computed the same way by the served corrected model
(:mod:`tasks.reestimation.serving`).
"""
from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from labelshift import rows as rows_mod
from labelshift.monitoring.batches import batch_format, batch_rows, check_one_format, iter_feature_chunks, \
    iter_output_chunks, id_bytes, read_ids
from labelshift.errors import FormatError, InputError, ObjectNotFoundError
from labelshift.inference.segments import usable_cpus
from labelshift.monitoring.inputs import load_batch
from labelshift.monitoring.layout import ChangedBatchError, RejectedBatch, TargetBatch
from labelshift.storage import open_store
from labelshift_mlflow.registry import ModelBundle
from labelshift_mlflow.references import ReferenceBundle
from labelshift_mlflow.scores import forward, model_scores

__all__ = ["ScoredBatches", "forward", "model_scores", "download_batch", "score_for_reestimation",
           "expected_batches"]


@dataclass
class ScoredBatches:
    """What scoring made of the new batches: the good ones with their probabilities (and the raw outputs those came
    from, float32, batch by batch like ``probs``), those that failed their checks (rejected, with the reason) and
    those gone or replaced since the listing (skipped: the next run lists them afresh). ``ids``: for prediction logs
    with an id column, each good batch's ids (a pyarrow array, None for a batch without the column) read with its
    outputs, for the corrected outputs; empty when not read (other models, or ids above :data:`KEPT_ID_BYTES`)."""

    batches: list[TargetBatch]
    probs: list[np.ndarray]
    rejected: list[RejectedBatch] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    outputs: list[np.ndarray] = field(default_factory=list)
    ids: list = field(default_factory=list)


def _shape(dims) -> str:
    return ", ".join(str(d) for d in dims)


def _listed(names, limit: int = 6) -> str:
    names = [repr(str(n)) for n in names]
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def expected_batches(bundle, target_uri: str) -> str:
    """What a batch of ``bundle``'s target is, as a phrase for an error (after "write each batch there as"): its
    format and columns or shape for this model's kind -- prediction logs, a scikit-learn or pyfunc model, PyTorch."""
    if isinstance(bundle, ModelBundle):
        from labelshift.experiments.training import TRAINING_DEFAULTS      # the datasets `simulate-target` knows

        demo = bundle.name.removeprefix("labelshift-")
        try_it = (f"; to try it, `labelshift data simulate-target {demo} --to {target_uri}` writes label-shifted "
                  "test images there" if bundle.name.startswith("labelshift-") and demo in TRAINING_DEFAULTS else "")
        return (f"NAME.npy, a float32 array of shape (n, {_shape(bundle.input_shape)}) of this PyTorch model's "
                f"inputs saved with numpy.save{try_it}")
    if bundle.mode == "outputs":
        return (f"NAME.parquet, the model's logged outputs ({bundle.output_kind}): one float column per class named "
                f"{_listed(bundle.class_names)}, or one list column of {bundle.n_classes} floats per row"
                + (f", and the id column {bundle.id_column!r} if you log one" if bundle.id_column else ""))
    kind = "scikit-learn" if bundle.mode == "sklearn" else "pyfunc"
    ways = []
    if bundle.input_columns:
        ways.append(f"NAME.parquet with this {kind} model's input columns {_listed(bundle.input_columns)}")
    if bundle.input_shape:
        ways.append(f"NAME.npy, a float array of shape (n, {_shape(bundle.input_shape)}) of its inputs saved with "
                    "numpy.save")
    return " or ".join(ways) or f"NAME.parquet with this {kind} model's input columns"


def _check_formats(bundle, store, batches: list[TargetBatch]) -> str:
    fmt = check_one_format([b.key for b in batches], store.uri)
    if isinstance(bundle, ModelBundle) and fmt != "npy":
        raise InputError(f"{bundle.uri} is a PyTorch model, which takes .npy batches of its inputs, but the new batches "
                         f"under {store.uri} are {fmt} ({batches[0].key}); save them as NAME.npy, or register a "
                         "reference (labelshift reference register) if they are the model's logged outputs.")
    if isinstance(bundle, ReferenceBundle) and bundle.mode != "outputs":
        if fmt == "parquet" and not bundle.input_columns:
            raise InputError(f"{bundle.uri}'s signature has no column names, so Parquet batch {batches[0].key} cannot "
                             "be matched to its inputs; save the batches as .npy arrays, or log the model with a "
                             "DataFrame input example.")
        if fmt == "npy" and not bundle.input_shape:
            raise InputError(f"{bundle.uri} has no input signature to check .npy batches against; log it with an "
                             "input example.")
    return fmt


def _unchanged(store, b: TargetBatch, digest: str) -> None:
    """ChangedBatchError unless ``digest`` is the checksum this run listed for ``b``."""
    if digest != b.checksum:
        raise ChangedBatchError(f"batch {store.url(b.key)} changed after this run listed it (listed sha256 "
                                f"{b.checksum[:12]}..., read {digest[:12]}...); run again.", {b.key: (b.checksum, digest)})


def _bytes(store, b: TargetBatch) -> bytes:
    import hashlib

    data = store.get_bytes(b.key)
    _unchanged(store, b, hashlib.sha256(data).hexdigest())
    return data


def download_batch(store, b: TargetBatch, folder: Path, name: str) -> Path:
    """The batch as the local file ``folder/name``, streamed from the store (verified against its recorded checksum on
    the way) and hashed again against the checksum this run listed."""
    from labelshift.storage.base import file_sha256

    path = folder / f"{name}{Path(b.key).suffix}"
    store.get_file(b.key, path)
    _unchanged(store, b, file_sha256(path))
    return path


def skip_batch(out: ScoredBatches, b: TargetBatch, exc: Exception, logger) -> None:
    """Record ``b`` as skipped (gone or replaced since the listing) with the reason, and say so."""
    out.skipped.append({"key": b.key, "reason": str(exc)})
    logger.warning("skipped %s: %s", b.key, exc)


def reject_batch(out: ScoredBatches, b: TargetBatch, exc: Exception, logger) -> None:
    """Record ``b`` as rejected (it failed its checks) with the reason; said when ``logger`` is given."""
    out.rejected.append(RejectedBatch(b, str(exc)))
    if logger is not None:              # in strict mode the flow reports every rejection at once, in its error
        logger.warning("rejected %s: %s", b.key, exc)


#: threads that download a run's batches, and that read and calibrate them (a thread per core the run may use, at
#: most 2, up to 100 classes: the reading and the block arithmetic release the GIL; above, a chunk's temporaries
#: are large and one thread keeps them to one set; the downloads wait on the network)
DOWNLOAD_THREADS = 4
CALIBRATE_THREADS = max(1, min(2, usable_cpus()))


def threads_for(k: int, threads: int) -> int:
    """Threads for per-batch work on k classes: ``threads`` up to THREADED_PASS_CLASSES classes, else one."""
    return threads if k <= rows_mod.THREADED_PASS_CLASSES else 1


def mapped(threads: int, fn, *items) -> list:
    """``[fn(*args) for args in zip(*items)]`` on ``threads`` threads, in order. When this thread is stopped
    (SIGTERM, Ctrl-C) or a call fails, work not started is cancelled and this thread does not wait for the calls
    under way (they end on their own: each is bounded by the store's timeouts)."""
    pool = ThreadPoolExecutor(max_workers=threads)
    try:
        out = list(pool.map(fn, *items))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return out


def _downloaded(store, batches: list[TargetBatch], folder: Path, out: ScoredBatches, logger, reject_logger) -> list:
    """(batch, uri, format, local path, rows) of each batch that could be downloaded, in the batches' order; the
    others skipped (gone or replaced) or rejected (unreadable metadata). Several downloads at once."""
    def one(i_b):
        i, b = i_b
        uri, fmt = store.url(b.key), batch_format(b.key)
        try:
            path = download_batch(store, b, folder, f"batch-{i}")
            return b, (b, uri, fmt, path, batch_rows(path, fmt, uri))
        except (ObjectNotFoundError, ChangedBatchError, FormatError, InputError) as exc:
            return b, exc

    files = []
    for b, got in mapped(DOWNLOAD_THREADS, one, enumerate(batches)):
        if isinstance(got, (ObjectNotFoundError, ChangedBatchError)):
            skip_batch(out, b, got, logger)
        elif isinstance(got, Exception):
            reject_batch(out, b, got, reject_logger)
        else:
            files.append(got)
    return files


#: the most bytes of id columns (all batches of a run together, from the files' metadata) kept in memory for the
#: corrected outputs; above it the outputs read each batch's ids from a second download (string ids of 10M rows:
#: about 400 MB)
KEPT_ID_BYTES = 256 * 2**20


def _ids_kept(bundle: ReferenceBundle, files: list) -> bool:
    """Whether the batches' id columns fit :data:`KEPT_ID_BYTES` (estimated from the Parquet metadata; a batch whose
    metadata cannot be read counts nothing: its read fails and rejects it)."""
    total = 0
    for _, uri, fmt, path, _ in files:
        if fmt == "parquet":
            with suppress(FormatError, InputError, OSError):
                total += id_bytes(path, uri, bundle.id_column)
    return total <= KEPT_ID_BYTES


def _calibrate_file(bundle: ReferenceBundle, file, pooled: np.ndarray, pooled_raw: np.ndarray, at: int,
                    keep_ids: bool):
    """One downloaded batch read in row chunks into ``pooled_raw[at:at + n]`` and calibrated into ``pooled``, and
    with ``keep_ids`` its ids read (the reference's id column, None without one); (None, ids), or (the
    FormatError/InputError that rejects it, None). Its file is deleted either way."""
    b, uri, fmt, path, n = file
    row = at
    try:
        for chunk in iter_output_chunks(path, fmt, bundle.spec, uri):
            if row + len(chunk) > at + n:
                raise FormatError(f"batch {uri} holds more rows than its metadata says ({n}); write it again.")
            kept = pooled_raw[row:row + len(chunk)]
            kept[:] = chunk
            pooled[row:row + len(chunk)] = bundle.calibrator.predict_proba(kept.astype(np.float64))
            row += len(chunk)
        if row != at + n:
            raise FormatError(f"batch {uri} holds {row - at} rows but its metadata says {n}; write it again.")
        ids = read_ids(path, uri, bundle.id_column) if keep_ids and fmt == "parquet" else None
    except (FormatError, InputError) as exc:
        return exc, None
    finally:
        path.unlink(missing_ok=True)
    return None, ids


def _move_rows(a: np.ndarray, start: int, to: int, n: int) -> None:
    """Rows ``start:start + n`` of the C-contiguous ``a`` moved up to ``to`` (< start), through flat views: numpy
    copies overlapping 1-D ranges without a temporary (a 2-D overlapping assignment copies the whole source first)."""
    flat, k = a.reshape(-1), a.shape[1]
    flat[to * k:(to + n) * k] = flat[start * k:(start + n) * k]


def _score_logs(bundle: ReferenceBundle, store, batches: list[TargetBatch], out: ScoredBatches, logger,
                reject_logger) -> None:
    """Prediction logs: the batches downloaded (several at once), then each calibrated chunk by chunk into its rows
    of one pooled float32 (m, k) array (a batch per thread), as are their raw outputs; the good batches get
    consecutive views of it (pooling them is free), and a rejected batch's rows go to the batches after it."""
    with tempfile.TemporaryDirectory(prefix="labelshift-batches-") as tmp, rows_mod.one_blas_thread():
        files = _downloaded(store, batches, Path(tmp), out, logger, reject_logger)
        starts = np.concatenate([[0], np.cumsum([f[4] for f in files], dtype=np.int64)])
        pooled = np.empty((int(starts[-1]), bundle.n_classes), dtype=np.float32)
        pooled_raw = np.empty_like(pooled)     # for the source-aware interval
        keep_ids = _ids_kept(bundle, files)
        read = mapped(threads_for(bundle.n_classes, CALIBRATE_THREADS),
                      lambda f, at: _calibrate_file(bundle, f, pooled, pooled_raw, int(at), keep_ids), files,
                      starts[:-1])
        at = 0
        for (b, _, _, _, n), start, (exc, ids) in zip(files, starts[:-1], read):
            if exc is not None:
                reject_batch(out, b, exc, reject_logger)
                continue
            if start != at:        # after a rejected batch: its rows move up
                _move_rows(pooled, start, at, n)
                _move_rows(pooled_raw, start, at, n)
            out.batches.append(b)
            out.probs.append(pooled[at:at + n])
            out.outputs.append(pooled_raw[at:at + n])
            if keep_ids:
                out.ids.append(ids)
            at += n


def _calibrated(bundle, scores, raw: list) -> np.ndarray:
    """The calibrated probabilities of raw model outputs, kept (float32) in ``raw`` for the source-aware interval;
    the probabilities are computed from the kept values, so that both describe the same rows exactly."""
    kept = np.asarray(scores).astype(np.float32)
    raw.append(kept)
    return bundle.calibrator.predict_proba(kept.astype(np.float64))


def _score_batch(bundle, store, b: TargetBatch, batch_size: int, raw: list | None = None) -> np.ndarray:
    """Calibrated probabilities of every row of one batch (its rows stream through in chunks; only the (n, k)
    probabilities stay, and the raw outputs as float32 in ``raw`` when given). Raises FormatError/InputError for a
    batch that fails its checks."""
    raw = [] if raw is None else raw
    if isinstance(bundle, ModelBundle):
        x = load_batch(store, b, input_shape=bundle.input_shape)
        return _calibrated(bundle, forward(bundle.model, x, batch_size), raw)
    uri, fmt = store.url(b.key), batch_format(b.key)
    parts = []
    if fmt == "parquet":
        for chunk in iter_feature_chunks(_bytes(store, b), uri, bundle.input_columns,
                                         chunk_rows=max(batch_size, 1024)):
            parts.append(_calibrated(bundle, model_scores(bundle, chunk), raw))
    else:
        x = load_batch(store, b, input_shape=bundle.input_shape)
        for i in range(0, len(x), max(batch_size, 1)):
            parts.append(_calibrated(bundle, model_scores(bundle, x[i:i + batch_size]), raw))
    return np.concatenate(parts)


@task(name="score-batches", task_run_name="score-{target_uri}", cache_policy=NO_CACHE, persist_result=False)
def score_for_reestimation(bundle, target_uri: str, batches: list[TargetBatch], *, batch_size: int = 1024,
                           log_rejections: bool = True) -> ScoredBatches:
    """Calibrated probabilities (and the raw outputs they came from, float32) of every row of every batch, in any mode
    and format, in one pass that goes on past a bad batch: one that fails its checks is rejected with its message,
    one deleted or replaced since the listing skipped. Nothing is written here. Different formats under one target,
    or trouble with the store itself, still fail."""
    from prefect.logging import get_run_logger

    logger = get_run_logger()
    store = open_store(target_uri)
    _check_formats(bundle, store, batches)
    out, t0 = ScoredBatches([], []), time.perf_counter()
    reject_logger = logger if log_rejections else None
    if isinstance(bundle, ReferenceBundle) and bundle.mode == "outputs":
        _score_logs(bundle, store, batches, out, logger, reject_logger)
    else:
        for i, b in enumerate(batches):
            raw: list = []
            try:
                probs = _score_batch(bundle, store, b, batch_size, raw)
            except (ObjectNotFoundError, ChangedBatchError) as exc:
                skip_batch(out, b, exc, logger)
                continue
            except (FormatError, InputError) as exc:
                reject_batch(out, b, exc, reject_logger)
                continue
            out.probs.append(probs)
            out.outputs.append(np.concatenate(raw))
            out.batches.append(b)
            logger.info("scored %s (%d of %d): %d rows, %.1f s so far", b.key, i + 1, len(batches), len(probs),
                        time.perf_counter() - t0)
    logger.info("%d batch(es) scored, %d rejected, %d skipped in %.1f s", len(out.batches), len(out.rejected),
                len(out.skipped), time.perf_counter() - t0)
    return out
