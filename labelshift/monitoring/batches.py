"""Batch formats of a target, read in streamed chunks and checked (the corrected outputs are written back by
:mod:`labelshift.monitoring.outputs`).

A target holds batches of one format:

- ``NAME.npy``: a float array; in input mode the model's inputs (:func:`labelshift.monitoring.inputs.load_batch`), in
  prediction-log mode the model's outputs, shape (n, k);
- ``NAME.parquet``: in prediction-log mode the model's outputs, one float column per class (named as the classes)
  or one list column of k floats per row, optionally an id column carried into the corrected output (other columns,
  e.g. a timestamp, are ignored); in input mode a table of features whose columns are the model's input columns.

Readers stream: a Parquet batch is read one record batch (``chunk_rows`` rows) at a time and each chunk is checked
and converted to float32 before the next is read (:func:`iter_output_chunks`, :func:`iter_feature_chunks`), so
callers can keep only what they derive from a chunk. Every check names the batch, the problem and the fix. A segment
column's values are read by :func:`read_segments` and checked by :func:`check_segment_values`.

A *reference* (prediction-log mode) is what re-estimation needs besides the new outputs: class names, the kind of
output (``"logits"`` or ``"probabilities"``) and the labelled holdout's outputs; :func:`check_reference` checks it,
:func:`read_holdout` reads it from a Parquet file.
"""
from __future__ import annotations

import io
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import FormatError, InputError

__all__ = ["FORMATS", "OUTPUT_KINDS", "OutputSpec", "batch_format", "check_one_format", "iter_output_chunks",
           "read_outputs", "iter_feature_chunks", "read_features", "read_ids", "id_bytes", "batch_rows", "iter_ids",
           "metric_names", "default_class_names", "check_class_names", "check_reference",
           "read_holdout", "LabelledOutputs", "PARQUET_CORRECTED_SUFFIX", "read_segments", "check_segment_values"]

#: batch suffix -> format name
FORMATS = {".npy": "npy", ".parquet": "parquet"}
OUTPUT_KINDS = ("logits", "probabilities")
PARQUET_CORRECTED_SUFFIX = ".corrected.parquet"
#: rows of one streamed chunk of a Parquet batch
CHUNK_ROWS = 65536
#: how far a row of probabilities may sum from 1 (float32 logs round)
SUM_TOLERANCE = 1e-3


def default_class_names(k: int) -> tuple[str, ...]:
    return tuple(str(i) for i in range(k))


def check_class_names(names: Any, what: str, k: int | None = None) -> tuple[str, ...]:
    """Class names as a tuple of distinct non-empty strings (``k`` of them when given)."""
    if names is None or isinstance(names, (str, bytes)) or not isinstance(names, Sequence) or len(names) == 0:
        raise InputError(f"{what} has no class names (got {names!r}); give one name per class in the order of the "
                         "output columns, e.g. class_names=['legit', 'fraud'] (--class-names legit,fraud).")
    out = tuple(str(n) for n in names)
    if any(not n.strip() for n in out):
        raise InputError(f"{what}: class names must be non-empty, got {list(out)}; name every class.")
    dup = sorted({n for n in out if out.count(n) > 1})
    if dup:
        raise InputError(f"{what}: class names {dup} occur more than once; give each class its own name.")
    if k is not None and len(out) != k:
        raise InputError(f"{what} names {len(out)} classes ({', '.join(out)}) but the outputs have {k} columns; give "
                         "one name per output column, in column order.")
    return out


def metric_names(class_names: Sequence[str]) -> list[str]:
    """A metric-name-safe key per class (MLflow allows letters, digits and ``_-. `` and ``/``; ``/`` would nest, so it
    is replaced too), distinct: a name that collides after sanitising gets its index prefixed. Default names
    ("0".."k-1") are their own keys, so series of unnamed classes keep their names."""
    safe = [re.sub(r"[^A-Za-z0-9_\-. ]", "_", str(n)).strip() or f"class_{i}" for i, n in enumerate(class_names)]
    return [f"{i}_{s}" if safe.count(s) > 1 else s for i, s in enumerate(safe)]


@dataclass(frozen=True)
class OutputSpec:
    """What a prediction-log batch must hold: one output per class, of the declared kind."""

    class_names: tuple[str, ...]
    output_kind: str
    id_column: str | None = None

    def __post_init__(self):
        if self.output_kind not in OUTPUT_KINDS:
            raise InputError(f"output kind must be one of {OUTPUT_KINDS}, got {self.output_kind!r}.")
        object.__setattr__(self, "class_names", check_class_names(self.class_names, "the reference"))

    @property
    def n_classes(self) -> int:
        return len(self.class_names)


def batch_format(key: str) -> str:
    for suffix, name in FORMATS.items():
        if key.endswith(suffix):
            return name
    raise InputError(f"{key!r} is not a batch: batches end in {', '.join(FORMATS)}.")


def check_one_format(keys: Sequence[str], target: str) -> str:
    """The one format of the batches ``keys`` of ``target``; a mix is refused (the two would be read as different
    things)."""
    found: dict[str, list[str]] = {}
    for k in keys:
        found.setdefault(batch_format(k), []).append(k)
    if len(found) > 1:
        shown = "; ".join(f"{fmt}: {', '.join(ks[:3])}{' ...' if len(ks) > 3 else ''}" for fmt, ks in found.items())
        raise InputError(f"the new batches under {target} mix formats ({shown}); one target holds one format. Move "
                         "the batches of the other format to a target of their own.")
    return next(iter(found))


# -- reading -----------------------------------------------------------------------------------------------------------
def _parquet(source: bytes | str | Path, uri: str) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(pa.BufferReader(source) if isinstance(source, (bytes, bytearray, memoryview))
                              else str(source))
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"batch {uri} is not a readable Parquet file ({exc}); write it again with "
                          "pandas.DataFrame.to_parquet or pyarrow.parquet.write_table, and upload the whole file.") \
            from None


def _is_float_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) and \
        (pa.types.is_floating(t.value_type) or pa.types.is_integer(t.value_type))


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_decimal(t)


def _output_layout(schema: pa.Schema, spec: OutputSpec, uri: str) -> tuple[str, list[str]]:
    """("columns", class columns) or ("list", [the list column])."""
    names = list(schema.names)
    missing = [c for c in spec.class_names if c not in names]
    lists = [f.name for f in schema if _is_float_list(f.type)]
    floats = [f.name for f in schema if pa.types.is_floating(f.type)]
    want = ", ".join(spec.class_names)
    if not missing:
        extra = [c for c in floats if c not in spec.class_names and c.isdigit()]
        if extra and all(c.isdigit() for c in spec.class_names):
            raise InputError(f"batch {uri} has output columns for {len(spec.class_names) + len(extra)} classes "
                             f"({', '.join(spec.class_names + tuple(extra))}) but the reference has "
                             f"{spec.n_classes} ({want}); log the outputs of the model the reference was registered "
                             "for, or register a reference for this model.")
        bad = [c for c in spec.class_names if not _is_number(schema.field(c).type)]
        if bad:
            raise InputError(f"batch {uri}: class column(s) {bad} are of type "
                             f"{', '.join(str(schema.field(c).type) for c in bad)}, not numbers; write the model's "
                             f"{spec.output_kind} as float columns.")
        return "columns", list(spec.class_names)
    if len(lists) == 1 and not any(c in names for c in spec.class_names):
        return "list", lists
    near = {c: [n for n in names if n.strip().lower() == c.strip().lower()] for c in missing}
    renamed = "; ".join(f"{c!r} is there as {v[0]!r}" for c, v in near.items() if v)
    count = ""
    if not renamed and len(floats) != spec.n_classes and floats:
        count = (f" It has {len(floats)} float column(s) ({', '.join(floats[:12])}) for {spec.n_classes} classes: "
                 "the wrong number of classes, or outputs of another model.")
    return _raise(InputError(
        f"batch {uri} has no column for class(es) {', '.join(repr(c) for c in missing)} (its columns: "
        f"{', '.join(names[:20])}{' ...' if len(names) > 20 else ''})."
        + (f" Named differently: {renamed}." if renamed else "") + count
        + f" Write one float column per class named {want} (the reference's class names), or one list column "
          f"with {spec.n_classes} values per row, and rename or drop the others."))


def _raise(exc: Exception):
    raise exc


def _check_values(x: np.ndarray, spec: OutputSpec, uri: str, first_row: int, state: dict) -> None:
    finite = np.isfinite(x)
    if not finite.all():
        rows = np.flatnonzero(~finite.all(axis=1))
        raise InputError(f"batch {uri} has NaN or infinite outputs in {rows.size} row(s) of rows {first_row}.."
                         f"{first_row + len(x) - 1}, first row {first_row + int(rows[0])}; drop or fix those rows "
                         "(a NaN output means the model failed on that example) and write the batch again.")
    if spec.output_kind == "probabilities":
        lo, hi = float(x.min()), float(x.max())
        if lo < -1e-6 or hi > 1 + 1e-6:
            r = int(np.flatnonzero((x < -1e-6).any(axis=1) | (x > 1 + 1e-6).any(axis=1))[0])
            raise InputError(f"batch {uri} holds values outside [0, 1] (row {first_row + r}: "
                             f"{np.round(x[r], 4).tolist()}) but the reference declares probabilities: these look "
                             "like logits. Log softmax(logits) instead, or register the reference with outputs "
                             "'logits' (--outputs logits).")
        sums = x.sum(axis=1, dtype=np.float64)
        off = np.flatnonzero(np.abs(sums - 1) > SUM_TOLERANCE)
        if off.size:
            r = int(off[0])
            raise InputError(f"batch {uri} holds probabilities that do not sum to 1 in {off.size} row(s) (row "
                             f"{first_row + r} sums to {sums[r]:.4f}); log all {spec.n_classes} class "
                             "probabilities of each row (normalised, e.g. predict_proba), not a subset or "
                             "one-vs-rest scores.")
    else:
        if state.get("probability_like", True):
            sums = x.sum(axis=1, dtype=np.float64)
            state["probability_like"] = bool(x.min() >= 0 and x.max() <= 1 and np.all(np.abs(sums - 1) < 1e-4))


def iter_output_chunks(source: bytes | str | Path, fmt: str, spec: OutputSpec, uri: str, *,
                       chunk_rows: int = CHUNK_ROWS) -> Iterator[np.ndarray]:
    """The model outputs of a prediction-log batch, (rows, k) float32 chunks in order, each checked (shape and
    columns, finite values, the declared kind). ``source``: the batch's bytes or a local file."""
    state: dict = {}
    row = 0
    if fmt == "npy":
        try:
            arr = np.load(io.BytesIO(source), allow_pickle=False) if isinstance(source, (bytes, bytearray, memoryview)) \
                else np.load(str(source), allow_pickle=False, mmap_mode="r")
        except (ValueError, OSError, EOFError) as exc:
            raise FormatError(f"batch {uri} is not a readable .npy array ({exc}); write it with numpy.save.") \
                from None
        if arr.ndim != 2 or arr.shape[1] != spec.n_classes:
            raise InputError(f"batch {uri} has shape {arr.shape}, but the reference has {spec.n_classes} classes "
                             f"({', '.join(spec.class_names)}): write the model's outputs as an (n, "
                             f"{spec.n_classes}) array, one column per class in this order.")
        if arr.dtype.kind not in "fiu":
            raise InputError(f"batch {uri} has dtype {arr.dtype}; write the outputs as float32.")
        for i in range(0, len(arr), chunk_rows):
            with np.errstate(over="ignore"):
                x = np.ascontiguousarray(arr[i:i + chunk_rows], dtype=np.float32)
            _check_values(x, spec, uri, i, state)
            yield x
        row = len(arr)
    else:
        pf = _parquet(source, uri)
        layout, cols = _output_layout(pf.schema_arrow, spec, uri)
        for rb in pf.iter_batches(batch_size=chunk_rows, columns=cols):
            if layout == "columns":
                x = np.column_stack([rb.column(c).to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
                                     for c in cols]) if rb.num_rows else np.zeros((0, spec.n_classes), np.float32)
                if rb.num_rows and any(rb.column(c).null_count for c in cols):
                    nulls = [c for c in cols if rb.column(c).null_count]
                    raise InputError(f"batch {uri} has missing (null) outputs in column(s) {nulls}; drop or fix "
                                     "those rows and write the batch again.")
            else:
                x = _list_chunk(rb.column(0), spec, uri, row, cols[0])
            _check_values(x, spec, uri, row, state)
            row += len(x)
            yield x
    if row == 0:
        raise InputError(f"batch {uri} holds zero rows; delete it or put at least one row in it.")
    if spec.output_kind == "logits" and state.get("probability_like") and spec.n_classes > 1:
        raise InputError(f"batch {uri} holds rows that are all in [0, 1] and sum to 1 -- probabilities -- but the "
                         "reference declares logits; log the logits (decision scores) the reference was fit on, or "
                         "register the reference with outputs 'probabilities' (--outputs probabilities).")


def _list_chunk(col: pa.Array, spec: OutputSpec, uri: str, first_row: int, name: str) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if col.null_count:
        raise InputError(f"batch {uri} has missing (null) lists in column {name!r}; drop those rows.")
    if pa.types.is_fixed_size_list(col.type):
        sizes = np.full(len(col), col.type.list_size)
    else:
        offsets = col.offsets.to_numpy()
        sizes = np.diff(offsets)
    wrong = np.flatnonzero(sizes != spec.n_classes)
    if wrong.size:
        r = int(wrong[0])
        raise InputError(f"batch {uri}: column {name!r} holds {int(sizes[r])} values in row {first_row + r}, but the "
                         f"reference has {spec.n_classes} classes ({', '.join(spec.class_names)}); log one value per "
                         "class, or register a reference for this model.")
    return col.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, spec.n_classes)


def read_outputs(source, fmt: str, spec: OutputSpec, uri: str, *, chunk_rows: int = CHUNK_ROWS) -> np.ndarray:
    """All outputs of a prediction-log batch as one (n, k) float32 array (:func:`iter_output_chunks`)."""
    chunks = list(iter_output_chunks(source, fmt, spec, uri, chunk_rows=chunk_rows))
    return np.concatenate(chunks) if len(chunks) > 1 else chunks[0]


def read_ids(source, uri: str, id_column: str | None) -> pa.Array | None:
    """The id column of a Parquet batch (None without one); FormatError when it cannot be read."""
    if not id_column:
        return None
    pf = _parquet(source, uri)
    if id_column not in pf.schema_arrow.names:
        return None
    try:
        return pf.read(columns=[id_column]).column(0).combine_chunks()
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"batch {uri}: its id column {id_column!r} cannot be read ({' '.join(str(exc).split())}); "
                          "write the batch again.") from None


def id_bytes(source, uri: str, id_column: str | None) -> int:
    """About how many bytes the id column of a Parquet batch takes once read (its uncompressed size in the file's
    metadata; 0 without one)."""
    if not id_column:
        return 0
    pf = _parquet(source, uri)
    leaves = [j for j in range(len(pf.schema)) if pf.schema.column(j).path == id_column]
    meta = pf.metadata
    return sum(meta.row_group(i).column(j).total_uncompressed_size for i in range(meta.num_row_groups)
               for j in leaves)


def batch_rows(source: str | Path, fmt: str, uri: str) -> int:
    """The number of rows of a batch file, from its Parquet metadata or .npy header (nothing else is read)."""
    if fmt == "npy":
        try:
            arr = np.load(str(source), mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise FormatError(f"batch {uri} is not a readable .npy array ({exc}); write it with numpy.save.") \
                from None
        return int(arr.shape[0]) if arr.ndim else 0
    return int(_parquet(source, uri).metadata.num_rows)


def iter_ids(source, uri: str, id_column: str | None, *, chunk_rows: int = CHUNK_ROWS) -> Iterator[pa.Array | None]:
    """The id column of a Parquet batch in chunks of at most ``chunk_rows`` rows; an endless run of None without one."""
    pf = _parquet(source, uri) if id_column else None
    if pf is None or id_column not in pf.schema_arrow.names:
        while True:
            yield None
    for rb in pf.iter_batches(batch_size=chunk_rows, columns=[id_column]):
        yield rb.column(0)


def iter_feature_chunks(source, uri: str, columns: Sequence[str], *, chunk_rows: int = CHUNK_ROWS) \
        -> Iterator[np.ndarray]:
    """The model-input columns of a tabular Parquet batch, in the model's column order, as (rows, d) float32 chunks;
    the batch's columns are checked against ``columns`` (the model signature's input names) first."""
    pf = _parquet(source, uri)
    schema = pf.schema_arrow
    names = list(schema.names)
    missing = [c for c in columns if c not in names]
    if missing:
        near = {c: [n for n in names if n.strip().lower().replace("-", "_") == c.strip().lower().replace("-", "_")]
                for c in missing}
        renamed = "; ".join(f"{c!r} is there as {v[0]!r}" for c, v in near.items() if v)
        raise InputError(f"batch {uri} lacks the model's input column(s) {', '.join(repr(c) for c in missing[:10])}"
                         f"{' ...' if len(missing) > 10 else ''} ({len(missing)} of {len(columns)})."
                         + (f" Named differently: {renamed}." if renamed else "")
                         + " Write the features with the column names of the model's signature "
                           f"({', '.join(list(columns)[:8])}{' ...' if len(columns) > 8 else ''}).")
    bad = [c for c in columns if not _is_number(schema.field(c).type)]
    if bad:
        raise InputError(f"batch {uri}: input column(s) {bad[:5]} are not numeric "
                         f"({', '.join(str(schema.field(c).type) for c in bad[:5])}); write them as floats.")
    row = 0
    for rb in pf.iter_batches(batch_size=chunk_rows, columns=list(columns)):
        x = np.column_stack([rb.column(c).to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
                             for c in columns])
        finite = np.isfinite(x)
        if not finite.all():
            rows = np.flatnonzero(~finite.all(axis=1))
            raise InputError(f"batch {uri} has NaN, null or infinite inputs in {rows.size} row(s), first row "
                             f"{row + int(rows[0])}; drop or impute those rows and write the batch again.")
        row += len(x)
        yield x
    if row == 0:
        raise InputError(f"batch {uri} holds zero rows; delete it or put at least one row in it.")


def read_features(source, uri: str, columns: Sequence[str], *, chunk_rows: int = CHUNK_ROWS) -> np.ndarray:
    return np.concatenate(list(iter_feature_chunks(source, uri, columns, chunk_rows=chunk_rows)))


def check_segment_values(values: Sequence, *, column: str, batch: str) -> np.ndarray:
    """The segment values of one batch as an array of str; a value that is missing (None, NaN) or empty (blank
    after stripping) is refused.

    Raises:
        InputError: naming the batch, the column, how many rows lack a value and the first such row.
    """
    out = np.array(["" if v is None or (isinstance(v, float) and v != v) else str(v).strip() for v in values],
                   dtype=object)
    empty = np.flatnonzero(out == "")
    if empty.size:
        raise InputError(f"batch {batch}: segment column {column!r} is empty or missing in {empty.size} of {len(out)} "
                         f"row(s) (first row {int(empty[0])}); give every row a segment value (e.g. 'unknown') and "
                         "write the batch again, or run without segment_column (CLI: without --segment-column).")
    return out


def read_segments(source, uri: str, column: str) -> np.ndarray:
    """The segment value of every row of a Parquet batch (an array of str, in row order), read from ``column``
    (any type: numbers become their text).

    Raises:
        InputError: the batch has no such column (the message lists the columns it has), or some rows have no value
            (null or blank; :func:`check_segment_values`).
        FormatError: the batch is not a readable Parquet file.
    """
    import pyarrow.compute as pc

    pf = _parquet(source, uri)
    names = list(pf.schema_arrow.names)
    if column not in names:
        raise InputError(f"batch {uri} has no segment column {column!r}; its columns are "
                         f"{', '.join(repr(n) for n in names[:30])}{' ...' if len(names) > 30 else ''}. Pass one of "
                         "them as segment_column (CLI: --segment-column NAME), or write the column into the batch.")
    col = pf.read(columns=[column]).column(0)
    if pa.types.is_floating(col.type):          # a NaN is a missing value, not the segment "nan"
        col = pc.if_else(pc.is_nan(col), pa.scalar(None, col.type), col)
    text = pc.fill_null(pc.utf8_trim_whitespace(pc.cast(col, pa.string())), "")
    return check_segment_values(text.to_numpy(zero_copy_only=False), column=column, batch=uri)


# -- the reference -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LabelledOutputs:
    """The labelled holdout of a reference as read and checked: raw outputs (n, k), labels 0..k-1, class names, output
    kind (the holdout re-estimation assesses against, with calibrated outputs, is
    :class:`labelshift.inference.holdout.Holdout`)."""

    outputs: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]
    output_kind: str


def check_reference(outputs, labels, class_names, output_kind: str, what: str = "the holdout") -> LabelledOutputs:
    """Check a labelled holdout for a reference: finite (n, k) outputs of the declared kind, k named classes, labels
    (class names or indices 0..k-1) with at least one example of every class."""
    x = np.asarray(outputs, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 2:
        raise InputError(f"{what} outputs must be an (n, k) array with k >= 2 classes and several rows, got shape "
                         f"{x.shape}.")
    names = check_class_names(class_names, what, x.shape[1])
    spec = OutputSpec(names, output_kind)
    state: dict = {}
    _check_values(x.astype(np.float32), spec, what, 0, state)
    if output_kind == "logits" and state.get("probability_like"):
        raise InputError(f"{what} outputs are all in [0, 1] and sum to 1 per row -- probabilities -- but were "
                         "declared logits; declare them 'probabilities' (--outputs probabilities).")
    y = np.asarray(labels)
    if y.ndim != 1 or len(y) != len(x):
        raise InputError(f"{what} has {len(x)} rows of outputs but labels of shape {y.shape}; give one label per row.")
    if y.dtype.kind in "OUS":
        index = {n: i for i, n in enumerate(names)}
        unknown = sorted({str(v) for v in y.tolist()} - set(index))
        if unknown:
            raise InputError(f"{what} has labels {unknown[:5]} that are not class names ({', '.join(names)}); label "
                             "each row with one of the class names (or its index).")
        y = np.array([index[str(v)] for v in y.tolist()], dtype=np.int64)
    else:
        if y.dtype.kind == "f" and not np.all(np.isfinite(y) & (y == np.round(y))):
            raise InputError(f"{what} has labels that are not whole numbers; give class indices 0..{len(names) - 1} "
                             "or class names.")
        y = y.astype(np.int64)
        if y.min() < 0 or y.max() >= len(names):
            raise InputError(f"{what} has labels outside 0..{len(names) - 1} (min {y.min()}, max {y.max()}) for "
                             f"{len(names)} classes; give class indices in that range or class names.")
    counts = np.bincount(y, minlength=len(names))
    empty = [names[i] for i in np.flatnonzero(counts == 0)]
    if empty:
        raise InputError(f"{what} has no example of class(es) {', '.join(repr(c) for c in empty)} (of "
                         f"{len(names)}: {', '.join(names)}); the calibrator and the confusion matrix need every "
                         "class. Add labelled examples of each class to the holdout, or drop the class from the "
                         "model's outputs.")
    return LabelledOutputs(x, y, names, output_kind)


def read_holdout(path: str | Path, *, label_column: str, output_kind: str, class_names: Sequence[str] | None = None,
                 output_column: str | None = None) -> LabelledOutputs:
    """A labelled holdout from a Parquet file: the label column, and the outputs as one float column per class (the
    class names are the column names unless ``class_names`` picks them) or one list column (``class_names`` then
    required)."""
    uri = str(path)
    if not Path(path).is_file():
        raise InputError(f"holdout file {uri} does not exist; give the Parquet file of the labelled holdout's outputs.")
    pf = _parquet(path, uri)
    schema = pf.schema_arrow
    if label_column not in schema.names:
        raise InputError(f"holdout {uri} has no label column {label_column!r} (its columns: "
                         f"{', '.join(schema.names[:20])}); name it with --label-column.")
    table = pf.read()
    labels = table.column(label_column).to_numpy(zero_copy_only=False)
    lists = [f.name for f in schema if _is_float_list(f.type)]
    if output_column or (class_names is None and lists and not any(pa.types.is_floating(f.type) for f in schema)):
        col = output_column or lists[0]
        if class_names is None:
            raise InputError(f"holdout {uri} holds its outputs as one list column ({col!r}), which carries no class "
                             "names; give them with --class-names a,b,c (one per value, in order).")
        names = check_class_names(class_names, f"holdout {uri}")
        x = _list_chunk(table.column(col).combine_chunks(), OutputSpec(names, output_kind), uri, 0, col)
    else:
        if class_names is None:
            names = tuple(f.name for f in schema if pa.types.is_floating(f.type) and f.name != label_column)
            if not names:
                raise InputError(f"holdout {uri} has no float output columns; write one column per class (named as "
                                 "the class) or one list column with --class-names.")
        else:
            names = check_class_names(class_names, f"holdout {uri}")
            missing = [c for c in names if c not in schema.names]
            if missing:
                raise InputError(f"holdout {uri} has no column for class(es) {missing} (its columns: "
                                 f"{', '.join(schema.names[:20])}); name the output columns as the classes.")
        x = np.column_stack([table.column(c).to_numpy(zero_copy_only=False).astype(np.float64) for c in names])
    return check_reference(x, labels, names, output_kind, what=f"holdout {uri}")
