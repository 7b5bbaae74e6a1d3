"""labelshift: label shift estimation and correction after Garg, Wu, Balakrishnan & Lipton,
"A Unified View of Label Shift Estimation" (NeurIPS 2020).

The public API::

    from labelshift import BCTS, MLLS
    cal = BCTS().fit(valid_logits, valid_labels)
    est = MLLS().fit(cal.predict_proba(valid_logits), valid_labels)
    res = est.estimate(cal.predict_proba(target_logits))     # res.weights, res.target_prior

The assessment of a target set for monitoring -- estimate, interval, no-shift test, identifiability -- is
``labelshift.assess_shift(Holdout(...), Target(...), AssessmentSettings(...))`` (a :class:`ShiftReport`). Estimators (``labelshift.estimation.estimators``; by name,
``labelshift.estimation.registry``), calibrators (``labelshift.calibration``), shift simulation
(``labelshift.experiments.shift``), diagnostics (``labelshift.estimation.diagnostics``) and the paper's two-Gaussian
experiments (``labelshift.experiments.gaussian``). Errors a user can cause raise :class:`LabelShiftError` subclasses.
"""
from .estimation.base import Estimate, LabelShiftEstimator
from .calibration import (BCTS, NBVS, TS, VS, BinningCalibrator, ConfusionMatrixCalibrator, TemperatureScaling,
                          VectorScaling, expected_calibration_error, load_calibrator, nll)
from .errors import (CredentialsError, FormatError, IllConditionedError, IllConditionedWarning, InputError,
                     LabelShiftError, NotFittedError, ObjectNotFoundError, ServiceUnavailableError, StorageError)
from .estimation.estimators import BBSE, MLLS, MLLSCM, PCC, RLLS, MLLSBinned
from .inference.holdout import Holdout, Target
from .inference.report import ShiftReport, assess_shift
from .inference.settings import AssessmentSettings

__version__ = "0.1.0"

__all__ = [
    "BBSE", "RLLS", "MLLS", "MLLSCM", "MLLSBinned", "PCC", "Estimate", "LabelShiftEstimator",
    "ShiftReport", "assess_shift", "Holdout", "Target", "AssessmentSettings",
    "TS", "TemperatureScaling", "BCTS", "VS", "VectorScaling", "NBVS", "ConfusionMatrixCalibrator",
    "BinningCalibrator", "load_calibrator", "nll", "expected_calibration_error",
    "LabelShiftError", "InputError", "NotFittedError", "IllConditionedError", "IllConditionedWarning",
    "FormatError", "StorageError", "ObjectNotFoundError", "CredentialsError", "ServiceUnavailableError",
]
