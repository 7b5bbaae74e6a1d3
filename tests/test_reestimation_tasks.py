"""Unit tests of the pure helpers of :mod:`tasks.reestimation` (no servers)."""
from __future__ import annotations

import numpy as np
import pytest

from labelshift.errors import InputError
from labelshift.estimators import BBSE
from tasks.reestimation import joint_confusion, parse_model_uri, prior_metrics, verdict


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


@pytest.mark.parametrize("uri, parsed", [
    ("models:/clf@production", ("clf", "production", None)),
    ("models:/labelshift-mnist-5k/3", ("labelshift-mnist-5k", None, "3")),
])
def test_model_uris(uri, parsed):
    assert parse_model_uri(uri) == parsed


@pytest.mark.parametrize("uri", ["clf@prod", "models:/clf", "models:/clf/x", "runs:/abc/model", "", None])
def test_bad_model_uris_say_the_expected_form(uri):
    with pytest.raises(InputError, match=r"models:/NAME@ALIAS"):
        parse_model_uri(uri)


def _result(shifted=True, trustworthy=True):
    return {"target_prior": [0.2, 0.8], "weights": [0.4, 1.6], "source_prior": [0.5, 0.5],
            "interval": {"lower": [0.1, 0.7], "upper": [0.3, 0.9]}, "cross_check": {"BBSE-soft": {
                "target_prior": [0.25, 0.75]}, "BBSE-hard": {"error": "singular"}},
            "no_shift_test": {"p_value": 1e-5, "statistic": 20.0}, "total_variation": 0.3, "shifted": shifted,
            "trustworthy": trustworthy, "n_target": 100,
            "identifiability": {"min_hessian_eigenvalue": 0.1, "min_free_eigenvalue": 0.1,
                                "confusion_condition": None}}


def test_metrics_and_verdicts():
    m = prior_metrics(_result())
    assert m["prior/1"] == 0.8 and m["prior_lower/0"] == 0.1 and m["weight/0"] == 0.4
    assert m["cross_check/BBSE-soft/prior/0"] == 0.25 and not any("BBSE-hard" in k for k in m)
    assert "confusion_condition" not in m and m["shifted"] == 1.0
    assert verdict(_result()) == "Shifted"
    assert verdict(_result(shifted=False)) == "No shift"
    assert verdict(_result(trustworthy=False)) == "Untrustworthy"      # untrustworthy wins over the test
