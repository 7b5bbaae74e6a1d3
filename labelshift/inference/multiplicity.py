"""Many tests in one run: p-values adjusted over a family of tests, so that the run's error is controlled rather
than each test's alone (issue 29). A target split into S segments runs each segment's label-shift test and no-shift
test; read at the single-test level, about S x level of the truly label-shifted segments are called "Not label
shift" by chance in every run.

* :func:`holm` -- Holm (1979), step-down: controls the family-wise error rate (the chance of *any* false rejection
  in the run) at the level, whatever the dependence between the tests. The default for segments
  (:data:`SEGMENT_CORRECTION`): segments share one labelled holdout, and the sign of the dependence it creates is
  not guaranteed (``docs/reestimation.md``, "Estimates per segment").
* :func:`benjamini_hochberg` -- Benjamini & Hochberg (1995), step-up: controls the false discovery rate (the
  expected share of false ones among the rejections) at the level for independent tests and under positive
  regression dependence (PRDS; Benjamini & Yekutieli 2001). Rejects more when many hypotheses are false.

An adjusted p-value is the smallest level at which the procedure rejects that test, so a test is rejected at level
alpha exactly when its adjusted p-value is below alpha (the strict ``<`` of the tests' own ``rejects``).
Non-finite p-values (a test that gave none) are left out of the family and come back as NaN.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError

__all__ = ["CORRECTIONS", "SEGMENT_CORRECTION", "AdjustedPValue", "adjust_p_values", "benjamini_hochberg",
           "check_correction", "correction_label", "holm"]

#: the corrections over a family of tests: Holm (family-wise error), Benjamini-Hochberg (false discovery rate), none
CORRECTIONS: tuple[str, ...] = ("holm", "bh", "none")
#: the correction of the segments' tests by default: Holm (why: ``docs/reestimation.md``, "Many segments, few false
#: alarms")
SEGMENT_CORRECTION = "holm"
_LABELS = {"holm": "Holm", "bh": "Benjamini-Hochberg", "none": "unadjusted"}


def check_correction(method) -> str:
    """``method`` if it is one of :data:`CORRECTIONS`; InputError naming them otherwise."""
    if method not in CORRECTIONS:
        raise InputError(f"segment correction must be one of {', '.join(map(repr, CORRECTIONS))} (Holm: family-wise "
                         f"error; bh: Benjamini-Hochberg false discovery rate; none: each test at its own level), "
                         f"got {method!r}.")
    return method


def correction_label(method: str) -> str:
    """The correction's name for people: "Holm", "Benjamini-Hochberg" or "unadjusted"."""
    return _LABELS[check_correction(method)]


def _checked(p_values) -> tuple[np.ndarray, np.ndarray]:
    """The p-values as a float array and the mask of the finite ones (the family); InputError when one lies
    outside [0, 1]."""
    p = np.asarray(p_values, dtype=np.float64).reshape(-1)
    finite = np.isfinite(p)
    bad = finite & ((p < 0.0) | (p > 1.0))
    if bad.any():
        raise InputError(f"p-values must lie in [0, 1] (NaN for a test that gave none); got {float(p[bad][0])!r} at "
                         f"position {int(np.flatnonzero(bad)[0])}.")
    return p, finite


def _stepwise(p_values: Sequence[float], adjust) -> np.ndarray:
    """The finite p-values sorted, ``adjust(sorted, S)`` applied, capped at 1 and put back in place; NaN where
    the p-value was not finite."""
    p, finite = _checked(p_values)
    out = np.full(p.shape, np.nan)
    q = p[finite]
    order = np.argsort(q, kind="stable")
    adjusted = np.empty_like(q)
    adjusted[order] = np.minimum(1.0, adjust(q[order], len(q)))
    out[finite] = adjusted
    return out


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values: with the S finite p-values sorted, p_(1) <= ... <= p_(S),
    adj_(i) = min(1, max_{j <= i} (S - j + 1) p_(j)). Valid under any dependence."""
    return _stepwise(p_values, lambda q, s: np.maximum.accumulate((s - np.arange(s)) * q))


def benjamini_hochberg(p_values: Sequence[float]) -> np.ndarray:
    """Benjamini-Hochberg step-up adjusted p-values: with the S finite p-values sorted,
    adj_(i) = min(1, min_{j >= i} S p_(j) / j). Controls the false discovery rate for independent or positively
    dependent (PRDS) tests."""
    return _stepwise(p_values, lambda q, s: np.minimum.accumulate((s / np.arange(1, s + 1) * q)[::-1])[::-1])


def adjust_p_values(p_values: Sequence[float], method: str) -> np.ndarray:
    """The p-values adjusted over their family by ``method`` (:data:`CORRECTIONS`); ``"none"`` returns them as
    they are (as floats; non-finite ones as NaN)."""
    method = check_correction(method)
    if method == "holm":
        return holm(p_values)
    if method == "bh":
        return benjamini_hochberg(p_values)
    p, finite = _checked(p_values)
    return np.where(finite, p, np.nan)


@dataclass(frozen=True)
class AdjustedPValue:
    """One test's p-value and its value adjusted over the family of tests it was read with.

    Attributes:
        p_value: the test's own p-value (what a run on this target alone reports).
        adjusted: adjusted over the family by ``method`` (equal to ``p_value`` with ``"none"``).
        method: one of :data:`CORRECTIONS`.
        family: how many tests the family held (those with a finite p-value).
        level: the level the test is judged at.
    """

    p_value: float
    adjusted: float
    method: str
    family: int
    level: float

    @property
    def rejects(self) -> bool:
        """The test rejects after the adjustment: adjusted p-value < level."""
        return bool(self.adjusted < self.level)

    def describe(self, unit: str = "segments") -> str:
        """E.g. "p = 0.004, Holm-adjusted over 100 segments 0.31"; "p = 0.004" without a correction."""
        if self.method == "none":
            return f"p = {self.p_value:.3g}"
        return f"p = {self.p_value:.3g}, {correction_label(self.method)}-adjusted over {self.family} {unit} " \
               f"{self.adjusted:.3g}"
