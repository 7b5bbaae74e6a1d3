"""Comparing results computed along two paths (batched and whole, prepared and not): equal in every field but
floats, which may differ by the rounding of a different summation order -- never compared bit for bit."""
from __future__ import annotations

import math

import numpy as np

#: relative difference two float64 paths over at most ~10^6 terms may show: m eps64 = 2e-10 at m = 10^6, worst case
RTOL = 1e-9
#: absolute floor, for values that are 0 on one path and rounding noise on the other
ATOL = 1e-12


def assert_close_nested(a, b, path: str = "", rtol: float = RTOL, atol: float = ATOL) -> None:
    """``a`` and ``b`` (dicts, lists, arrays, numbers, strings, None) equal, floats within rtol/atol (NaN == NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_close_nested(a[key], b[key], f"{path}.{key}", rtol, atol)
    elif isinstance(a, (list, tuple, np.ndarray)) and isinstance(b, (list, tuple, np.ndarray)):
        x, y = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
        assert x.shape == y.shape, f"{path}: shapes {x.shape} != {y.shape}"
        for i, (u, v) in enumerate(zip(x.ravel().tolist(), y.ravel().tolist())):
            assert_close_nested(u, v, f"{path}[{i}]", rtol, atol)
    elif isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), f"{path}: {a!r} != {b!r}"
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rtol, abs_tol=atol), \
            f"{path}: {a!r} != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
