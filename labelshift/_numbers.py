"""Numbers to and from JSON: JSON has no NaN or infinity, so the domain's results write them as null."""
from __future__ import annotations

import math

import numpy as np


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
