"""Input checks at the public boundary. Each failure raises :class:`~labelshift.errors.InputError`
naming the argument and the fix."""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from . import rows as _rows
from .errors import InputError
from .partitions import PartitionedRows, is_partitioned

#: rows of a probability matrix must sum to 1 within this tolerance (float32 outputs of a softmax drift ~1e-6)
ROW_SUM_TOL = 1e-4


def as_float_array(x, name: str, ndim: int | tuple[int, ...], check_finite: bool = True) -> np.ndarray:
    """Convert ``x`` to a float64 array with the given number of dimensions; reject NaN/inf and empties."""
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name} must be a numeric array; could not convert it ({exc}).") from None
    dims = (ndim,) if isinstance(ndim, int) else ndim
    if arr.ndim not in dims:
        want = " or ".join(f"{d}-D" for d in dims)
        raise InputError(f"{name} must be {want}, got an array of shape {arr.shape}.")
    if arr.size == 0:
        raise InputError(f"{name} is empty (shape {arr.shape}); pass at least one row and one class.")
    if check_finite:
        require_finite(arr, name)
    return arr


def as_float_rows(x, name: str) -> np.ndarray:
    """:func:`as_float_array` for an (m, k) array of raw outputs, except that a large float32 set
    (:func:`labelshift.rows.is_large`) is returned as it is (checked for NaN/inf in row blocks), not copied to
    float64; callers read it in row blocks (:func:`labelshift.rows.blocks`)."""
    if isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim == 2 and x.size and _rows.is_large(x):
        for sl in _rows.blocks(x.shape[0], width=x.shape[1]):
            require_finite(x[sl], name)
        return x
    return as_float_array(x, name, 2)


def require_finite(arr: np.ndarray, name: str) -> None:
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise InputError(f"{name} contains {bad} NaN or infinite value(s); remove or impute those rows first.")


#: rows per block of the fast probability check (~1 MB of float64 per block at k = 10, so each block is read
#: from memory once and checked twice in cache)
_BLOCK_BYTES = 2**20


def _valid_probability_rows(arr: np.ndarray) -> bool:
    """True when every entry is finite and >= 0 and every row sums to 1 within ROW_SUM_TOL.

    The fast path of :func:`check_probabilities` for large (batched) inputs: per block of rows, the minimum (NaN
    propagates into it, -inf fails it) and the row sums as a matrix-vector product with ones (+inf and NaN make
    them fail); about 10x cheaper than ``isfinite``, ``< 0`` and ``sum(axis=-1)`` over the whole array.
    """
    k = arr.shape[-1]
    flat = arr.reshape(-1, k)
    ones = np.ones(k)
    step = max(1, _BLOCK_BYTES // (8 * k))
    for a in range(0, flat.shape[0], step):
        block = flat[a:a + step]
        if not block.min() >= 0.0:
            return False
        dev = block @ ones
        dev -= 1.0
        if not (dev.max() <= ROW_SUM_TOL and dev.min() >= -ROW_SUM_TOL):
            return False
    return True


def check_probabilities(x, name: str, ndim: int | tuple[int, ...] = 2) -> np.ndarray:
    """A matrix (or batch) of probability vectors over classes in its last axis. A large single set
    (:func:`labelshift.rows.is_large`) given as float32 stays float32 (no float64 copy of it is made). Rows in
    partitions are checked where they live (:func:`check_partitioned`) and returned as they are."""
    if is_partitioned(x):
        return check_partitioned(x, name, ndim)
    if isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim in ((ndim,) if isinstance(ndim, int) else ndim) \
            and _rows.is_large(x):
        arr = x
    else:
        arr = as_float_array(x, name, ndim, check_finite=False)
    if _valid_probability_rows(arr):
        if arr.shape[-1] < 2:
            raise InputError(f"{name} has {arr.shape[-1]} class column(s); label shift needs at least 2 classes.")
        return arr
    # something is wrong: find what, in a fixed order, for the message
    require_finite(arr, name)
    if arr.shape[-1] < 2:
        raise InputError(f"{name} has {arr.shape[-1]} class column(s); label shift needs at least 2 classes.")
    if np.any(arr < 0):
        raise InputError(
            f"{name} has negative entries (min {arr.min():.3g}); it looks like logits, not probabilities. "
            "Apply a calibrator (e.g. BCTS().fit(logits, labels).predict_proba(logits)) or a softmax first."
        )
    sums = arr.sum(axis=-1)
    worst = float(np.max(np.abs(sums - 1.0)))
    if worst > ROW_SUM_TOL:
        raise InputError(
            f"rows of {name} must sum to 1 (worst row sums to {1.0 + worst:.4g} or {1.0 - worst:.4g}); "
            "they look like logits or unnormalised scores. Pass probabilities: apply a calibrator or a softmax first."
        )
    return arr


class RowCheck(NamedTuple):
    """What is wrong with some probability rows: entries that are NaN or infinite, entries below 0, the row sum
    furthest from 1 (its distance; NaN rows left out), and the number of rows."""

    nonfinite: int
    negative: int
    worst_sum: float
    rows: int


def row_check(P: np.ndarray) -> RowCheck:
    """:class:`RowCheck` of the (m, k) rows P, in row blocks (the per-partition function of
    :func:`check_partitioned`)."""
    nonfinite = negative = 0
    worst = 0.0
    for sl in _rows.blocks(P.shape[0], width=P.shape[1]):
        B = P[sl]
        finite = np.isfinite(B)
        nonfinite += int(B.size - np.count_nonzero(finite))
        negative += int(np.count_nonzero(B < 0))
        ok = finite.all(axis=1)
        if ok.any():
            worst = max(worst, float(np.max(np.abs(B[ok].sum(axis=1, dtype=np.float64) - 1.0))))
    return RowCheck(nonfinite, negative, worst, int(P.shape[0]))


def check_partitioned(x: PartitionedRows, name: str, ndim: int | tuple[int, ...] = 2) -> PartitionedRows:
    """Rows in partitions (:class:`labelshift.partitions.PartitionedRows`) checked as :func:`check_probabilities`
    checks an array, by one pass where the partitions live; an InputError names the first bad partition."""
    dims = (ndim,) if isinstance(ndim, int) else ndim
    if x.ndim not in dims:
        raise InputError(f"{name} must be {' or '.join(f'{d}-D' for d in dims)}, got rows in partitions of shape "
                         f"{x.shape}.")
    if x.dtype not in (np.float32, np.float64):
        raise InputError(f"{name}: the partitions hold {x.dtype} values; load them as float32 or float64 "
                         "probabilities.")
    if x.shape[-2] == 0:
        raise InputError(f"{name} is empty (its partitions hold no rows); pass at least one row.")
    if x.shape[-1] < 2:
        raise InputError(f"{name} has {x.shape[-1]} class column(s); label shift needs at least 2 classes.")
    for where, c in zip(x.names, x.run(row_check)):
        if c.nonfinite:
            raise InputError(f"{name}, {where}: {c.nonfinite} NaN or infinite value(s); remove or impute those rows "
                             "when the partition is made.")
        if c.negative:
            raise InputError(f"{name}, {where}: {c.negative} negative entries; it looks like logits, not "
                             "probabilities. Calibrate the partition's outputs (or apply a softmax) when it is made.")
        if c.worst_sum > ROW_SUM_TOL:
            raise InputError(f"{name}, {where}: rows must sum to 1 (one is off by {c.worst_sum:.4g}); they look like "
                             "logits or unnormalised scores. Calibrate the partition's outputs when it is made.")
    return x


def check_labels(y, name: str, n_classes: int, n_rows: int | None = None) -> np.ndarray:
    """Integer class labels in 0..n_classes-1."""
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise InputError(f"{name} must be 1-D integer labels, got shape {arr.shape}.")
    if arr.size == 0:
        raise InputError(f"{name} is empty; pass at least one labelled example per class.")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise InputError(f"{name} must hold integer class indices 0..{n_classes - 1}; found non-integers.")
        arr = arr.astype(np.int64)
    elif arr.dtype.kind not in "iu":
        raise InputError(f"{name} must hold integer class indices 0..{n_classes - 1}; got dtype {arr.dtype}.")
    arr = arr.astype(np.int64, copy=False)
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= n_classes:
        raise InputError(
            f"{name} has labels outside 0..{n_classes - 1} (found {lo}..{hi}); labels must be integer class "
            f"indices matching the {n_classes} probability columns."
        )
    if n_rows is not None and arr.shape[0] != n_rows:
        raise InputError(f"{name} has {arr.shape[0]} labels but the outputs have {n_rows} rows; they must match.")
    return arr


def check_all_classes_present(labels: np.ndarray, n_classes: int, name: str, why: str | None = None) -> np.ndarray:
    """Counts per class; every class needs at least one source example. ``why``: the error's text after the
    missing classes (why they are needed and the fix), for callers that need a class for their own reason."""
    counts = np.bincount(labels, minlength=n_classes)
    missing = np.flatnonzero(counts == 0)
    if missing.size:
        raise InputError(f"{name} has no example{'' if why else 's'} of class(es) {missing.tolist()}"
                         + (why or "; every class needs source examples to estimate p_s(y) and the confusion "
                                   "matrix. Add labelled data for those classes."))
    return counts


def check_prior(p, name: str, n_classes: int) -> np.ndarray:
    """A probability vector of length n_classes with strictly positive entries."""
    arr = as_float_array(p, name, 1)
    if arr.shape[0] != n_classes:
        raise InputError(f"{name} has {arr.shape[0]} entries but there are {n_classes} classes.")
    if np.any(arr <= 0):
        raise InputError(f"{name} must be strictly positive (a class with p_s(y)=0 has no defined weight).")
    if abs(arr.sum() - 1.0) > ROW_SUM_TOL:
        raise InputError(f"{name} must sum to 1, it sums to {arr.sum():.6g}.")
    return arr / arr.sum()


def check_target_batch(target, name: str, n_classes: int):
    """Normalise one target set or a batch of them.

    Accepts an (m, k) array (one set), an (S, m, k) array, or a list of (m_s, k) arrays of different m.
    Returns ``(probs, mask, is_batch)`` where ``probs`` is (S, M, k) padded with uniform rows, ``mask`` is
    (S, M) with 1.0 on real rows, and ``is_batch`` says whether the caller passed a batch. An array input needs
    no padding and is returned without a copy when it already is float64 (callers only read it).
    """
    if isinstance(target, Sequence) and not isinstance(target, (str, bytes)) and len(target) > 0 and \
            np.ndim(target[0]) == 2:
        sets = [check_probabilities(t, f"{name}[{i}]", 2) for i, t in enumerate(target)]
        is_batch = True
    else:
        arr = check_probabilities(target, name, (2, 3))
        is_batch = arr.ndim == 3
        if arr.shape[-1] != n_classes:
            where = f"{name}[0]" if is_batch else name
            raise InputError(
                f"{where} has {arr.shape[-1]} classes but the estimator was fit on {n_classes}; source and target "
                "outputs must come from the same classifier."
            )
        probs = arr if is_batch else (arr.batch() if is_partitioned(arr) else arr[None])
        return probs, np.ones(probs.shape[:2]), is_batch
    for i, s in enumerate(sets):
        if s.shape[1] != n_classes:
            raise InputError(
                f"{name}[{i}] has {s.shape[1]} classes but the estimator was fit on {n_classes}; source and target "
                "outputs must come from the same classifier."
            )
    m_max = max(s.shape[0] for s in sets)
    probs = np.full((len(sets), m_max, n_classes), 1.0 / n_classes)
    mask = np.zeros((len(sets), m_max))
    for i, s in enumerate(sets):
        probs[i, : s.shape[0]] = s
        mask[i, : s.shape[0]] = 1.0
    return probs, mask, is_batch


def check_level(level, name: str = "level", example: str = "e.g. 0.95") -> float:
    """``level`` as a float strictly between 0 and 1; InputError naming ``name`` (with ``example`` as the hint)
    otherwise (bools rejected)."""
    if isinstance(level, bool) or not isinstance(level, (int, float, np.floating)) or not 0.0 < level < 1.0:
        raise InputError(f"{name} must be a probability strictly between 0 and 1 ({example}), got {level!r}.")
    return float(level)


def check_given_weights(weights, n_classes: int, source_prior: np.ndarray, *, shape_fix: str, sign_fix: str,
                        sum_fix: str, sum_tol: float = 1e-6) -> np.ndarray:
    """Given weights w as a (k,) float array in W = {w >= 0, p_s^T w = 1} (negatives down to -1e-9 clipped to 0).

    Raises:
        InputError: a wrong length, a negative entry or p_s^T w off 1 by more than ``sum_tol``; each message ends
            with the caller's fix (``shape_fix``, ``sign_fix``, ``sum_fix``).
    """
    w = as_float_array(weights, "weights", 1)
    if w.shape[0] != n_classes:
        raise InputError(f"weights has {w.shape[0]} entries but target_probs has {n_classes} class columns; "
                         + shape_fix)
    if np.any(w < -1e-9):
        raise InputError(f"weights has negative entries (min {w.min():.3g}); " + sign_fix)
    w = np.maximum(w, 0.0)
    total = float(w @ source_prior)
    if abs(total - 1.0) > sum_tol:
        raise InputError(f"weights are not in W: sum_y w_y p_s(y) = {total:.8g}, not 1. " + sum_fix)
    return w
