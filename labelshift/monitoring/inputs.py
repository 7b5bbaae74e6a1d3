"""An input batch (``NAME.npy`` of model inputs) read and checked before the model sees it.

:func:`load_batch` reads one batch of a target, checks that its content is the content listed, parses the ``.npy``
header without unpickling anything, and checks dtype, shape and values, each failure naming the batch and the fix.
The other formats (prediction logs, tabular inputs) are read by :mod:`labelshift.monitoring.batches`.
"""
from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Sequence

import numpy as np

from ..errors import FormatError, InputError
from ..storage import Store
from .layout import ChangedBatchError, TargetBatch

__all__ = ["load_batch"]

_FLOAT_SIZES = (2, 4, 8)  # float16, float32, float64


def _npy_header(data: bytes, uri: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """Shape, Fortran order, dtype and data offset from a .npy header, without reading (or unpickling) the data."""
    from numpy.lib import format as npy_format

    stream = io.BytesIO(data)
    try:
        version = npy_format.read_magic(stream)
    except ValueError as exc:
        raise FormatError(
            f"{uri} is not a .npy file ({exc}); write batches with numpy.save (an .npz archive, a pickle or a "
            "truncated upload cannot be read)."
        ) from None
    if version == (1, 0):
        read_header = npy_format.read_array_header_1_0
    elif version == (2, 0):
        read_header = npy_format.read_array_header_2_0
    else:  # 3.0 exists only for structured dtypes with non-ASCII field names
        raise InputError(
            f"{uri} uses .npy format version {version[0]}.{version[1]} (a structured dtype); save a plain float "
            "array instead: numpy.save(path, arr.astype(numpy.float32))."
        )
    try:
        shape, fortran_order, dtype = read_header(stream)
    except (ValueError, EOFError, SyntaxError) as exc:
        raise FormatError(f"{uri} has a corrupt .npy header ({exc}); write it again with numpy.save.") from None
    return tuple(int(n) for n in shape), bool(fortran_order), dtype, stream.tell()


def _check_dtype(dtype: np.dtype, uri: str) -> None:
    expected = "expected float32 (float16 and float64 are accepted and converted)"
    if dtype.kind == "f" and dtype.itemsize in _FLOAT_SIZES:
        return
    if dtype.hasobject:
        fix = ("object arrays hold pickled Python objects, which are never loaded; save a numeric array: "
               "numpy.save(path, numpy.asarray(arr, dtype=numpy.float32))")
    elif dtype.kind in "iub":
        fix = ("convert it with arr.astype(numpy.float32), after the same preprocessing the model was trained "
               "with (e.g. uint8 pixels scaled to [0, 1]), and save it again")
    elif dtype.kind == "c":
        fix = "complex values have no meaning as model input; save the real-valued features as float32"
    elif dtype.kind == "f":
        fix = "convert it with arr.astype(numpy.float32) and save it again"
    else:
        fix = "save a plain float array: numpy.save(path, arr.astype(numpy.float32))"
    raise InputError(f"batch {uri} has dtype {dtype} ({expected}): {fix}.")


def _check_shape(shape: tuple[int, ...], input_shape: tuple[int, ...] | None, uri: str) -> None:
    if len(shape) < 2 and input_shape is None:
        raise InputError(
            f"batch {uri} has shape {shape}; a batch is (n, *input shape) with one row per example, at least "
            "2-D. Save a single example as arr[None] and a 1-D feature column as arr[:, None]."
        )
    if input_shape is not None and (len(shape) == 0 or shape[1:] != input_shape):
        dims = ", ".join(str(d) for d in input_shape)
        expected = f"(n, {dims})" if dims else "(n,)"
        per_row = math.prod(input_shape)
        hint = ""
        if len(shape) > 1 and math.prod(shape[1:]) == per_row:
            hint = f" The sizes agree: save arr.reshape(-1, {dims}) instead."
        elif len(shape) == 1 and per_row > 1 and shape[0] % per_row == 0:
            hint = f" A 1-D array is a flattened example or batch: save arr.reshape(-1, {dims}) instead."
        raise InputError(
            f"batch {uri} has shape {shape}, but the model takes {expected}: one row per example of input shape "
            f"{input_shape}.{hint}"
        )
    if shape[0] == 0:
        raise InputError(f"batch {uri} holds zero rows (shape {shape}); delete it or put at least one example in it.")


def load_batch(store: Store, batch: TargetBatch, *, input_shape: Sequence[int] | None,
               max_rows: int | None = None) -> np.ndarray:
    """Read and check one batch; returns a C-contiguous float32 array of shape (n, *input_shape).

    Checks, in this order (each failure names the batch's URI and the fix; nothing is written):

    - the content is what was listed (checksum), else :class:`ChangedBatchError`;
    - it is a .npy file whose byte count matches its header, else :class:`FormatError` (garbage, truncated,
      .npz, pickle). Objects are never unpickled: ``allow_pickle=False`` and the dtype is checked from the header
      before any data is read;
    - dtype float16/float32/float64 (converted to float32), else :class:`InputError` naming the dtype found and
      how to convert (integers, bool, complex, object, strings, structured);
    - shape ``(n, *input_shape)`` with ``n >= 1`` (``input_shape=None``: any shape of at least 2 dimensions) and
      ``n <= max_rows`` when given, else :class:`InputError`;
    - every value finite after the conversion (float64 beyond float32's range becomes inf), else :class:`InputError`.
    """
    uri = store.url(batch.key)
    if input_shape is not None:
        try:
            input_shape = tuple(int(d) for d in input_shape)
        except (TypeError, ValueError):
            raise InputError(f"input_shape must be a tuple of integers like (1, 28, 28), got {input_shape!r}.") \
                from None
        if any(d < 1 for d in input_shape):
            raise InputError(f"input_shape must hold positive sizes, got {input_shape}.")
    if max_rows is not None and (not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows < 1):
        raise InputError(f"max_rows must be a positive integer or None, got {max_rows!r}.")
    data = store.get_bytes(batch.key)
    digest = hashlib.sha256(data).hexdigest()
    if digest != batch.checksum:
        raise ChangedBatchError(
            f"batch {uri} changed after this run listed it (listed sha256 {batch.checksum[:12]}..., read "
            f"{digest[:12]}...): it was replaced while the run was going. Run again; the new content is then "
            "listed and read together.",
            {batch.key: (batch.checksum, digest)},
        )
    shape, fortran_order, dtype, offset = _npy_header(data, uri)
    _check_dtype(dtype, uri)
    _check_shape(shape, input_shape, uri)
    if max_rows is not None and shape[0] > max_rows:
        raise InputError(
            f"batch {uri} has {shape[0]} rows, more than max_rows={max_rows}; split it into smaller batches "
            "(several NAME.npy files) or raise max_rows."
        )
    expected = offset + math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        state = "truncated" if len(data) < expected else "followed by extra bytes"
        raise FormatError(
            f"batch {uri} is {state}: its header promises {expected} bytes for shape {shape} of {dtype}, the "
            f"object has {len(data)}. Upload it again (numpy.save, then copy the whole file)."
        )
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:  # checked above; kept so no numpy error escapes unexplained
        raise FormatError(f"batch {uri} is not a readable .npy array ({exc}); write it again with numpy.save.") \
            from None
    with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf, reported just below
        out = np.ascontiguousarray(arr, dtype=np.float32)
    finite = np.isfinite(out)
    if not finite.all():
        bad_rows = np.flatnonzero(~finite.reshape(out.shape[0], -1).all(axis=1))
        raise InputError(
            f"batch {uri} has {out.size - int(np.count_nonzero(finite))} NaN or infinite value(s) (as float32; "
            f"float64 values beyond +-3.4e38 overflow) in {bad_rows.size} row(s), first row {int(bad_rows[0])}; "
            "remove or impute those rows and save the batch again."
        )
    return out
