"""Stopping a bootstrap early: Besag & Clifford's sequential Monte Carlo p-value (Biometrika 78, 1991, 301-304).

A bootstrap p-value (1 + #{draws reaching the statistic}) / (B + 1) needs all B draws only when few draws reach the
statistic; when many do, the p-value is large and its exact value does not matter. Drawing until the h-th draw that
reaches the statistic (at draw L) and reporting h / L is as valid under H0 as the fixed-B p-value, and equals it
whenever fewer than h draws reach the statistic. Both parts of the label-shift test use it
(``docs/label_shift_test.md``, "Stopping the bootstrap early").
"""
from __future__ import annotations

import numpy as np

#: a bootstrap stops once this many draws reach the statistic: with B = 200 a stopped p-value is at least 10 / 200
#: = 0.05 and every fixed-B p-value it replaces at least 11 / 201, so no decision "p < level" at a level up to 0.05
#: changes (the strict < matters at exactly 0.05); a target consistent with label shift needs about 40 draws on
#: average instead of 200
STOP_EXCEEDANCES = 10
#: draws computed together before the stopping rule looks at them
DRAW_BATCH = 20


def reaching(statistic: float, boot: np.ndarray) -> np.ndarray:
    """Positions of the draws that reach the statistic (>= it, up to a relative 1e-9)."""
    return np.flatnonzero(boot >= statistic - 1e-9 * max(1.0, statistic))


def stopping_draw(statistic: float, boot: np.ndarray, exceedances: int = STOP_EXCEEDANCES) -> int | None:
    """The draw L (1-based) at which the ``exceedances``-th draw of ``boot`` reaches the statistic, or None."""
    hits = reaching(statistic, boot)
    return int(hits[exceedances - 1]) + 1 if hits.size >= exceedances else None


def sequential_p_value(statistic: float, batches, draws: int,
                       exceedances: int = STOP_EXCEEDANCES) -> tuple[float, int, int]:
    """The sequential p-value of ``statistic`` from bootstrap statistics arriving in ``batches`` (an iterable of
    arrays, at most ``draws`` in all, consumed only as far as needed): ``exceedances`` / L when the
    ``exceedances``-th draw that reaches the statistic is draw L; otherwise, after all the draws,
    (1 + #reaching) / (draws + 1), the fixed-B p-value. Returns (p, draws that reached the statistic, draws used)."""
    seen = []
    for boot in batches:
        seen.append(np.asarray(boot, dtype=np.float64))
        stop = stopping_draw(statistic, np.concatenate(seen), exceedances)
        if stop is not None:
            return exceedances / stop, exceedances, stop
    boot = np.concatenate(seen) if seen else np.zeros(0)
    found = int(reaching(statistic, boot).size)
    return (1 + found) / (draws + 1), found, int(boot.size)
