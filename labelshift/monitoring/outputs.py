"""The outputs a run writes beside each batch of a target: the corrected predictions, then the batch's summary.

Beside a batch ``NAME.npy`` a run writes ``NAME.corrected.npy`` (:func:`write_batch_outputs`), beside a Parquet
batch ``NAME.corrected.parquet`` (:func:`corrected_parquet`, :func:`write_corrected_parquet` one row group per
streamed chunk, uploaded by :func:`write_corrected` or :func:`write_corrected_file`), and then ``NAME.summary.json``,
last, so a summary never refers to predictions that are not there yet. Each summary gets an ``input`` field (key,
uri, sha256 and rows of the batch) and an ``output`` field (key, uri, sha256 and classes of the corrected
predictions).
"""
from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._validation import check_probabilities
from ..errors import InputError
from ..storage import Store, encode_json
from .layout import TargetBatch

__all__ = ["SUMMARY_KEYS", "write_batch_outputs", "corrected_parquet", "write_corrected_parquet", "write_corrected",
           "write_corrected_file"]

#: keys of a batch summary set by :func:`write_batch_outputs`
SUMMARY_KEYS = ("input", "output")


def _with_input_and_output(store, batch, summary: Mapping[str, Any], corrected_key: str, digest: str, *, rows: int,
                           classes: int) -> dict:
    """``summary`` with the ``input`` (the batch) and ``output`` (its corrected predictions) fields added."""
    record = dict(summary)
    record["input"] = {"key": batch.key, "uri": store.url(batch.key), "sha256": batch.checksum, "rows": int(rows)}
    record["output"] = {"key": corrected_key, "uri": store.url(corrected_key), "sha256": digest,
                        "classes": int(classes)}
    return record


def write_batch_outputs(store: Store, batch: TargetBatch, corrected: Any, summary: Mapping[str, Any], *,
                        n_rows: int | None = None) -> dict:
    """Write the corrected predictions of ``batch`` and then its summary, each atomically.

    ``corrected`` holds p_t(y|x) per row, shape (n, k): rows of non-negative numbers that sum to 1, as the paper's
    correction p_t(y|x) proportional to w_y f_y(x) gives (Section 2); it is stored as float32 under
    ``NAME.corrected.npy``. ``n_rows``, when given, must equal n (the batch's row count).

    The summary is written last under ``NAME.summary.json``, so a summary never refers to predictions that are not
    there yet. Two fields are added (a summary passed in may not use them): ``input`` (key, uri, sha256 and rows of
    the batch) and ``output`` (key, uri, sha256 and classes of the corrected predictions). Everything is checked,
    and the summary encoded, before the first write. Writing again overwrites both. Returns the summary as written.
    """
    if not isinstance(summary, Mapping):
        raise InputError(f"summary must be a dict, got {type(summary).__name__}.")
    taken = [k for k in SUMMARY_KEYS if k in summary]
    if taken:
        raise InputError(f"summary fields {taken} are set by write_batch_outputs; rename them in the summary.")
    probs = check_probabilities(corrected, f"corrected predictions for {store.url(batch.key)}", 2)
    if n_rows is not None and probs.shape[0] != n_rows:
        raise InputError(
            f"corrected predictions for {store.url(batch.key)} have {probs.shape[0]} rows but the batch has "
            f"{n_rows}; pass one row per example."
        )
    array = probs.astype(np.float32)
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    payload = buffer.getvalue()
    record = _with_input_and_output(store, batch, summary, batch.corrected_key, hashlib.sha256(payload).hexdigest(),
                                    rows=array.shape[0], classes=array.shape[1])
    text = encode_json(record, f"the summary of {store.url(batch.key)}")
    store.put_bytes(batch.corrected_key, payload, content_type="application/octet-stream")
    store.put_bytes(batch.summary_key, text, content_type="application/json")
    return json.loads(text)


def corrected_parquet(corrected: np.ndarray, class_names: Sequence[str], ids: pa.Array | None = None,
                      id_column: str | None = None) -> bytes:
    """Parquet bytes of corrected probabilities: the id column first (when given), then one float32 column per
    class, named as the class."""
    buf = io.BytesIO()
    pq.write_table(_corrected_table(corrected, class_names, ids, id_column), buf)
    return buf.getvalue()


def _corrected_table(corrected: np.ndarray, class_names: Sequence[str], ids, id_column: str | None) -> pa.Table:
    arrays, names = [], []
    if ids is not None:
        if len(ids) != len(corrected):
            raise InputError(f"the id column has {len(ids)} rows but the corrected outputs {len(corrected)}.")
        arrays.append(ids)
        names.append(id_column or "id")
    for j, name in enumerate(class_names):
        arrays.append(pa.array(np.asarray(corrected[:, j], dtype=np.float32)))
        names.append(str(name))
    return pa.Table.from_arrays(arrays, names=names)


def write_corrected_parquet(path: str | Path, chunks, class_names: Sequence[str], id_column: str | None = None) -> int:
    """Write corrected probabilities to the Parquet file ``path`` one row group per chunk, as
    :func:`corrected_parquet` lays them out (the id column first when given, then one float32 column per class).
    ``chunks``: an iterable of (corrected (rows, k), ids or None). Returns the number of rows written."""
    writer, rows = None, 0
    try:
        for corrected, ids in chunks:
            table = _corrected_table(corrected, class_names, ids, id_column)
            if writer is None:      # no dictionary for the float columns: it never pays on probabilities, and
                # trying it cost 0.7 s per million rows and made the file 40% larger (measured at k = 10)
                writer = pq.ParquetWriter(str(path), table.schema,
                                          use_dictionary=[id_column or "id"] if ids is not None else False)
            writer.write_table(table)
            rows += len(corrected)
        if writer is None:
            raise InputError(f"no corrected rows to write to {path}.")
    finally:
        if writer is not None:
            writer.close()
    return rows


def write_corrected_file(store, batch, path: str | Path, corrected_key: str, summary: Mapping[str, Any], *,
                         rows: int, classes: int) -> dict:
    """:func:`write_corrected` for corrected outputs already in the local file ``path`` (uploaded with
    ``store.put_file``: streamed, multipart when large), then the summary."""
    digest = store.put_file(corrected_key, path)
    record = _with_input_and_output(store, batch, summary, corrected_key, digest, rows=rows, classes=classes)
    text = json.dumps(record, indent=2, default=_json_default).encode("utf-8")
    store.put_bytes(batch.summary_key, text, content_type="application/json")
    return json.loads(text)


def write_corrected(store, batch, payload: bytes, corrected_key: str, summary: Mapping[str, Any], *,
                    rows: int, classes: int, content_type: str = "application/vnd.apache.parquet") -> dict:
    """Write a batch's corrected outputs (``payload`` under ``corrected_key``) and then its summary, each atomically,
    with the ``input`` and ``output`` fields :func:`write_batch_outputs` adds."""
    record = _with_input_and_output(store, batch, summary, corrected_key, hashlib.sha256(payload).hexdigest(),
                                    rows=rows, classes=classes)
    text = json.dumps(record, indent=2, default=_json_default).encode("utf-8")
    store.put_bytes(corrected_key, payload, content_type=content_type)
    store.put_bytes(batch.summary_key, text, content_type="application/json")
    return json.loads(text)


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)
