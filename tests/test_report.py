"""The typed shift report (:mod:`labelshift.report`): its dict is the stored ``result`` of a re-estimation, and
:func:`assess_shift` computes what the ``estimate-shift`` task computed before it moved into the domain.

``fixtures/shift_report_golden.json`` holds that task's output (``tasks.reestimation.estimate_shift`` before the
report existed) on the inputs of :func:`_case` below.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from labelshift import ShiftReport, assess_shift
from labelshift.errors import FormatError, InputError
from labelshift.estimators import BBSE
from labelshift.report import CrossCheck, joint_confusion
from tests.reestimation_support import K, SHIFTED_PRIOR, SOURCE_PRIOR, bayes_logits, draw

GOLDEN = json.loads((Path(__file__).parent / "fixtures" / "shift_report_golden.json").read_text())

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
    report = assess_shift(sp, ys, probs, source_prior=prior, **CASES[name])
    _assert_same(report.to_dict(), GOLDEN[name])


@pytest.mark.parametrize("name", list(CASES))
def test_dict_round_trip_is_exact(name):
    d = GOLDEN[name]
    text = json.dumps(d, indent=1)
    back = ShiftReport.from_dict(json.loads(text))
    assert json.dumps(back.to_dict(), indent=1) == text
    assert back.verdict == ("Untrustworthy" if not d["trustworthy"] else "Shifted" if d["shifted"] else "No shift")


def test_report_attributes_are_typed():
    sp, ys, probs, prior = _case("mlls-fisher-width")
    r = assess_shift(sp, ys, np.concatenate(probs), source_prior=prior, **CASES["mlls-fisher-width"])
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
    r = assess_shift(sp, ys, probs, source_prior=prior, **CASES["singular"])
    assert not r.cross_check["BBSE-hard"].ok and "singular" in r.cross_check["BBSE-hard"].error
    assert r.identifiability.confusion_condition == math.inf and not r.trustworthy


def test_bad_arguments_name_the_fix():
    sp, ys, probs, prior = _case("mlls-fisher")
    with pytest.raises(InputError, match="interval 'bootstrap'"):
        assess_shift(sp, ys, probs, source_prior=prior, estimator="BBSE-soft", interval="fisher")
    with pytest.raises(InputError, match="estimator"):
        assess_shift(sp, ys, probs, source_prior=prior, estimator="RLLS", interval="bootstrap")
    with pytest.raises(InputError, match="cross_check"):
        assess_shift(sp, ys, probs, source_prior=prior, cross_check=["PCC"])
    with pytest.raises(InputError, match="class columns"):
        assess_shift(sp, ys, [p[:, :2] / p[:, :2].sum(axis=1, keepdims=True) for p in probs], source_prior=prior)
    with pytest.raises(InputError, match="significance"):
        assess_shift(sp, ys, probs, source_prior=prior, significance=1.5)
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
