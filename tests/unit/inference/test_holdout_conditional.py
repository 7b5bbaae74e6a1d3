"""Counting the holdout's error kappa times (:mod:`labelshift.inference.holdout_conditional`): the derived factor
meets its defining equation, the no-shift test given one holdout rejects at the rate the non-central chi^2 law
predicts (and at the level for a holdout at the design quantile), and the source-aware interval scales its holdout
part by kappa and by nothing else. Every seed is fixed; tolerances are derived in the comments.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy.stats import chi2, ncx2

from labelshift.calibration.scaling import BCTS
from labelshift.errors import InputError
from labelshift.experiments.well_specified import WellSpecifiedGaussians
from labelshift.inference.holdout_conditional import (INTERVAL_CONDITIONAL_COVERAGE, INTERVAL_QUANTILE,
                                                      NO_SHIFT_DESIGN_LEVEL, NO_SHIFT_QUANTILE, holdout_inflation,
                                                      interval_inflation, no_shift_inflation)
from labelshift.inference.no_shift import no_shift_test
from labelshift.inference.source_aware import source_aware_interval


@pytest.mark.parametrize("dof", [1, 2, 9, 99])
@pytest.mark.parametrize("rho", [0.05, 1.0, 20.0])
def test_the_factor_solves_its_defining_equation(dof, rho):
    """At the returned kappa (> 1 here) the holdout at the design quantile is rejected with probability ``rate``:
    P(chi^2_dof(rho s_q) > c (1 + kappa rho)) = rate, evaluated by a second route (the survival function, not the
    inverse the code uses), so the two agree to the root-finding accuracy of scipy's ncx2 (1e-6 relative)."""
    kappa = float(holdout_inflation(rho, dof, level=0.05, rate=0.05, quantile=0.99))
    assert kappa > 1.0
    c, s_q = chi2.isf(0.05, dof), chi2.ppf(0.99, dof)
    assert ncx2.sf(c * (1.0 + kappa * rho), dof, rho * s_q) == pytest.approx(0.05, rel=1e-6)
    # a higher quantile asks more; at kappa = 1 the quantile holdout is rejected more often than the rate
    assert holdout_inflation(rho, dof, level=0.05, rate=0.05, quantile=0.995) > kappa
    assert ncx2.sf(c * (1.0 + rho), dof, rho * s_q) > 0.05


def test_the_factor_is_one_without_holdout_error_and_checks_its_arguments():
    assert holdout_inflation(0.0, 3, level=0.05, rate=0.05, quantile=0.99) == 1.0
    np.testing.assert_array_equal(interval_inflation([1.0, 1.0, 0.0], [0.0, 1e-9, 1.0], 0.95), [1.0, 1.0, 1.0])
    assert no_shift_inflation(1000, 20_000, 9) == pytest.approx(
        float(holdout_inflation(20.0, 9, level=NO_SHIFT_DESIGN_LEVEL, rate=NO_SHIFT_DESIGN_LEVEL,
                                quantile=NO_SHIFT_QUANTILE)), rel=1e-12)
    for bad in (dict(level=0.0), dict(rate=1.0), dict(quantile=1.5)):
        args = dict(level=0.05, rate=0.05, quantile=0.99) | bad
        with pytest.raises(InputError, match=next(iter(bad))):
            holdout_inflation(1.0, 2, **args)
    with pytest.raises(InputError, match="rho"):
        holdout_inflation(-1.0, 2, level=0.05, rate=0.05, quantile=0.99)
    with pytest.raises(InputError, match="n_source"):
        no_shift_inflation(0, 100, 2)
    with pytest.raises(InputError, match="holdout_inflation"):
        no_shift_test(np.eye(3)[[0, 1, 2, 0]], None, np.full(3, 1 / 3), source_probs=np.eye(3)[[0, 1, 2]],
                      holdout_inflation=0.5)


def test_interval_factor_meets_the_conditional_coverage():
    """Where the holdout's share r of a class's variance makes kappa > 1, a holdout whose standardised error is at
    the INTERVAL_QUANTILE of |N(0, 1)| covers with probability INTERVAL_CONDITIONAL_COVERAGE: P(|sqrt(r) u +
    sqrt(1 - r) N| <= z sqrt(1 - r + kappa r)), from the normal law (a route independent of the ncx2 inverse)."""
    from scipy.stats import norm
    r = np.array([0.4, 0.5, 0.7, 0.85])
    kappa = interval_inflation(1.0 - r, r, 0.95)
    assert np.all(kappa > 1.0)
    z, u = norm.ppf(0.975), norm.ppf(0.5 + INTERVAL_QUANTILE / 2)
    half = z * np.sqrt(1.0 - r + kappa * r)
    cover = norm.cdf((half - np.sqrt(r) * u) / np.sqrt(1 - r)) - norm.cdf((-half - np.sqrt(r) * u) / np.sqrt(1 - r))
    np.testing.assert_allclose(cover, INTERVAL_CONDITIONAL_COVERAGE, rtol=1e-6)


def test_no_shift_test_given_one_unlucky_holdout_rejects_as_derived():
    """One-hot outputs, k = 3, p = (0.5, 0.3, 0.2): a holdout of n = 500 rows whose counts (279, 121, 100) put its
    error at s = n sum_y (p_hat_y - p_y)^2 / p_y = 8.97, near the 99th percentile of chi^2_2 (9.21); 1,000 fresh
    targets of m = 10,000 rows at p (rho = 20). Given that holdout the statistic is chi^2_2(rho s) / (1 + kappa rho)
    to first order, so the rate is P(chi^2_2(rho s) > c (1 + kappa rho)): 0.99 at kappa = 1 (the test
    before) and 0.034 at the derived kappa (1.89). Tolerance: 3 binomial sd at 1,000 targets plus 0.02 for the
    first-order law (the pooled covariance is estimated, the F law in place of chi^2)."""
    p = np.array([0.5, 0.3, 0.2])
    n, m, targets = 500, 10_000, 1000
    counts = np.array([279, 121, 100])
    S = np.eye(3)[np.repeat(np.arange(3), counts)]
    s = n * float(np.sum((counts / n - p) ** 2 / p))
    rho, c = m / n, chi2.isf(0.05, 2)
    rng = np.random.default_rng(38)
    rejected = {1.0: 0, None: 0}
    for _ in range(targets):
        P = np.eye(3)[rng.choice(3, m, p=p)]
        for kappa in rejected:
            rejected[kappa] += no_shift_test(P, None, p, source_probs=S, holdout_inflation=kappa).rejects(0.05)
    derived = no_shift_inflation(n, m, 2)
    for kappa, count in rejected.items():
        factor = derived if kappa is None else kappa
        predicted = float(ncx2.sf(c * (1.0 + factor * rho), 2, rho * s))
        tol = 3 * math.sqrt(predicted * (1 - predicted) / targets) + 0.02
        assert abs(count / targets - predicted) <= tol, (kappa, count / targets, predicted)
    assert rejected[None] / targets <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / targets)
    assert rejected[1.0] / targets > 0.5


@pytest.fixture(scope="module")
def interval_case():
    """BCTS on 400 holdout rows of 3 Gaussian classes, 20,000 target rows: the holdout's share of the variance is
    large enough that the derived kappa exceeds 1."""
    problem = WellSpecifiedGaussians.make(3)
    rng = np.random.default_rng(5)
    Xh, yh = problem.holdout(400, rng)
    Xt, _ = problem.draw(np.array([0.2, 0.3, 0.5]), 20_000, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = BCTS(tol=1e-7).fit(Xh, yh)
    return Xh, yh, Xt, cal


def test_interval_counts_its_holdout_part_kappa_times(interval_case):
    """kappa = 1 is the interval before: its holdout covariance is the influence's, infl^T infl / n^2 (a second
    route, to 1e-9 relative); kappa = 3 multiplies that part and nothing else (target part, estimate unchanged),
    and the standard errors are sqrt(target + 3 holdout); the default's kappa is the largest per-class
    interval_inflation of the kappa = 1 shares, and the total covariance keeps (1, ..., 1) in its null space."""
    Xh, yh, Xt, cal = interval_case
    one = source_aware_interval(Xh, yh, Xt, cal, holdout_inflation=1.0)
    three = source_aware_interval(Xh, yh, Xt, cal, holdout_inflation=3.0)
    default = source_aware_interval(Xh, yh, Xt, cal)
    n = Xh.shape[0]
    infl = one.holdout_influence
    np.testing.assert_allclose(one.covariance_holdout, infl.T @ infl / n ** 2, rtol=1e-9, atol=1e-15)
    assert one.extra["holdout_inflation"] == 1.0 and three.extra["holdout_inflation"] == 3.0
    np.testing.assert_allclose(three.covariance_target, one.covariance_target, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(three.covariance_holdout, 3.0 * one.covariance_holdout, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(three.target_prior, one.target_prior, rtol=1e-12)
    np.testing.assert_allclose(three.std_error ** 2, np.diag(one.covariance_target)
                               + 3.0 * np.diag(one.covariance_holdout), rtol=1e-9)
    kappa = float(np.max(interval_inflation(np.diag(one.covariance_target), np.diag(one.covariance_holdout), 0.95)))
    assert kappa > 1.0
    assert default.extra["holdout_inflation"] == pytest.approx(kappa, rel=1e-9)
    np.testing.assert_allclose(default.covariance_holdout, kappa * one.covariance_holdout, rtol=1e-9, atol=1e-15)
    assert np.all(default.upper - default.lower >= one.upper - one.lower - 1e-15)
    assert np.abs(default.covariance.sum(axis=1)).max() < 1e-12
    with pytest.raises(InputError, match="holdout_inflation"):
        source_aware_interval(Xh, yh, Xt, cal, holdout_inflation=float("nan"))
