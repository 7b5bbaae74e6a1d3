"""How much to count the holdout's error so that a verdict is valid given the one holdout a model has.

A deployed model is compared with one labelled holdout for every batch (``/work/shared/DESIGN.md``, "One holdout,
many runs"). A statistic whose error is the target's sampling error plus the holdout's has, given the holdout, a
fixed holdout part; a law that treats that part as redrawn is right on average over holdouts and wrong for the
unlucky ones. This module derives the factor kappa >= 1 by which the holdout's variance is counted so that a holdout
whose error lies at a chosen quantile of its sampling law still sees the nominal rate.

Linearised, in coordinates where the holdout's and the target's errors are independent standard normal vectors of
dof coordinates, scaled by V_h and V_t (ratio ``rho = V_h / V_t``; for the two-sample no-shift test rho = m / n):
given the holdout's standardised error h (||h||^2 = s ~ chi^2_dof over holdouts) the statistic with the holdout
counted kappa times is

    ||e_t + h sqrt(V_h)||^2 / (V_t + kappa V_h)  =  chi^2_dof(lambda = rho s) / (1 + kappa rho),

so a test at critical value c = chi^2_dof quantile (1 - alpha) rejects given the holdout with probability
P(chi^2_dof(rho s) > c (1 + kappa rho)). :func:`holdout_inflation` returns the smallest kappa >= 1 for which that
is ``rate`` at s = the ``quantile`` of chi^2_dof. Derivation and measured rates: ``docs/uncertainty.md``
("Given one holdout") and ``docs/intervals.md`` ("Given one holdout").
"""
from __future__ import annotations

import math

import numpy as np
from scipy.stats import chi2, ncx2

from ..errors import InputError

#: the no-shift test: a holdout whose error is at this quantile of its law sees the level as its rate of false
#: Shifted (one holdout in a hundred sees more)
NO_SHIFT_QUANTILE = 0.99
#: the level the no-shift test's kappa is derived at (its p-value is read at any level; the report's is 5%)
NO_SHIFT_DESIGN_LEVEL = 0.05
#: the prior interval: a holdout whose error is at this quantile of its law (per class) still covers with
#: probability INTERVAL_CONDITIONAL_COVERAGE (the 10th percentile over holdouts covers at least 0.90)
INTERVAL_QUANTILE = 0.90
INTERVAL_CONDITIONAL_COVERAGE = 0.90


def holdout_inflation(rho, dof: int, *, level: float, rate: float, quantile: float) -> np.ndarray:
    """kappa >= 1 (array like ``rho``): the factor on the holdout's variance V_h so that, given a holdout whose
    standardised error has squared norm at the ``quantile`` of chi^2_dof, a test at ``level`` (critical value
    c = chi^2_dof upper ``level`` quantile, against chi^2_dof (V_t + kappa V_h)) rejects with probability ``rate``:

        kappa = max(1, (ncx2.isf(rate, dof, rho s_q) / c - 1) / rho),   rho = V_h / V_t,  s_q = chi2.ppf(quantile).

    rho = 0 (no holdout error, or an infinite holdout) gives 1. For a two-sided interval at ``level`` = 1 - coverage
    the same with dof = 1. Contract: kappa is 1 exactly when the quantile holdout already meets ``rate`` at
    kappa = 1, and increasing in ``quantile``.
    """
    for name, value in (("level", level), ("rate", rate), ("quantile", quantile)):
        if not 0.0 < float(value) < 1.0:
            raise InputError(f"{name} must be strictly between 0 and 1, got {value!r}.")
    if int(dof) < 1:
        raise InputError(f"dof must be a positive number of degrees of freedom, got {dof!r}.")
    rho = np.asarray(rho, dtype=np.float64)
    if np.any(~np.isfinite(rho) | (rho < 0)):
        raise InputError("rho (the holdout's variance over the target's) must be finite and >= 0; pass "
                         "V_h / V_t of the statistic.")
    c = float(chi2.isf(level, dof))
    s_q = float(chi2.ppf(quantile, dof))
    positive = rho > 0
    safe = np.where(positive, rho, 1.0)
    need = ncx2.isf(rate, dof, safe * s_q) / c
    kappa = np.where(positive, (need - 1.0) / safe, 1.0)
    return np.maximum(kappa, 1.0)


def no_shift_inflation(n_source: float, n_target: float, dof: int) -> float:
    """kappa of the two-sample no-shift test (:func:`labelshift.inference.no_shift.no_shift_test`): the holdout's
    mean counted with covariance kappa Sigma / n beside the target's Sigma / m (rho = m / n, ``n_target`` the
    effective m when rows repeat), derived at NO_SHIFT_DESIGN_LEVEL for the holdout at NO_SHIFT_QUANTILE."""
    if not (n_source > 0 and n_target > 0 and math.isfinite(n_source) and math.isfinite(n_target)):
        raise InputError(f"n_source and n_target must be positive row counts, got {n_source!r} and {n_target!r}.")
    return float(holdout_inflation(n_target / n_source, max(int(dof), 1), level=NO_SHIFT_DESIGN_LEVEL,
                                   rate=NO_SHIFT_DESIGN_LEVEL, quantile=NO_SHIFT_QUANTILE))


def interval_inflation(var_target, var_holdout, level: float) -> np.ndarray:
    """(k,) kappa per class of a normal interval at ``level`` whose variance is var_target + var_holdout: the
    holdout's part counted kappa_y times so that a holdout whose error in class y is at the INTERVAL_QUANTILE of
    its law (two-sided: |u| at the normal (1 + q) / 2 quantile) covers p_t(y) with probability
    INTERVAL_CONDITIONAL_COVERAGE; 1 where the holdout's share is 0, where var_target is 0 (no target error: the
    holdout's quantile then lies inside the interval whenever that coverage is below ``level``) or not finite."""
    vt = np.asarray(var_target, dtype=np.float64)
    vh = np.asarray(var_holdout, dtype=np.float64)
    ok = np.isfinite(vt) & np.isfinite(vh) & (vt > 0) & (vh > 0)
    rho = np.where(ok, vh / np.where(ok, vt, 1.0), 0.0)
    return holdout_inflation(rho, 1, level=1.0 - level, rate=1.0 - INTERVAL_CONDITIONAL_COVERAGE,
                             quantile=INTERVAL_QUANTILE)


def check_inflation(value, name: str = "holdout_inflation") -> float | None:
    """``value`` as None (derive kappa) or a finite float >= 1; InputError naming ``name`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not (
            math.isfinite(float(value)) and float(value) >= 1.0):
        raise InputError(f"{name} must be None (kappa derived from the holdout's share) or a finite number >= 1 "
                         f"(1: the holdout's error counted once, valid on average over holdouts only), got {value!r}.")
    return float(value)
