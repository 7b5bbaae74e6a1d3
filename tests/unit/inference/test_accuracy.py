"""labelshift.inference.accuracy: the expected accuracy on the target and its interval."""
from __future__ import annotations

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest

from labelshift.inference.accuracy import AccuracyEstimate, expected_accuracy
from labelshift.calibration.scaling import BCTS
from labelshift.errors import InputError
from labelshift.experiments.well_specified import WellSpecifiedGaussians
from labelshift.inference.source_aware import source_aware_interval


def _draw(k, n, m, seed, prior=None):
    pb = WellSpecifiedGaussians.make(k)
    rng = np.random.default_rng(seed)
    prior = rng.dirichlet(np.ones(k)) if prior is None else np.asarray(prior, float)
    Xh, yh = pb.holdout(n, rng)
    Xt, yt = pb.draw(prior, m, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = BCTS().fit(Xh, yh)
    return pb, prior, Xh, yh, Xt, yt, cal


@pytest.fixture(scope="module")
def small():
    _, prior, Xh, yh, Xt, yt, cal = _draw(3, 1000, 2000, 1)
    return Xh, yh, Xt, yt, cal


def test_point_estimate_matches_realised_accuracy_on_a_large_target():
    _, prior, Xh, yh, Xt, yt, cal = _draw(3, 5000, 200_000, 7, prior=[0.6, 0.1, 0.3])
    a = expected_accuracy(Xh, yh, Xt, cal)
    real = float(np.mean(Xt.argmax(axis=1) == yt))
    real_c = float(np.mean(np.argmax(cal.predict_proba(Xt) * a.weights, axis=1) == yt))
    # binomial standard errors: the holdout recalls (n_y rows each, weighted by p_t) and the target's m Bernoullis;
    # the prior's own error is far smaller at m = 200,000. Four of them: a false failure has probability < 1e-4.
    counts = np.bincount(yh, minlength=3)
    for est, recall, acc in ((a.expected, a.per_class_recall, real), (a.corrected, a.corrected_per_class_recall,
                                                                       real_c)):
        se = math.sqrt(np.sum(a.target_prior ** 2 * recall * (1 - recall) / counts) + acc * (1 - acc) / Xt.shape[0])
        assert abs(est - acc) < 4 * se
    assert a.lower <= a.expected <= a.upper
    assert a.batch_lower <= a.lower and a.batch_upper >= a.upper          # the batch interval is the wider one
    assert a.source == pytest.approx(float(np.mean(Xh.argmax(axis=1) == yh)))


def test_on_a_large_target_the_interval_s_free_terms_save_the_accuracy_its_own_pass(monkeypatch):
    """Above LARGE_ROWS rows (made small here) the source-aware interval hands its (g_F, H_FF^{-1}) to the
    accuracy estimate, which then makes no pass of its own for them; the same estimate as with that pass, to the
    rounding of two summation orders of the same float64 sums (1e-9 relative: far above it, far below any figure
    reported)."""
    from labelshift import rows
    from labelshift.inference import accuracy

    monkeypatch.setattr(rows, "ROW_BLOCK", 1000)
    monkeypatch.setattr(rows, "LARGE_ROWS", 2000)
    _, prior, Xh, yh, Xt, _, cal = _draw(4, 2000, 6000, 5, prior=[0.5, 0.3, 0.2, 0.0])
    iv = source_aware_interval(Xh, yh, Xt, cal)
    assert iv.target_terms is not None
    passes = []
    own = accuracy.free_sums
    monkeypatch.setattr(accuracy, "free_sums", lambda *args: passes.append(1) or own(*args))
    alone = expected_accuracy(Xh, yh, Xt, cal, interval=dataclasses.replace(iv, target_terms=None))
    assert passes == [1]
    reused = expected_accuracy(Xh, yh, Xt, cal, interval=iv)
    assert passes == [1]
    for key in ("expected", "lower", "upper", "std_error", "batch_std_error", "corrected", "corrected_std_error"):
        assert getattr(reused, key) == pytest.approx(getattr(alone, key), rel=1e-9), key


def test_variance_parts_add_up_and_reuse_of_the_interval(small):
    Xh, yh, Xt, _, cal = small
    iv = source_aware_interval(Xh, yh, Xt, cal)
    a = expected_accuracy(Xh, yh, Xt, cal)
    b = expected_accuracy(Xh, yh, Xt, cal, interval=iv)
    assert a.to_dict() == b.to_dict()
    assert sum(a.variance.values()) == pytest.approx(a.std_error ** 2, rel=1e-9)
    r = a.per_class_recall
    assert a.variance["prior_target"] == pytest.approx(r @ iv.covariance_target @ r, rel=1e-9)
    assert a.variance["prior_holdout"] == pytest.approx(r @ iv.covariance_holdout @ r, rel=1e-6, abs=1e-15)


def test_holdout_influence_reproduces_the_holdout_covariance(small):
    Xh, yh, Xt, _, cal = small
    iv = source_aware_interval(Xh, yh, Xt, cal)
    n = Xh.shape[0]
    assert iv.holdout_influence.shape == (n, 3)
    np.testing.assert_allclose(iv.holdout_influence.T @ iv.holdout_influence / n ** 2, iv.covariance_holdout,
                               rtol=1e-10, atol=1e-16)
    assert "holdout_influence" not in iv.to_dict()


def test_coverage_on_a_small_cell():
    # k = 3, n = 1000, m = 2000, a fresh prior, holdout and target per seed; the truth is the population expected
    # accuracy sum_y r_y p_t(y) with r_y from 200,000 rows per class (standard error < 0.0005). With 120 seeds the
    # coverage of a 0.95 interval has binomial standard error sqrt(0.95 * 0.05 / 120) = 0.020; we accept
    # [0.95 - 3 * 0.020, 1] = [0.89, 1] (a correct interval fails this with probability about 0.002).
    k = 3
    pb = WellSpecifiedGaussians.make(k)
    rng = np.random.default_rng(99)
    recall = np.array([np.mean(pb.draw(np.eye(k)[c], 200_000, rng)[0].argmax(axis=1) == c) for c in range(k)])
    hits = 0
    seeds = 120
    for s in range(seeds):
        _, prior, Xh, yh, Xt, _, cal = _draw(k, 1000, 2000, 1000 + s)
        a = expected_accuracy(Xh, yh, Xt, cal)
        hits += a.covers(float(recall @ prior))
    assert 0.89 <= hits / seeds <= 1.0


def test_round_trip_and_summary(small):
    Xh, yh, Xt, _, cal = small
    a = expected_accuracy(Xh, yh, Xt, cal, level=0.9)
    d = a.to_dict()
    assert json.loads(json.dumps(d)) == d
    b = AccuracyEstimate.from_dict(d)
    assert b.to_dict() == d
    assert isinstance(b, AccuracyEstimate) and b.level == 0.9
    text = a.summary()
    assert text.startswith(f"accuracy estimated {a.expected:.2f} [{a.lower:.2f}, {a.upper:.2f}], "
                           f"{a.source:.2f} on the source")
    assert a.change == pytest.approx(a.expected - a.source)
    with pytest.raises(InputError, match="to_dict"):
        AccuracyEstimate.from_dict({"expected": 0.9})


def test_bad_inputs_name_the_fix(small):
    Xh, yh, Xt, _, cal = small
    with pytest.raises(InputError, match="class columns"):
        expected_accuracy(Xh, yh, Xt[:, :2], cal)
    with pytest.raises(InputError, match="holdout_labels"):
        expected_accuracy(Xh, yh[:-1], Xt, cal)
    y0 = yh.copy()
    y0[y0 == 2] = 1
    with pytest.raises(InputError, match=r"no example of class\(es\) \[2\].*Add labelled holdout rows"):
        expected_accuracy(Xh, y0, Xt, cal)
    for level in (0.0, 1.0, 1.5, -0.1, True, "0.95"):
        with pytest.raises(InputError, match="strictly between 0 and 1"):
            expected_accuracy(Xh, yh, Xt, cal, level=level)
    iv = source_aware_interval(Xh[:-5], yh[:-5], Xt, BCTS().fit(Xh[:-5], yh[:-5]))
    with pytest.raises(InputError, match="interval=None"):
        expected_accuracy(Xh, yh, Xt, cal, interval=iv)
