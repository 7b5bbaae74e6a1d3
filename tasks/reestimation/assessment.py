"""The assessment of one re-estimation: :func:`labelshift.inference.report.assess_shift` on the scored target rows
against the loaded model's source holdout, as a Prefect task (:func:`estimate_shift`)."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from labelshift.inference.holdout import Holdout, Target
from labelshift.inference.report import ShiftReport, assess_shift
from labelshift.inference.settings import AssessmentSettings

__all__ = ["estimate_shift"]


@task(name="estimate-shift", cache_policy=NO_CACHE, persist_result=False)
def estimate_shift(holdout: Holdout, target: Target, settings: AssessmentSettings) -> ShiftReport:
    """:func:`labelshift.inference.report.assess_shift` of the pooled new rows (``target``: calibrated and raw
    outputs) against the model's holdout (``bundle.holdout``), with the run's settings."""
    return assess_shift(holdout, target, settings)
