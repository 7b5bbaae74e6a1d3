"""Holdouts the model separates: the scaling calibrators' weak prior keeps their fits finite, the
source-aware interval accepts a calibrator fit on exactly those rows, and the default path of ``assess_shift``
returns a report -- never an exception that blames the input -- while the user's own errors still raise.

The problems are :class:`labelshift.experiments.well_specified.WellSpecifiedGaussians`: 5 classes at separation 6
(100% holdout accuracy at n = 2,000) and 10 classes at separation 4.3 (about 99%), the model's logits 1.8 times the
exact posterior logits plus a class bias. Every seed is fixed.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from labelshift.calibration import load_calibrator
from labelshift.calibration.scaling import BCTS, NBVS, PRIOR_SD, TS, VS
from labelshift.errors import InputError
from labelshift.experiments.well_specified import WellSpecifiedGaussians
from labelshift.inference.source_aware import source_aware_interval
from labelshift.inference.report import VERDICTS, ShiftReport, assess_shift
from labelshift import Holdout, Target, AssessmentSettings

SEPARABLE = [(5, 6.0, seed) for seed in range(4)] + [(10, 4.3, 0)]
N, M = 2000, 5000


def draw(k: int, sep: float, seed: int, n: int = N, m: int = M):
    """(holdout outputs, labels, target outputs, target prior): the target prior puts 0.4 on class 0 and shares
    the rest, so it is far from the source prior (a clearly shifted target)."""
    problem = WellSpecifiedGaussians.make(k, sep=sep)
    rng = np.random.default_rng(seed)
    Xh, yh = problem.holdout(n, rng)
    truth = np.full(k, 0.6 / (k - 1))
    truth[0] = 0.4
    Xt, _ = problem.draw(truth, m, rng)
    return Xh, yh, Xt, truth


def fit(cls, Xh, yh, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**kw).fit(Xh, yh)


def default_path(Xh, yh, Xt, cal):
    """assess_shift as the reestimate flow calls it by default (flows/params.py): MLLS, the source-aware interval,
    BBSE-soft as the cross-check, the label-shift test and the accuracy."""
    sp, tp = cal.predict_proba(Xh), cal.predict_proba(Xt)
    return assess_shift(Holdout(sp, yh, sp.mean(axis=0), outputs=Xh, calibrator=cal),
                        Target(tp, Xt),
                        AssessmentSettings(cross_check=["BBSE-soft"], interval="source-aware"))


def theta(cal) -> np.ndarray:
    """The optimiser's parameters: log T or a, then the biases relative to b_0."""
    scale = [math.log(cal.temperature_)] if hasattr(cal, "temperature_") else list(cal.scale_)
    bias = list(cal.bias_[1:] - cal.bias_[0]) if hasattr(cal, "bias_") else []
    return np.asarray(scale + bias)


# -- the fits ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k, sep, seed", SEPARABLE)
@pytest.mark.parametrize("cls", [BCTS, VS], ids=lambda c: c.kind)
def test_fits_on_separable_holdouts_are_finite_and_bounded(k, sep, seed, cls):
    Xh, yh, _, _ = draw(k, sep, seed)
    if k == 5:
        assert np.all(Xh.argmax(axis=1) == yh)          # the model separates this holdout
    cal = fit(cls, Xh, yh)
    assert cal.converged_
    t = theta(cal)
    assert np.all(np.isfinite(t))
    # the penalised objective at the fit is at most its value at the start theta_0 (the identity map, where the prior
    # is 0): n * nll_after + |theta - theta_0|^2 / (2 sd^2) <= n * nll_before, so |theta - theta_0| <= sd *
    # sqrt(2 n nll_before) -- finite whatever the data, and small when the identity already fits (separable rows)
    start = cal._initial_theta(k)
    centred = t.copy()
    if cls is BCTS:
        b = np.concatenate([[0.0], t[1:]])
        centred[1:] = (b - b.mean())[1:]
    bound = PRIOR_SD * math.sqrt(2 * N * cal.nll_before_)
    assert np.linalg.norm(centred - start) <= bound * (1 + 1e-9)
    assert np.all(np.isfinite(cal.predict_proba(Xh)))


def test_the_prior_gives_a_separated_fit_an_optimum_the_tolerance_does_not_move():
    # without the prior the plain NLL of a separated holdout keeps falling as T -> 0: each tighter tolerance fits a
    # colder map (measured: T = 0.133 at tol 1e-9, 0.078 at 1e-14); with it the optimum is interior (T = 0.2268)
    Xh, yh, _, _ = draw(5, 5.0, 0)
    assert np.all(Xh.argmax(axis=1) == yh)
    plain = [fit(BCTS, Xh, yh, prior_sd=None, tol=tol).temperature_ for tol in (1e-9, 1e-14)]
    prior = [fit(BCTS, Xh, yh, tol=tol).temperature_ for tol in (1e-9, 1e-14)]
    assert plain[1] < 0.7 * plain[0]
    # the fit stops within tol of a zero gradient; the penalised objective curves by at least 1 / (n sd^2) per unit
    # of log T, so log T is off by at most tol * n * sd^2 = 1e-9 * 2000 * 2500 = 5e-3 (measured 4e-4)
    assert abs(math.log(prior[1] / prior[0])) < 5e-3


# -- the check "fit on these rows" -------------------------------------------------------------------------------
@pytest.mark.parametrize("k, sep, seed", SEPARABLE)
@pytest.mark.parametrize("cls", [BCTS, VS], ids=lambda c: c.kind)
def test_source_aware_interval_runs_on_a_calibrator_fit_on_these_rows(k, sep, seed, cls):
    Xh, yh, Xt, _ = draw(k, sep, seed)
    for tol in (1e-5, 1e-9):                             # whatever the optimiser's tolerance
        cal = fit(cls, Xh, yh, tol=tol)
        r = source_aware_interval(Xh, yh, Xt, cal)
        assert np.all(np.isfinite(r.lower)) and np.all(np.isfinite(r.upper))
        assert np.all(r.lower <= r.target_prior) and np.all(r.target_prior <= r.upper)


@pytest.mark.parametrize("k, sep", [(5, 2.5), (10, 4.3)])
def test_the_check_still_fires_on_a_calibrator_fit_on_other_rows(k, sep):
    Xh, yh, Xt, _ = draw(k, sep, 0)
    X2, y2, _, _ = draw(k, sep, 99)
    cal = fit(BCTS, X2, y2)
    # the message names the parameter that failed: 1/T or the bias of a class
    with pytest.raises(InputError, match=r"not fit on these holdout rows.* parameter (1/T|b_\d+) .*refit"):
        source_aware_interval(Xh, yh, Xt, cal)


# -- the default path --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k, sep, seed", SEPARABLE)
def test_default_path_on_separable_holdouts_returns_a_trustworthy_report(k, sep, seed):
    Xh, yh, Xt, truth = draw(k, sep, seed)
    r = default_path(Xh, yh, Xt, fit(BCTS, Xh, yh))
    assert r.verdict in VERDICTS
    # an accurate model identifies the target prior well: the estimate is trusted, the shift (0.4 on class 0 against
    # a source share near 1/k) is found, and the accuracy is estimated
    assert r.trustworthy and r.reasons == [], r.reasons
    assert r.shifted
    # the label-shift test rejects a truly label-shifted target at its level by chance (5%; seed 0 of k = 5 here,
    # p = 0.033, of 12 seeds measured), and "Not label shift" then takes precedence
    assert r.verdict == ("Not label shift" if r.label_shift.p_value < r.significance else "Shifted")
    assert r.accuracy is not None and r.accuracy.expected > 0.95
    assert r.failures == [] and "failures" not in r.to_dict()


def test_a_calibration_the_holdout_does_not_identify_is_untrustworthy_not_an_error():
    # a fit without the prior (as before it existed) on a separated holdout: its NLL Hessian is singular (condition
    # number ~1e286); the interval still runs and the report names the reason
    Xh, yh, Xt, _ = draw(5, 8.0, 0)
    cal = fit(BCTS, Xh, yh, prior_sd=None)
    r = default_path(Xh, yh, Xt, cal)
    assert r.verdict == "Untrustworthy"
    assert any("not identified by the holdout" in reason for reason in r.reasons), r.reasons


def test_a_part_that_fails_numerically_makes_the_report_untrustworthy(monkeypatch):
    import labelshift.inference.report as report

    Xh, yh, Xt, _ = draw(5, 6.0, 1)                     # seed 1: the label-shift test does not reject (p = 0.87)
    cal = fit(BCTS, Xh, yh)

    def singular(*args, **kwargs):
        raise np.linalg.LinAlgError("Singular matrix")

    monkeypatch.setattr(report, "source_aware_interval", singular)
    r = default_path(Xh, yh, Xt, cal)
    assert r.verdict == "Untrustworthy" and r.interval.method == "fisher" and r.accuracy is None
    assert r.failures and "could not be computed (LinAlgError: Singular matrix" in r.reasons[-1]
    d = r.to_dict()
    assert d["failures"] == r.failures and d["trustworthy"] is False
    assert ShiftReport.from_dict(d).to_dict() == d

    monkeypatch.undo()

    def overflow(*args, **kwargs):
        raise FloatingPointError("overflow")

    monkeypatch.setattr(report, "expected_accuracy", overflow)
    r = default_path(Xh, yh, Xt, cal)
    assert r.verdict == "Untrustworthy" and r.interval.method == "source-aware" and r.accuracy is None
    assert r.reasons == ["the expected accuracy on the target could not be computed (FloatingPointError: overflow)"]


def test_the_users_errors_still_raise():
    Xh, yh, Xt, _ = draw(5, 6.0, 0)
    cal = fit(BCTS, Xh, yh)
    sp, tp = cal.predict_proba(Xh), cal.predict_proba(Xt)
    with pytest.raises(InputError, match="not fit on these holdout rows"):
        X2, y2, _, _ = draw(5, 2.5, 3)
        other = fit(BCTS, X2, y2)
        assess_shift(Holdout(other.predict_proba(Xh), yh, sp.mean(axis=0), outputs=Xh, calibrator=other),
                     Target(other.predict_proba(Xt), Xt),
                     AssessmentSettings(interval="source-aware"))
    with pytest.raises(InputError, match="no example of class"):
        keep = yh != 4
        assess_shift(Holdout(sp[keep], yh[keep], sp[keep].mean(axis=0), outputs=Xh[keep], calibrator=cal),
                     Target(tp, Xt),
                     AssessmentSettings(interval="source-aware"))


# -- ordinary fits -----------------------------------------------------------------------------------------------
def _standard_errors(cal, t, z, y, h=1e-5) -> np.ndarray:
    """sqrt(diag(H^-1) / n), H the Hessian of the mean NLL at t (central differences of the analytic gradient)."""
    H = np.array([(cal._objective(t + h * e, z, y)[1] - cal._objective(t - h * e, z, y)[1]) / (2 * h)
                  for e in np.eye(t.size)])
    return np.sqrt(np.diag(np.linalg.inv((H + H.T) / 2)) / len(y))


@pytest.mark.parametrize("k, sep, n", [(3, 2.0, 50), (5, 2.5, 1000), (10, 3.0, 190)])
@pytest.mark.parametrize("cls", [TS, BCTS, VS, NBVS], ids=lambda c: c.kind)
def test_the_prior_leaves_ordinary_fits_unchanged(k, sep, n, cls):
    z, y = WellSpecifiedGaussians.make(k, sep=sep).holdout(n, np.random.default_rng(0))
    plain, prior = fit(cls, z, y, prior_sd=None), fit(cls, z, y)
    t0, t1 = theta(plain), theta(prior)
    se = _standard_errors(plain, t0, z, y)
    # the prior adds |theta - theta_0|^2 / (2 sd^2) to the total NLL, which moves the optimum by about
    # (n J)^-1 (theta - theta_0) / sd^2, i.e. se * |theta - theta_0| / sd^2 standard errors: below 1e-3 here
    # (se < 0.5, |theta - theta_0| < 3, sd = 50); 1% of a standard error leaves room for the optimiser's tolerance
    assert np.max(np.abs(t1 - t0) / se) < 0.01
    assert np.max(np.abs(prior.predict_proba(z) - plain.predict_proba(z))) < 2e-3


# -- persistence and the prior's derivatives -----------------------------------------------------------------------
def test_saved_calibrators_record_the_prior_and_old_ones_load_without_it():
    Xh, yh, _, _ = draw(5, 2.5, 0, n=500)
    cal = fit(BCTS, Xh, yh)
    d = cal.to_dict()
    assert d["settings"]["prior_sd"] == PRIOR_SD and load_calibrator(d).prior_sd == PRIOR_SD
    old = {**d, "settings": {key: v for key, v in d["settings"].items() if key != "prior_sd"}}
    legacy = load_calibrator(old)                        # written before the prior existed: fit without it
    assert legacy.prior_sd is None
    np.testing.assert_array_equal(legacy.predict_proba(Xh), cal.predict_proba(Xh))
    grad, hess = legacy.penalty_terms()
    assert not grad.any() and not hess.any()
    with pytest.raises(InputError, match="prior_sd must be a positive finite number"):
        BCTS(prior_sd=0).fit(Xh, yh)


@pytest.mark.parametrize("cls", [TS, BCTS, VS, NBVS], ids=lambda c: c.kind)
def test_penalty_terms_are_the_derivatives_of_the_prior_in_the_linear_coordinates(cls):
    Xh, yh, _, _ = draw(4, 2.0, 1, n=400)
    cal = fit(cls, Xh, yh, prior_sd=3.0)                 # a strong prior, so that its derivatives are not tiny
    k = 4
    lin0 = np.concatenate([[1.0 / cal.temperature_] if cls in (TS, BCTS) else cal.scale_,
                           cal.bias_[1:] if cls in (BCTS, VS) else []])

    def prior(lin):
        """P as the fit computes it, from the linear coordinates (1/T or a, then b_1..b_{k-1}, b_0 fixed)."""
        ns = 1 if cls in (TS, BCTS) else k
        scale = [-math.log(lin[0])] if ns == 1 else list(lin[:ns])
        bias = list(lin[ns:] - cal.bias_[0]) if cls in (BCTS, VS) else []
        return cal._penalty(np.asarray(scale + bias), k)[0]

    grad, hess = cal.penalty_terms()
    h = 1e-4
    eye = np.eye(lin0.size)
    fd_grad = np.array([(prior(lin0 + h * e) - prior(lin0 - h * e)) / (2 * h) for e in eye])
    fd_hess = np.array([[(prior(lin0 + h * a + h * b) - prior(lin0 + h * a - h * b) - prior(lin0 - h * a + h * b)
                          + prior(lin0 - h * a - h * b)) / (4 * h * h) for b in eye] for a in eye])
    # central differences: O(h^2) truncation, O(eps P / h^2) = 1e-8 rounding in the Hessian
    np.testing.assert_allclose(grad, fd_grad, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(hess, fd_hess, rtol=1e-4, atol=1e-6)
