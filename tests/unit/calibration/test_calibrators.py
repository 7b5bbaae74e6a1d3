"""Tests of labelshift.calibration: scaling calibrators (TS, BCTS, VS, NBVS), the confusion-matrix and binning
calibrators, the NLL/ECE metrics, JSON persistence and every documented bad input.

Synthetic miscalibration: true logits u ~ N(0, 1.5^2 I_k) per example, labels drawn from softmax(u) (so
softmax(u) is the true posterior), and the "classifier" outputs z = 3 u + c for a fixed class offset c. Then
softmax(z / T + b) is exactly the true posterior at T = 3, b = -c / 3 (up to a constant), and vector scaling at
a = 1/3, b = -c / 3: BCTS and VS are well specified, TS and NBVS are not (no bias).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from labelshift.calibration import BCTS, CM, NBVS, PROB_FLOOR, TS, VS, BinningCalibrator, Calibrator, \
    ConfusionMatrixCalibrator, TemperatureScaling, VectorScaling, expected_calibration_error, load_calibrator, \
    nll, softmax
from labelshift.errors import FormatError, InputError, LabelShiftError, NotFittedError, ObjectNotFoundError

K = 4
SCALE = 3.0
OFFSET = np.array([1.0, -0.5, 0.3, 0.0])
N_FIT = 20_000
N_HELD = 20_000
SCALING = [TemperatureScaling, BCTS, VectorScaling, NBVS]


def _draw(n: int, seed: int, k: int = K, spread: float = 1.5):
    rng = np.random.default_rng(seed)
    u = rng.normal(0.0, spread, size=(n, k))
    p = softmax(u)
    y = (p.cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1)
    return u, p, y


@pytest.fixture(scope="module")
def data():
    u_fit, p_fit, y_fit = _draw(N_FIT, seed=11)
    u_held, p_held, y_held = _draw(N_HELD, seed=12)
    return dict(z_fit=SCALE * u_fit + OFFSET[:K], y_fit=y_fit, z_held=SCALE * u_held + OFFSET[:K], y_held=y_held,
                p_true_held=p_held)


@pytest.fixture(scope="module")
def fitted(data):
    return {cls.kind: cls().fit(data["z_fit"], data["y_fit"]) for cls in SCALING}


# -- scaling calibrators --------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", SCALING, ids=lambda c: c.kind)
def test_scaling_lowers_heldout_nll(cls, data, fitted):
    cal = fitted[cls.kind]
    before = nll(softmax(data["z_held"]), data["y_held"])
    after = nll(cal.predict_proba(data["z_held"]), data["y_held"])
    oracle = nll(data["p_true_held"], data["y_held"])
    print(f"{cls.kind}: held-out NLL {before:.4f} -> {after:.4f} (true posterior {oracle:.4f}); "
          f"fit NLL {cal.nll_before_:.4f} -> {cal.nll_after_:.4f}")
    # the outputs are 3x over-confident: the uncalibrated held-out NLL is about 0.5 nats above the oracle's,
    # so any sensible fit removes most of that gap
    assert after < before - 0.3
    assert cal.nll_after_ < cal.nll_before_
    assert cal.converged_
    if cls in (BCTS, VectorScaling):
        # well specified with d <= 2k parameters: the excess held-out NLL of the MLE is about chi2_d / (2 n_fit)
        # (< 25 / 40000 = 6e-4 with overwhelming probability) plus O(1/sqrt(n)) noise of a difference between
        # two nearly equal models on the same held-out rows; 3e-3 leaves a wide margin
        assert after - oracle < 3e-3


def _hessian_fd(cal, theta, z, y, h=1e-5):
    """Hessian of the mean NLL by central differences of the analytic gradient (symmetrised)."""
    d = theta.size
    H = np.empty((d, d))
    for i in range(d):
        e = np.zeros(d)
        e[i] = h
        H[i] = (cal._objective(theta + e, z, y)[1] - cal._objective(theta - e, z, y)[1]) / (2 * h)
    return (H + H.T) / 2


@pytest.mark.parametrize("cls", [BCTS, VectorScaling], ids=lambda c: c.kind)
def test_bcts_and_vs_recover_the_known_map(cls, data, fitted):
    cal = fitted[cls.kind]
    true_bias = -OFFSET / SCALE
    if cls is BCTS:
        theta_hat = np.concatenate([[np.log(cal.temperature_)], cal.bias_[1:] - cal.bias_[0]])
        theta_true = np.concatenate([[np.log(SCALE)], true_bias[1:] - true_bias[0]])
    else:
        theta_hat = np.concatenate([cal.scale_, cal.bias_[1:] - cal.bias_[0]])
        theta_true = np.concatenate([np.full(K, 1 / SCALE), true_bias[1:] - true_bias[0]])
    # tolerance from the sample size: the MLE's covariance is H^{-1} / n_fit with H the Hessian of the mean NLL
    # (= Fisher information, the model being well specified); allow 5 standard errors per coordinate
    # (two-sided normal tail 6e-7)
    H = _hessian_fd(cal, theta_hat, data["z_fit"], data["y_fit"])
    se = np.sqrt(np.diag(np.linalg.inv(H)) / N_FIT)
    print(f"{cls.kind}: theta_hat {np.round(theta_hat, 4)}, true {np.round(theta_true, 4)}, se {np.round(se, 4)}")
    assert np.all(se < 0.05)  # the check is not vacuous: the parameters are pinned down to a few percent
    assert np.all(np.abs(theta_hat - theta_true) < 5 * se)
    assert abs(cal.bias_.sum()) < 1e-12  # the reported bias is centred


def _random_problem(cls, seed: int, n: int):
    """Logits and labels of n rows and 5 classes, a fresh ``cls`` and a parameter vector near its start."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 2, size=(n, 5))
    y = rng.integers(0, 5, size=n)
    cal = cls()
    theta = cal._initial_theta(5) + rng.normal(0, 0.3, size=cal._initial_theta(5).size)
    return z, y, cal, theta


@pytest.mark.parametrize("cls", SCALING, ids=lambda c: c.kind)
def test_analytic_gradient_matches_finite_differences(cls):
    z, y, cal, theta = _random_problem(cls, seed=3, n=50)
    _, grad = cal._objective(theta, z, y)
    h = 1e-6
    fd = np.array([(cal._objective(theta + h * e, z, y)[0] - cal._objective(theta - h * e, z, y)[0]) / (2 * h)
                   for e in np.eye(theta.size)])
    # central differences have O(h^2) truncation and O(eps / h) = 1e-10 rounding error
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("cls", SCALING, ids=lambda c: c.kind)
def test_newton_pass_is_the_objective_with_its_exact_hessian(cls):
    # the Newton fit's blocked pass (above LBFGS_MAX_CLASSES) computes the objective L-BFGS-B minimises, its gradient
    # and its Hessian; 2,500 rows span three row blocks
    z, y, cal, theta = _random_problem(cls, seed=4, n=2500)
    value, grad, hess = cal._newton_pass(theta, z, y, hessian=True)
    want_value, want_grad = cal._objective(theta, z, y)
    assert value == pytest.approx(want_value, rel=1e-13)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-15)
    h = 1e-6
    fd = np.array([(cal._objective(theta + h * e, z, y)[1] - cal._objective(theta - h * e, z, y)[1]) / (2 * h)
                   for e in np.eye(theta.size)])
    np.testing.assert_allclose(hess, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("cls", SCALING, ids=lambda c: c.kind)
def test_newton_fit_reaches_the_lbfgs_optimum(cls, monkeypatch):
    # above LBFGS_MAX_CLASSES the fit is Newton's; here forced on 5 classes and compared with L-BFGS-B on the same
    # rows: both stop at a gradient of at most tol = 1e-9 of the same strictly convex objective, so their
    # calibrated probabilities agree to ~1e-7 (measured 1e-7 - 5e-7 at k = 30)
    from labelshift.calibration import scaling
    u, _, y = _draw(3000, seed=9, k=5)
    z = SCALE * u + np.array([1.0, -0.5, 0.3, 0.0, 0.2])
    lbfgs = cls().fit(z, y)
    monkeypatch.setattr(scaling, "LBFGS_MAX_CLASSES", 3)
    newton = cls().fit(z, y)
    assert newton.converged_ and newton.n_iter_ <= 10
    assert np.max(np.abs(newton._objective(_theta_of(newton), z, y)[1])) <= 1e-9
    np.testing.assert_allclose(newton.predict_proba(z), lbfgs.predict_proba(z), atol=1e-5)
    assert newton.nll_after_ == pytest.approx(lbfgs.nll_after_, abs=1e-9)
    # a holdout the model separates: finite, converged (the prior gives it an optimum)
    rng = np.random.default_rng(7)
    zs = rng.normal(size=(300, 5))
    fit = cls().fit(zs, zs.argmax(axis=1))
    assert fit.converged_ and np.all(np.isfinite(fit.predict_proba(zs)))


def _theta_of(cal) -> np.ndarray:
    """The optimiser's parameter vector of a fitted scaling calibrator ([log T] or a, then b_1..b_{k-1} with b_0
    pinned at 0)."""
    scale = [np.log(cal.temperature_)] if hasattr(cal, "temperature_") else list(cal.scale_)
    bias = list(cal.bias_[1:] - cal.bias_[0]) if hasattr(cal, "bias_") else []
    return np.array(scale + bias)


def test_bcts_on_probabilities_matches_bcts_on_logits():
    # log softmax(z) = z - logsumexp(z): a per-row constant, to which softmax(. / T + b) is blind, so the two fits
    # agree as long as no probability is clipped at PROB_FLOOR
    u, _, y = _draw(5000, seed=5)
    z = u + OFFSET
    p = softmax(z)
    assert p.min() > PROB_FLOOR
    on_logits = BCTS().fit(z, y)
    on_probs = BCTS().fit(p, y)
    assert on_logits.input_kind_ == "logits" and on_probs.input_kind_ == "probs"
    assert abs(on_logits.temperature_ - on_probs.temperature_) < 1e-5
    np.testing.assert_allclose(on_logits.predict_proba(z), on_probs.predict_proba(p), atol=1e-6)


def test_probability_zeros_are_clipped_not_infinite():
    u, _, y = _draw(2000, seed=6)
    p = softmax(40 * u).astype(np.float32).astype(np.float64)  # float32 underflow gives exact zeros
    p /= p.sum(axis=1, keepdims=True)
    assert np.any(p == 0)
    for cls in SCALING:
        q = cls(input_kind="probs").fit(p, y).predict_proba(p)
        assert np.all(np.isfinite(q)) and np.allclose(q.sum(axis=1), 1.0)


def test_non_convergence_is_warned_not_hidden():
    u, _, y = _draw(500, seed=8)
    with pytest.warns(RuntimeWarning, match="did not converge in 1 iterations"):
        cal = VS(max_iter=1).fit(3 * u, y)
    assert not cal.converged_


def test_separable_data_stays_finite():
    # labels = argmax: the NLL keeps falling as T -> 0; log T is bounded, so the outputs stay finite
    rng = np.random.default_rng(7)
    z = rng.normal(size=(300, 3))
    y = z.argmax(axis=1)
    for cls in SCALING:
        q = cls().fit(z, y).predict_proba(z)
        assert np.all(np.isfinite(q)) and np.allclose(q.sum(axis=1), 1.0)


# -- confusion-matrix calibrator ------------------------------------------------------------------------------
def test_confusion_matrix_matches_hand_computation():
    pred = np.array([0, 0, 1, 1, 2, 0, 2, 1])
    true = np.array([0, 1, 1, 1, 2, 0, 0, 2])
    outputs = np.eye(3)[pred] * 2.0 - 1.0  # logits whose argmax is `pred`
    cal = ConfusionMatrixCalibrator().fit(outputs, true)
    # C[predicted, true] counts: row 0 <- true (0, 1, 0); row 1 <- (1, 1, 2); row 2 <- (2, 0)
    counts = np.array([[2, 1, 0], [0, 2, 1], [1, 0, 1]], dtype=float)
    np.testing.assert_array_equal(cal.joint_, counts / 8)
    np.testing.assert_allclose(cal.conditional_, counts / counts.sum(axis=1, keepdims=True), rtol=0, atol=1e-15)
    assert cal.empty_rows_.tolist() == []
    np.testing.assert_array_equal(cal.predict_proba(outputs), cal.conditional_[pred])


def test_confusion_matrix_empty_row_falls_back_to_source_prior():
    probs = np.array([[0.9, 0.05, 0.05], [0.2, 0.7, 0.1], [0.6, 0.3, 0.1], [0.1, 0.8, 0.1]])
    labels = np.array([0, 1, 2, 1])
    cal = CM().fit(probs, labels)
    assert cal.input_kind_ == "probs"
    assert cal.empty_rows_.tolist() == [2]  # class 2 is never predicted
    np.testing.assert_array_equal(cal.conditional_[2], [0.25, 0.5, 0.25])
    np.testing.assert_array_equal(cal.predict_proba([[0.1, 0.1, 0.8]]), [[0.25, 0.5, 0.25]])


# -- binning calibrator ---------------------------------------------------------------------------------------
def _assert_calibrated_on(cal, outputs, labels):
    """Canonical calibration on the fit data: among rows given the same vector q, the label frequencies are q."""
    q = cal.predict_proba(outputs)
    uniq, inv = np.unique(q, axis=0, return_inverse=True)
    k = q.shape[1]
    for j, v in enumerate(uniq):
        rows = inv.ravel() == j
        freq = np.bincount(labels[rows], minlength=k) / rows.sum()
        np.testing.assert_allclose(freq, v, atol=1e-12)
    return uniq.shape[0]


@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
@pytest.mark.parametrize("k", [2, 4])
def test_binning_is_calibrated_on_its_fit_data(k, strategy):
    u, _, y = _draw(5000, seed=21, k=k)
    z = SCALE * u + OFFSET[:k]
    cal = BinningCalibrator(n_bins=8, strategy=strategy).fit(z, y)
    n_cells = _assert_calibrated_on(cal, z, y)
    assert n_cells > (4 if k == 2 else 16)  # many distinct cells, not one pooled answer
    assert cal.edges_.shape == ((1 if k == 2 else k), 9)
    cells = cal.assign_bins(z)
    np.testing.assert_array_equal(np.bincount(cells, minlength=cal.bin_counts_[..., 0].size),
                                  cal.bin_counts_.sum(axis=-1).ravel())
    if strategy == "quantile":
        per_bin = cal.bin_counts_.sum(axis=-1)
        expected = per_bin.sum(axis=1, keepdims=True) / 8
        assert np.all(np.abs(per_bin - expected) <= 1)  # no ties in continuous scores: counts differ by <= 1


def test_binning_one_bin_equals_confusion_matrix_for_multiclass(data):
    z, y = data["z_fit"], data["y_fit"]
    b = BinningCalibrator(n_bins=1).fit(z, y)
    c = ConfusionMatrixCalibrator().fit(z, y)
    np.testing.assert_array_equal(b.bin_probs_[:, 0, :], c.conditional_)
    np.testing.assert_array_equal(b.predict_proba(data["z_held"]), c.predict_proba(data["z_held"]))


def test_binning_two_uniform_bins_equal_confusion_matrix_for_binary():
    _, p, y = _draw(3000, seed=22, k=2)
    p = np.vstack([p, [[0.5, 0.5]]])  # an exact tie goes to class 0 in both
    y = np.append(y, 1)
    b = BinningCalibrator(n_bins=2).fit(p, y)
    c = ConfusionMatrixCalibrator().fit(p, y)
    np.testing.assert_array_equal(b.predict_proba(p), c.predict_proba(p))


def test_binning_empty_bins_pool_nearest_neighbours():
    # scores only in bin 0 ([0, 1/11]) and bin 10 ((10/11, 1]) of 11 uniform bins
    s = np.array([0.02, 0.05, 0.03, 0.95, 0.97, 0.99, 0.96])
    y = np.array([0, 0, 1, 1, 1, 0, 1])
    cal = BinningCalibrator(n_bins=11).fit(np.c_[1 - s, s], y)
    assert cal.empty_bins_.tolist() == [[0, j] for j in range(1, 10)]
    low, high = np.array([2 / 3, 1 / 3]), np.array([1 / 4, 3 / 4])
    np.testing.assert_allclose(cal.bin_probs_[0, 0], low)
    np.testing.assert_allclose(cal.bin_probs_[0, 4], low)    # nearer to bin 0
    np.testing.assert_allclose(cal.bin_probs_[0, 6], high)   # nearer to bin 10
    np.testing.assert_allclose(cal.bin_probs_[0, 5], [3 / 7, 4 / 7])  # equidistant: both pooled


def test_binning_unpredicted_class_gets_source_prior():
    probs = np.array([[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.6, 0.3, 0.1], [0.1, 0.5, 0.4]])
    labels = np.array([0, 1, 2, 2])
    cal = BinningCalibrator(n_bins=3).fit(probs, labels)
    assert [g for g, _ in cal.empty_bins_.tolist()].count(2) == 3
    np.testing.assert_array_equal(cal.predict_proba([[0.1, 0.1, 0.8]]), [[0.25, 0.25, 0.5]])


# -- metrics --------------------------------------------------------------------------------------------------
def test_nll_and_ece_by_hand():
    p = np.array([[0.8, 0.2], [0.8, 0.2], [0.8, 0.2], [0.8, 0.2], [0.8, 0.2], [0.3, 0.7]])
    y = np.array([0, 0, 0, 0, 1, 0])
    assert nll(p, y) == pytest.approx(-(4 * np.log(0.8) + np.log(0.2) + np.log(0.3)) / 6)
    # bin (0.733, 0.8]: 5 rows, accuracy 0.8, confidence 0.8 -> 0; bin (0.667, 0.733]: 1 row, acc 0, conf 0.7
    assert expected_calibration_error(p, y) == pytest.approx(0.7 / 6)
    assert nll([[1.0, 0.0]], [1]) == pytest.approx(-np.log(PROB_FLOOR))  # clipped, not infinite


def test_calibration_improves_ece(data, fitted):
    before = expected_calibration_error(softmax(data["z_held"]), data["y_held"])
    after = expected_calibration_error(fitted["BCTS"].predict_proba(data["z_held"]), data["y_held"])
    print(f"BCTS held-out ECE {before:.4f} -> {after:.4f}")
    assert after < before / 3


# -- persistence ----------------------------------------------------------------------------------------------
def _all_fitted(data):
    z, y = data["z_fit"][:4000], data["y_fit"][:4000]
    p = softmax(z)
    _, p2, y2 = _draw(2000, seed=31, k=2)
    cals = [cls().fit(z, y) for cls in SCALING]
    cals += [BCTS(input_kind="probs").fit(p, y), CM().fit(z, y), BinningCalibrator(5).fit(z, y),
             BinningCalibrator(7, "quantile").fit(p, y), BinningCalibrator(6, "quantile").fit(p2, y2)]
    return cals


def test_json_round_trip_is_bit_identical(data, tmp_path):
    z = data["z_held"][:3000]
    for i, cal in enumerate(_all_fitted(data)):
        x = z if cal.n_classes_ == K else softmax(z[:, :2])
        if cal.input_kind_ == "probs" and x is z:
            x = softmax(z)
        ref = cal.predict_proba(x)
        path = cal.save(tmp_path / f"cal{i}.json")
        doc = json.loads(path.read_text())
        assert doc["kind"] == cal.kind and doc["format_version"] == 1 and doc["n_classes"] == cal.n_classes_
        for loaded in (load_calibrator(path), type(cal).load(path), load_calibrator(cal.to_dict()),
                       Calibrator.from_dict(json.loads(json.dumps(cal.to_dict())))):
            assert type(loaded) is type(cal) and loaded.get_params() == cal.get_params()
            assert np.array_equal(loaded.predict_proba(x), ref), cal


def test_aliases_are_the_same_classes():
    assert TS is TemperatureScaling and VS is VectorScaling and CM is ConfusionMatrixCalibrator


# -- bad input ------------------------------------------------------------------------------------------------
ALL = SCALING + [ConfusionMatrixCalibrator, BinningCalibrator]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.kind)
def test_bad_inputs_raise_documented_errors(cls):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(60, 3))
    y = np.arange(60) % 3
    with pytest.raises(NotFittedError, match="fit"):
        cls().predict_proba(z)
    with pytest.raises(NotFittedError):
        cls().to_dict()
    bad = z.copy()
    bad[3, 1] = np.nan
    with pytest.raises(InputError, match="outputs contains 1 NaN"):
        cls().fit(bad, y)
    with pytest.raises(InputError, match="labels has labels outside 0..2"):
        cls().fit(z, np.where(y == 2, 3, y))
    with pytest.raises(InputError, match=r"labels has no examples of class\(es\) \[2\]"):
        cls().fit(z, y % 2)
    with pytest.raises(InputError, match="labels has 59 labels"):
        cls().fit(z, y[:-1])
    with pytest.raises(InputError, match="input_kind"):
        cls(input_kind="logprobs").fit(z, y)
    with pytest.raises(InputError, match="1 class column"):
        cls().fit(z[:, :1], np.zeros(60, int))
    with pytest.raises(InputError, match="empty"):
        cls().fit(np.empty((0, 3)), [])
    cal = cls().fit(z, y)
    with pytest.raises(InputError, match="outputs has 4 class columns but .* fit on 3 classes"):
        cal.predict_proba(rng.normal(size=(5, 4)))
    with pytest.raises(InputError, match="outputs contains"):
        cal.predict_proba(bad)
    with pytest.raises(InputError, match="look like probabilities .* fit on logits"):
        cal.predict_proba(softmax(z))
    on_probs = cls().fit(softmax(z), y)
    with pytest.raises(InputError, match="looks like logits"):
        on_probs.predict_proba(z)
    with pytest.raises(InputError, match="looks like logits"):
        cls(input_kind="probs").fit(z, y)
    assert issubclass(InputError, LabelShiftError) and issubclass(FormatError, LabelShiftError)


def test_binning_settings_are_validated():
    z, y = np.random.default_rng(1).normal(size=(30, 3)), np.arange(30) % 3
    with pytest.raises(InputError, match="n_bins"):
        BinningCalibrator(n_bins=0).fit(z, y)
    with pytest.raises(InputError, match="strategy"):
        BinningCalibrator(strategy="kmeans").fit(z, y)
    with pytest.raises(InputError, match="max_iter"):
        BCTS(max_iter=0).fit(z, y)
    with pytest.raises(InputError, match="path_or_dict"):
        load_calibrator(42)


@pytest.fixture
def saved(tmp_path):
    z, y = np.random.default_rng(2).normal(size=(90, 3)), np.arange(90) % 3
    path = VS().fit(z, y).save(tmp_path / "vs.json")
    return path, json.loads(path.read_text())


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def test_wrong_kind_is_refused(saved):
    path, _ = saved
    with pytest.raises(FormatError, match=r"vs\.json holds a VS calibrator, not BCTS; load it with load_calibrator"):
        BCTS.load(path)
    assert isinstance(load_calibrator(path), VectorScaling)


@pytest.mark.parametrize("edit, pattern", [
    (lambda d: d.update(format_version=2), "format_version 2, newer .* upgrade labelshift"),
    (lambda d: d.update(format_version="1"), "invalid format_version"),
    (lambda d: d.update(kind="Isotonic"), "unknown calibrator kind 'Isotonic'"),
    (lambda d: d.pop("params"), "no 'params' field"),
    (lambda d: d.pop("kind"), "no 'kind' field"),
    (lambda d: d["params"].pop("bias"), "no params.bias field"),
    (lambda d: d["params"].update(scale=[1.0, 2.0]), r"params.scale must be a finite array of shape \(3,\)"),
    (lambda d: d.update(n_classes=1), "invalid n_classes"),
    (lambda d: d.update(input_kind="auto"), "invalid input_kind"),
    (lambda d: d["settings"].update(n_bins=3), "settings"),
], ids=["newer", "version-type", "unknown-kind", "no-params", "no-kind", "no-bias", "bad-shape", "bad-k",
        "bad-input-kind", "bad-settings"])
def test_damaged_files_raise_format_error_naming_the_file(saved, edit, pattern):
    path, doc = saved
    edit(doc)
    with pytest.raises(FormatError, match=pattern) as info:
        load_calibrator(_write(path, doc))
    assert str(path) in str(info.value)


def test_corrupt_and_missing_files(saved, tmp_path):
    path, _ = saved
    path.write_text(path.read_text()[:40])
    with pytest.raises(FormatError, match=r"vs\.json is not valid JSON .* Re-save"):
        load_calibrator(path)
    path.write_text("[1, 2]")
    with pytest.raises(FormatError, match="not a saved labelshift calibrator"):
        VS.load(path)
    with pytest.raises(ObjectNotFoundError, match="does not exist"):
        load_calibrator(tmp_path / "nope.json")
