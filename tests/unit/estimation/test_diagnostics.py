"""Diagnostics (Sections 5 and 6): true weights, weight MSE, Hessian, conditioning, calibration error, correction."""
import numpy as np
import pytest

from labelshift.estimation import solvers
from labelshift.estimation.diagnostics import (canonical_calibration_error, confusion_condition, corrected_accuracy,
                                               correct_predictions, hessian_min_eigenvalue, label_frequencies,
                                               mlls_hessian, true_weights, weight_mse)
from labelshift.errors import InputError


def test_true_weights_hand_computed():
    # target frequencies [3/4, 1/4] over a source prior [1/2, 1/2]: w = [1.5, 0.5]
    np.testing.assert_allclose(true_weights([0, 0, 0, 1], [0.5, 0.5], 2), [1.5, 0.5])
    # frequencies [1/2, 1/4, 1/4] against the same source prior: w = 1 everywhere; a missing class gets w = 0
    np.testing.assert_allclose(true_weights([0, 2, 0, 1], [0.5, 0.25, 0.25], 3), [1.0, 1.0, 1.0])
    np.testing.assert_allclose(true_weights([1, 1], [0.25, 0.75], 2), [0.0, 4 / 3])


def test_true_weights_batched():
    W = true_weights(np.array([[0, 0, 0, 1], [1, 1, 1, 1]]), [0.5, 0.5], 2)
    np.testing.assert_allclose(W, [[1.5, 0.5], [0.0, 2.0]])
    # sets of different sizes as a list
    W = true_weights([np.array([0, 1]), np.array([0, 0, 0, 0, 1])], [0.5, 0.5], 2)
    np.testing.assert_allclose(W, [[1.0, 1.0], [1.6, 0.4]])
    np.testing.assert_allclose(label_frequencies([2, 2, 0], 3), [1 / 3, 0, 2 / 3])


def test_true_weights_bad_input():
    with pytest.raises(InputError, match="labels"):
        true_weights([0, 3], [0.5, 0.5], 2)
    with pytest.raises(InputError, match="source_prior"):
        true_weights([0, 1], [0.5, 0.0], 2)


def test_weight_mse_hand_computed_and_batched():
    # ((1 - 1.5)^2 + (2 - 0.5)^2) / 2 = (0.25 + 2.25) / 2 = 1.25
    assert weight_mse([1.0, 2.0], [1.5, 0.5]) == pytest.approx(1.25)
    est = np.array([[[1.0, 2.0], [1.5, 0.5], [0.0, 0.0]],
                    [[1.0, 1.0], [2.0, 0.0], [1.0, 3.0]]])            # (S=2, methods=3, k=2)
    true = np.array([[1.5, 0.5], [1.0, 1.0]])
    mse = weight_mse(est, true[:, None, :])
    np.testing.assert_allclose(mse, [[1.25, 0.0, (2.25 + 0.25) / 2], [0.0, 1.0, 2.0]])
    with pytest.raises(InputError, match="classes"):
        weight_mse([1.0, 2.0], [1.0, 1.0, 1.0])


def test_hessian_reexport_matches_definition():
    rng = np.random.default_rng(0)
    f = rng.dirichlet([1, 1, 1], size=50)
    w = np.array([0.5, 1.0, 1.5]) / (np.array([0.5, 1.0, 1.5]) @ np.full(3, 1 / 3))
    # -Hessian of (1/m) sum log f^T w is (1/m) sum f f^T / (f^T w)^2 (Section 5)
    direct = sum(np.outer(fi, fi) / (fi @ w) ** 2 for fi in f) / len(f)
    np.testing.assert_allclose(mlls_hessian(f, w), direct, rtol=1e-12)
    assert hessian_min_eigenvalue(f, w) == pytest.approx(np.linalg.eigvalsh(direct)[0], rel=1e-12)
    assert mlls_hessian is solvers.mlls_hessian


def test_confusion_condition():
    cond, smin = confusion_condition(np.diag([0.5, 0.25]))
    assert cond == pytest.approx(2.0) and smin == pytest.approx(0.25)
    cond, smin = confusion_condition([[0.25, 0.25], [0.25, 0.25]])   # rank one
    assert smin == pytest.approx(0.0, abs=1e-15)
    assert cond > 1e14
    with pytest.raises(InputError, match="square"):
        confusion_condition(np.ones((2, 3)))


def test_canonical_calibration_error_hand_computed():
    # one cell: mean label [3/4, 1/4], mean prediction [0.8, 0.2] -> E^2 = 2 * 0.05^2 = 0.005
    probs = np.tile([0.8, 0.2], (4, 1))
    labels = [0, 0, 0, 1]
    assert canonical_calibration_error(probs, labels, 10, squared=True) == pytest.approx(0.005)
    assert canonical_calibration_error(probs, labels, 10) == pytest.approx(np.sqrt(0.005))
    # binning bias: two miscalibrations of opposite sign in one cell cancel out
    probs = np.array([[0.6, 0.4], [0.6, 0.4], [0.9, 0.1], [0.9, 0.1]])
    labels = [0, 0, 0, 1]                       # cell-wise: 0.6 -> freq 1.0, 0.9 -> freq 0.5
    assert canonical_calibration_error(probs, labels, 2, squared=True) == pytest.approx(2 * (0.75 - 0.75) ** 2)
    assert canonical_calibration_error(probs, labels, 10, squared=True) == pytest.approx(
        0.5 * 2 * 0.4 ** 2 + 0.5 * 2 * 0.4 ** 2)


def test_canonical_calibration_error_statistics():
    rng = np.random.default_rng(1)
    n = 40_000
    p = rng.choice([0.2, 0.7], size=n)               # predictor with two values
    probs = np.stack([1 - p, p], axis=1)
    calibrated = (rng.random(n) < p).astype(int)     # y ~ Bernoulli(f_1): perfectly calibrated
    # plug-in is biased upward by about sum over the 2 cells of 2 p(1-p)/n; debiasing removes that. The debiased
    # estimate has std ~ sqrt(2) * 2 * sqrt(2 * 0.25 / n) * |E| ~ 0 at E = 0, so allow a few times the raw bias.
    raw = canonical_calibration_error(probs, calibrated, 10, squared=True)
    assert 0 <= raw < 10 * 4 * 0.25 / n
    assert canonical_calibration_error(probs, calibrated, 10, squared=True, debias=True) < 4 * 0.25 / n
    # miscalibrated: labels ~ Bernoulli(0.5) whatever f says: E^2 = 2 * (0.5 * 0.3^2 + 0.5 * 0.2^2) = 0.13.
    # Each cell's mean label has std sqrt(0.25 / 20000) = 0.0035; E^2 moves by 4 * 0.3 * 0.0035 = 0.004 per std.
    mis = (rng.random(n) < 0.5).astype(int)
    e2 = canonical_calibration_error(probs, mis, 10, squared=True, debias=True)
    assert abs(e2 - 0.13) < 0.02


def test_canonical_calibration_error_multiclass_runs():
    rng = np.random.default_rng(2)
    probs = rng.dirichlet([1, 1, 1], size=2000)
    labels = np.array([rng.choice(3, p=pi) for pi in probs])
    e = canonical_calibration_error(probs, labels, 4, debias=True)
    assert 0 <= e < 0.1          # calibrated by construction; 4^2 = 16 cells of ~125 points each


def test_correct_predictions_hand_computed():
    probs = np.array([[0.5, 0.5], [0.6, 0.4]])
    Q = correct_predictions(probs, [3.0, 1.0])
    np.testing.assert_allclose(Q, [[0.75, 0.25], [1.8 / 2.2, 0.4 / 2.2]])
    # a row whose re-weighted mass is 0 is returned unchanged; negative weights are clipped to 0
    Q = correct_predictions(np.array([[0.0, 1.0], [0.5, 0.5]]), [1.0, -0.2])
    np.testing.assert_allclose(Q, [[0.0, 1.0], [1.0, 0.0]])
    # batched: per-set weights
    B = correct_predictions(np.stack([probs, probs]), np.array([[3.0, 1.0], [1.0, 1.0]]))
    np.testing.assert_allclose(B[0], correct_predictions(probs, [3.0, 1.0]))
    np.testing.assert_allclose(B[1], probs)


def test_corrected_accuracy():
    probs = np.array([[0.6, 0.4], [0.4, 0.6]])
    assert corrected_accuracy(probs, [1.0, 1.0], [0, 0]) == 0.5
    # w = [2, 0.5]: second row becomes [0.8/1.1, 0.3/1.1] -> predicted 0
    assert corrected_accuracy(probs, [2.0, 0.5], [0, 0]) == 1.0
    acc = corrected_accuracy(np.stack([probs, probs]), np.array([[1.0, 1.0], [2.0, 0.5]]), np.zeros((2, 2), int))
    np.testing.assert_allclose(acc, [0.5, 1.0])
    with pytest.raises(InputError, match="labels"):
        corrected_accuracy(probs, [1.0, 1.0], [0, 0, 1])


def test_correction_with_true_weights_helps_under_shift():
    # Two Gaussians N(+-1, 1), source prior 1/2: p_s(y=0|x) = sigmoid(2x). Target p_t(y=1) = 0.1.
    # The Bayes rule for the target is argmax w_y f_y(x): its accuracy is P(correct) = 0.9 Phi(1 + ln(9)/2) +
    # 0.1 Phi(1 - ln(9)/2) = 0.930 vs 0.841 for the uncorrected rule; with m = 20000 each accuracy has std < 0.003.
    rng = np.random.default_rng(3)
    y = (rng.random(20_000) < 0.1).astype(int)
    x = np.where(y == 0, 1.0, -1.0) + rng.standard_normal(y.size)
    p0 = 1 / (1 + np.exp(-2 * x))
    probs = np.stack([p0, 1 - p0], axis=1)
    base = corrected_accuracy(probs, [1.0, 1.0], y)
    corr = corrected_accuracy(probs, [1.8, 0.2], y)
    assert abs(base - 0.8413) < 0.015 and abs(corr - 0.9299) < 0.015
