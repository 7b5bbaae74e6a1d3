"""The miscalibration check (:mod:`labelshift.inference.miscalibration`): the moment estimate p_c = A^{-1} E_t[h] is
consistent whether or not f is canonically calibrated, MLLS is not when f is not (Garg et al. 2020, Theorem (mlls),
eq. (bound-main)), and the check says so, widens the interval to p_c's and makes the report Untrustworthy.

The data: three Gaussian classes on a line with standard deviations (0.6, 2.0, 0.6). The canonically calibrated
model is the exact posterior (quadratic logits); the misspecified one assumes a common standard deviation, so its
logits are linear in x and no calibration of them (temperature, bias) gives the posterior of the wide class, whose
density wins in both tails. Tolerances: a normal estimate lies within 4 standard errors of its mean except with
probability 6e-5 per class; fixed seeds.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from labelshift import AssessmentSettings, Holdout, ShiftReport, assess_shift
from labelshift.errors import FormatError
from labelshift.estimation.estimators import MLLS
from labelshift.inference.intervals import fisher_interval
from labelshift.inference.miscalibration import (DEFAULT_THRESHOLD, MAX_CLASSES, MiscalibrationCheck,
                                                 miscalibration_check, widened_interval)

MEANS, SDS = np.array([-2.0, 0.0, 2.0]), np.array([0.6, 2.0, 0.6])
SOURCE, TARGET = np.array([0.4, 0.2, 0.4]), np.array([0.2, 0.5, 0.3])
N, M = 20_000, 20_000
#: a normal estimate within this many standard errors of its mean, except with probability 6e-5 per class
Z = 4.0


def _softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _draw(prior, n, rng):
    y = rng.choice(3, size=n, p=prior)
    return MEANS[y] + SDS[y] * rng.standard_normal(n), y


def _exact(x):
    """The source posterior p_s(y | x): canonically calibrated."""
    logit = -0.5 * ((x[:, None] - MEANS) / SDS) ** 2 - np.log(SDS) + np.log(SOURCE)
    return _softmax(logit)


def _linear(x):
    """The posterior of a model that assumes one standard deviation: miscalibrated beyond any scaling."""
    return _softmax(-0.5 * (x[:, None] - MEANS) ** 2 + np.log(SOURCE))


def _data(model, seed=0):
    rng = np.random.default_rng(seed)
    xs, ys = _draw(SOURCE, N, rng)
    xt, _ = _draw(TARGET, M, rng)
    sp, tp = model(xs), model(xt)
    prior = sp.mean(axis=0)
    return sp, ys, tp, prior


def _check(model, seed=0, level=0.95):
    sp, ys, tp, prior = _data(model, seed)
    est = MLLS().fit(sp, ys, prior).estimate(tp)
    ci = fisher_interval(tp, est.weights, prior, level=level)
    return miscalibration_check(sp, ys, tp, est.weights, est.target_prior), est, ci, prior


def test_on_a_calibrated_model_the_moment_estimate_is_mlls_and_the_check_stays_silent():
    check, est, _, _ = _check(_exact)
    # w^T h = 1 for every row, so p_c sums to 1 and V_c has rank k - 1
    assert check.error is None and check.df == 2 and np.isclose(check.reference_prior.sum(), 1.0)
    assert np.all(np.abs(check.reference_prior - TARGET) <= Z * check.reference_std_error)
    # both solve the same equations at the population: their difference is noise, within p_c's error
    assert np.all(np.abs(check.difference) <= Z * check.reference_std_error)
    assert not check.acts and check.p_value > DEFAULT_THRESHOLD and check.reason is None
    assert np.allclose(check.implied_bias, 0.0)


def test_on_a_miscalibrated_model_mlls_is_biased_the_moment_estimate_is_not_and_the_check_acts():
    check, est, _, _ = _check(_linear)
    assert np.max(np.abs(est.target_prior - TARGET)) > 0.05                  # MLLS's miscalibration term
    assert np.all(np.abs(check.reference_prior - TARGET) <= Z * check.reference_std_error)
    assert check.acts and check.p_value < 1e-6
    y = int(np.argmax(np.abs(check.difference)))
    assert check.implied_bias[y] > 0 and "not canonically calibrated" in check.reason and f"class {y}" in check.reason


def test_the_widened_interval_holds_both_intervals_and_is_unchanged_without_a_check():
    level = 1 - 6e-5                                   # z = 4: the truth is inside p_c's interval (module doc)
    check, est, ci, prior = _check(_linear, level=level)
    wide = widened_interval(ci, check, prior)
    z = ci.extra["z"]
    assert np.all(wide.lower <= ci.lower) and np.all(wide.upper >= ci.upper)
    assert np.all(wide.lower <= np.maximum(check.reference_prior - z * check.reference_std_error, 0.0) + 1e-12)
    assert np.all(wide.upper >= np.minimum(check.reference_prior + z * check.reference_std_error, 1.0) - 1e-12)
    assert np.all(wide.covers(TARGET)) and not np.all(ci.covers(TARGET))
    assert np.allclose(wide.weights_lower * prior, wide.lower) and np.array_equal(wide.target_prior, ci.target_prior)
    assert widened_interval(ci, MiscalibrationCheck(error="not run"), prior) is ci


def test_dict_round_trip_is_exact_and_a_bad_dict_is_a_format_error():
    check, *_ = _check(_linear)
    for c in (check, MiscalibrationCheck(error="not computed above 100 classes (200)")):
        text = json.dumps(c.to_dict())
        back = MiscalibrationCheck.from_dict(json.loads(text))
        assert json.dumps(back.to_dict()) == text and back.acts == c.acts
    with pytest.raises(FormatError):
        MiscalibrationCheck.from_dict({"threshold": 0.01, "reference_prior": [0.5]})
    with pytest.raises(FormatError):
        MiscalibrationCheck.from_dict([1, 2])


def test_more_classes_than_the_limit_are_not_checked_and_nothing_raises():
    k = MAX_CLASSES + 1
    rng = np.random.default_rng(0)
    p = _softmax(rng.standard_normal((50, k)))
    check = miscalibration_check(p, np.arange(50) % k, p, np.ones(k), np.full(k, 1 / k))
    assert check.error is not None and not check.acts and check.reason is None


def test_the_report_carries_the_check_and_says_untrustworthy_with_the_reason():
    sp, ys, tp, prior = _data(_linear)
    settings = AssessmentSettings(interval="fisher", label_shift_check=False)
    report = assess_shift(Holdout(sp, ys, prior), tp, settings)
    assert isinstance(report.miscalibration, MiscalibrationCheck) and report.miscalibration.acts
    assert report.verdict == "Untrustworthy" and any("canonically calibrated" in r for r in report.reasons)
    assert np.all(report.interval.covers(report.miscalibration.reference_prior))     # widened to p_c's
    d = report.to_dict()
    assert list(d)[-1] == "miscalibration" and d["miscalibration"]["acts"] is True
    back = ShiftReport.from_dict(json.loads(json.dumps(d)))
    assert back.to_dict() == d and back.verdict == "Untrustworthy"
    off = assess_shift(Holdout(sp, ys, prior), tp, AssessmentSettings(interval="fisher", label_shift_check=False,
                                                                      miscalibration_check=False))
    assert off.miscalibration is None and "miscalibration" not in off.to_dict() and off.trustworthy


def test_the_report_of_a_calibrated_model_keeps_its_verdict():
    sp, ys, tp, prior = _data(_exact)
    report = assess_shift(Holdout(sp, ys, prior), tp, AssessmentSettings(interval="fisher", label_shift_check=False))
    assert not report.miscalibration.acts and report.verdict == "Shifted"
