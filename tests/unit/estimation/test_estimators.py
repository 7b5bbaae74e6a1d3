"""Tests of the estimator classes (labelshift.estimation.estimators): exactness on population quantities, agreement
between methods, the m^(-1/2) rate of MLLS, batching, conditioning reports, and every bad input."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from labelshift.estimation import solvers
from labelshift.calibration import BinningCalibrator, ConfusionMatrixCalibrator
from labelshift.errors import IllConditionedError, IllConditionedWarning, InputError, LabelShiftError, \
    NotFittedError
from labelshift.estimation.estimators import BBSE, MLLS, MLLSCM, PCC, RLLS, MLLSBinned

ALL = [BBSE, RLLS, MLLS, MLLSCM, MLLSBinned, PCC]


def all_estimators():
    return [BBSE(), BBSE(soft=True), RLLS(), RLLS(soft=True), RLLS(rho_scale=0.01), MLLS(), MLLS(solver="em"),
            MLLSCM(), MLLSBinned(n_bins=4), PCC()]


def gaussian_posteriors(rng, k, m, prior, source_prior=None, sep=2.0):
    """True source posteriors p_s(y|x) of a k-class Gaussian mixture (means sep * e_y, identity covariance) for m
    points drawn under ``prior``; returns (probs, labels)."""
    source_prior = np.full(k, 1.0 / k) if source_prior is None else np.asarray(source_prior)
    y = rng.choice(k, size=m, p=prior)
    x = sep * np.eye(k)[y] + rng.normal(size=(m, k))
    logits = sep * x + np.log(source_prior)
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    return p / p.sum(axis=1, keepdims=True), y


@pytest.fixture(scope="module")
def data():
    """3-class source held-out set and target sets of different sizes (one under severe shift)."""
    rng = np.random.default_rng(11)
    sp, sy = gaussian_posteriors(rng, 3, 3000, [1 / 3] * 3)
    targets = [gaussian_posteriors(rng, 3, m, q)[0]
               for m, q in [(60, [0.2, 0.3, 0.5]), (700, [0.95, 0.05, 0.0]), (250, [0.5, 0.25, 0.25])]]
    return sp, sy, targets


def population_problem(rng, k, soft_rows=True):
    """Source outputs whose empirical (hard and soft) confusion matrices are exactly C = N / n for integer counts N
    (N[i, j] rows with label j predicted as i), and a target whose mean predictions are exactly C w.

    The target repeats each source row r_j times, r_j its label's integer multiplicity, so for either confusion
    matrix mu_t = sum_j C[:, j] r_j / sum_j p_s(j) r_j = C w with w = r / sum_j p_s(j) r_j (and sum_j p_s(j) w_j = 1).
    """
    N = rng.integers(1, 15, size=(k, k)) + np.diag(rng.integers(150, 300, size=k))
    rows, labels = [], []
    for i in range(k):
        for j in range(k):
            r = rng.dirichlet(np.ones(k), size=N[i, j]) if soft_rows else np.full((N[i, j], k), 0.0)
            r[:, i] += 2.0                      # argmax is i: r_i >= 2/3 > 1/3 >= the others after normalising
            rows.append(r / r.sum(axis=1, keepdims=True))
            labels.append(np.full(N[i, j], j))
    probs, y = np.concatenate(rows), np.concatenate(labels)
    mult = rng.integers(1, 5, size=k)
    target = np.repeat(probs, mult[y], axis=0)
    ps = N.sum(axis=0) / N.sum()
    w = mult / (ps @ mult)
    return probs, y, target, w, N / N.sum()


# -- exactness ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bbse_recovers_w_exactly_from_population_confusion_matrices(soft, seed):
    probs, y, target, w, C = population_problem(np.random.default_rng(seed), k=3 + seed)
    est = BBSE(soft=soft).fit(probs, y)
    if not soft:
        np.testing.assert_allclose(est.confusion_, C, rtol=0, atol=1e-15)
    res = est.estimate(target)
    np.testing.assert_allclose(res.weights, w, rtol=0, atol=1e-12)
    assert res.method == ("BBSE-soft" if soft else "BBSE-hard")
    np.testing.assert_allclose(res.target_prior, w * est.source_prior_, atol=1e-12)


@pytest.mark.parametrize("soft", [False, True])
def test_rlls_with_zero_rho_equals_bbse(soft):
    probs, y, target, w, _ = population_problem(np.random.default_rng(3), k=4)
    rng = np.random.default_rng(4)
    noisy = [target[rng.choice(len(target), size=400)] for _ in range(5)]   # sampling noise, BBSE still >= 0
    bbse = BBSE(soft=soft).fit(probs, y)
    rlls = RLLS(soft=soft, rho=0.0).fit(probs, y)
    for t in [target, *noisy]:
        b = bbse.estimate(t).weights
        assert np.all(b > 0)
        r = rlls.estimate(t)
        assert r.converged
        # the IPM stops at objective gap 1e-10; the minimum is sharp (||C theta - b|| grows at rate sigma_min(C)
        # ~ 0.2), so w is within ~1e-9 of it
        np.testing.assert_allclose(r.weights, b, rtol=0, atol=1e-8)
    assert rlls.estimate(target).method == ("RLLS-soft" if soft else "RLLS-hard")


def test_rlls_default_rho_and_regularisation():
    probs, y, target, w, _ = population_problem(np.random.default_rng(5), k=3)
    est = RLLS().fit(probs, y)
    assert est.rho_ == pytest.approx(solvers.rlls_rho(3, len(y), 0.05))
    assert RLLS(rho_scale=0.01).fit(probs, y).rho_ == pytest.approx(0.01 * est.rho_)
    # a large rho shrinks theta = w - 1 to 0 (once rho exceeds ||C^T b|| / ||b||, theta = 0 is optimal)
    strong = RLLS(rho=10.0).fit(probs, y).estimate(target)
    np.testing.assert_allclose(strong.weights, 1.0, atol=1e-8)
    # a target where class 0 is never predicted: mu_t(0) = 0 = sum_j C[0, j] w_j forces BBSE below 0 somewhere,
    # while RLLS keeps w >= 0 (theta >= -1)
    bad = target[target.argmax(axis=1) != 0]
    assert np.any(BBSE().fit(probs, y).estimate(bad).weights < -1e-3)
    r = RLLS(rho=0.0).fit(probs, y).estimate(bad)
    assert r.converged and np.all(r.weights >= -1e-9)


def test_mlls_error_shrinks_at_the_root_m_rate():
    """Two Gaussians N(+1, 1) (class 0) and N(-1, 1) (class 1), equal source priors, f = the true posterior
    p_s(y=0|x) = sigmoid(2x) (Example 1 with mu = 1), target prior (0.7, 0.3), so w* = (1.4, 0.6).

    MLLS is the MLE of a regular model here (calibrated f, interior w*), so its RMSE is ~ c / sqrt(m): the slope of
    log RMSE against log m is -1/2. Tolerance: with N = 200 seeds the RMSE at each m has relative standard error
    ~ 1/sqrt(2N) = 0.05, so log RMSE is off by ~0.05 and the least-squares slope over log m = ln(250)..ln(16000)
    (4 points 1.39 apart, sum of squared deviations 9.6) by ~0.05 / sqrt(9.6) = 0.016; the O(1/m) bias of the MLE is
    negligible from m = 250 on. We accept [-0.65, -0.35], about 9 standard errors, and also check the constant.
    """
    rng = np.random.default_rng(2020)
    ms, n_seeds, q = [250, 1000, 4000, 16000], 200, 0.7
    src_y = np.repeat([0, 1], 500)
    src_x = np.where(src_y == 0, 1.0, -1.0) + rng.normal(size=1000)
    post = lambda x: np.stack([1 / (1 + np.exp(-2 * x)), 1 / (1 + np.exp(2 * x))], axis=-1)  # noqa: E731
    est = MLLS().fit(post(src_x), src_y)
    assert np.array_equal(est.source_prior_, [0.5, 0.5])
    w_star = np.array([q, 1 - q]) / 0.5
    rmse = []
    for m in ms:
        y = (rng.uniform(size=(n_seeds, m)) > q).astype(int)
        x = np.where(y == 0, 1.0, -1.0) + rng.normal(size=(n_seeds, m))
        res = est.estimate(post(x))
        assert np.all(res.converged)
        rmse.append(np.sqrt(np.mean((res.weights - w_star) ** 2)))
    slope = np.polyfit(np.log(ms), np.log(rmse), 1)[0]
    assert -0.65 <= slope <= -0.35, (slope, rmse)
    # the constant: sqrt(m) * RMSE is O(1) (about 1.2 to 1.3 here); a gross solver error would show up as a plateau
    assert np.all(np.sqrt(ms) * np.array(rmse) < 5), rmse


# -- the MLLS family agrees with itself --------------------------------------------------------------------------
def test_mlls_cm_equals_mlls_on_the_confusion_matrix_calibration(data):
    sp, sy, targets = data
    cal = ConfusionMatrixCalibrator(input_kind="probs").fit(sp, sy)
    direct = MLLS().fit(cal.predict_proba(sp), sy)
    cm = MLLSCM().fit(sp, sy)
    for t in targets:
        a = cm.estimate(t)
        b = direct.estimate(cal.predict_proba(t))
        np.testing.assert_allclose(a.weights, b.weights, atol=1e-9)
        assert a.method == "MLLS-CM"
        assert a.diagnostic == pytest.approx(b.diagnostic, rel=1e-6, abs=1e-12)


def test_mlls_binned_equals_mlls_on_the_binned_calibration(data):
    sp, sy, targets = data
    cal = BinningCalibrator(n_bins=4, input_kind="probs").fit(sp, sy)
    direct = MLLS().fit(cal.predict_proba(sp), sy)
    binned = MLLSBinned(n_bins=4).fit(sp, sy)
    for t in targets:
        np.testing.assert_allclose(binned.estimate(t).weights, direct.estimate(cal.predict_proba(t)).weights,
                                   atol=1e-9)


def test_em_and_newton_estimators_agree(data):
    sp, sy, targets = data
    a = MLLS(solver="newton").fit(sp, sy).estimate(targets)
    b = MLLS(solver="em").fit(sp, sy).estimate(targets)
    np.testing.assert_allclose(a.weights, b.weights, atol=1e-8)
    assert np.all(a.iterations > 0) and np.all(b.iterations > 0)


def test_pcc_is_the_mean_prediction_over_the_source_prior(data):
    sp, sy, targets = data
    est = PCC().fit(sp, sy)
    res = est.estimate(targets[0])
    np.testing.assert_allclose(res.weights, targets[0].mean(axis=0) / est.source_prior_, rtol=1e-13)
    assert res.method == "PCC"


# -- batching ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("est", all_estimators(), ids=repr)
def test_batched_equals_one_at_a_time(est, data):
    sp, sy, targets = data
    est.fit(sp, sy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IllConditionedWarning)
        batch = est.estimate(targets)
        singles = [est.estimate(t) for t in targets]
    assert batch.is_batch and len(batch) == len(targets)
    closed_form = isinstance(est, (BBSE, PCC))
    for i, one in enumerate(singles):
        assert not one.is_batch
        np.testing.assert_allclose(batch.weights[i], one.weights, rtol=0, atol=1e-12 if closed_form else 1e-10)
        np.testing.assert_allclose(batch[i].target_prior, one.target_prior, rtol=0, atol=1e-10)
        assert batch[i].iterations == one.iterations and batch[i].converged == one.converged
        assert batch[i].ill_conditioned == one.ill_conditioned
        assert batch[i].method == one.method
        np.testing.assert_allclose(one.target_prior.sum(), 1.0)
    # an (S, m, k) array is the same batch as a list of equal-size sets
    same = [targets[1][:50], targets[1][50:100], targets[1][100:150]]
    np.testing.assert_allclose(est.estimate(np.stack(same)).weights, est.estimate(same).weights, atol=1e-12)


# -- conditioning is reported ------------------------------------------------------------------------------------
def two_class_counts(a, b):
    """Hard source outputs with confusion counts [[a, b], [b, a]]: sigma_min(C) = (a - b) / n, n = 2(a + b)."""
    rows = np.array([[0.8, 0.2], [0.8, 0.2], [0.2, 0.8], [0.2, 0.8]])
    labels = np.array([0, 1, 0, 1])
    counts = np.array([a, b, b, a])
    return np.repeat(rows, counts, axis=0), np.repeat(labels, counts)


def test_bbse_raises_on_a_near_singular_confusion_matrix():
    probs, y = two_class_counts(55, 45)        # sigma_min sqrt(n) = 10 / 200 * sqrt(200) = 0.71 < 1
    with pytest.raises(IllConditionedError, match="source_probs") as info:
        BBSE().fit(probs, y)
    assert info.value.value == pytest.approx(0.05)
    assert "merge classes" in str(info.value) and "0.05" in str(info.value)
    # RLLS is regularised for this case: it fits and flags instead
    with pytest.warns(IllConditionedWarning):
        res = RLLS().fit(probs, y).estimate(probs)
    assert res.ill_conditioned and res.diagnostic == pytest.approx(0.05)


def test_bbse_raises_on_a_singular_confusion_matrix():
    rng = np.random.default_rng(7)
    probs = rng.dirichlet(np.ones(3), size=300)
    probs[:, 2] = 0.0                            # class 2 is never predicted: a zero row of C
    probs /= probs.sum(axis=1, keepdims=True)
    y = rng.integers(0, 3, size=300)
    with pytest.raises(IllConditionedError, match=r"never predicted") as info:
        BBSE().fit(probs, y)
    assert info.value.value == pytest.approx(0.0, abs=1e-15)
    assert isinstance(info.value, LabelShiftError)


def test_bbse_flags_a_moderately_ill_conditioned_matrix():
    probs, y = two_class_counts(60, 40)        # sigma_min sqrt(n) = 20 / 200 * sqrt(200) = 1.41, in [1, 2)
    est = BBSE().fit(probs, y)
    with pytest.warns(IllConditionedWarning, match="BBSE-hard"):
        res = est.estimate(probs)
    assert res.ill_conditioned and res.diagnostic == pytest.approx(0.1)
    well = BBSE().fit(*two_class_counts(150, 50))        # sqrt(400) * 0.25 = 5: not flagged
    with warnings.catch_warnings():
        warnings.simplefilter("error", IllConditionedWarning)
        assert not well.estimate(probs).ill_conditioned


def test_mlls_reports_the_hessian_eigenvalue_and_flags_an_unidentified_problem(data):
    sp, sy, targets = data
    res = MLLS().fit(sp, sy).estimate(targets[2])
    assert res.diagnostic == pytest.approx(solvers.hessian_min_eigenvalue(targets[2], res.weights), rel=1e-10)
    assert not res.ill_conditioned and res.extra["sigma_free"] >= res.diagnostic
    # one bin: f(x) = p_s for every x, so the likelihood is flat in w (sigma = 0): flagged, never silent
    rng = np.random.default_rng(8)
    p2, y2 = gaussian_posteriors(rng, 2, 500, [0.5, 0.5])
    t2, _ = gaussian_posteriors(rng, 2, 300, [0.8, 0.2])
    with pytest.warns(IllConditionedWarning, match="MLLS-binned"):
        flat = MLLSBinned(n_bins=1).fit(p2, y2).estimate(t2)
    assert flat.ill_conditioned and flat.diagnostic == pytest.approx(0.0, abs=1e-9)


def test_severe_shift_on_the_boundary_is_not_flagged():
    """Absent classes have w_y = 0 and tiny curvature; that is the constraint at work, not ill-conditioning."""
    rng = np.random.default_rng(9)
    sp, sy = gaussian_posteriors(rng, 4, 4000, [0.25] * 4, sep=6.0)     # confident: f_y(x) ~ 0 off class y
    t, _ = gaussian_posteriors(rng, 4, 3000, [0.8, 0.2, 0.0, 0.0], sep=6.0)
    res = MLLS().fit(sp, sy).estimate(t)
    assert np.all(res.weights[2:] < solvers.PIN_TOL)
    assert res.diagnostic < 1e-6                                 # the paper's sigma collapses ...
    assert res.extra["sigma_free"] > 0.01 and not res.ill_conditioned   # ... but w is well determined


def test_non_convergence_is_reported(data):
    sp, sy, targets = data
    with pytest.warns(RuntimeWarning, match="did not converge"):
        res = MLLS(solver="em", max_iter=2).fit(sp, sy).estimate(targets[1])
    assert not res.converged and res.iterations == 2


def test_source_prior_argument_defines_w(data):
    sp, sy, targets = data
    prior = np.array([0.5, 0.3, 0.2])
    for est in (MLLS(), BBSE(), PCC()):
        res = est.fit(sp, sy, source_prior=prior).estimate(targets[0])
        np.testing.assert_allclose(res.source_prior, prior)
        np.testing.assert_allclose(res.target_prior.sum(), 1.0)
    assert MLLS().fit(sp, sy, source_prior=prior).estimate(targets[0]).weights @ prior == pytest.approx(1.0)


# -- bad input ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(10)
    return gaussian_posteriors(rng, 3, 300, [1 / 3] * 3)


def _fresh(cls):
    return cls()


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_bad_source_inputs(cls, small):
    probs, y = small
    nan = probs.copy()
    nan[3, 1] = np.nan
    with pytest.raises(InputError, match=r"source_probs.*NaN"):
        _fresh(cls).fit(nan, y)
    inf = probs.copy()
    inf[0, 0] = np.inf
    with pytest.raises(InputError, match=r"source_probs.*infinite"):
        _fresh(cls).fit(inf, y)
    with pytest.raises(InputError, match=r"source_probs.*negative.*logits"):
        _fresh(cls).fit(probs - 0.5, y)
    with pytest.raises(InputError, match=r"source_probs.*look like logits"):
        _fresh(cls).fit(probs * 2.0, y)
    with pytest.raises(InputError, match=r"source_labels.*outside 0\.\.2"):
        _fresh(cls).fit(probs, np.where(y == 2, 3, y))
    with pytest.raises(InputError, match=r"source_labels.*rows"):
        _fresh(cls).fit(probs, y[:-1])
    with pytest.raises(InputError, match=r"source_probs.*empty"):
        _fresh(cls).fit(np.empty((0, 3)), np.empty(0, dtype=int))
    with pytest.raises(InputError, match=r"source_labels.*no examples of class\(es\) \[1\]"):
        _fresh(cls).fit(probs, np.where(y == 1, 0, y))


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_bad_target_inputs(cls, small):
    probs, y = small
    est = _fresh(cls)
    with pytest.raises(NotFittedError, match=r"not fitted.*fit\(source_probs, source_labels\)"):
        est.estimate(probs)
    est.fit(probs, y)
    bad = probs[:20].copy()
    bad[2, 2] = np.nan
    with pytest.raises(InputError, match=r"target_probs.*NaN"):
        est.estimate(bad)
    with pytest.raises(InputError, match=r"target_probs\[1\].*NaN"):
        est.estimate([probs[:10], bad])
    with pytest.raises(InputError, match=r"target_probs.*negative.*logits"):
        est.estimate(np.log(probs[:20]))
    with pytest.raises(InputError, match=r"target_probs.*look like logits"):
        est.estimate(probs[:20] + 0.1)
    with pytest.raises(InputError, match=r"target_probs has 4 classes.*fit on 3"):
        est.estimate(np.full((5, 4), 0.25))
    with pytest.raises(InputError, match=r"target_probs.*empty"):
        est.estimate(np.empty((0, 3)))


@pytest.mark.parametrize("make, match", [
    (lambda: BBSE(soft="yes"), "soft"),
    (lambda: RLLS(delta=1.5), "delta"),
    (lambda: RLLS(rho=-1.0), "rho"),
    (lambda: RLLS(rho_scale=0), "rho_scale"),
    (lambda: MLLS(solver="lbfgs"), "solver"),
    (lambda: MLLS(tol=0.0), "tol"),
    (lambda: MLLS(max_iter=2.5), "max_iter"),
    (lambda: MLLSCM(solver="sgd"), "solver"),
    (lambda: MLLSBinned(n_bins=0), "n_bins"),
])
def test_bad_parameters_are_rejected_at_fit(make, match, small):
    with pytest.raises(InputError, match=match):
        make().fit(*small)


def test_repr_shows_the_parameters():
    assert repr(MLLS()) == "MLLS(solver='newton', tol=1e-10, max_iter=None)"
    assert repr(BBSE(soft=True)) == "BBSE(soft=True)"
