"""Target rows that repeat (labelshift.inference.repeats): how they are found, what the tests and intervals count them
as, what the report says, and the label-shift test's verdict on targets drawn with replacement (Section 6's sampling)
from simulated classes and from a real network's outputs on real images (ResNet-18 on Fashion-MNIST)."""
from __future__ import annotations

import dataclasses
import functools
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from labelshift.experiments.well_specified import WellSpecifiedGaussians
from labelshift.experiments.zoo import OutputsCase, dirichlet_target
from labelshift.inference import repeats as R
from labelshift.inference import report as report_module
from labelshift.inference.report import ShiftReport, assess_shift
from labelshift.errors import InputError
from labelshift.inference.intervals import fisher_interval
from labelshift.inference.holdout_conditional import no_shift_inflation
from labelshift.inference.no_shift import no_shift_test
from labelshift import Holdout, Target, AssessmentSettings

REPO = Path(__file__).resolve().parents[3]
RESNET = REPO / "benchmarks" / "fashion_resnet18_outputs_h200.npz"


def _probs(m: int, k: int = 5, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.ones(k), size=m)


# ------------------------------------------------------------------------------------------------ finding repeats
def test_distinct_rows_groups_equal_rows_in_order_of_first_occurrence():
    base = _probs(40)
    idx = np.random.default_rng(1).integers(0, 40, 200)
    P = base[idx]
    first, inverse, counts = R.distinct_rows(P)
    assert np.array_equal(P[first][inverse], P)                    # every row is its group's first row
    assert np.all(np.diff(first) > 0)                              # groups in order of first occurrence
    assert counts.sum() == 200 and len(first) == len(np.unique(idx))
    assert np.array_equal(np.sort(counts), np.sort(np.unique(idx, return_counts=True)[1]))


def test_a_target_of_many_repeats_is_grouped_without_sorting_every_hash_first(monkeypatch):
    """Repeats that a fixed sample of 2^16 hashes already shows skip the sort of all hashes that looks for them
    (_all_distinct); the groups are the same. A target of distinct rows still takes that sort, and no grouping."""
    called = []
    real = R._all_distinct
    monkeypatch.setattr(R, "_all_distinct", lambda h: called.append(h.size) or real(h))
    idx = np.random.default_rng(2).integers(0, 1000, 200_000)
    P = _probs(1000)[idx]
    first, inverse, counts = R.distinct_rows(P)
    assert called == [] and np.array_equal(P[first][inverse], P) and len(first) == len(np.unique(idx))
    assert R._sorted_groups(_probs(5000)) is None and called == [5000]


def test_distinct_rows_are_exact_when_the_hash_collides(monkeypatch):
    P = _probs(30)[np.r_[0:30, 0:10]]
    monkeypatch.setattr(R, "_row_hash", lambda words: np.zeros(words.shape[0], np.uint64))   # every row collides
    first, inverse, counts = R.distinct_rows(P)
    assert len(first) == 30 and np.array_equal(P[first][inverse], P) and counts.max() == 2


def test_finding_repeats_takes_little_memory_however_the_rows_repeat():
    """At most 40 bytes a row besides the rows themselves (an (m,) hash, sort order and group starts), whether every
    row is distinct, all are one row, or the rows fall into ten large groups."""
    import tracemalloc

    base = _probs(10, k=10).astype(np.float32)
    cases = {"distinct": _probs(300_000, k=10).astype(np.float32),
             "one row": np.repeat(base[:1], 300_000, axis=0),
             "ten groups": base[np.random.default_rng(3).integers(0, 10, 300_000)]}
    for name, P in cases.items():
        tracemalloc.start()
        R.find_repeats(P)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 40 * len(P), (name, peak / len(P))


def test_a_holdout_match_is_found_among_rows_whose_hashes_collide(monkeypatch):
    monkeypatch.setattr(R, "_row_hash", lambda words: np.zeros(words.shape[0], np.uint64))
    holdout = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert R._in_holdout(np.array([[0.0, 1.0], [0.5, 0.5]]), np.array([0, 1]), holdout).tolist() == [True, False]


def test_rows_that_differ_in_one_bit_are_distinct():
    P = _probs(2).astype(np.float32)
    Q = P.copy()
    Q[1, 0] = np.nextafter(Q[1, 0], np.float32(1))
    assert len(R.distinct_rows(np.vstack([P, Q]))[0]) == 3


def test_ties_in_the_holdout_are_taken_as_the_models_own_and_change_nothing():
    holdout = _probs(1000)
    holdout[:50] = holdout[50]                                     # 5% of the holdout tied: the model has atoms
    target = _probs(300, seed=2)[np.r_[0:300, 0:100]]
    r = R.find_repeats(target, holdout)
    assert r.repeated_rows == 100 and not r.handled and not r.adjusts and r.effective_rows == 400
    assert "counted as independent" in r.summary()
    fresh = R.find_repeats(target, _probs(1000, seed=3))
    assert fresh.handled and fresh.adjusts
    assert fresh.effective_rows == pytest.approx(400 ** 2 / (200 + 100 * 4))          # Kish: m^2 / sum c^2


def test_a_repeated_output_that_also_occurs_in_the_holdout_is_the_models_own_tie():
    """0.3% of the holdout share one output (a saturated row, say): under the 1% rule, yet that value's copies in
    the target are the model's own ties, not repeats of one item, and count as independent rows."""
    holdout = _probs(1000)
    atom = holdout[7].copy()
    holdout[[100, 200]] = atom
    fresh = _probs(400, seed=8)
    target = np.vstack([fresh, np.repeat(atom[None], 300, axis=0)])
    r = R.find_repeats(target, holdout)
    assert r.handled and not r.adjusts and r.collapsed_rows == 0 and r.shared_rows == 300
    assert r.effective_rows == 700 and "count as independent" in r.summary()
    both = R.find_repeats(np.vstack([target, fresh[:50]]), holdout)      # plus 50 repeats of fresh rows
    assert both.adjusts and both.collapsed_rows == 50 and both.kept_rows == 700
    assert np.sum(np.all(target[both.test_rows] == atom, axis=1)) == 300  # the atom's rows all go to the test


# ------------------------------------------------------------------------------------------ clustered covariances
def _repeats_of(P, holdout=None):
    return R.find_repeats(P, holdout if holdout is not None else _probs(500, seed=99))


def test_clustered_covariance_weights_each_distinct_row_by_its_copies_squared():
    base = _probs(60)
    c = np.random.default_rng(5).integers(1, 6, 60)
    P = np.repeat(base, c, axis=0)[np.random.default_rng(6).permutation(c.sum())]
    reps = _repeats_of(P)
    center = P.mean(axis=0)
    got = R.clustered_covariance(lambda rows: P[rows], reps, 5, center)
    want = sum(ci ** 2 * np.outer(s - center, s - center) for ci, s in zip(c, base)) / c.sum()
    # the same sums in another order: equal to rounding (1e-12 relative to the entries' scale)
    assert np.allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())


def test_clustered_covariance_of_doubled_rows_is_twice_the_rows_covariance():
    base = _probs(300)
    reps = _repeats_of(np.vstack([base, base]))
    center = base.mean(axis=0)
    plain = (base - center).T @ (base - center) / 300
    got = R.clustered_covariance(lambda rows: np.vstack([base, base])[rows], reps, 5, center)
    assert np.allclose(got, 2 * plain, rtol=0, atol=1e-12 * np.abs(plain).max())


# ------------------------------------------------------------------------------------------------- in the report
@functools.lru_cache(maxsize=1)
def _gaussian_setting():
    problem = WellSpecifiedGaussians.make(5, sep=3.0, scale=1.8, seed=0)
    rng = np.random.default_rng(10)
    zh, yh = problem.draw(problem.source_prior, 3000, rng)
    from labelshift.calibration import BCTS

    cal = BCTS().fit(zh, yh)
    hp = cal.predict_proba(zh)
    zt, _ = problem.draw(np.array([0.4, 0.3, 0.1, 0.1, 0.1]), 1500, rng)
    return cal, zh, yh, hp, zt[rng.permutation(len(zt))]          # draw() returns the rows class by class


def _assess(zt, interval="source-aware"):
    cal, zh, yh, hp, _ = _gaussian_setting()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return assess_shift(Holdout(hp, yh, hp.mean(axis=0), outputs=zh, calibrator=cal),
                            Target(cal.predict_proba(zt), zt),
                            AssessmentSettings(interval=interval))


def test_a_target_of_doubled_rows_is_tested_on_its_distinct_rows_and_its_interval_widens():
    zt = _gaussian_setting()[4]
    once, twice = _assess(zt[:750]), _assess(np.concatenate([zt[:750], zt[:750]]))
    assert once.repeats.repeated_rows == 0 and once.repeats_summary is None and "repeats" not in once.to_dict()
    assert twice.repeats.n_distinct == 750 and twice.repeats.effective_rows == pytest.approx(750)
    assert twice.label_shift.n_target == 750                        # the test saw each row once
    # the same distinct rows: the same estimate, and the same test statistic (p-values from the same draws)
    assert np.allclose(twice.target_prior, once.target_prior, atol=1e-6)
    assert twice.label_shift.statistic == pytest.approx(once.label_shift.statistic, rel=1e-6, abs=1e-8)
    # each distinct row and its copy are one cluster: the doubled target's covariance is the 750 rows' (to
    # rounding: the same sums, scaled by 4 and by 1/2 twice), never that of 1,500 independent rows
    se1 = np.sqrt(np.diag(once.interval.covariance_target))
    se2 = np.sqrt(np.diag(twice.interval.covariance_target))
    assert np.allclose(se2, se1, rtol=1e-6, atol=0), se2 / se1
    assert "750 of 1,500 target rows repeat" in twice.repeats_summary
    assert "the label-shift test used 750 of them, each copied row once" in twice.repeats_summary


def test_fisher_interval_and_no_shift_test_count_copies():
    cal, _, _, hp, zt = _gaussian_setting()
    P1 = cal.predict_proba(zt[:600])
    P2 = np.concatenate([P1, P1, P1])
    reps = R.find_repeats(P2, hp)
    p = hp.mean(axis=0)
    a = fisher_interval(P2, None, p)
    b = fisher_interval(P2, None, p, repeats=reps)
    assert np.allclose(b.std_error, a.std_error * math.sqrt(3), rtol=1e-6)    # each row 3 times: 600 rows' width
    plain = no_shift_test(P2, None, p, source_probs=hp)
    counted = no_shift_test(P2, None, p, source_probs=hp, repeats=reps)
    assert counted.statistic < plain.statistic and counted.p_value > plain.p_value
    # the holdout counted kappa times, kappa from the effective target size (600 items, not 1,800 rows)
    n = hp.shape[0]
    assert plain.holdout_inflation == pytest.approx(no_shift_inflation(n, 1800, plain.dof), rel=1e-12)
    assert counted.holdout_inflation == pytest.approx(no_shift_inflation(n, reps.effective_rows, counted.dof),
                                                      rel=1e-12)


def test_one_row_repeated_gets_a_verdict_with_its_reason_not_an_error():
    zt = _gaussian_setting()[4]
    rep = _assess(np.repeat(zt[:1], 500, axis=0))
    assert rep.verdict == "Untrustworthy"
    assert "only 1 rows" in rep.label_shift_error and any("distinct" in f for f in rep.failures)
    every_row_twice = _assess(np.repeat(zt[:30], 20, axis=0))     # 30 items, each scored 20 times
    assert every_row_twice.verdict == "Untrustworthy" and every_row_twice.repeats.n_distinct == 30


def test_the_report_round_trips_with_its_repeats():
    zt = _gaussian_setting()[4]
    rep = _assess(np.concatenate([zt[:600], zt[:300]]), interval="fisher")
    d = rep.to_dict()
    assert d["repeats"]["repeated_rows"] == 300 and d["repeats_summary"].startswith("300 of 900 target rows")
    back = ShiftReport.from_dict(d)
    assert back.to_dict() == d
    from tasks.reestimation.runs import prior_metrics

    metrics = prior_metrics(rep)
    assert metrics["target_distinct_rows"] == 600 and metrics["target_effective_rows"] == pytest.approx(
        900 ** 2 / (300 * 4 + 300))
    assert "target_distinct_rows" not in prior_metrics(_assess(zt[:600], interval="fisher"))
    with pytest.raises(InputError, match="without its groups"):       # a stored report's repeats hold no groups
        fisher_interval(_gaussian_setting()[0].predict_proba(zt[:900]), None, back.source_prior,
                        repeats=back.repeats)


def test_a_float32_target_is_judged_against_the_holdout_at_float32():
    """Holdout rows saturated beyond float32's range are distinct in float64 and tie in float32: the target (stored
    as float32) is compared at its precision, so the ties are the model's own, not repeats."""
    rng = np.random.default_rng(12)
    holdout = _probs(2000, k=2, seed=13)
    holdout[:100] = np.c_[rng.uniform(1e-60, 1e-50, 100), np.ones(100)]      # 5%: equal once rounded to float32
    labels = (holdout[:, 1] > 0.5).astype(int)
    target = np.vstack([_probs(1500, k=2, seed=14), holdout[:100], holdout[:100]]).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = assess_shift(Holdout(holdout, labels, holdout.mean(axis=0)),
                           target,
                           AssessmentSettings(interval="fisher"))
    assert rep.repeats.holdout_tied == pytest.approx(0.05) and not rep.repeats.handled
    assert not rep.repeats.adjusts and rep.label_shift.n_target == 1700


# -------------------------------------------------------------------------- the verdict on targets that repeat
def _independent(monkeypatch):
    """Count every row as independent: the code before repeats were handled."""
    original = R.find_repeats

    def independent(target, holdout=None):
        return dataclasses.replace(original(target, holdout), handled=False, collapsed_rows=0,
                                   effective_rows=float(len(target)))

    monkeypatch.setattr(report_module, "find_repeats", independent)


def _not_label_shift(case, seeds) -> int:
    sys.path.insert(0, str(REPO / "tests"))
    from zoo_support import run_case

    runs = [run_case(case, s) for s in seeds]
    assert all(r.error is None for r in runs), [r.error for r in runs]
    return sum(r.not_label_shift for r in runs)


@pytest.mark.parametrize("handled", [False, True])
def test_section_6_targets_of_a_real_network_are_label_shift(monkeypatch, handled):
    """ResNet-18 on Fashion-MNIST (trained on a lent GPU; its logits ship in benchmarks/): holdout one random half of
    the test images, the target 10,000 rows drawn with replacement from 500 images of the other half (95% of the
    rows repeat). Counted as independent rows, nearly every target is called Not label shift; on its distinct rows,
    at most two of eight (at the test's level of 5%, P(3 or more of 8) = 0.006)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import real_networks

    if not handled:
        _independent(monkeypatch)
    pools = functools.partial(real_networks.load_pools, str(RESNET), "test", "test")
    case = OutputsCase("resnet18-repeated-test", "", 10, "logits", 10_000, dirichlet_target(1.0), pools=pools,
                       n=5000, replace=True, pool_rows=500, split=True)
    called = _not_label_shift(case, range(206, 214))
    if handled:
        assert called <= 2
    else:
        assert called >= 6


def test_real_network_power_against_a_changed_class_look_is_kept():
    """The same network, the target's T-shirts turned upside down (fresh rows): still called Not label shift."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import real_networks

    pools = functools.partial(real_networks.load_pools, str(RESNET), "test", "class-look")
    case = OutputsCase("resnet18-class-look-test", "", 10, "logits", 2000, dirichlet_target(1.0), pools=pools,
                       n=5000, split=True)
    assert _not_label_shift(case, range(200, 203)) >= 2
