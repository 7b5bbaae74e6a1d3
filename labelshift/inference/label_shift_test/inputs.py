"""The checked inputs of :func:`~labelshift.inference.label_shift_test.label_shift_test`: shapes, the target's size, the
method and calibration, the bootstrap's draws and seed, and given MLLS weights checked for optimality."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ... import rows as _rows
from ..._validation import check_given_weights, check_labels, check_prior, check_probabilities
from ...errors import InputError
from ...estimation.solvers import mlls_newton
from ...partitions import is_partitioned
from ..mlls_inputs import certified_weights
from .holdout import check_holdout_size, check_int, check_log_odds, class_rows
from . import holdout_noise
#: ... and target sets smaller than this
MIN_TARGET = 50

# |p_s^T w - 1| above this: the weights are not in W
_SUM_TOL = 1e-6

#: the two forms of the test
METHODS = ("likelihood-ratio", "wald")
#: the reference distributions of the likelihood ratio: a parametric bootstrap from the fitted null, or chi^2
CALIBRATIONS = ("bootstrap", "chi2")
#: default number of bootstrap draws
BOOTSTRAP_DRAWS = 200


def _mlls_weights(P: np.ndarray, p: np.ndarray, weights) -> np.ndarray:
    k = P.shape[1]
    if weights is None:
        return np.maximum(mlls_newton(P, p).weights, 0.0)
    w = check_given_weights(
        weights, k, p, sum_tol=_SUM_TOL,
        shape_fix="pass the MLLS weights estimated on these target_probs (or weights=None to solve MLLS here).",
        sign_fix="the test needs the MLLS estimate, which lies in W = {w >= 0, sum_y w_y p_s(y) = 1}. Pass MLLS "
                 "weights or weights=None.",
        sum_fix="Pass the MLLS weights estimated with the holdout's class frequencies as source prior "
                "(MLLS().fit(holdout_probs, holdout_labels)), or weights=None to solve MLLS here.")
    if not _rows_positive(P, w):
        raise InputError("weights give zero likelihood to some target rows (f_i^T w = 0): they are not the MLLS "
                         "estimate for these target_probs. Pass weights=None to solve MLLS here.")
    return certified_weights(P, w, p, "the null covariance is derived at the maximum. Pass "
                             "MLLS().fit(holdout_probs, holdout_labels).estimate(target_probs).weights, or "
                             "weights=None.")


def _rows_positive(P: np.ndarray, w: np.ndarray) -> bool:
    """Whether f_i^T w > 0 on every row (a large set in row blocks, without a float64 copy of it; rows in partitions
    by the count of such rows in each, :func:`labelshift.rows.mlls_total`)."""
    if is_partitioned(P):
        return _rows.mlls_total(P, w).dead == 0
    if not _rows.is_large(P):
        return not np.any(P @ w <= 0)
    return all(not np.any(P[sl].astype(np.float64) @ w <= 0) for sl in _rows.blocks(P.shape[0], width=P.shape[1]))


class TestInputs(NamedTuple):
    """The checked inputs of :func:`label_shift_test`."""
    Ph: np.ndarray              # (n, k) calibrated holdout outputs
    y: np.ndarray               # (n,) holdout labels
    Pt: np.ndarray              # (m, k) calibrated target outputs, or rows in partitions (PartitionedRows)
    n_y: np.ndarray             # (k,) holdout rows per class
    p: np.ndarray               # (k,) the source prior
    w_given: np.ndarray | None  # the given MLLS weights (checked), or None
    min_region_rows: int
    max_confidence_bins: int
    bootstrap_draws: int
    seed: int
    log_odds: bool
    holdout_inflation: float | None = 1.0  # a fixed kappa of holdout_noise, or None: derived per class


def test_inputs(holdout_probs, holdout_labels, target_probs, weights, source_prior, min_region_rows,
                 max_confidence_bins, class_names, method, calibration, bootstrap_draws, seed,
                 log_odds, holdout_inflation=None) -> TestInputs:
    """The arguments of :func:`label_shift_test` checked (InputError as documented there)."""
    Ph = check_probabilities(holdout_probs, "holdout_probs", 2)
    n, k = Ph.shape
    Pt = check_probabilities(target_probs, "target_probs", 2)
    m = Pt.shape[0]
    if Pt.shape[1] != k:
        raise InputError(f"target_probs has {Pt.shape[1]} class columns but holdout_probs has {k}; both must be the "
                         "calibrated outputs of the same classifier (same classes, same order).")
    y = check_labels(holdout_labels, "holdout_labels", k, n_rows=n)
    min_region_rows = check_int(min_region_rows, "min_region_rows", 1)
    max_confidence_bins = check_int(max_confidence_bins, "max_confidence_bins", 1)
    if class_names is not None and len(class_names) != k:
        raise InputError(f"class_names has {len(class_names)} entries but there are {k} classes.")
    check_holdout_size(n)
    if m < MIN_TARGET:
        raise InputError(f"target_probs has m = {m} rows, fewer than MIN_TARGET = {MIN_TARGET}; test a larger "
                         "target batch (or several batches together).")
    n_y = class_rows(y, k)
    if method not in METHODS:
        raise InputError(f"method must be one of {METHODS}, got {method!r}.")
    if calibration not in CALIBRATIONS:
        raise InputError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}.")
    bootstrap_draws = check_int(bootstrap_draws, "bootstrap_draws", 19)
    log_odds = check_log_odds(log_odds, k)
    seed = check_int(seed, "seed", 0)
    holdout_inflation = _check_inflation(holdout_inflation)
    p = n_y / n if source_prior is None else check_prior(source_prior, "source_prior", k)
    w_given = None if weights is None else _mlls_weights(Pt, p, weights)
    return TestInputs(Ph=Ph, y=y, Pt=Pt, n_y=n_y, p=p, w_given=w_given, min_region_rows=min_region_rows,
                       max_confidence_bins=max_confidence_bins, bootstrap_draws=bootstrap_draws, seed=seed,
                       log_odds=log_odds, holdout_inflation=holdout_inflation)


def _check_inflation(value) -> float | None:
    """``holdout_inflation`` as a float >= 1, or None for kappa derived per class (holdout_noise.class_inflation):
    ``"derived"`` gives None, None reads holdout_noise.HOLDOUT_INFLATION at each call (itself a number or None);
    InputError otherwise."""
    if value is None:
        value = holdout_noise.HOLDOUT_INFLATION
    if value is None or (isinstance(value, str) and value == "derived"):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value) or value < 1.0:
        raise InputError(f"holdout_inflation must be a finite number >= 1 (1: the holdout's error drawn as it is, "
                         f"the law averaged over holdouts) or 'derived' (kappa per class from the holdout's share "
                         f"of the variance), got {value!r}.")
    return float(value)
