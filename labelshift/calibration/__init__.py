"""Calibrators: maps from a classifier's outputs (logits or probabilities) to calibrated probabilities p_s(y|x).

Fit on held-out labelled source outputs, then apply the same map to source and target outputs (Garg et al.,
NeurIPS 2020, Sections 4.2, 4.4, 6 and Appendix A).

* :class:`ConfusionMatrixCalibrator` (``CM``): p_s(y | argmax), eq. (cm-log) -- the predictor of MLLS-CM.
* :class:`BinningCalibrator`: p_s(y | bin), the aggregated predictor of Section 6 / Figure 2.
* :class:`TemperatureScaling` (``TS``), :class:`BCTS`, :class:`VectorScaling` (``VS``), :class:`NBVS`: the
  scaling maps of Guo et al. (2017) and Alexandari et al. (2020), fit by NLL with L-BFGS (Newton above 100 classes).
* :func:`nll`, :func:`expected_calibration_error`: NLL and top-label ECE for reporting before/after calibration.
* :func:`load_calibrator`: load any saved calibrator (JSON) by its ``kind``.
"""
from ._base import FORMAT_VERSION, PROB_FLOOR, Calibrator, load_calibrator, log_softmax, softmax
from .discrete import CM, BinningCalibrator, ConfusionMatrixCalibrator
from .metrics import expected_calibration_error, nll
from .scaling import BCTS, NBVS, TS, VS, NoBiasVectorScaling, TemperatureScaling, VectorScaling, \
    BiasCorrectedTemperatureScaling

__all__ = [
    "Calibrator", "load_calibrator", "FORMAT_VERSION", "PROB_FLOOR", "softmax", "log_softmax",
    "ConfusionMatrixCalibrator", "CM", "BinningCalibrator",
    "TemperatureScaling", "TS", "BCTS", "BiasCorrectedTemperatureScaling", "VectorScaling", "VS", "NBVS",
    "NoBiasVectorScaling",
    "nll", "expected_calibration_error",
]
