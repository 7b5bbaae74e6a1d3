"""Diagnostics of label shift estimates (Sections 5 and 6 of the paper).

* :func:`true_weights` and :func:`weight_mse` -- the error measure of Section 6: the mean over classes of
  (w_hat(y) - w(y))^2, with the true w from the empirical label frequencies of the sampled target set and of the
  source data.
* :func:`mlls_hessian` and :func:`hessian_min_eigenvalue` (re-exported from :mod:`labelshift.estimation.solvers`) -- the
  Hessian of the MLLS objective and its minimum eigenvalue sigma, which governs the error of MLLS (Section 5,
  eq. bound-main).
* :func:`confusion_condition` -- conditioning of a confusion matrix, the corresponding quantity for BBSE and RLLS.
* :func:`canonical_calibration_error` -- a binned estimate of the canonical calibration error (Section 2,
  definition "caliberrr").
* :func:`correct_predictions` and :func:`corrected_accuracy` -- predictions re-weighted to the target domain,
  p_t(y | x) proportional to w(y) f_y(x).

All functions are pure; those marked "batched" accept a leading batch axis.
"""
from __future__ import annotations

import numpy as np

from .._validation import as_float_array, check_labels, check_prior, check_probabilities
from ..errors import InputError
from .solvers import hessian_min_eigenvalue, mlls_hessian

__all__ = ["true_weights", "label_frequencies", "weight_mse", "mlls_hessian", "hessian_min_eigenvalue",
           "confusion_condition", "canonical_calibration_error", "correct_predictions", "corrected_accuracy"]


def label_frequencies(labels, n_classes: int) -> np.ndarray:
    """Empirical label frequencies, shape (k,) for (m,) labels or (S, k) for an (S, m) array or a list of sets.
    """
    if isinstance(labels, (list, tuple)) and len(labels) > 0 and np.ndim(labels[0]) == 1:
        return np.stack([label_frequencies(y, n_classes) for y in labels])
    y = np.asarray(labels)
    if y.ndim == 2:
        return np.stack([label_frequencies(row, n_classes) for row in y])
    y = check_labels(y, "labels", n_classes)
    return np.bincount(y, minlength=n_classes) / y.shape[0]


def true_weights(target_labels, source_prior, n_classes: int) -> np.ndarray:
    """The weights the estimates are scored against: w(y) = q_m(y) / p_s(y) (Section 6). Batched.

    Following the paper's protocol, q_m is the empirical label distribution of the *sampled* target set (not the
    prior it was drawn from), and ``source_prior`` should be the empirical label distribution of the source data
    the estimator saw (use :func:`label_frequencies` on the source labels), so that sampling noise in the class
    counts is not charged to the estimator.

    Args:
        target_labels: (m,) labels of one target set, or (S, m) / a list of S label arrays.
        source_prior: (k,) p_s(y), strictly positive.
        n_classes: k.

    Returns:
        (k,) or (S, k) true weights.
    """
    p_s = check_prior(source_prior, "source_prior", n_classes)
    return label_frequencies(target_labels, n_classes) / p_s


def weight_mse(estimated, true) -> np.ndarray:
    """Mean squared error of weights, averaged over classes (the last axis). Batched by broadcasting.

    ``weight_mse(w_hat, w)`` = mean_y (w_hat(y) - w(y))^2; with (S, k) inputs it returns (S,) values, and e.g.
    (S, n_methods, k) against (S, 1, k) gives (S, n_methods). Average the result over seeds for the paper's MSE.
    """
    a = as_float_array(estimated, "estimated", (1, 2, 3, 4))
    b = as_float_array(true, "true", (1, 2, 3, 4))
    if a.shape[-1] != b.shape[-1]:
        raise InputError(f"estimated has {a.shape[-1]} classes but true has {b.shape[-1]}; they must match.")
    try:
        d = a - b
    except ValueError:
        raise InputError(f"estimated {a.shape} and true {b.shape} weights do not broadcast together.") from None
    return np.mean(d * d, axis=-1)


def confusion_condition(confusion) -> tuple[float, float]:
    """(condition number, smallest singular value) of a k x k confusion matrix.

    BBSE solves C w = mu_t, so its error scales with 1 / sigma_min(C) (Lipton et al. 2018); the condition number
    sigma_max / sigma_min is the scale-free version (inf for a singular matrix). Pass the joint confusion matrix
    (entries summing to 1) to compare with the BBSE bounds.
    """
    C = as_float_array(confusion, "confusion", 2)
    if C.shape[0] != C.shape[1]:
        raise InputError(f"confusion must be square (k x k), got shape {C.shape}.")
    s = np.linalg.svd(C, compute_uv=False)
    smin, smax = float(s[-1]), float(s[0])
    cond = smax / smin if smin > 0 else float("inf")
    return cond, smin


def canonical_calibration_error(probs, labels, n_bins: int = 10, *, squared: bool = False,
                                debias: bool = False) -> float:
    """Binned estimate of the canonical calibration error (Section 2, definition "caliberrr"):
    E(f) = (E_s ||f(x) - f_c(x)||^2)^(1/2) with f_c(x) = P_s(y = . | f(x)), on labelled (source) data.

    The simplex is cut into cells by ``n_bins`` equal-width bins on each of the first k-1 coordinates of f(x); only
    occupied cells count, and E^2 ~= sum_B (n_B / n) ||ybar_B - fbar_B||_2^2 (cell means of the one-hot labels and
    of f). Binning biases it down, sampling up (a calibrated f scores about (occupied cells) / n); ``debias=True``
    removes the sampling term. The number of cells grows like n_bins^(k-1), so for many classes use few bins and
    many examples. The estimator and its two biases: ``docs/estimators.md`` ("The canonical calibration error").

    Args:
        probs: (n, k) predicted probabilities on labelled source data.
        labels: (n,) labels 0..k-1.
        n_bins: bins per coordinate.
        squared: return E^2 instead of E.
        debias: subtract the sampling variance (see above).
    """
    P = check_probabilities(probs, "probs", 2)
    n, k = P.shape
    y = check_labels(labels, "labels", k, n_rows=n)
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise InputError(f"n_bins must be a positive integer, got {n_bins!r}.")
    Y = np.zeros((n, k))
    Y[np.arange(n), y] = 1.0
    coords = np.clip(np.floor(P[:, : k - 1] * n_bins).astype(np.int64), 0, n_bins - 1)
    _, cell = np.unique(coords, axis=0, return_inverse=True)
    cell = cell.ravel()
    n_cells = int(cell.max()) + 1
    counts = np.bincount(cell, minlength=n_cells).astype(np.float64)
    Z = Y - P                                   # per-example residual y - f(x)
    sums = np.zeros((n_cells, k))
    np.add.at(sums, cell, Z)
    means = sums / counts[:, None]             # ybar_B - fbar_B
    per_cell = np.sum(means ** 2, axis=1)
    if debias:
        sq = np.zeros((n_cells, k))
        np.add.at(sq, cell, Z * Z)
        with np.errstate(invalid="ignore", divide="ignore"):
            var = (sq - counts[:, None] * means ** 2) / (counts[:, None] - 1.0)   # sample variance, ddof=1
            corr = np.where(counts > 1, var.sum(axis=1) / counts, 0.0)
        per_cell = per_cell - corr
    e2 = max(float(np.sum(counts * per_cell) / n), 0.0)
    return e2 if squared else float(np.sqrt(e2))


def _broadcast_weights(probs: np.ndarray, weights) -> np.ndarray:
    w = as_float_array(weights, "weights", (1, 2))
    if w.shape[-1] != probs.shape[-1]:
        raise InputError(f"weights have {w.shape[-1]} classes but probs have {probs.shape[-1]}.")
    if w.ndim == 2:
        if probs.ndim != 3 or w.shape[0] != probs.shape[0]:
            raise InputError(f"batched weights {w.shape} need probs of shape (S, m, k) with S = {w.shape[0]}, "
                             f"got {probs.shape}.")
        w = w[:, None, :]
    return np.clip(w, 0.0, None)


def correct_predictions(probs, weights) -> np.ndarray:
    """Target-domain posteriors p_t(y | x) proportional to w(y) f_y(x), rows renormalised (Saerens et al. 2002).

    Batched: probs (m, k) with weights (k,), or probs (S, m, k) with weights (k,) or (S, k). Negative weights
    (an unconstrained BBSE can return them) are clipped to 0. A row whose re-weighted mass is 0 (every class it
    supports has weight 0) is returned unchanged, since no re-weighting of it is defined.
    """
    P = check_probabilities(probs, "probs", (2, 3))
    w = _broadcast_weights(P, weights)
    Q = P * w
    s = Q.sum(axis=-1, keepdims=True)
    return np.where(s > 0, Q / np.where(s > 0, s, 1.0), P)


def corrected_accuracy(probs, weights, labels) -> np.ndarray | float:
    """Accuracy of argmax of :func:`correct_predictions` against ``labels`` ((m,) or (S, m)). Batched: returns a
    float for one set and (S,) for a batch."""
    Q = correct_predictions(probs, weights)
    y = np.asarray(labels)
    if y.shape != Q.shape[:-1]:
        raise InputError(f"labels have shape {y.shape} but probs have {Q.shape[:-1]} rows; they must match.")
    y = check_labels(y.ravel(), "labels", Q.shape[-1]).reshape(y.shape)
    acc = np.mean(np.argmax(Q, axis=-1) == y, axis=-1)
    return float(acc) if np.ndim(acc) == 0 else acc
