"""Intervals, the no-shift test and the identifiability report (labelshift.inference.intervals, .no_shift_test and
.identifiability).

Every statistical test uses a problem with *exact* posteriors, so f is perfectly calibrated and the only error is the
finite target sample: k one-dimensional Gaussian classes N(mu_y, 1) with source prior p_s, and
f_y(x) = p_s(y) phi(x - mu_y) / sum_j p_s(j) phi(x - mu_j) in closed form. A target set of size m draws its labels
i.i.d. from the target prior q, then x | y; q (the population prior, not the sample frequencies) is the truth an
interval must cover. All seeds are fixed, so every assertion is deterministic; the tolerances say how far a
correct method could stray by chance and are derived in the comments.
"""
import json
import math
import warnings

import numpy as np
import pytest
from scipy import integrate
from scipy.special import softmax
from scipy.stats import kstest, norm
from scipy.stats import t as student_t

from labelshift.errors import IllConditionedWarning, InputError
from labelshift.estimation.estimators import BBSE, MLLS
from labelshift.inference.identifiability import (MAX_RELATIVE_ERROR, MAX_STANDARD_ERROR, Identifiability,
                                                  identifiability)
from labelshift.inference.intervals import PriorInterval, bootstrap_interval, fisher_interval
from labelshift.inference.holdout_conditional import no_shift_inflation
from labelshift.inference.no_shift import NoShiftTest, no_shift_test

MU3 = np.array([-2.0, 0.0, 2.0])
PS3 = np.array([0.5, 0.3, 0.2])
Q3 = np.array([0.2, 0.3, 0.5])          # a clear shift from PS3
LEVEL = 0.95
Z95 = norm.ppf(0.975)


def posterior(x, source_prior, mu):
    """The exact source posterior p_s(y | x) for unit-variance Gaussian classes."""
    return softmax(np.log(source_prior) - 0.5 * (np.asarray(x)[..., None] - mu) ** 2, axis=-1)


def draw_targets(seed, n_sets, m, prior, source_prior=PS3, mu=MU3):
    """(n_sets, m, k) exact posteriors of target sets: labels i.i.d. from ``prior``, then x | y ~ N(mu_y, 1)."""
    rng = np.random.default_rng(seed)
    y = rng.choice(len(prior), size=(n_sets, m), p=prior)
    return posterior(mu[y] + rng.standard_normal((n_sets, m)), source_prior, mu)


def draw_source(seed, n, source_prior=PS3, mu=MU3):
    rng = np.random.default_rng(seed)
    y = rng.choice(len(source_prior), size=n, p=source_prior)
    return posterior(mu[y] + rng.standard_normal(n), source_prior, mu), y


def mlls(source_prior):
    """MLLS with a known source prior (it uses no source outputs besides p_s)."""
    k = len(source_prior)
    return MLLS().fit(np.eye(k), np.arange(k), source_prior=source_prior)


def quantile_sample(m, prior, mu):
    """A deterministic 'sample' whose empirical distribution is the target mixture up to O(1/m): the midpoint
    quantiles x_i = F_t^{-1}((i + 1/2) / m), by bisection on the mixture CDF. Sample averages over it are
    midpoint-rule integrals against p_t, so the MLE and the observed information equal their population values
    up to O(1/m) instead of O(m^{-1/2})."""
    u = (np.arange(m) + 0.5) / m
    lo, hi = np.full(m, -30.0), np.full(m, 30.0)
    for _ in range(64):                        # 60 / 2^64: far below the O(1/m) of the midpoint rule
        mid = 0.5 * (lo + hi)
        below = (norm.cdf(mid[:, None] - mu) @ prior) < u
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 0.5 * (lo + hi)


def population_prior_covariance(prior, source_prior, mu, m_grid=50_000):
    """Asymptotic covariance of sqrt(m) (p_t_hat - q) from the population information E_t[f f^T / (f^T w)^2]
    (via the quantile sample) -- the 'theory' the Fisher standard errors should reproduce."""
    x = quantile_sample(m_grid, prior, mu)
    F = posterior(x, source_prior, mu)
    w = prior / source_prior
    s = F / (F @ w)[:, None]
    info = s.T @ s / m_grid
    k = len(prior)
    Z = np.linalg.svd(source_prior[None, :])[2][1:].T           # orthonormal basis of {d : p_s^T d = 0}
    cov_w = Z @ np.linalg.inv(Z.T @ info @ Z) @ Z.T
    D = np.diag(source_prior)
    assert Z.shape == (k, k - 1)
    return D @ cov_w @ D


# ---------------------------------------------------------------------------------------------------------------
# Fisher intervals: coverage and standard errors over many seeds
# ---------------------------------------------------------------------------------------------------------------
N_SEEDS = 1000
M = 1000


@pytest.fixture(scope="module")
def shifted_runs():
    """N_SEEDS target sets of size M from Q3, their MLLS estimates and Fisher intervals."""
    F = draw_targets(101, N_SEEDS, M, Q3)
    est = mlls(PS3).estimate(F)
    intervals = [fisher_interval(F[s], est.weights[s], PS3, level=LEVEL) for s in range(N_SEEDS)]
    return F, est, intervals


def test_fisher_coverage_is_nominal(shifted_runs):
    _, _, intervals = shifted_runs
    covered = np.array([iv.covers(Q3) for iv in intervals])          # (seeds, classes)
    assert not any(iv.pinned.any() for iv in intervals)               # an interior case
    # Tolerance. Each (seed, class) indicator is Bernoulli(0.95) if the interval is exact. The three classes of a
    # seed are correlated (the priors sum to 1), so the effective number of independent pairs lies between
    # N_SEEDS and 3 N_SEEDS; the conservative end gives sd = sqrt(0.95 * 0.05 / 1000) = 0.0069, 3 sd = 0.021.
    # Asymptotic allowance: for a symmetric two-sided normal interval the O(m^-1/2) Edgeworth terms cancel and the
    # coverage error is O(1/m); with m = 1000 and the moderate skewness of a mixture weight, 0.01 is ample.
    sd = math.sqrt(0.95 * 0.05 / N_SEEDS)
    overall = covered.mean()
    assert 0.95 - 3 * sd - 0.01 <= overall <= 0.95 + 3 * sd + 0.01, overall
    # per class (1000 independent indicators each): the same bound
    per_class = covered.mean(axis=0)
    assert np.all(per_class >= 0.95 - 3 * sd - 0.01), per_class
    assert np.all(per_class <= 0.95 + 3 * sd + 0.01), per_class


def test_fisher_width_matches_theory(shifted_runs):
    """Not absurdly wide (or narrow): the mean half-width is z times the population standard error."""
    _, _, intervals = shifted_runs
    theory_se = np.sqrt(np.diag(population_prior_covariance(Q3, PS3, MU3)) / M)
    mean_se = np.mean([iv.std_error for iv in intervals], axis=0)
    # se(w_hat) is a smooth function of w_hat, so its mean over seeds is se(w*) + O(1/m); the mean over 1000 seeds
    # of a quantity whose seed-to-seed relative spread is ~ O(m^-1/2) = 3% has noise ~0.1%. 3% is generous.
    np.testing.assert_allclose(mean_se, theory_se, rtol=0.03)
    half = np.mean([(iv.upper - iv.lower) / 2 for iv in intervals], axis=0)
    np.testing.assert_allclose(half, Z95 * theory_se, rtol=0.03)


def test_fisher_standard_error_matches_spread_of_estimates(shifted_runs):
    _, est, intervals = shifted_runs
    rms_se = np.sqrt(np.mean([iv.std_error ** 2 for iv in intervals], axis=0))
    spread = est.target_prior.std(axis=0, ddof=1)
    # The sample sd of N (near-normal) estimates has relative sd 1/sqrt(2N) = 0.022 for N = 1000; 3 of those plus
    # 0.02 for O(1/m) effects (the Fisher se is the asymptotic value, the spread the finite-m one).
    tol = 3 / math.sqrt(2 * N_SEEDS) + 0.02
    assert np.all(np.abs(rms_se / spread - 1) <= tol), (rms_se, spread)


@pytest.mark.parametrize("source_prior", [np.array([0.6, 0.4]), np.array([0.25, 0.75])])
def test_fisher_variance_two_classes_closed_form(source_prior):
    """k = 2: one free direction. With calibrated f, f^T w = p_t(x) / p_s(x) and f_y = p_s(y) phi_y / p_s(x); along
    d = (1, -p_s(0) / p_s(1)) (p_s^T d = 0, d_0 = 1), d^T f / f^T w = p_s(0) (phi_0 - phi_1) / p_t(x), so the
    information on w_0 is p_s(0)^2 J with J = integral (phi_0 - phi_1)^2 / p_t dx, and
        Var(p_t_hat(0)) = p_s(0)^2 Var(w_hat_0) = 1 / (m J),
    the classical information of a two-component mixture weight -- independent of the source prior."""
    mu = np.array([-1.0, 1.0])
    q = np.array([0.3, 0.7])

    def integrand(x):
        phi = norm.pdf(x - mu)
        return (phi[0] - phi[1]) ** 2 / (phi @ q)

    # the integrand is below phi(x -+ 1) / min(q), negligible beyond |x| = 20
    J = integrate.quad(integrand, -20.0, 20.0, points=[-1.0, 0.0, 1.0], epsabs=1e-13, epsrel=1e-12, limit=200)[0]
    m = 20_000
    F = posterior(quantile_sample(m, q, mu), source_prior, mu)
    w_hat = mlls(source_prior).estimate(F).weights
    iv = fisher_interval(F, w_hat, source_prior)
    # The quantile sample turns sample means into midpoint-rule integrals against p_t, whose error is
    # O(1/m^2) = 2.5e-9 for these smooth integrands (times a constant of order 1; measured: 1e-9 for w_hat, 6e-9
    # for the variance); 1e-6 leaves a wide margin and still fails for any error in the formula (e.g. inverting
    # H without the constraint changes the variance by ~10% and makes the two classes' standard errors differ).
    np.testing.assert_allclose(w_hat * source_prior, q, atol=1e-6)
    np.testing.assert_allclose(iv.std_error ** 2 * m, [1 / J, 1 / J], rtol=1e-6)
    # and the interval is target_prior +- z se
    np.testing.assert_allclose(iv.upper - iv.target_prior, Z95 * iv.std_error, rtol=1e-12)
    np.testing.assert_allclose(iv.weights_upper - iv.weights, Z95 * iv.std_error / source_prior, rtol=1e-12)


def test_fisher_weights_none_solves_mlls():
    F = draw_targets(7, 1, 800, Q3)[0]
    w = mlls(PS3).estimate(F).weights
    a = fisher_interval(F, w, PS3)
    b = fisher_interval(F, None, PS3)
    np.testing.assert_allclose(b.weights, a.weights, atol=1e-8)
    np.testing.assert_allclose(b.upper, a.upper, atol=1e-7)
    assert a.method == "fisher" and a.level == 0.95 and a.n_target == 800
    np.testing.assert_allclose(a.target_prior.sum(), 1.0, atol=1e-9)
    assert np.all(a.lower <= a.target_prior) and np.all(a.target_prior <= a.upper)
    # a higher level gives a wider interval, by the ratio of the normal quantiles
    c = fisher_interval(F, w, PS3, level=0.99)
    np.testing.assert_allclose((c.upper - c.lower) / (a.upper - a.lower), norm.ppf(0.995) / Z95, rtol=1e-9)


# ---------------------------------------------------------------------------------------------------------------
# Fisher intervals at the boundary (a class pinned at w_y = 0)
# ---------------------------------------------------------------------------------------------------------------
def test_fisher_absent_class_gets_one_sided_interval():
    q = np.array([0.0, 0.5, 0.5])
    n = 200
    F = draw_targets(11, n, 1000, q)
    est = mlls(PS3).estimate(F)
    ivs = [fisher_interval(F[s], est.weights[s], PS3) for s in range(n)]
    pinned = np.array([iv.pinned[0] for iv in ivs])
    assert 0.2 < pinned.mean() < 0.8         # the MLE of an absent class sits at 0 in about half of the seeds
    for iv in (iv for iv in ivs if iv.pinned[0]):
        assert iv.covers(q)[0]
        assert iv.lower[0] == 0.0 and iv.weights_lower[0] == 0.0 and iv.target_prior[0] <= 1e-8
        # a one-sided bound of the order z^2 / (2 m a) or z sqrt(v / m): small but positive
        assert 0.0 < iv.upper[0] < 0.05
        assert math.isnan(iv.std_error[0]) and np.all(np.isfinite(iv.std_error[1:]))
        d = iv.to_dict()
        assert d["std_error"][0] is None and d["pinned"] == [True, False, False]
        json.dumps(d, allow_nan=False)
    # over all seeds (pinned or not) the absent class is covered at least at the nominal rate: 3 binomial sd
    # for 200 seeds is 0.046
    covered = np.mean([iv.covers(q)[0] for iv in ivs])
    assert covered >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / n), covered


def test_fisher_coverage_near_boundary():
    """A small class (p_t = 0.01, m = 500): pinned at 0 in about a fifth of the seeds. The interval mixes normal
    intervals (clipped at 0) and one-sided profile bounds; it is approximate here, so the allowance is larger."""
    q = np.array([0.01, 0.49, 0.5])
    F = draw_targets(12, 1000, 500, q)
    est = mlls(PS3).estimate(F)
    ivs = [fisher_interval(F[s], est.weights[s], PS3) for s in range(1000)]
    pinned = np.array([iv.pinned[0] for iv in ivs])
    assert 0.05 < pinned.mean() < 0.5
    covered = np.array([iv.covers(q)[0] for iv in ivs])
    # 3 binomial sd (0.021 for 1000 seeds) and 0.02 for the boundary approximation (measured: 0.98)
    assert covered.mean() >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / 1000) - 0.02, covered.mean()


# ---------------------------------------------------------------------------------------------------------------
# the no-shift test
# ---------------------------------------------------------------------------------------------------------------
def test_no_shift_test_type_one_error_and_uniform_p_values():
    n = 1000
    F = draw_targets(202, n, 1000, PS3)            # no shift: q = p_s
    est = mlls(PS3).estimate(F)
    tests = [no_shift_test(F[s], est.weights[s], PS3) for s in range(n)]
    assert all(t.statistic >= 0 and t.dof == 2 and t.method == "likelihood-ratio" for t in tests)
    p = np.array([t.p_value for t in tests])
    rate = np.mean([t.rejects(0.05) for t in tests])
    # Under H0 the rejections are Bernoulli(0.05): sd = sqrt(0.05 * 0.95 / 1000) = 0.0069; 3 sd either side
    # (the lower side: the test is not conservative either)
    sd = math.sqrt(0.05 * 0.95 / n)
    assert 0.05 - 3 * sd <= rate <= 0.05 + 3 * sd, rate
    assert kstest(p, "uniform").pvalue > 0.001
    # mean of n uniforms: 0.5 +- sqrt(1/12/n) = 0.009; 3 sd
    assert abs(p.mean() - 0.5) <= 3 * math.sqrt(1 / 12 / n)


def test_no_shift_test_detects_a_clear_shift():
    q = np.array([0.4, 0.3, 0.3])                  # p_s = (0.5, 0.3, 0.2): total variation 0.1
    F = draw_targets(303, 200, 2000, q)
    est = mlls(PS3).estimate(F)
    rejected = np.mean([no_shift_test(F[s], est.weights[s], PS3).rejects(0.05) for s in range(200)])
    assert rejected >= 0.95, rejected


def test_no_shift_statistic_closed_form_and_zero_at_no_shift():
    F = draw_targets(5, 1, 500, Q3)[0]
    w = mlls(PS3).estimate(F).weights
    t = no_shift_test(F, w, PS3)
    # 2 m [L(w_hat) - L(1)] with L(w) = mean log f^T w (and f^T 1 = 1)
    assert t.statistic == pytest.approx(2 * 500 * np.mean(np.log(F @ w)), rel=1e-10)
    assert t.p_value == pytest.approx(math.exp(-t.statistic / 2), rel=1e-9)      # chi^2_2 survival function
    assert t.rejects(0.05) == (t.p_value < 0.05)
    # the source distribution itself (quantile sample): w_hat = 1 up to O(1/m), so the statistic is ~0
    F0 = posterior(quantile_sample(5000, PS3, MU3), PS3, MU3)
    t0 = no_shift_test(F0, None, PS3)
    assert 0.0 <= t0.statistic < 1e-3 and t0.p_value > 0.99 and not t0.rejects()
    d = t.to_dict()
    assert d == {"statistic": t.statistic, "dof": 2, "p_value": t.p_value, "method": "likelihood-ratio",
                 "n_target": 500, "n_source": None, "holdout_inflation": 1.0}
    json.dumps(d, allow_nan=False)


# ---------------------------------------------------------------------------------------------------------------
# bootstrap
# ---------------------------------------------------------------------------------------------------------------
def test_bootstrap_coverage():
    n = 200
    F = draw_targets(404, n, 1000, Q3)
    covered = np.array([bootstrap_interval(F[s], PS3, n_bootstrap=200, seed=s).covers(Q3) for s in range(n)])
    # 200 seeds: 3 sd = 3 sqrt(0.95 * 0.05 / 200) = 0.046 (conservative effective size, as above); plus 0.02 for
    # the percentile method with B = 200 (each end is an order statistic among ~5 in its tail, which narrows the
    # interval on average: coverage below nominal by O(1/B) to O(1/sqrt(B)) of the tail mass).
    sd = math.sqrt(0.95 * 0.05 / n)
    assert 0.95 - 3 * sd - 0.02 <= covered.mean() <= 0.95 + 3 * sd, covered.mean()


def test_bootstrap_agrees_with_fisher_in_the_interior():
    F = draw_targets(505, 1, 2000, Q3)[0]
    w = mlls(PS3).estimate(F).weights
    fi = fisher_interval(F, w, PS3)
    bi = bootstrap_interval(F, PS3, n_bootstrap=1000, seed=3)
    # same point estimate (both MLLS on the full set)
    np.testing.assert_allclose(bi.target_prior, fi.target_prior, atol=1e-8)
    np.testing.assert_allclose(bi.weights, fi.weights, atol=1e-8)
    # widths within 30%: both estimate the same asymptotic spread; the percentile ends with B = 1000 carry ~3%
    # noise each, the bootstrap spread itself O(m^-1/2) relative error
    ratio = (bi.upper - bi.lower) / (fi.upper - fi.lower)
    assert np.all((ratio > 0.7) & (ratio < 1.3)), ratio
    np.testing.assert_allclose(bi.std_error, fi.std_error, rtol=0.3)
    assert bi.method == "bootstrap" and bi.extra["n_bootstrap"] == 1000 and bi.extra["estimator"] == "MLLS"
    json.dumps(bi.to_dict(), allow_nan=False)


def test_bootstrap_is_reproducible():
    F = draw_targets(606, 1, 300, Q3)[0]
    a = bootstrap_interval(F, PS3, n_bootstrap=50, seed=9)
    b = bootstrap_interval(F, PS3, n_bootstrap=50, seed=9)
    c = bootstrap_interval(F, PS3, n_bootstrap=50, seed=10)
    for name in ("lower", "upper", "weights_lower", "weights_upper", "std_error"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.lower, c.lower)


def test_bootstrap_chunks_give_the_same_answer(monkeypatch):
    """Replicates solved in many small estimate calls equal one big call (the resampling stream is the same)."""
    import labelshift.inference.intervals as U

    F = draw_targets(607, 1, 200, Q3)[0]
    whole = bootstrap_interval(F, PS3, n_bootstrap=40, seed=1)
    monkeypatch.setattr(U, "_BOOTSTRAP_CHUNK_BYTES", 8 * 200 * 3 * 7)      # 7 replicates per call
    chunked = bootstrap_interval(F, PS3, n_bootstrap=40, seed=1)
    np.testing.assert_allclose(chunked.lower, whole.lower, atol=1e-12)
    np.testing.assert_allclose(chunked.upper, whole.upper, atol=1e-12)


def test_bootstrap_with_another_estimator():
    src, labels = draw_source(1, 5000)
    bbse = BBSE(soft=True).fit(src, labels, source_prior=PS3)
    F = draw_targets(708, 1, 1500, Q3)[0]
    bi = bootstrap_interval(F, PS3, estimator=bbse, n_bootstrap=200, seed=0)
    assert bi.extra["estimator"] == "BBSE-soft"
    np.testing.assert_allclose(bi.target_prior, bbse.estimate(F).target_prior)
    assert np.all(bi.weights_lower >= 0) and np.all(bi.lower <= bi.upper)
    assert np.all(np.isfinite(bi.std_error)) and np.all(bi.std_error > 0)
    with pytest.raises(InputError, match="different source prior"):
        bootstrap_interval(F, np.array([1 / 3, 1 / 3, 1 / 3]), estimator=bbse)
    with pytest.raises(InputError, match="fitted"):
        bootstrap_interval(F, PS3, estimator=MLLS())


# ---------------------------------------------------------------------------------------------------------------
# identifiability
# ---------------------------------------------------------------------------------------------------------------
def test_identifiability_well_separated_is_trustworthy():
    mu = np.array([-4.0, 0.0, 4.0])
    F = draw_targets(808, 1, 2000, Q3, mu=mu)[0]
    src, labels = draw_source(2, 5000, mu=mu)
    C = BBSE().fit(src, labels, source_prior=PS3).confusion_
    rep = identifiability(F, None, PS3, confusion=C, n_source=5000, max_relative_width=1.0)
    assert isinstance(rep, Identifiability)
    assert rep.trustworthy and rep.reasons == []
    assert rep.n_target * rep.min_free_eigenvalue >= 4 and rep.confusion_snr >= 2
    assert rep.min_hessian_eigenvalue <= rep.min_free_eigenvalue + 1e-12
    assert rep.confusion_condition >= 1 and rep.n_source == 5000 and rep.max_weight_width <= 1.0
    d = rep.to_dict()
    json.dumps(d, allow_nan=False)
    assert d["trustworthy"] is True and d["pinned_bounds"] == [None, None, None]


def test_identifiability_flags_overlapping_classes():
    """Classes 1 and 2 nearly coincide (means 1 and 1.05): w_1 and w_2 are not identified. Either both are free and
    their relative errors are large, or one is pinned at 0 and moving mass back into it costs almost no likelihood."""
    mu = np.array([-3.0, 1.0, 1.05])
    q = np.array([0.3, 0.35, 0.35])
    F = draw_targets(909, 20, 1000, q, mu=mu)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IllConditionedWarning)
        est = mlls(PS3).estimate(F)
    kinds = set()
    for s in range(20):
        rep = identifiability(F[s], est.weights[s], PS3)
        assert not rep.trustworthy and rep.reasons
        for r in rep.reasons:
            if "too poorly estimated" in r:
                kinds.add("relative")
                worst = max(e for e in rep.relative_errors if e is not None)
                assert worst > MAX_RELATIVE_ERROR and f"relative error {worst:.2f})" in r
                assert all((e is None) == (rep.pinned_bounds[y] is not None) for y, e in enumerate(rep.relative_errors))
            else:
                kinds.add("pinned")
                y = int(r.split()[1])
                assert f"is {rep.pinned_bounds[y]:.3g} > {MAX_STANDARD_ERROR:g}" in r
    assert kinds == {"relative", "pinned"}         # both situations occur among these seeds


def test_identifiability_absent_class_is_not_flagged():
    """Severe shift: class 0 absent from the target. Its w_0 = 0 is determined by the likelihood's slope, not by
    curvature, so it must not be reported as unidentified."""
    q = np.array([0.0, 0.5, 0.5])
    F = draw_targets(910, 10, 1000, q)
    est = mlls(PS3).estimate(F)
    for s in range(10):
        rep = identifiability(F[s], est.weights[s], PS3)
        assert rep.trustworthy, rep.reasons


def test_identifiability_flags_near_singular_confusion_matrix():
    F = draw_targets(911, 1, 2000, Q3)[0]
    # two nearly identical columns (classes 1 and 2 predicted alike): sigma_min ~ 0.003
    C = np.array([[0.45, 0.02, 0.02], [0.03, 0.16, 0.16], [0.02, 0.12, 0.023]])
    C[2, 2] = 0.12 + 0.003
    C = C / C.sum()
    rep = identifiability(F, None, PS3, confusion=C, n_source=1000, estimator="BBSE-soft")
    assert not rep.trustworthy
    (reason,) = rep.reasons
    assert "sigma_min(C) * sqrt(n_source)" in reason and f"= {rep.confusion_snr:.3g} < 2" in reason
    assert rep.confusion_snr == pytest.approx(rep.confusion_sigma_min * math.sqrt(1000))
    assert rep.confusion_condition > 100
    # the same matrix beside an MLLS estimate is a BBSE cross-check's: a note, not a reason (MLLS is judged by its
    # own relative errors, and these classes are well separated in the calibrated outputs)
    mlls_rep = identifiability(F, None, PS3, confusion=C, n_source=1000)
    assert mlls_rep.trustworthy and mlls_rep.reasons == []
    (note,) = mlls_rep.notes
    assert note.startswith("BBSE cross-check: confusion matrix near singular") and reason in note
    assert Identifiability.from_dict(json.loads(json.dumps(mlls_rep.to_dict()))) == mlls_rep


def test_identifiability_flags_wide_interval():
    F = draw_targets(912, 1, 100, Q3)[0]
    w = mlls(PS3).estimate(F).weights
    iv = fisher_interval(F, w, PS3)
    widest = float(np.max(iv.weights_upper - iv.weights_lower))
    ok = identifiability(F, w, PS3, max_relative_width=widest * 1.01, interval=iv)
    bad = identifiability(F, w, PS3, max_relative_width=widest * 0.99, interval=iv)
    assert not any(r.startswith("interval") for r in ok.reasons)
    assert any(r.startswith("interval too wide") and f"width {widest:.3g} >" in r for r in bad.reasons)
    assert bad.max_weight_width == pytest.approx(widest)


# ---------------------------------------------------------------------------------------------------------------
# input validation and serialisation
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_problem():
    F = draw_targets(1000, 1, 300, Q3)[0]
    return F, mlls(PS3).estimate(F).weights


@pytest.mark.parametrize("fn", [fisher_interval, no_shift_test, identifiability])
def test_mismatched_classes_raise(fn, small_problem):
    F, w = small_problem
    with pytest.raises(InputError, match="weights has 2 entries but target_probs has 3"):
        fn(F, w[:2], PS3)
    with pytest.raises(InputError, match="source_prior has 2 entries but target_probs has 3"):
        fn(F, w, np.array([0.5, 0.5]))


@pytest.mark.parametrize("fn", [fisher_interval, no_shift_test, identifiability])
def test_bad_inputs_raise(fn, small_problem):
    F, w = small_problem
    with pytest.raises(InputError, match="logits"):
        fn(np.log(F), w, PS3)                                       # negative entries
    with pytest.raises(InputError, match="sum to 1"):
        fn(F * 2, w, PS3)
    with pytest.raises(InputError, match="not in W"):
        fn(F, w * 1.1, PS3)
    with pytest.raises(InputError, match="negative entries"):
        fn(F, w - 0.5, PS3)
    with pytest.raises(InputError, match="not the MLLS maximiser"):
        fn(F, np.ones(3), PS3)                                      # in W, but not the maximum for shifted data
    with pytest.raises(InputError, match="NaN"):
        fn(F, np.array([np.nan, 1.0, 1.0]), PS3)


def test_parameter_checks(small_problem):
    F, w = small_problem
    for level in (0, 1, 1.5, True):
        with pytest.raises(InputError, match="level"):
            fisher_interval(F, w, PS3, level=level)
    with pytest.raises(InputError, match="n_bootstrap"):
        bootstrap_interval(F, PS3, n_bootstrap=5)
    with pytest.raises(InputError, match="seed"):
        bootstrap_interval(F, PS3, seed=-1)
    with pytest.raises(InputError, match="significance"):
        no_shift_test(F, w, PS3).rejects(1.2)
    with pytest.raises(InputError, match="n_source"):
        identifiability(F, w, PS3, confusion=np.eye(3) / 3)
    with pytest.raises(InputError, match="without confusion"):
        identifiability(F, w, PS3, n_source=100)
    with pytest.raises(InputError, match="shape"):
        identifiability(F, w, PS3, confusion=np.eye(2) / 2, n_source=100)
    with pytest.raises(InputError, match="joint confusion matrix"):
        identifiability(F, w, PS3, confusion=np.eye(3), n_source=100)
    with pytest.raises(InputError, match="max_relative_width"):
        identifiability(F, w, PS3, max_relative_width=-1)


def test_to_dict_is_json(small_problem):
    F, w = small_problem
    iv = fisher_interval(F, w, PS3)
    d = iv.to_dict()
    assert isinstance(iv, PriorInterval) and isinstance(no_shift_test(F, w, PS3), NoShiftTest)
    assert set(d) >= {"target_prior", "lower", "upper", "weights", "weights_lower", "weights_upper", "std_error",
                      "level", "method"}
    assert all(isinstance(v, float) for v in d["lower"]) and len(d["upper"]) == 3
    assert json.loads(json.dumps(d, allow_nan=False))["method"] == "fisher"


def test_two_sample_no_shift_test_holds_its_level_when_the_calibrator_is_fit_on_source_data():
    """The realistic setting: BCTS fit on n = 1000 labelled source examples (it learns p_hat_s through its biases),
    targets of m = 2000 drawn from the *true* source prior. The known-prior likelihood-ratio test then mistakes the
    source sampling error for a shift; the two-sample test must not.

    300 seeds: the rejection rate of a 5%-level test has sd sqrt(0.05 * 0.95 / 300) = 0.0126, so a correct test lands
    in 0.05 +- 0.038 (3 sd); the bound is 0.05 + 3 sd = 0.088 above (the first-order theory ignores the temperature's
    own estimation error, a second-order effect). The LR test's rate here is about 0.40 (measured); it must exceed
    0.2, showing what the source term corrects. Power: a shift to Q3 at the same sizes is always detected.

    That is the level averaged over holdouts, a property of ``holdout_inflation=1``; the default counts the holdout
    kappa > 1 times (valid given the holdout), so its statistic is smaller draw for draw and it rejects no more often.
    """
    from labelshift.calibration import BCTS

    def logits(x):
        return np.log(PS3) - 0.5 * (np.asarray(x)[:, None] - MU3) ** 2

    n, m, seeds = 1000, 2000, 300
    rej_lr = rej_two = rej_default = detected = 0
    for seed in range(seeds):
        rng = np.random.default_rng([seed, 77])
        ys = rng.choice(3, n, p=PS3)
        xs = MU3[ys] + rng.standard_normal(n)
        cal = BCTS(input_kind="logits").fit(logits(xs), ys)
        source_probs = cal.predict_proba(logits(xs))
        est = MLLS().fit(source_probs, ys)
        for prior, shifted in ((PS3, False), (Q3, True)):
            if shifted and seed % 10:
                continue                       # power on 30 seeds is plenty
            yt = rng.choice(3, m, p=prior)
            P = cal.predict_proba(logits(MU3[yt] + rng.standard_normal(m)))
            w = est.estimate(P).weights
            two = no_shift_test(P, w, est.source_prior_, source_probs=source_probs, holdout_inflation=1.0)
            default = no_shift_test(P, w, est.source_prior_, source_probs=source_probs)
            assert two.method == "two-sample" and two.n_source == n and two.dof == 2
            assert default.holdout_inflation > 1.0 and default.statistic < two.statistic
            if shifted:
                detected += default.rejects(0.05)
            else:
                rej_two += two.rejects(0.05)
                rej_default += default.rejects(0.05)
                rej_lr += no_shift_test(P, w, est.source_prior_).rejects(0.05)
    print(f"two-sample test: rejection rate {rej_two / seeds:.3f}; known-prior LR test {rej_lr / seeds:.3f}; "
          f"power {detected}/30")
    assert 0.012 <= rej_two / seeds <= 0.088
    assert rej_default <= rej_two
    assert rej_lr / seeds > 0.2
    assert detected == 30


def test_two_sample_test_of_one_hot_outputs_is_the_pooled_t_test_of_two_proportions():
    """Closed form: with one-hot outputs and k = 2 the statistic is the square of Student's pooled two-sample t of
    the class-1 indicator, t^2 = (q1 - p1)^2 / (s2 (1/m + 1/n)) with the pooled variance
    s2 = (m q1 (1 - q1) + n p1 (1 - p1)) / (n + m - 2) (each side's sum of squares about its own mean), and Hotelling's
    law with one degree of freedom is Student's t with n + m - 2: p = 2 P(t_{n+m-2} >= |t|). That is the test at
    ``holdout_inflation=1``; with kappa the holdout side counts kappa times: t^2 = (q1 - p1)^2 / (s2 (1/m + kappa/n)),
    and the default's kappa is :func:`no_shift_inflation` at n, m and one degree of freedom."""
    n, m = 400, 600
    ys = np.r_[np.zeros(300, int), np.ones(100, int)]
    yt = np.r_[np.zeros(390, int), np.ones(210, int)]
    S, P = np.eye(2)[ys], np.eye(2)[yt]
    p = np.bincount(ys) / n
    w = MLLS().fit(S, ys).estimate(P).weights
    test = no_shift_test(P, w, p, source_probs=S, holdout_inflation=1.0)
    q1, p1 = yt.mean(), p[1]
    s2 = (m * q1 * (1 - q1) + n * p1 * (1 - p1)) / (n + m - 2)
    expected = (q1 - p1) ** 2 / (s2 * (1 / m + 1 / n))
    assert test.statistic == pytest.approx(expected, rel=1e-9) and test.dof == 1
    assert test.p_value == pytest.approx(2 * student_t.sf(math.sqrt(expected), n + m - 2), rel=1e-9)
    assert test.holdout_inflation == 1.0
    kappa = no_shift_inflation(n, m, 1)
    for given in (2.5, None):
        inflated = no_shift_test(P, w, p, source_probs=S, holdout_inflation=given)
        factor = kappa if given is None else given
        assert inflated.holdout_inflation == pytest.approx(factor, rel=1e-12)
        assert inflated.statistic == pytest.approx((q1 - p1) ** 2 / (s2 * (1 / m + factor / n)), rel=1e-9)
        assert inflated.p_value == pytest.approx(2 * student_t.sf(math.sqrt(inflated.statistic), n + m - 2), rel=1e-9)


def test_two_sample_test_is_symmetric_in_its_two_samples():
    """The pooled covariance and the quadratic form do not care which side is called the target."""
    S, P = draw_targets(31, 1, 300, PS3)[0], draw_targets(32, 1, 2000, Q3)[0]
    a = no_shift_test(P, None, PS3, source_probs=S, holdout_inflation=1.0)
    b = no_shift_test(S, None, PS3, source_probs=P, holdout_inflation=1.0)
    assert a.statistic == pytest.approx(b.statistic, rel=1e-9) and a.p_value == pytest.approx(b.p_value, rel=1e-9)
    assert (a.n_source, a.n_target, b.n_source, b.n_target) == (300, 2000, 2000, 300)
    # two rows a side: the pooled covariance has rank <= n + m - 2 = 2 = k - 1, and the F law stays defined
    tiny = no_shift_test(P[:2], None, PS3, source_probs=S[:2])
    assert 1 <= tiny.dof <= 2 and 0.0 <= tiny.p_value <= 1.0


def test_two_sample_test_holds_its_level_with_rare_classes_and_m_much_larger_than_n():
    """The case that made the unpooled form liberal: k = 10 well-separated classes (``WellSpecifiedGaussians.make``,
    exact posteriors, so no calibrator), the rarest at p_s = 0.048, n = 200 source rows (about 10 of that class) and
    m = 3000 target rows, both from the source prior. A rare class's prediction is near 0 or 1, so a source sample
    with few such rows has a low mean *and* a low variance for it; with the source's own covariance as its
    variance, the unpooled statistic is inflated exactly when the difference is large (measured: 10.2% false alarms
    over 2000 seeds). The pooled covariance is dominated by the m target rows, nearly independent of the source
    mean. 1000 seeds: a correct 5% test's rate has sd sqrt(0.05 * 0.95 / 1000) = 0.0069, so it lies in 0.05 +- 3 sd
    = [0.029, 0.071]; the p-values' mean is 0.5 +- 3 sqrt(1 / 12 / 1000) = 0.5 +- 0.027."""
    from labelshift.experiments.well_specified import WellSpecifiedGaussians

    problem = WellSpecifiedGaussians.make(10)
    k, n, m, seeds = 10, 200, 3000, 1000
    ps = problem.source_prior
    pvals = []
    for seed in range(seeds):
        rng = np.random.default_rng([seed, 11])
        rows = []
        for size in (n, m):
            x = rng.standard_normal((size, k))
            x[np.arange(size), rng.choice(k, size, p=ps)] += problem.sep
            rows.append(problem.posterior(x))
        test = no_shift_test(rows[1], None, ps, source_probs=rows[0], holdout_inflation=1.0)
        assert test.method == "two-sample" and test.dof == k - 1
        pvals.append(test.p_value)
    pvals = np.asarray(pvals)
    rate = float(np.mean(pvals < 0.05))
    sd = math.sqrt(0.05 * 0.95 / seeds)
    assert 0.05 - 3 * sd <= rate <= 0.05 + 3 * sd, rate
    assert abs(pvals.mean() - 0.5) <= 3 * math.sqrt(1 / 12 / seeds), pvals.mean()
