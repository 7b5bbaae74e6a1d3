"""p-values adjusted over a family of tests: Holm and Benjamini-Hochberg against hand-computed values and
against their step-down / step-up procedures, and the one-line description the segments' table uses."""
from __future__ import annotations

import numpy as np
import pytest

from labelshift.errors import InputError
from labelshift.inference.multiplicity import (AdjustedPValue, adjust_p_values, benjamini_hochberg,
                                               check_correction, holm)

#: four p-values, sorted 0.005 < 0.01 < 0.03 < 0.04 (positions 3, 0, 2, 1)
P = [0.01, 0.04, 0.03, 0.005]


def test_holm_by_hand():
    # (S - j + 1) p_(j): 4 x 0.005 = 0.02, 3 x 0.01 = 0.03, 2 x 0.03 = 0.06, 1 x 0.04 = 0.04; running max
    # 0.02, 0.03, 0.06, 0.06
    np.testing.assert_allclose(holm(P), [0.03, 0.06, 0.06, 0.02])
    # at 0.05: 0.005 < 0.05/4 and 0.01 < 0.05/3 are rejected, 0.03 >= 0.05/2 stops the procedure
    assert (holm(P) < 0.05).tolist() == [True, False, False, True]
    np.testing.assert_allclose(holm([0.6, 0.7]), [1.0, 1.0])          # capped at 1
    np.testing.assert_allclose(holm([0.2]), [0.2])                    # a family of one: as it is


def test_benjamini_hochberg_by_hand():
    # S p_(j) / j: 0.02, 0.02, 0.04, 0.04; running min from the largest: the same
    np.testing.assert_allclose(benjamini_hochberg(P), [0.02, 0.04, 0.04, 0.02])
    # at 0.05 the largest j with p_(j) <= j 0.05 / 4 is j = 4 (0.04 <= 0.05): all four are rejected
    assert (benjamini_hochberg(P) < 0.05).all()
    np.testing.assert_allclose(benjamini_hochberg([0.02, 0.02]), [0.02, 0.02])   # ties
    np.testing.assert_allclose(benjamini_hochberg([0.01, 0.5, 0.9]), [0.03, 0.75, 0.9])


def test_tests_without_a_p_value_are_left_out_of_the_family():
    with_nan = [0.01, np.nan, 0.04, 0.03, 0.005]
    np.testing.assert_allclose(holm(with_nan), [0.03, np.nan, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(benjamini_hochberg(with_nan), [0.02, np.nan, 0.04, 0.04, 0.02])
    np.testing.assert_allclose(adjust_p_values(with_nan, "none"), with_nan)
    assert holm([]).shape == (0,) and benjamini_hochberg([np.nan]).tolist() != [0.0]


def _holm_procedure(p, alpha):
    order = np.argsort(p)
    out = np.zeros(len(p), bool)
    for j, i in enumerate(order):
        if p[i] >= alpha / (len(p) - j):
            break
        out[i] = True
    return out


def _bh_procedure(p, alpha):
    order = np.argsort(p)
    below = [j for j in range(len(p)) if p[order[j]] < (j + 1) * alpha / len(p)]
    out = np.zeros(len(p), bool)
    if below:
        out[order[:max(below) + 1]] = True
    return out


def test_adjusted_values_reject_what_the_procedures_reject():
    from scipy.stats import false_discovery_control

    rng = np.random.default_rng(0)
    for _ in range(200):
        p = np.concatenate([rng.uniform(size=rng.integers(1, 30)), rng.uniform(0, 0.01, size=rng.integers(0, 5))])
        alpha = float(rng.choice([0.01, 0.05, 0.1]))
        assert ((holm(p) < alpha) == _holm_procedure(p, alpha)).all()
        assert ((benjamini_hochberg(p) < alpha) == _bh_procedure(p, alpha)).all()
        np.testing.assert_allclose(benjamini_hochberg(p), false_discovery_control(p, method="bh"))
        assert (holm(p) >= benjamini_hochberg(p) - 1e-15).all() and (benjamini_hochberg(p) >= p).all()


def test_bad_input_names_the_fix():
    with pytest.raises(InputError, match=r"one of 'holm', 'bh', 'none'.*got 'bonferroni'"):
        check_correction("bonferroni")
    with pytest.raises(InputError, match=r"\[0, 1\].*1.5 at position 1"):
        holm([0.1, 1.5])


def test_the_description_names_the_correction_and_the_family():
    adjusted = AdjustedPValue(0.004, 0.31, "holm", 100, 0.05)
    assert adjusted.describe() == "p = 0.004, Holm-adjusted over 100 segments 0.31"
    assert not adjusted.rejects and AdjustedPValue(0.004, 0.04, "bh", 10, 0.05).rejects
    assert AdjustedPValue(0.004, 0.004, "none", 100, 0.05).describe() == "p = 0.004"
