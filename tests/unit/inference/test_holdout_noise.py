"""The holdout's error in the label-shift test's reference laws (label_shift_test.holdout_noise): both bootstraps
draw each class's holdout rows as if the holdout had ceil(n_y / kappa) of them, so that the law carries the
holdout's sampling variance kappa times over; kappa = 1 is the test averaged over holdouts (the draws of before)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.stats import chi2, norm

from labelshift.errors import InputError
from labelshift.inference.label_shift_test import label_shift_test
from labelshift.inference.label_shift_test import log_odds as lot
from labelshift.inference.label_shift_test.holdout_noise import (HOLDOUT_INFLATION, class_inflation, drawn_rows,
                                                                 holdout_share, inflation_for_share)
from labelshift.inference.label_shift_test.null_fit import bootstrap_null

from .test_label_shift_test import K, SOURCE_PRIOR, draw, holdout, posterior


def test_drawn_rows():
    n_y = np.array([2, 3, 5, 1000, 1001])
    assert np.array_equal(drawn_rows(n_y, 1.0), n_y)
    assert np.array_equal(drawn_rows(n_y, 2.0), [2, 2, 3, 500, 501])        # ceil(n / 2), at least 2, at most n
    assert np.array_equal(drawn_rows(n_y, 3.0), [2, 2, 2, 334, 334])
    assert HOLDOUT_INFLATION >= 1.0                                     # the default: a fixed kappa
    # one kappa per class: each class its own
    assert np.array_equal(drawn_rows(n_y, [1.0, 2.0, 1.0, 2.0, 3.0]), [2, 2, 5, 500, 334])


def _normal_quantiles(k, level=0.05, tail=0.05):
    # c^2 and u^2 by another path than holdout_noise's (chi^2 with 1 dof, Sidak's per-class tail by pow)
    return float(chi2.isf(level, 1)), float(chi2.isf(1.0 - (1.0 - tail) ** (1.0 / k), 1))


def test_inflation_for_share_limits_and_monotone():
    for k in (2, 4, 10, 100):
        c2, u2 = _normal_quantiles(k)
        r = np.linspace(0.0, 1.0, 2001)
        kappa = inflation_for_share(r, k)
        assert kappa[0] == 1.0 and np.all(kappa >= 1.0)
        assert np.all(np.diff(kappa) >= 0.0)                                  # nondecreasing in the share
        # r -> 1: u^2 / c^2 (the holdout one in twenty entirely fixed); r at or under (c^2 - 1) / (u^2 - 1): 1
        assert abs(kappa[-1] - u2 / c2) <= 1e-9 * u2 / c2
        assert np.all(kappa[r <= (c2 - 1.0) / (u2 - 1.0) - 1e-9] == 1.0)
        assert np.all(kappa[r > (c2 - 1.0) / (u2 - 1.0) + 1e-6] > 1.0)
    # k = 10 at the defaults: about 2 where the holdout is all of it (the fixed kappa of before)
    assert 2.0 < float(inflation_for_share(1.0, 10)) < 2.1
    # more classes: a larger largest class error one holdout in twenty, a larger kappa
    assert float(inflation_for_share(1.0, 100)) > float(inflation_for_share(1.0, 10)) > \
        float(inflation_for_share(1.0, 4))


def test_inflation_for_share_meets_its_criterion():
    # at kappa(r) > 1 the expected squared statistic given the holdout at its quantile, E[(sqrt(1 - r) e +
    # sqrt(r) u)^2], integrated numerically over e ~ N(0, 1), equals the inflated law's critical value
    # (1 - r + kappa r) c^2; quad's error bound is ~1e-10 of the value, the quantiles' paths agree to ~1e-12:
    # 1e-8 relative
    k = 10
    c2, u2 = _normal_quantiles(k)
    u = np.sqrt(u2)
    for r in (0.45, 0.6, 0.8, 0.95, 0.999):
        kappa = float(inflation_for_share(r, k))
        assert kappa > 1.0
        second, err = quad(lambda e, r=r: (np.sqrt(1 - r) * e + np.sqrt(r) * u) ** 2 * norm.pdf(e), -np.inf, np.inf,
                           epsabs=0.0, epsrel=1e-11)
        critical = (1.0 - r + kappa * r) * c2
        assert err <= 1e-9 * second
        assert abs(second - critical) <= 1e-8 * critical


def test_holdout_share_and_class_inflation():
    n_y = np.array([100, 100, 100, 0])
    q = np.array([0.5, 0.0, 0.5, 0.0])
    r = holdout_share(n_y, 1000, q)
    assert np.allclose(r, [500 / 600, 0.0, 500 / 600, 0.0], rtol=1e-12, atol=0)
    assert np.array_equal(class_inflation(1.0, n_y, 1000, q), np.ones(4))
    assert np.array_equal(class_inflation(2.5, n_y, 1000, q), np.full(4, 2.5))
    derived = class_inflation(None, n_y, 1000, q)
    assert np.array_equal(derived, inflation_for_share(r, 4))
    assert derived[1] == 1.0 and derived[0] > 1.0


def test_regions_bootstrap_carries_the_holdouts_error_kappa_times():
    # with the target's error negligible (m = 10^7 against n_y = 2,000: its share of the variance about 1e-3) the
    # likelihood ratio of a draw is kappa times what it is at kappa = 1 (the holdout's deviations kappa times their
    # variance, weighed as n_y rows; about chi^2_{J-k} at kappa = 1): 400 draws on one seed, the ratio of the means
    # within 19% of kappa (each mean's relative se sqrt(2 / d) / 20 = 0.025, a ratio's at most 0.035: 4 se, plus 5%
    # for the finite-sample bias, as test_bootstrap_follows_the_chi_squared_law_when_wilks_applies)
    rng = np.random.default_rng(8)
    k, J = 4, 12
    pi = rng.dirichlet(np.full(J, 5.0), size=k)
    q = np.array([0.2, 0.3, 0.25, 0.25])
    n_y = np.array([2000] * 4)
    mean = {kappa: np.concatenate(list(bootstrap_null(pi, q, n_y, 10_000_000, 400, 0, 100, kappa))).mean()
            for kappa in (1.0, 2.0, 3.0)}
    for kappa in (2.0, 3.0):
        assert abs(mean[kappa] / mean[1.0] / kappa - 1.0) <= 0.19
    # kappa = 1 is the bootstrap of before, draw for draw
    assert np.array_equal(np.concatenate(list(bootstrap_null(pi, q, n_y, 20_000, 40, 3, None, 1.0))),
                          np.concatenate(list(bootstrap_null(pi, q, n_y, 20_000, 40, 3))))


def test_log_odds_draws_carry_the_holdouts_error_kappa_times():
    # each class's mean moments in a draw average r_y = ceil(n_y / kappa) rows drawn with replacement from the
    # world, so their variance over draws is n_y / r_y times that at kappa = 1 (about 2 at kappa = 2); 600 draws:
    # each variance has relative sd sqrt(2 / 599) = 0.058, a ratio about 0.082 (0.16 at ratio 2); the mean ratio of
    # a class's moments within 0.4 of n_y / r_y (more than 4 sd of a single moment's ratio)
    rng = np.random.default_rng(3)
    S, ys = holdout(1200, rng)
    xt, _ = draw(np.array([0.4, 0.3, 0.2, 0.1]), 3000, rng)
    P = posterior(xt)
    hm = lot._holdout_moments(S, ys, P, K)
    var = {}
    for kappa in (1.0, 2.0):
        wd = lot._world_draws(hm, ys, P, 600, 5, lambda Z: Z, SOURCE_PRIOR, kappa)
        assert np.array_equal(wd.n_y, drawn_rows(hm.n_y, kappa))
        var[kappa] = lot._draw_moments(hm, wd, slice(0, 600), P.shape[0]).Mb.var(axis=0)        # (d, k)
    ok = var[1.0] > 1e-10
    for c in range(K):
        ratio = float(np.mean(var[2.0][ok[:, c], c] / var[1.0][ok[:, c], c]))
        assert abs(ratio - hm.n_y[c] / drawn_rows(hm.n_y, 2.0)[c]) < 0.4


def test_holdout_inflation_is_checked_and_recorded():
    rng = np.random.default_rng(4)
    S, ys = holdout(800, rng)
    P = posterior(draw(SOURCE_PRIOR, 1000, rng)[0])
    for bad in (0.5, True, float("nan"), "2"):
        with pytest.raises(InputError, match="holdout_inflation"):
            label_shift_test(S, ys, P, holdout_inflation=bad, bootstrap_draws=19)
    for bad in ("Derived", "2.0"):
        with pytest.raises(InputError, match="'derived'"):
            label_shift_test(S, ys, P, holdout_inflation=bad, bootstrap_draws=19)
    assert label_shift_test(S, ys, P, bootstrap_draws=39).extra["holdout_inflation"] == [HOLDOUT_INFLATION] * K
    res = label_shift_test(S, ys, P, bootstrap_draws=39, holdout_inflation="derived")
    kappa = np.asarray(res.extra["holdout_inflation"])                 # one per class, from the shares
    assert kappa.shape == (K,) and np.all(kappa >= 1.0) and np.all(kappa <= inflation_for_share(1.0, K))
    assert label_shift_test(S, ys, P, bootstrap_draws=39, holdout_inflation=1).extra["holdout_inflation"] == [1.0] * K
    assert label_shift_test(S, ys, P, bootstrap_draws=39, log_odds=False,
                            holdout_inflation=2).extra["holdout_inflation"] == [2.0] * K


def test_the_assessment_passes_its_setting_to_the_test_and_defaults_to_the_tests_own_kappa():
    """assess_shift's label-shift test counts the holdout's error as AssessmentSettings.label_shift_holdout_inflation
    says (the flow's --label-shift-holdout-inflation), by default the test's own HOLDOUT_INFLATION."""
    from labelshift import AssessmentSettings, Holdout, assess_shift
    from labelshift.inference.settings import DEFAULTS

    assert DEFAULTS.label_shift_holdout_inflation == HOLDOUT_INFLATION
    rng = np.random.default_rng(5)
    S, ys = holdout(800, rng)
    P = posterior(draw(SOURCE_PRIOR, 1000, rng)[0])
    for kappa in (1.0, 3.0):
        report = assess_shift(Holdout(S, ys, S.mean(axis=0)), P,
                              AssessmentSettings(interval="fisher", label_shift_holdout_inflation=kappa))
        assert report.label_shift.extra["holdout_inflation"] == [kappa] * K
