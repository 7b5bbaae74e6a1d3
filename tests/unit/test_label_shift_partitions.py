"""The label-shift test on rows in partitions (:mod:`labelshift.partitions`): its per-row passes over the target --
the region counts, the Wald form's row sums, the log-odds part's moments and its subsample of target rows -- run per
partition and are reduced here, and the test's statistics and p-values equal those on the concatenated array. The
engine is :func:`labelshift.partitions.local_rows` (uneven partitions, one of 1 row and one of 0 rows); the Dask
cluster's is tested in tests/integration/test_cluster_rows.py.

Tolerances, from the arithmetic. Counts of rows (per region, per predicted class) are whole numbers, exact in any
order: equal. The rows taken for the bootstrap world are copies: equal. Every other per-partition result is a float64
sum whose terms have one sign (psi_i = f_i / f_i^T w >= 0 and its products; the clipped log-odds <= 0, their squares;
the block vectors' products, of one sign per entry), computed row by row with the same operations in both paths; the
paths group the terms differently (blocks cut at other rows, partition sums added last). As in
tests/unit/test_partitions.py each path's sum is within (k + B + b + p) eps of the exact sum (B rows a block, b
blocks, p partitions; k for a row's dot product grouped differently by BLAS), so the two within twice that,
relative (terms of one sign: the sum of |terms| is |sum|). A variance E[x^2] - E[x]^2 loses that relative accuracy
to cancellation: its error is at most the bound times E[x^2] + 2 E[x]^2 <= 3 E[x^2]. The regions' likelihood ratio,
null fit and bootstrap are functions of the counts alone, so they are equal too. The log-odds statistic and the Wald
statistic are smooth functions of sums within about 1e-12 relative (the bound here); 1e-9 leaves a factor of 1000
for their conditioning (measured: 4e-15 and 1e-14 relative). A bootstrap p-value counts draws at or above the
statistic: it moves only if a draw lies within that 1e-12 of it (none does in these draws).
"""
from __future__ import annotations

import numpy as np
import pytest

from labelshift import MLLS, rows
from labelshift.errors import InputError
from labelshift.inference.label_shift_test import label_shift_test, prepare_holdout
from labelshift.inference.label_shift_test.log_odds import target_moments
from labelshift.inference.label_shift_test.regions import assign_rows, make_regions, region_counts_of
from labelshift.inference.label_shift_test.regions_fit import wald_target_sums
from labelshift.partitions import local_rows, take_rows
from tests.fixtures.draws import softmax_draw

K = 4
BLOCK = 1000
EPS64 = float(np.finfo(np.float64).eps)
#: where the target is cut: uneven partitions, one of 1 row and one of 0 rows
CUTS = (0, 1, 1, 1700, 1701, 4100, 6000)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of 1000 rows, so that a partition spans several blocks cut at other rows than the whole array's;
    sets of more than 2000 rows count as large (the blocked passes run on the whole array too)."""
    monkeypatch.setattr(rows, "ROW_BLOCK", BLOCK)
    monkeypatch.setattr(rows, "LARGE_ROWS", 2000)




@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    S, y = softmax_draw(rng, 2000, np.full(K, 1 / K))
    P, _ = softmax_draw(rng, CUTS[-1], np.array([0.4, 0.3, 0.2, 0.1]))
    return S, y, P


def _parts(P):
    return local_rows([P[a:b] for a, b in zip(CUTS[:-1], CUTS[1:])])


def _bound(m, k):
    """Twice the rounding of one path's sums, relative (module docstring)."""
    return 2.0 * (k + BLOCK + -(-m // BLOCK) + len(CUTS)) * EPS64


def test_counts_and_taken_rows_are_exact(data):
    S, _, P = data
    R = _parts(P)
    regions = make_regions(S, 25, 4)
    counts = region_counts_of(regions, R)
    np.testing.assert_array_equal(counts, region_counts_of(regions, P))
    np.testing.assert_array_equal(counts, np.bincount(regions.assign(P), minlength=regions.n_regions))
    sub = np.array([0, 1, 2, 1699, 1700, 1701, 4099, 4100, 5999])        # the 1-row partition and every edge
    taken = take_rows(R, sub)
    assert taken.dtype == P.dtype
    np.testing.assert_array_equal(taken, P[sub])
    assert take_rows(R, np.array([], dtype=np.int64)).shape == (0, K)
    for bad in ([3, 2], [-1], [6000]):
        with pytest.raises(ValueError, match="sorted row numbers"):
            take_rows(R, np.array(bad))


def test_moment_and_wald_sums_within_the_summation_rounding(data):
    S, _, P = data
    R = _parts(P)
    m, k = P.shape
    tol = _bound(m, k)
    mean, var, second = target_moments(P, k, products=True)
    mean_r, var_r, second_r = target_moments(R, k, products=True)
    np.testing.assert_array_equal(mean_r[:k], mean[:k])                 # predicted-class counts / m: exact
    np.testing.assert_allclose(mean_r, mean, rtol=tol, atol=0)
    np.testing.assert_allclose(var_r, var, rtol=0, atol=3 * tol * float(np.max(var + mean ** 2)))
    np.testing.assert_allclose(second_r, second, rtol=tol, atol=0)
    regions = make_regions(S, 25, 4)
    w = np.array([1.6, 1.2, 0.8, 0.4])
    a, b = wald_target_sums(P, w, assign_rows(regions, P), regions), wald_target_sums(R, w, None, regions)
    for x, x_r in zip(a, b):
        np.testing.assert_allclose(x_r, x, rtol=tol, atol=0)


@pytest.mark.parametrize("form", [dict(), dict(method="wald"), dict(calibration="chi2", log_odds=False)])
def test_the_label_shift_test_on_partitions_equals_the_whole_array(data, form):
    S, y, P = data
    R = _parts(P)
    one = label_shift_test(S, y, P, bootstrap_draws=59, seed=3, **form)
    parts = label_shift_test(S, y, R, bootstrap_draws=59, seed=3, **form)
    assert parts.n_target == one.n_target and parts.dof == one.dof
    if form.get("method") == "wald":
        assert parts.statistic == pytest.approx(one.statistic, rel=1e-9)
        np.testing.assert_allclose(parts.weights, one.weights, rtol=0, atol=1e-9)    # the row solver's 2 tol
    else:                                   # the regions' fit: a function of the counts alone
        assert parts.statistic == one.statistic
        np.testing.assert_array_equal(parts.weights, one.weights)
    assert abs(parts.p_value - one.p_value) <= 1e-9
    if "log_odds_statistic" in one.extra:
        assert parts.extra["log_odds_statistic"] == pytest.approx(one.extra["log_odds_statistic"], rel=1e-9)
        assert abs(parts.extra["p_value_log_odds"] - one.extra["p_value_log_odds"]) <= 1e-9
    np.testing.assert_allclose([r.observed for r in parts.regions], [r.observed for r in one.regions], rtol=0, atol=0)


def test_given_weights_and_a_prepared_holdout_on_partitions(data):
    """Given MLLS weights are checked on the partitions (optimality and f_i^T w > 0, by map-reduce), and a
    prepared holdout gives the same result as without it."""
    S, y, P = data
    R = _parts(P)
    w = MLLS().fit(S, y).estimate(P).weights
    prepared = prepare_holdout(S, y)
    one = label_shift_test(S, y, P, weights=w, bootstrap_draws=59, seed=3, prepared=prepared)
    parts = label_shift_test(S, y, R, weights=w, bootstrap_draws=59, seed=3, prepared=prepared)
    again = label_shift_test(S, y, R, weights=w, bootstrap_draws=59, seed=3)
    assert parts.statistic == pytest.approx(one.statistic, rel=1e-9) and abs(parts.p_value - one.p_value) <= 1e-9
    assert again.statistic == parts.statistic and again.p_value == parts.p_value
    lone = P.copy()
    lone[1700] = [1.0, 0.0, 0.0, 0.0]              # the 1-row partition: f^T w = 0 where w_0 = 0
    zero = np.array([0.0, 1.0, 1.0, 1.0]) / (1.0 - np.mean(y == 0))
    with pytest.raises(InputError, match="zero likelihood to some target rows"):
        label_shift_test(S, y, _parts(lone), weights=zero, method="wald")
