"""The source-aware interval of labelshift.inference.source_aware: coverage, covariance against the empirical spread,
the target-only part, classes pinned at 0, and bad input.

The problems are :class:`labelshift.experiments.well_specified.WellSpecifiedGaussians`: Gaussian classes whose model
logits are an affine map of the exact posterior logits, so BCTS (and VS) contain the exact posterior and the only
errors are the finite holdout and the finite target. Every seed is fixed, so every assertion is deterministic; the
tolerances say how far a correct method could stray by chance and are derived in the comments.
"""
import json
import math
import warnings
from functools import partial

import numpy as np
import pytest

from labelshift.calibration.discrete import BinningCalibrator
from labelshift.calibration.scaling import BCTS, TemperatureScaling, VectorScaling
from labelshift.errors import InputError
from labelshift.experiments.well_specified import WellSpecifiedGaussians
from labelshift.inference.source_aware import (METHOD, MIN_ROWS_PER_PARAMETER, SourceAwareInterval, min_holdout_rows,
                                               source_aware_interval)
from labelshift.inference.intervals import PriorInterval, fisher_interval

PRIOR3 = np.array([0.2, 0.3, 0.5])


# the calibrators' default gtol is 1e-9; 1e-7 fits in fewer iterations (the tests' main cost) and leaves the mean
# holdout score far below the 5% of a standard error that source_aware_interval accepts
FastBCTS = partial(BCTS, tol=1e-7)


def fit_and_interval(problem, prior, n, m, rng, calibrator=FastBCTS, **kw):
    Xh, yh = problem.holdout(n, rng)
    Xt, _ = problem.draw(prior, m, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = calibrator().fit(Xh, yh)
        return source_aware_interval(Xh, yh, Xt, cal, **kw), (Xh, yh, Xt, cal)


@pytest.fixture(scope="module")
def problem3():
    return WellSpecifiedGaussians.make(3)


def test_result_is_a_prior_interval_with_the_holdout_terms(problem3):
    r, (Xh, yh, Xt, cal) = fit_and_interval(problem3, PRIOR3, 1000, 5000, np.random.default_rng(0))
    assert isinstance(r, SourceAwareInterval) and isinstance(r, PriorInterval)
    assert r.method == METHOD == "source-aware" and r.n_source == 1000 and r.n_target == 5000
    assert r.calibrator == "BCTS" and r.trustworthy and r.reasons == []
    # p_s is the mean calibrated holdout prediction (the flow's ModelBundle.source_prior)
    np.testing.assert_allclose(r.source_prior, cal.predict_proba(Xh).mean(axis=0), atol=1e-12)
    np.testing.assert_allclose(r.target_prior, r.source_prior * r.weights, atol=1e-15)
    np.testing.assert_allclose(r.covariance, r.covariance_target + r.covariance_holdout, atol=1e-18)
    for c in (r.covariance, r.covariance_target, r.covariance_holdout):
        assert np.linalg.eigvalsh(c)[0] > -1e-12
        # p_t sums to 1, so every part has (1, ..., 1) in its null space
        assert np.abs(c.sum(axis=1)).max() < 1e-12
    assert np.all(np.diag(r.covariance_holdout) > 0)
    assert np.all(r.lower <= r.target_prior) and np.all(r.target_prior <= r.upper)
    json.dumps(r.to_dict(), allow_nan=False)


def test_target_part_is_the_fisher_interval(problem3):
    """The target-only part of the sandwich is exactly the constrained Fisher covariance of fisher_interval (the
    two coincide at the MLLS optimum; module docstring of labelshift.inference.intervals)."""
    r, (Xh, yh, Xt, cal) = fit_and_interval(problem3, PRIOR3, 1000, 5000, np.random.default_rng(1))
    f = fisher_interval(cal.predict_proba(Xt), r.weights, r.source_prior)
    np.testing.assert_allclose(r.target_only.std_error, f.std_error, rtol=1e-6)
    np.testing.assert_allclose(r.target_only.lower, f.lower, atol=1e-10)
    np.testing.assert_allclose(r.target_only.upper, f.upper, atol=1e-10)
    np.testing.assert_allclose(np.sqrt(np.diag(r.covariance_target)), f.std_error, rtol=1e-6)
    assert np.all(r.std_error > f.std_error)


@pytest.mark.slow          # about 5 s of CPU (120 BCTS fits)
def test_coverage_in_a_small_cell(problem3):
    """k = 3, n = 300 holdout rows, m = 6000 target rows, Dirichlet(1) priors, 120 seeds: about 360 free
    class-intervals.

    Tolerance: the binomial standard error of a coverage of 0.95 over N = 360 (nearly independent: the prior is
    redrawn per seed) intervals is sqrt(0.95 * 0.05 / 360) = 0.0115; we allow 3.5 of them, 0.040, on either side.
    The target-only Fisher interval, which treats the calibrator and p_s as known, covers far less here (about
    0.8: the holdout's error is about half the variance when m = 20 n), which shows the test can tell them apart."""
    covered = covered_fisher = total = 0
    for seed in range(120):
        rng = np.random.default_rng([7, seed])
        prior = rng.dirichlet(np.ones(3))
        r, _ = fit_and_interval(problem3, prior, 300, 6000, rng)
        free = ~r.pinned
        covered += int(r.covers(prior)[free].sum())
        covered_fisher += int(r.target_only.covers(prior)[free].sum())
        total += int(free.sum())
    assert total >= 350
    assert abs(covered / total - 0.95) <= 3.5 * math.sqrt(0.95 * 0.05 / total)
    assert covered_fisher / total < 0.88


@pytest.mark.slow          # about 4 s of CPU each (100 fits)
@pytest.mark.parametrize("calibrator", [FastBCTS, partial(VectorScaling, tol=1e-7)], ids=["BCTS", "VS"])
def test_covariance_matches_the_spread_over_fresh_holdouts_and_targets(problem3, calibrator):
    """Fixed prior; R = 100 replications, each with a fresh holdout (n = 300) and target (m = 6000). The sample
    standard deviation of R normal draws has relative standard error 1/sqrt(2 (R - 1)) = 7.1%; the reported
    standard error varies a little between replications too (the root of its mean square is used). Tolerance 0.2
    on |ratio - 1|, about 3 standard errors. The holdout's share of the variance is asserted to be above 0.4, so
    that the target-only standard error (at most sqrt(0.6) = 0.77 of the total) would fail the same test."""
    R = 100
    est, ses, share = [], [], []
    for seed in range(R):
        r, _ = fit_and_interval(problem3, PRIOR3, 300, 6000, np.random.default_rng([11, seed]),
                                calibrator=calibrator)
        est.append(r.target_prior)
        ses.append(r.std_error ** 2)
        share.append(r.holdout_share)
    sd_emp = np.std(np.array(est), axis=0, ddof=1)
    sd_rep = np.sqrt(np.mean(ses, axis=0))
    np.testing.assert_array_less(np.abs(sd_rep / sd_emp - 1.0), 0.2)
    assert np.mean(share) > 0.4


def test_temperature_scaling_runs_and_differs_from_the_label_frequencies():
    """TS has no bias, so p_s (the mean calibrated prediction) is not the label frequencies; the interval is for
    that p_s. A TS-well-specified problem: no offset."""
    problem = WellSpecifiedGaussians(source_prior=np.array([0.5, 0.3, 0.2]), offset=None)
    r, (Xh, yh, Xt, cal) = fit_and_interval(problem, PRIOR3, 600, 5000, np.random.default_rng(3),
                                            calibrator=TemperatureScaling)
    assert r.calibrator == "TS" and r.extra["n_parameters"] == 1
    np.testing.assert_allclose(r.source_prior, cal.predict_proba(Xh).mean(axis=0), atol=1e-12)
    assert np.all(np.isfinite(r.std_error)) and np.all(np.diag(r.covariance_holdout) > 0)


def test_pinned_class_gets_a_wider_one_sided_interval(problem3):
    """A class absent from the target is pinned at w = 0: [0, U] with U at least the target-only profile bound
    (the holdout's variance only widens it), and the interval covers the true 0."""
    prior = np.array([0.0, 0.4, 0.6])
    r, _ = fit_and_interval(problem3, prior, 1000, 20_000, np.random.default_rng(5))
    assert r.pinned.tolist() == [True, False, False]
    assert r.lower[0] == 0.0 and r.weights_lower[0] == 0.0
    assert r.upper[0] >= r.target_only.upper[0] > 0
    assert math.isnan(r.std_error[0]) and math.isnan(r.weights_std_error[0])
    assert np.all(r.covers(prior))


def test_poorly_identified_case_is_untrustworthy():
    """Nearly overlapping classes (sep = 0.3) and a small target: the standard error of w in its worst direction
    is far above 1/2, which is reported, not hidden."""
    problem = WellSpecifiedGaussians.make(3, sep=0.3)
    r, _ = fit_and_interval(problem, PRIOR3, 300, 200, np.random.default_rng(2))
    assert not r.trustworthy
    assert any("standard error" in s or "not identified" in s for s in r.reasons)


# ---------------------------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_setup(problem3):
    rng = np.random.default_rng(9)
    Xh, yh = problem3.holdout(300, rng)
    Xt, _ = problem3.draw(PRIOR3, 500, rng)
    return Xh, yh, Xt, BCTS().fit(Xh, yh)


@pytest.mark.parametrize("level", [0, 1, 1.5, -0.1, True, "0.95", float("nan")])
def test_level_outside_0_1(small_setup, level):
    Xh, yh, Xt, cal = small_setup
    with pytest.raises(InputError, match=r"level must be .* strictly between 0 and 1"):
        source_aware_interval(Xh, yh, Xt, cal, level=level)


def test_holdout_too_small_names_the_minimum(problem3):
    """BCTS on k = 3 classes has 3 parameters, so the minimum is max(10 * 3, 2 * 3) = 30 rows."""
    assert min_holdout_rows("BCTS", 3) == 3 * MIN_ROWS_PER_PARAMETER == 30
    assert min_holdout_rows("VS", 10) == 190 and min_holdout_rows("TS", 3) == 10
    rng = np.random.default_rng(4)
    Xh, yh = problem3.draw(np.array([1 / 3, 1 / 3, 1 / 3]), 24, rng)
    Xt, _ = problem3.draw(PRIOR3, 200, rng)
    cal = BCTS().fit(Xh, yh)
    with pytest.raises(InputError, match=r"24 rows, too few .* at least 30 .*Label more holdout rows"):
        source_aware_interval(Xh, yh, Xt, cal)


def test_class_without_holdout_example(small_setup):
    Xh, yh, Xt, cal = small_setup
    keep = yh != 2
    with pytest.raises(InputError, match=r"no example of class\(es\) \[2\].*Add labelled holdout rows"):
        source_aware_interval(Xh[keep], yh[keep], Xt, cal)


def test_calibrator_fit_on_other_rows(problem3, small_setup):
    Xh, yh, Xt, cal = small_setup
    X2, y2 = problem3.holdout(300, np.random.default_rng(99))
    with pytest.raises(InputError, match=r"not fit on these holdout rows.*refit"):
        source_aware_interval(X2, y2, Xt, cal)


def test_unsupported_or_unfitted_calibrator(small_setup):
    Xh, yh, Xt, cal = small_setup
    with pytest.raises(InputError, match=r"not fitted"):
        source_aware_interval(Xh, yh, Xt, BCTS())
    hb = BinningCalibrator().fit(np.exp(Xh) / np.exp(Xh).sum(1, keepdims=True), yh)
    with pytest.raises(InputError, match=r"interval='fisher'"):
        source_aware_interval(Xh, yh, Xt, hb)
    with pytest.raises(InputError, match=r"interval='fisher'"):
        source_aware_interval(Xh, yh, Xt, None)


def test_mismatched_shapes_and_weights(small_setup):
    Xh, yh, Xt, cal = small_setup
    with pytest.raises(InputError, match=r"target_outputs has 2 class columns"):
        source_aware_interval(Xh, yh, Xt[:, :2], cal)
    with pytest.raises(InputError, match=r"holdout_labels has .* labels but the outputs have"):
        source_aware_interval(Xh, yh[:-1], Xt, cal)
    with pytest.raises(InputError, match=r"MLLS"):
        source_aware_interval(Xh, yh, Xt, cal, weights=np.ones(3))
    r = source_aware_interval(Xh, yh, Xt, cal)
    r2 = source_aware_interval(Xh, yh, Xt, cal, weights=r.weights)
    np.testing.assert_allclose(r2.upper, r.upper)
