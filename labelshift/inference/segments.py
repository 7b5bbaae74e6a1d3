"""Estimates per segment: the rows of a target split by the value of a segment column (a region, a channel, a customer
group), each segment assessed on its own rows against the one shared labelled holdout.

:func:`split_segments` groups row indices by segment value; :func:`check_segment_values` refuses rows without a
value; :class:`SegmentEstimate` is one segment's result -- the :class:`~labelshift.inference.report.ShiftReport` of
:func:`~labelshift.inference.report.assess_shift` on that segment's rows, or "too small" with its size when it has
fewer rows than the minimum (:data:`MIN_SEGMENT_SIZE`; why 200: ``docs/reestimation.md``, "Estimates per segment").
What sharing the holdout means for the segments' intervals is said there too.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .report import ShiftReport

__all__ = ["MIN_SEGMENT_SIZE", "SegmentEstimate", "check_segment_values", "split_segments"]

#: the fewest rows a segment is assessed on; smaller segments are reported as too small, with their size
MIN_SEGMENT_SIZE = 200


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


def split_segments(values: np.ndarray) -> dict[str, np.ndarray]:
    """Row indices (int64, ascending) of each segment, by segment value, the values in sorted order."""
    values = np.asarray(values, dtype=object)
    names, inverse = np.unique(values.astype(str), return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=len(names)))[:-1]
    return {str(n): rows.astype(np.int64) for n, rows in zip(names, np.split(order, bounds))}


@dataclass(frozen=True)
class SegmentEstimate:
    """One segment's result: its name, its number of rows, and the assessment of its rows (None when it has fewer
    than ``min_size`` rows: too small to assess; or when the assessment failed, with the ``error``)."""

    name: str
    n_rows: int
    min_size: int
    report: ShiftReport | None = None
    error: str | None = None

    @property
    def too_small(self) -> bool:
        return self.report is None and self.error is None

    def to_dict(self) -> dict:
        """A compact, JSON-ready record: name, rows, and either ``too_small`` or the verdict, the prior with its
        interval, the total variation, the tests' p-values and the expected accuracy with its interval."""
        base = {"name": self.name, "rows": self.n_rows, "too_small": self.too_small}
        if self.error is not None:
            return {**base, "verdict": "Failed", "reason": self.error}
        if self.report is None:
            return {**base, "verdict": "Too small",
                    "reason": f"{self.n_rows} rows, fewer than the minimum segment size {self.min_size}"}
        r = self.report
        lst = r.label_shift
        acc = r.accuracy
        return {**base, "verdict": str(r.verdict), "target_prior": r.target_prior.tolist(),
                "lower": r.interval.lower.tolist(), "upper": r.interval.upper.tolist(),
                "total_variation": float(r.total_variation), "no_shift_p_value": float(r.no_shift_test.p_value),
                "label_shift_p_value": None if lst is None else float(lst.p_value),
                "label_shift_ok": r.label_shift_ok, "trustworthy": bool(r.trustworthy),
                "accuracy": None if acc is None else
                {"expected": float(acc.expected), "lower": float(acc.lower), "upper": float(acc.upper)}}
