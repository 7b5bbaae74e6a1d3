"""The statistical settings of one assessment of a target set, and their defaults, defined once.

:func:`labelshift.inference.report.assess_shift` takes its defaults from :data:`DEFAULTS`; so do the ``reestimate``
flow, its command-line options, its form in the Prefect UI (all three through
:class:`flows.params.ReestimateParameters`, which adds the bounds and descriptions) and the ``estimate-shift`` task.
``tests/test_parameter_drift.py`` fails when any of them drifts from here.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AssessmentSettings", "DEFAULTS"]


@dataclass(frozen=True)
class AssessmentSettings:
    """How a target set is assessed (the keyword arguments of :func:`~labelshift.inference.report.assess_shift`
    of the same names, which documents each).

    Attributes:
        estimator: the estimator of the target prior (MLLS, the paper's recommendation).
        cross_check: estimators run alongside for comparison.
        interval: ``"source-aware"`` (includes the error of the calibrator and p_s fit on the holdout,
            ``docs/intervals.md``), ``"fisher"`` or ``"bootstrap"``.
        level: confidence level of the intervals.
        significance: level of the no-shift test, and of the label-shift test unless
            ``label_shift_significance`` is set.
        label_shift_significance: a level of its own for the label-shift test; None: ``significance``.
        n_bootstrap, seed: the bootstrap's resamples and seed (``interval="bootstrap"``).
        max_interval_width: the estimate is also untrustworthy when the interval on some w_y is wider; None: no
            width check.
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


#: the defaults of every setting
DEFAULTS = AssessmentSettings()
