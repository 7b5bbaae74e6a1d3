"""The statistical settings of one assessment of a target set: their defaults and bounds, declared once.

:class:`AssessmentSettings` is what :func:`labelshift.inference.report.assess_shift` takes, whole; it checks itself
when made (an :class:`~labelshift.errors.InputError` naming the setting and its range). Its bounds
(:data:`BOUNDS`) and defaults (:data:`DEFAULTS`) are also those of the ``reestimate`` flow's parameters, of
``labelshift estimate``'s options and of the deployment's form in the Prefect UI: :mod:`flows.params` builds its
fields from them, and the flow makes one :class:`AssessmentSettings` from its parameters, which travels whole to
the pooled target's assessment and every segment's.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..estimation.registry import REESTIMATION_ESTIMATORS, check_interval, check_methods
from .label_shift_test.holdout_noise import HOLDOUT_INFLATION

__all__ = ["AssessmentSettings", "Bound", "BOUNDS", "DEFAULTS", "check_setting"]


@dataclass(frozen=True)
class Bound:
    """The range of a numeric setting, in the names JSON Schema and pydantic use (``gt``, ``ge``, ``lt``, ``le``;
    None: no bound on that side)."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def contains(self, value: float) -> bool:
        return ((self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
                and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le))

    def checked(self, name: str, value, *, integer: bool = False, optional: bool = False):
        """``value`` of the setting ``name`` as an int (``integer``) or float inside this range (None stays None
        when ``optional``); InputError naming the setting and its range otherwise."""
        if value is None and optional:
            return None
        kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
        if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(float(value)) \
                or not self.contains(value):
            raise InputError(f"{name} must be {'an integer' if integer else 'a number'} {self.describe()}"
                             f"{' (or None)' if optional else ''}; got {value!r}.")
        return int(value) if integer else float(value)

    def constraints(self) -> dict[str, float]:
        """The bounds that are set, as keyword arguments (``Field(**bound.constraints())``)."""
        return {name: value for name, value in dataclasses.asdict(self).items() if value is not None}

    def describe(self) -> str:
        """The range in words, e.g. "strictly between 0 and 1", "from 20 to 10000", "at least 0"."""
        low, high = (self.gt if self.gt is not None else self.ge), (self.lt if self.lt is not None else self.le)
        if low is not None and high is not None:
            return (f"strictly between {low:g} and {high:g}" if self.gt is not None and self.lt is not None
                    else f"from {low:g} to {high:g}" + (" (both included)" if self.ge is not None and
                                                         self.le is not None else ""))
        if low is not None:
            return f"greater than {low:g}" if self.gt is not None else f"at least {low:g}"
        return f"less than {high:g}" if self.lt is not None else f"at most {high:g}"


#: the range of each numeric setting (a setting that may be None is checked only when given)
BOUNDS: dict[str, Bound] = {
    "level": Bound(gt=0.0, lt=1.0),
    "significance": Bound(gt=0.0, lt=0.5),
    "label_shift_significance": Bound(gt=0.0, lt=1.0),
    "n_bootstrap": Bound(ge=20, le=10_000),
    "seed": Bound(ge=0),
    "max_interval_width": Bound(gt=0.0),
    "label_shift_holdout_inflation": Bound(ge=1.0, le=10.0),
}
_INTEGERS = ("n_bootstrap", "seed")
_OPTIONAL = ("label_shift_significance", "max_interval_width")


@dataclass(frozen=True)
class AssessmentSettings:
    """How a target set is assessed (:func:`~labelshift.inference.report.assess_shift`).

    Attributes:
        estimator: the estimator of the target prior, a name of
            :data:`~labelshift.estimation.registry.REESTIMATION_ESTIMATORS` (MLLS, the paper's recommendation).
        cross_check: estimators of the same set run alongside for comparison (duplicates and ``estimator`` itself
            are skipped).
        interval: one of :data:`~labelshift.estimation.registry.INTERVALS`: ``"source-aware"`` (includes the error
            of the calibrator and p_s fit on the holdout, ``docs/intervals.md``), ``"fisher"`` (both need a
            likelihood estimator) or ``"bootstrap"``.
        level: confidence level of the intervals.
        significance: level of the no-shift test, and of the label-shift test unless ``label_shift_significance``
            is set.
        label_shift_significance: a level of its own for the label-shift test; None: ``significance``.
        n_bootstrap, seed: the bootstrap's resamples and seed (``interval="bootstrap"``).
        max_interval_width: the estimate is also untrustworthy when the interval on some w_y is wider; None: no
            width check.
        label_shift_holdout_inflation: kappa, the variance factor of the holdout's error in the label-shift test's
            reference law (``label_shift_test(..., holdout_inflation=)``): 2 (the default) keeps the test valid given
            the one holdout a model has; 1 is the test valid on average over holdouts, with more power against
            violations as small as the holdout's own error (``docs/label_shift_test.md``, "Given one holdout").
        label_shift_check: run the label-shift test (the flow always does; benchmarks time the rest without it).
        miscalibration_check: measure MLLS's miscalibration term and carry it into the interval and the verdict
            (:mod:`labelshift.inference.miscalibration`; MLLS only). False: the report is as before it existed.

    Raises:
        InputError: a setting out of its range (:data:`BOUNDS`), an unknown estimator or interval, or an interval
            the estimator cannot give.
    """

    estimator: str = "MLLS"
    cross_check: tuple[str, ...] = ("BBSE-soft",)
    interval: str = "source-aware"
    level: float = 0.95
    significance: float = 0.05
    label_shift_significance: float | None = None
    n_bootstrap: int = 200
    seed: int = 0
    max_interval_width: float | None = None
    label_shift_holdout_inflation: float = HOLDOUT_INFLATION
    label_shift_check: bool = True
    miscalibration_check: bool = True

    def __post_init__(self):
        check_interval(self.estimator, self.interval)
        given = self.cross_check
        cross_check = ((given,) if given else ()) if isinstance(given, str) else tuple(given or ())
        if cross_check:
            check_methods(list(dict.fromkeys(cross_check)), allowed=REESTIMATION_ESTIMATORS, argument="cross_check")
        object.__setattr__(self, "cross_check", cross_check)
        for name in BOUNDS:
            object.__setattr__(self, name, check_setting(name, getattr(self, name)))

    @property
    def label_shift_level(self) -> float:
        """The level the label-shift test is judged at."""
        return self.significance if self.label_shift_significance is None else self.label_shift_significance


def check_setting(name: str, value):
    """``value`` of the numeric setting ``name`` checked against its bound (:data:`BOUNDS`)."""
    return BOUNDS[name].checked(name, value, integer=name in _INTEGERS, optional=name in _OPTIONAL)


#: the defaults of every setting
DEFAULTS = AssessmentSettings()
