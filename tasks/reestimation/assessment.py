"""The assessment of one re-estimation: :func:`labelshift.inference.report.assess_shift` on the scored target rows
with the loaded model's source holdout (:func:`estimate_shift`, a Prefect task)."""
from __future__ import annotations

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from labelshift.inference.report import ShiftReport, assess_shift
from labelshift.inference.settings import DEFAULTS
from labelshift.rows import joined
from tasks.reestimation.model import ModelBundle

__all__ = ["estimate_shift", "holdout_arguments"]


@task(name="estimate-shift", cache_policy=NO_CACHE, persist_result=False)
def estimate_shift(bundle: ModelBundle, probs: list[np.ndarray], *, estimator: str = DEFAULTS.estimator,
                   cross_check: list[str] = DEFAULTS.cross_check, interval: str = DEFAULTS.interval,
                   level: float = DEFAULTS.level, significance: float = DEFAULTS.significance,
                   n_bootstrap: int = DEFAULTS.n_bootstrap, seed: int = DEFAULTS.seed,
                   max_interval_width: float | None = DEFAULTS.max_interval_width,
                   outputs: list[np.ndarray] | None = None, class_names=None,
                   label_shift_significance: float | None = DEFAULTS.label_shift_significance,
                   prepared_holdout=None) -> ShiftReport:
    """:func:`labelshift.inference.report.assess_shift` on the pooled batches, with the bundle's source holdout and
    prior (and, for the source-aware interval, the raw holdout outputs, the calibrator and the raw target
    ``outputs``); the batches are pooled without a copy when they are views of one array
    (:func:`labelshift.rows.joined`). The defaults are :data:`labelshift.inference.settings.DEFAULTS`;
    ``prepared_holdout``: the label-shift test's work on the holdout, made once for many calls (the segments)."""
    return assess_shift(target_probs=joined(probs), **holdout_arguments(bundle),
                        estimator=estimator, cross_check=cross_check, interval=interval, level=level,
                        significance=significance, n_bootstrap=n_bootstrap, seed=seed,
                        max_interval_width=max_interval_width,
                        target_outputs=None if outputs is None else joined(outputs),
                        class_names=class_names, label_shift_significance=label_shift_significance,
                        prepared_holdout=prepared_holdout)


def holdout_arguments(bundle: ModelBundle) -> dict:
    """The keyword arguments of :func:`~labelshift.inference.report.assess_shift` that the bundle gives: its source
    holdout (calibrated and raw outputs, labels), prior and calibrator."""
    return {"source_probs": bundle.source_probs, "source_labels": bundle.source_labels,
            "source_prior": bundle.source_prior, "source_outputs": bundle.source_outputs,
            "calibrator": bundle.calibrator}
