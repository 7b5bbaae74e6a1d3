"""The typed shift report (:mod:`labelshift.inference.report`): its dict is the stored ``result`` of a re-estimation,
and :func:`assess_shift` computes what the ``estimate-shift`` task computed before it moved into the domain.

``fixtures/shift_report_golden.json`` holds that task's output (``tasks.reestimation.assessment.estimate_shift`` before the
report existed) on the inputs of :func:`_case` below, except its ``no_shift_test`` entries: those were rewritten
when the two-sample test moved to the pooled covariance and Hotelling's F law (``docs/uncertainty.md``), and again
when it began counting the holdout's error kappa times (``holdout_inflation``, docs/uncertainty.md "Given one
holdout": each entry replaced by what ``assess_shift`` now gives, every other entry checked unchanged); every
verdict stayed the same.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from labelshift import ShiftReport, assess_shift, Holdout, Target, AssessmentSettings
from labelshift.errors import FormatError, InputError
from labelshift.estimation.estimators import BBSE
from labelshift.inference.report import NOT_LABEL_SHIFT, VERDICTS, CrossCheck, check_holdout, joint_confusion
from tests.reestimation_support import K, SHIFTED_PRIOR, SOURCE_PRIOR, bayes_logits, draw

GOLDEN = json.loads((Path(__file__).resolve().parents[2] / "fixtures" / "shift_report_golden.json").read_text())

CASES = {
    "mlls-fisher": dict(estimator="MLLS", cross_check=["BBSE-soft"], interval="fisher"),
    "mlls-fisher-width": dict(estimator="MLLS", cross_check=["BBSE-soft", "BBSE-hard", "MLLS"], interval="fisher",
                              max_interval_width=0.2),
    "bbse-boot": dict(estimator="BBSE-soft", cross_check=[], interval="bootstrap", n_bootstrap=20, seed=3, level=0.9),
    "bbse-hard-boot-noshift": dict(estimator="BBSE-hard", cross_check=["BBSE-soft"], interval="bootstrap",
                                   n_bootstrap=20, significance=0.1),
    "mlls-pinned": dict(estimator="MLLS", cross_check=["BBSE-soft"], interval="fisher"),
    "mlls-boot": dict(estimator="MLLS", cross_check=[], interval="bootstrap", n_bootstrap=20),
    "singular": dict(estimator="MLLS", cross_check=["BBSE-hard"], interval="fisher"),
}


def _softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _case(name):
    """(source_probs, source_labels, target batches, source prior) of a golden case: the Bayes classifier of three
    Gaussian classes on 600 source rows, two target batches of 300 and 200 rows."""
    seed, target = 0, SHIFTED_PRIOR
    if name == "bbse-hard-boot-noshift":
        seed, target = 1, SOURCE_PRIOR
    elif name == "mlls-pinned":
        target = np.array([0.5, 0.5, 0.0])
    rng = np.random.default_rng(seed)
    xs, ys = draw(SOURCE_PRIOR, 600, rng)
    sp = _softmax(bayes_logits(xs.astype(np.float64)))
    probs = [_softmax(bayes_logits(draw(target, m, rng)[0].astype(np.float64))) for m in (300, 200)]
    if name == "singular":               # every hard prediction is class 0: BBSE-hard refuses, C is singular
        sp = 0.5 * sp + 0.5 * np.eye(K)[0]
        probs = [0.5 * p + 0.5 * np.eye(K)[0] for p in probs]
    prior = sp.mean(axis=0)
    return sp, ys, probs, prior / prior.sum()


def _assert_same(a, b, path="result"):
    """Equal structure, keys in the same order, equal strings and bools, numbers to 1e-9 relative."""
    if isinstance(b, dict):
        assert isinstance(a, dict) and list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for key in b:
            _assert_same(a[key], b[key], f"{path}.{key}")
    elif isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{path}[{i}]")
    elif isinstance(b, bool) or b is None or isinstance(b, str):
        assert a == b and type(a) is type(b), f"{path}: {a!r} != {b!r}"
    else:
        assert type(a) is type(b) and a == pytest.approx(b, rel=1e-9, abs=1e-12), f"{path}: {a!r} != {b!r}"


@pytest.mark.parametrize("name", list(CASES))
def test_assess_shift_gives_what_the_task_gave(name):
    sp, ys, probs, prior = _case(name)
    # the golden dicts predate the miscalibration check (test_miscalibration.py), which widens the interval
    old = dict(label_shift_check=False, miscalibration_check=False)
    report = assess_shift(Holdout(sp, ys, prior), probs, AssessmentSettings(**old, **CASES[name]))
    _assert_same(report.to_dict(), GOLDEN[name])
    # the label-shift test adds its entries after the old ones and changes none of them
    with_test = assess_shift(Holdout(sp, ys, prior), probs,
                             AssessmentSettings(miscalibration_check=False, **CASES[name])).to_dict()
    assert list(with_test)[-3:] == ["label_shift_test", "label_shift_ok", "label_shift_summary"]
    _assert_same({k: v for k, v in with_test.items() if k in GOLDEN[name]}, GOLDEN[name])


@pytest.mark.parametrize("name", list(CASES))
def test_dict_round_trip_is_exact(name):
    d = GOLDEN[name]
    text = json.dumps(d, indent=1)
    back = ShiftReport.from_dict(json.loads(text))
    assert json.dumps(back.to_dict(), indent=1) == text
    assert back.verdict == ("Untrustworthy" if not d["trustworthy"] else "Shifted" if d["shifted"] else "No shift")


def test_report_attributes_are_typed():
    sp, ys, probs, prior = _case("mlls-fisher-width")
    r = assess_shift(Holdout(sp, ys, prior), np.concatenate(probs), AssessmentSettings(**CASES["mlls-fisher-width"]))
    assert r.n_target == 500 and r.n_classes == K and r.method == "MLLS"
    assert r.target_prior.shape == (K,) and r.interval.lower.shape == (K,) and r.interval.method == "fisher"
    assert r.shifted and not r.trustworthy and r.verdict == "Untrustworthy"       # untrustworthy wins over the test
    assert list(r.cross_check) == ["BBSE-soft", "BBSE-hard"]                         # MLLS is the estimator itself
    assert all(isinstance(c, CrossCheck) and c.ok for c in r.cross_check.values())
    change = r.largest_change
    assert change.label == int(np.argmax(np.abs(r.target_prior - r.source_prior)))
    assert r.total_variation == pytest.approx(0.5 * np.abs(r.target_prior - r.source_prior).sum())
    # a failed cross-check is reported, not raised
    sp, ys, probs, prior = _case("singular")
    r = assess_shift(Holdout(sp, ys, prior), probs, AssessmentSettings(miscalibration_check=False, **CASES["singular"]))
    assert not r.cross_check["BBSE-hard"].ok and "singular" in r.cross_check["BBSE-hard"].error
    # the singular hard confusion matrix is the BBSE-hard cross-check's, not the reported MLLS estimate's: a note
    assert r.identifiability.confusion_condition == math.inf and r.trustworthy
    assert r.identifiability.notes[0].startswith("BBSE cross-check: confusion matrix near singular")
    # those outputs are the posterior mixed half and half with a point mass on class 0: not canonically calibrated,
    # which the miscalibration check (on by default) measures and says (test_miscalibration.py)
    r = assess_shift(Holdout(sp, ys, prior), probs, AssessmentSettings(**CASES["singular"]))
    assert r.miscalibration.acts and r.verdict == "Untrustworthy" and "canonically calibrated" in r.reasons[-1]


def test_bad_arguments_name_the_fix():
    sp, ys, probs, prior = _case("mlls-fisher")
    with pytest.raises(InputError, match="interval 'bootstrap'"):
        assess_shift(Holdout(sp, ys, prior), probs, AssessmentSettings(estimator="BBSE-soft", interval="fisher"))
    with pytest.raises(InputError, match="estimator"):
        assess_shift(Holdout(sp, ys, prior), probs, AssessmentSettings(estimator="RLLS", interval="bootstrap"))
    with pytest.raises(InputError, match="cross_check"):
        assess_shift(Holdout(sp, ys, prior), probs, AssessmentSettings(cross_check=["PCC"]))
    with pytest.raises(InputError, match="class columns"):
        assess_shift(Holdout(sp, ys, prior),
                     [p[:, :2] / p[:, :2].sum(axis=1, keepdims=True) for p in probs],
                     AssessmentSettings(interval="fisher"))
    with pytest.raises(InputError, match="significance"):
        assess_shift(Holdout(sp, ys, prior), probs, AssessmentSettings(significance=1.5, interval="fisher"))
    with pytest.raises(FormatError, match="lacks"):
        ShiftReport.from_dict({"method": "MLLS"})


def test_joint_confusion_is_the_matrix_bbse_inverts():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, size=500)
    # a decent classifier: 80% of the mass on the true class
    probs = 0.8 * np.eye(4)[labels] + 0.2 * rng.dirichlet(np.ones(4), size=500)
    C = joint_confusion(probs, labels)
    np.testing.assert_allclose(C, BBSE().fit(probs, labels).confusion_, atol=1e-15)
    assert C.sum() == pytest.approx(1.0)
    # columns sum to the label frequencies: C[:, y] = p_s(yhat, y)
    np.testing.assert_allclose(C.sum(axis=0), np.bincount(labels, minlength=4) / 500)


# -- the label-shift test and the source-aware interval in the report ------------------------------------------------
def _gaussian_case(k=3, n=1500, m=4000, seed=0, prior=None, drift=0.0, new_class=0.0):
    """Raw outputs of a well-specified classifier (BCTS contains the exact posterior) on a labelled holdout and a
    target: label-shifted by ``prior``, or with its inputs moved by ``drift`` along the first axis, or with a share
    ``new_class`` of rows from a class the model never saw (a tight cluster at the centre)."""
    from labelshift.calibration import BCTS
    from labelshift.experiments.well_specified import WellSpecifiedGaussians

    problem = WellSpecifiedGaussians.make(k)
    rng = np.random.default_rng(seed)
    Xh, yh = problem.holdout(n, rng)
    target_prior = problem.source_prior if prior is None else np.asarray(prior, float)
    Xt, _ = problem.draw(target_prior, m, rng)
    if drift or new_class:
        x = rng.normal(size=(m, k)) + problem.sep * np.eye(k)[rng.choice(k, size=m, p=target_prior)]
        x[:, 0] += drift
        n_new = int(new_class * m)
        x[:n_new] = problem.sep / k + 0.3 * rng.normal(size=(n_new, k))
        Xt = problem.outputs(x)
    cal = BCTS().fit(Xh, yh)
    sp = cal.predict_proba(Xh)
    prior_s = sp.mean(axis=0)
    return Xh, yh, Xt, cal, sp, cal.predict_proba(Xt), prior_s / prior_s.sum()


def test_source_aware_interval_and_label_shift_test_under_label_shift():
    Xh, yh, Xt, cal, sp, pt, prior = _gaussian_case(prior=[0.6, 0.3, 0.1])
    r = assess_shift(Holdout(sp, yh, prior, outputs=Xh, calibrator=cal, class_names=["a", "b", "c"]),
                     Target([pt[:1500], pt[1500:]], [Xt[:1500], Xt[1500:]]),
                     AssessmentSettings(interval="source-aware"))
    assert r.interval.method == "source-aware" and r.interval.n_source == len(yh)
    fisher = assess_shift(Holdout(sp, yh, prior), pt, AssessmentSettings(interval="fisher"))
    np.testing.assert_allclose(r.target_prior, fisher.target_prior)
    assert np.all(r.interval.width >= fisher.interval.width - 1e-12)        # the holdout's error is added
    assert np.all(r.interval.covers([0.6, 0.3, 0.1]))
    assert r.label_shift is not None and r.label_shift_ok is True and r.verdict == "Shifted"
    d = json.loads(json.dumps(r.to_dict()))
    assert d["label_shift_ok"] is True and d["label_shift_summary"].startswith("Consistent with label shift")
    assert d["interval"]["method"] == "source-aware" and d["interval"]["n_source"] == len(yh)
    back = ShiftReport.from_dict(d)
    assert back.to_dict() == d and back.verdict == "Shifted"
    assert back.interval.method == "source-aware" and back.label_shift.p_value == pytest.approx(r.label_shift.p_value)
    # what the shift costs: the expected accuracy rides along with the source-aware interval
    acc = r.accuracy
    assert acc is not None and acc.lower <= acc.expected <= acc.upper and back.accuracy.expected == acc.expected
    assert acc.expected == pytest.approx(float(acc.per_class_recall @ r.target_prior), rel=1e-9)
    assert r.accuracy_summary.startswith(f"accuracy estimated {acc.expected:.2f} [")
    assert fisher.accuracy is None and "accuracy" not in fisher.to_dict()


@pytest.mark.parametrize("kind", ["new class", "covariate shift"])
def test_not_label_shift_wins_over_every_other_verdict(kind):
    kw = {"new_class": 0.15} if kind == "new class" else {"drift": 2.0}
    Xh, yh, Xt, cal, sp, pt, prior = _gaussian_case(**kw)
    r = assess_shift(Holdout(sp, yh, prior, outputs=Xh, calibrator=cal),
                     Target(pt, Xt),
                     AssessmentSettings(interval="source-aware"))
    assert r.label_shift_ok is False and r.verdict == NOT_LABEL_SHIFT == VERDICTS[0]
    assert r.label_shift.p_value < 1e-6 and r.label_shift.disagreeing()
    d = json.loads(json.dumps(r.to_dict()))
    assert d["label_shift_ok"] is False and d["label_shift_summary"].startswith("Not label shift")
    assert d["label_shift_test"]["disagreeing"][0]["name"].startswith("predicted class")
    back = ShiftReport.from_dict(d)
    assert back.verdict == NOT_LABEL_SHIFT and back.to_dict() == d


def test_label_shift_test_that_cannot_run_is_recorded_not_raised():
    sp, ys, probs, prior = _case("mlls-fisher")
    keep = np.r_[np.flatnonzero(ys == 0)[:3], np.flatnonzero(ys != 0)]          # class 0: 3 holdout rows (< 5)
    r = assess_shift(Holdout(sp[keep], ys[keep], prior), probs, AssessmentSettings(interval="fisher"))
    assert r.label_shift is None and "MIN_CLASS_ROWS" in r.label_shift_error and r.label_shift_ok is None
    assert r.verdict in ("Shifted", "No shift", "Untrustworthy")
    d = json.loads(json.dumps(r.to_dict()))
    assert d["label_shift_test"] == {"error": r.label_shift_error} and d["label_shift_ok"] is None
    assert d["label_shift_summary"].startswith("Label-shift test not run")
    assert ShiftReport.from_dict(d).to_dict() == d


def test_old_dicts_load_without_the_new_fields():
    for d in GOLDEN.values():
        back = ShiftReport.from_dict(json.loads(json.dumps(d)))
        assert back.label_shift is None and back.label_shift_error is None and back.label_shift_ok is None
        assert back.verdict != NOT_LABEL_SHIFT and "label_shift_test" not in back.to_dict()


def test_untrustworthy_source_aware_interval_makes_the_report_untrustworthy():
    from labelshift.inference.source_aware import SourceAwareInterval

    Xh, yh, Xt, cal, sp, pt, prior = _gaussian_case(prior=[0.6, 0.3, 0.1])
    r = assess_shift(Holdout(sp, yh, prior, outputs=Xh, calibrator=cal),
                     Target(pt, Xt),
                     AssessmentSettings(interval="source-aware"))
    flagged = SourceAwareInterval.from_dict({**r.interval.to_dict(), "trustworthy": False,
                                             "reasons": ["the calibrator's temperature sits at its bound"]})
    bad = dataclasses.replace(r, interval=flagged)
    assert not bad.trustworthy and bad.verdict == "Untrustworthy"
    assert bad.reasons[-1] == "the calibrator's temperature sits at its bound"


def test_the_reasons_of_an_untrustworthy_estimate_name_the_classes_by_their_names():
    Xh, yh, Xt, cal, sp, pt, prior = _gaussian_case(prior=[0.6, 0.3, 0.1])
    settings = AssessmentSettings(interval="source-aware", max_interval_width=1e-3)     # every interval too wide
    named = assess_shift(Holdout(sp, yh, prior, outputs=Xh, calibrator=cal, class_names=["cat", "dog", "owl"]),
                         Target(pt, Xt), settings)
    plain = assess_shift(Holdout(sp, yh, prior, outputs=Xh, calibrator=cal), Target(pt, Xt), settings)
    wide = [r for r in named.reasons if r.startswith("interval too wide")]
    assert named.verdict == "Untrustworthy" and len(wide) == 1
    assert any(f"interval on w_{c} is" in wide[0] for c in ("cat", "dog", "owl")), wide[0]
    assert any(f"interval on w_{c} is" in r for r in plain.reasons for c in range(3))     # unnamed: 0..k-1
    assert named.target_prior.tolist() == plain.target_prior.tolist()        # names change words, not numbers


def test_bad_holdouts_and_source_aware_arguments_name_the_fix():
    Xh, yh, Xt, cal, sp, pt, prior = _gaussian_case()
    with pytest.raises(InputError, match="no example of class.*Add labelled holdout rows"):
        check_holdout(np.zeros(50, int), 3, interval="fisher")
    with pytest.raises(InputError, match="too few to refit the BCTS calibrator.*interval 'fisher'"):
        check_holdout(np.arange(15) % 3, 3, interval="source-aware", calibrator=cal)
    check_holdout(np.arange(15) % 3, 3, interval="fisher", calibrator=cal)          # fine without the sandwich
    with pytest.raises(InputError, match="scaling calibrator.*interval 'bootstrap' or 'fisher'"):
        check_holdout(yh, 3, interval="source-aware", calibrator=object())
    with pytest.raises(InputError, match="raw outputs"):
        assess_shift(Holdout(sp, yh, prior, calibrator=cal), pt, AssessmentSettings(interval="source-aware"))
    with pytest.raises(InputError, match="interval 'source-aware' comes from the MLLS likelihood.*'bootstrap'"):
        assess_shift(Holdout(sp, yh, prior, outputs=Xh, calibrator=cal),
                     Target(pt, Xt),
                     AssessmentSettings(estimator="BBSE-soft", interval="source-aware"))
    with pytest.raises(InputError, match="level"):
        assess_shift(Holdout(sp, yh, prior, outputs=Xh, calibrator=cal),
                     Target(pt, Xt),
                     AssessmentSettings(interval="source-aware", level=1.0))


# -- a level of its own for the label-shift test -----------------------------------------------------------------------
def _borderline_case():
    """Inputs drifted a little (0.165 along the first axis): the label-shift test's p-value is (3/201) / 0.7 = 0.021
    on these draws (bootstrap seed 0; the log-odds part's p over its share of the level, REGIONS_SHARE = 0.3), between
    the levels 0.01 and 0.05, while the no-shift test does not reject."""
    Xh, yh, Xt, cal, sp, pt, prior = _gaussian_case(seed=3, drift=0.165, m=2000, n=1000)
    return sp, yh, pt, prior


#: the label-shift test's law averaged over holdouts (label_shift_holdout_inflation = 1), under which
#: _borderline_case's p-value lies between 0.01 and 0.05 (at the default, which draws the holdout's error twice
#: over, it is 0.34)
AVERAGED_LAW = dict(interval="fisher", label_shift_holdout_inflation=1.0)


def test_the_label_shift_verdict_follows_its_own_level():
    sp, yh, pt, prior = _borderline_case()
    default = assess_shift(Holdout(sp, yh, prior), pt, AssessmentSettings(**AVERAGED_LAW))
    assert 0.01 < default.label_shift.p_value < 0.05 and not default.shifted
    assert default.label_shift_significance is None and default.label_shift_level == 0.05
    assert default.label_shift_ok is False and default.verdict == NOT_LABEL_SHIFT
    # not given and given as None are the same report, written as before (no new key, the old summary line)
    d = default.to_dict()
    assert "label_shift_significance" not in d and "level" not in d["label_shift_summary"]
    assert assess_shift(Holdout(sp, yh, prior),
                        pt,
                        AssessmentSettings(**AVERAGED_LAW, label_shift_significance=None)).to_dict() == d

    strict = assess_shift(Holdout(sp, yh, prior),
                          pt,
                          AssessmentSettings(**AVERAGED_LAW, label_shift_significance=0.01))
    assert strict.label_shift.p_value == default.label_shift.p_value
    assert strict.label_shift_level == 0.01 and strict.label_shift_ok is True and strict.verdict == "No shift"
    assert strict.significance == 0.05 and strict.shifted == default.shifted        # the no-shift test unchanged
    assert strict.label_shift_summary.startswith("Consistent with label shift: ")
    assert "(test level 0.01)" in strict.label_shift_summary
    s = json.loads(json.dumps(strict.to_dict()))
    assert s["label_shift_significance"] == 0.01 and s["label_shift_ok"] is True
    assert list(s)[list(s).index("significance") + 1] == "label_shift_significance"
    assert {k: v for k, v in s.items() if k not in ("label_shift_significance", "label_shift_ok",
                                                      "label_shift_summary")} == \
        {k: v for k, v in d.items() if k not in ("label_shift_ok", "label_shift_summary")}
    back = ShiftReport.from_dict(s)
    assert back.to_dict() == s and back.label_shift_significance == 0.01 and back.verdict == "No shift"

    # a looser level than significance is allowed too: the label-shift test alone moves
    loose = assess_shift(Holdout(sp, yh, prior),
                         pt,
                         AssessmentSettings(**AVERAGED_LAW, significance=0.01, label_shift_significance=0.05))
    assert loose.verdict == NOT_LABEL_SHIFT and "Not label shift" in loose.label_shift_summary
    assert "(test level 0.05)" in loose.label_shift_summary


def test_a_stored_report_keeps_its_label_shift_level():
    """Replacing the level on a stored report re-decides only the label-shift verdict; old dicts (no key) read
    back at ``significance``."""
    sp, yh, pt, prior = _borderline_case()
    d = json.loads(json.dumps(assess_shift(Holdout(sp, yh, prior), pt, AssessmentSettings(**AVERAGED_LAW)).to_dict()))
    old = ShiftReport.from_dict(d)
    assert old.label_shift_significance is None and old.verdict == NOT_LABEL_SHIFT and old.to_dict() == d
    relaxed = dataclasses.replace(old, label_shift_significance=0.01)
    assert relaxed.verdict == "No shift" and relaxed.to_dict()["label_shift_significance"] == 0.01
    with pytest.raises(FormatError, match="label_shift_significance must be a level"):
        ShiftReport.from_dict({**d, "label_shift_significance": 5})


@pytest.mark.parametrize("bad", [0, 1, -0.1, 2, 0.0, 1.0, float("nan"), True, "0.01"])
def test_bad_label_shift_significance_names_the_argument(bad):
    sp, yh, pt, prior = _borderline_case()
    with pytest.raises(InputError, match=r"label_shift_significance must be a number strictly between 0 and 1 "
                                         r"\(or None\)"):
        assess_shift(Holdout(sp, yh, prior), pt, AssessmentSettings(interval="fisher", label_shift_significance=bad))
