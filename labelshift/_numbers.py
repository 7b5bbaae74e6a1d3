"""Numbers to and from JSON: JSON has no NaN or infinity, so the domain's results write them as null; and the dicts
that the results' ``to_dict`` wrote, read back."""
from __future__ import annotations

import math

import numpy as np

from .errors import FormatError


def finite_or_none(x) -> float | None:
    """A JSON-able float: non-finite values (nan for "not defined", inf) become None."""
    x = float(x)
    return x if math.isfinite(x) else None


def nan_as_none(x) -> float | None:
    """A numpy scalar as a plain Python float; NaN as None (infinities kept)."""
    x = float(x)
    return None if np.isnan(x) else x


def none_as_nan(x) -> float:
    """A number read back from JSON: None (written for nan) is nan again."""
    return math.nan if x is None else float(x)


def finite_list(a) -> list:
    """An array as a flat JSON-able list, non-finite entries as None (:func:`finite_or_none`)."""
    return [finite_or_none(v) for v in np.asarray(a, dtype=np.float64).ravel()]


def json_value(v):
    """A value made JSON-able: numpy scalars and arrays as Python numbers and lists, non-finite floats as None,
    lists, tuples and dicts converted entry by entry (dict keys as strings); anything else unchanged."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return finite_or_none(v)
    if isinstance(v, np.ndarray):
        return [json_value(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        return [json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): json_value(x) for k, x in v.items()}
    return v


def nan_array(values) -> np.ndarray:
    """A float64 array from a list read back from JSON, None as nan (:func:`none_as_nan`)."""
    return np.array([none_as_nan(v) for v in values], dtype=np.float64)


def written_dict(d, name: str, keys: tuple[str, ...]) -> dict:
    """``d`` if it is a dict with ``keys``; FormatError naming what is missing otherwise."""
    if not isinstance(d, dict):
        raise FormatError(f"{name} must be a dict as written by to_dict(), got {type(d).__name__}.")
    missing = [k for k in keys if k not in d]
    if missing:
        raise FormatError(f"{name} lacks {', '.join(missing)}; pass the dict that to_dict() wrote.")
    return d
