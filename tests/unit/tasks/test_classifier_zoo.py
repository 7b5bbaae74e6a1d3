"""The zoo of classifiers through the default re-estimation path: the fast cases of
:mod:`labelshift.experiments.zoo`, each run by ``tests/zoo_support.py`` as the flow runs a prediction-log reference
(BCTS fit on the holdout, MLLS with the BBSE-soft cross-check, the source-aware 95% interval, the label-shift test,
the accuracy).

What is asserted is what every classifier a user brings must get: no exception on valid input; a verdict,
with reasons in words when it is Untrustworthy; where a few seeds measure it, the interval's coverage of the true
target prior over the runs that hand out an estimate; and truly label-shifted targets (all of the zoo's) seldom
called "Not label shift". The statistical bounds come from the binomial distribution (see each test). The full
table, with more seeds and the slow cases (k = 100, 1,000), is ``benchmarks/bench_zoo.py``.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
from scipy.stats import binom

from labelshift.experiments.zoo import CASES, GaussianCase, MisspecifiedCase, SklearnCase, case, fast_cases
from labelshift.inference.report import NOT_LABEL_SHIFT, VERDICTS
from tests.zoo_support import ZooRun, run_case

#: seeds of the no-exception checks: three for the cases that take well under a second a run, two for those that
#: take about a second, one for the slower ones (3-7 s a run on a quiet core)
SLOW = {"gauss-k10", "rare-0.1pct", "fraud", "float16"}
ABOUT_A_SECOND = {"gauss-k2", "under-confident", "over-confident", "absent-class"}
#: fast in the zoo's sense but too slow for a test file (k = 30: about 17 s a run); measured by benchmarks/bench_zoo.py
BENCH_ONLY = {"gauss-k30"}
#: classifiers no BCTS calibrates (benchmarks/bench_miscalibration.py measures them): here, one smoke run each
MISSPECIFIED = [c.name for c in fast_cases() if isinstance(c, MisspecifiedCase)]
TESTED = [c.name for c in fast_cases() if c.name not in BENCH_ONLY and c.name not in MISSPECIFIED]
#: cases whose coverage is measured, with their seeds (the cheapest runs: each whole check takes seconds)
COVERAGE_SEEDS = {"tiny-target": 30, "lr-breast-cancer": 20, "lr-iris": 20, "over-confident": 8, "absent-class": 8}
#: nominal level of the interval and the chance a correct interval fails a statistical bound below
LEVEL, FALSE_ALARM = 0.95, 0.001


def smoke_seeds(name: str) -> range:
    return range(1 if name in SLOW else 2 if name in ABOUT_A_SECOND else 3)


@lru_cache(maxsize=None)
def run(name: str, seed: int) -> ZooRun:
    """One run, shared by the tests (the runs are deterministic for a fixed case and seed)."""
    return run_case(case(name), seed)


def _describe(r: ZooRun) -> str:
    return f"{r.case} seed {r.seed}: {r.error or r.verdict} (at {r.origin})"


# -- the generators are what they claim --------------------------------------------------------------------------
def test_the_zoo_cases_have_what_their_names_say():
    sep = case("separable")
    h = sep.holdout(0)
    assert np.all(np.argmax(h.outputs, axis=1) == h.labels)                    # 100% accurate holdout
    rare = case("rare-0.1pct").holdout(0)
    assert 0.0003 <= np.mean(rare.labels == 0) <= 0.002                       # a class of ~0.1% (10 of 10,000)
    fraud = case("fraud")
    assert len(fraud.holdout(0).labels) == 20_000 and np.isclose(fraud.problem.source_prior[1], 0.01)
    assert np.allclose(fraud.target(0).prior, [0.97, 0.03])
    absent = case("absent-class").target(0)
    assert absent.prior[0] == 0 and not np.any(absent.labels == 0)
    assert case("float16").holdout(0).outputs.dtype == np.float16
    assert len(case("tiny-holdout").holdout(0).labels) == 60 and len(case("tiny-target").target(0).labels) == 30
    assert {c.n_classes for c in CASES.values()} >= {2, 3, 5, 10, 30, 100, 1000}
    assert not case("gauss-k100").fast and not case("gauss-k1000").fast


@pytest.mark.parametrize("name", ["rf-breast-cancer", "rf-wine"])
def test_forest_probabilities_hold_exact_zeros_ones_and_ties(name):
    p = case(name).holdout(0).outputs
    assert np.any(p == 0.0) and np.any(p == 1.0)
    assert len(np.unique(p[:, 0])) < len(p) / 2                               # many rows tie


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if isinstance(c, SklearnCase)])
def test_real_data_target_rows_are_disjoint_from_the_holdout(name):
    c = case(name)
    for seed in range(3):
        holdout_rows, pool_rows = c.split(seed)
        assert not set(holdout_rows) & set(pool_rows)     # training rows are in neither (the model's outputs
        assert len(c.target(seed).labels) == c.m          # exist only for the rows it was not trained on)


def test_the_same_seed_draws_the_same_sets_and_another_seed_others():
    c = case("gauss-k2")
    assert np.array_equal(c.holdout(3).outputs, c.holdout(3).outputs)
    assert np.array_equal(c.target(3).labels, c.target(3).labels)
    assert not np.array_equal(c.target(3).prior, c.target(4).prior)
    assert isinstance(c, GaussianCase)


# -- the default path on every fast case ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", TESTED)
def test_no_exception_on_valid_input(name):
    """The default path gives a verdict on every classifier, never an exception."""
    runs = [run(name, s) for s in smoke_seeds(name)]
    failed = [_describe(r) for r in runs if r.error is not None]
    assert not failed, "\n".join(failed)
    assert all(r.verdict in VERDICTS for r in runs)


@pytest.mark.parametrize("name", MISSPECIFIED)
def test_a_misspecified_classifier_gets_a_verdict_and_says_why_when_untrustworthy(name):
    r = run(name, 0)
    assert r.error is None, _describe(r)
    assert r.verdict in VERDICTS and (r.verdict != "Untrustworthy" or r.reasons)


@pytest.mark.parametrize("name", TESTED)
def test_an_untrustworthy_or_not_label_shift_verdict_says_why(name):
    """An Untrustworthy verdict carries its reasons, each a sentence (and Not label shift the test's line)."""
    for r in (run(name, s) for s in smoke_seeds(name)):
        if r.verdict in ("Untrustworthy", NOT_LABEL_SHIFT):
            assert r.reasons, _describe(r)
            assert all(isinstance(why, str) and len(why.split()) >= 5 for why in r.reasons), r.reasons


def miss_bound(runs: int, k: int) -> int:
    """The most misses of one class's interval over ``runs`` independent seeds that a correct 95% interval
    produces with probability 1 - FALSE_ALARM / k: misses ~ Binomial(runs, 0.05) for each class (seeds are
    independent), Bonferroni over the k classes, so a correct interval fails the whole check with probability at
    most FALSE_ALARM. (Classes of one seed are dependent, hence per class and not pooled.)"""
    return int(binom.ppf(1.0 - FALSE_ALARM / k, runs, 1.0 - LEVEL))


@pytest.mark.parametrize("name", list(COVERAGE_SEEDS))
def test_the_interval_covers_the_true_target_prior(name):
    """Over the runs that hand out an estimate (Shifted, No shift), the 95% interval covers the population
    target prior of each class as often as the binomial allows (:func:`miss_bound`); every run ends in a verdict."""
    runs = [run(name, s) for s in range(COVERAGE_SEEDS[name])]
    failed = [_describe(r) for r in runs if r.error is not None]
    assert not failed, "\n".join(failed)
    trusted = [r for r in runs if r.trusted]
    if not trusted:
        return
    misses = len(trusted) - np.sum(np.stack([r.covers for r in trusted]), axis=0)
    bound = miss_bound(len(trusted), case(name).n_classes)
    assert np.all(misses <= bound), f"{name}: misses per class {misses.tolist()} of {len(trusted)} runs > {bound}"


def test_label_shifted_targets_are_seldom_called_not_label_shift():
    """Every target of the zoo is truly label-shifted, so "Not label shift" is a false alarm of the label-shift test
    at 5%: over N runs their count is at most Binomial(N, 0.05)'s 1 - FALSE_ALARM quantile. The runs are those of
    the tests above (pooled over the cases: one case's few runs cannot tell 5% from 7%)."""
    runs = [run(n, s) for n in TESTED for s in smoke_seeds(n)]
    runs += [run(n, s) for n, seeds in COVERAGE_SEEDS.items() for s in range(seeds) if s not in smoke_seeds(n)]
    judged = [r for r in runs if r.error is None]
    called = [_describe(r) for r in judged if r.not_label_shift]
    bound = int(binom.ppf(1.0 - FALSE_ALARM, len(judged), 1.0 - LEVEL))
    assert len(called) <= bound, f"{len(called)} of {len(judged)} runs called Not label shift (> {bound}):\n" + \
        "\n".join(called)
