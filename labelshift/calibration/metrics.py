"""Calibration metrics for reporting before/after calibration: mean negative log-likelihood and top-label ECE."""
from __future__ import annotations

import numpy as np

from .._validation import check_labels, check_probabilities
from ..errors import InputError
from ._base import PROB_FLOOR


def nll(probs, labels) -> float:
    """Mean negative log-likelihood -(1/n) sum_i log p_i[y_i] of (n, k) probabilities for labels 0..k-1.

    A probability of exactly 0 for the true label (float32 underflow) is clipped to ``PROB_FLOOR`` = 1e-12, so
    one such row adds at most 27.6 / n instead of making the mean infinite; the same floor the scaling
    calibrators use on probability inputs.
    """
    p = check_probabilities(probs, "probs", 2)
    y = check_labels(labels, "labels", p.shape[1], n_rows=p.shape[0])
    return float(-np.mean(np.log(np.maximum(p[np.arange(p.shape[0]), y], PROB_FLOOR))))


def expected_calibration_error(probs, labels, n_bins: int = 15) -> float:
    """Top-label expected calibration error (Guo et al., ICML 2017).

    The confidence max_y p(y|x) is binned into ``n_bins`` equal-width bins on [0, 1], closed on the right
    ((j/B, (j+1)/B]); ECE = sum over bins of (n_bin / n) * |accuracy in the bin - mean confidence in the bin|.
    Accuracy compares argmax (ties to the lowest index) with the label.
    """
    p = check_probabilities(probs, "probs", 2)
    y = check_labels(labels, "labels", p.shape[1], n_rows=p.shape[0])
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise InputError(f"n_bins must be a positive integer, got {n_bins!r}.")
    conf = p.max(axis=1)
    correct = (p.argmax(axis=1) == y).astype(np.float64)
    inner = np.linspace(0.0, 1.0, n_bins + 1)[1:-1]
    b = np.searchsorted(inner, conf, side="left")
    gap = np.bincount(b, weights=correct - conf, minlength=n_bins)  # n_b * (accuracy - confidence)
    return float(np.sum(np.abs(gap)) / p.shape[0])
