"""The holdout's own sampling error in the label-shift test's reference laws: both bootstraps (the regions part's
parametric one, :mod:`.null_fit` and :mod:`.sparse_null`, and the log-odds part's, :mod:`.log_odds`) draw each
class's holdout rows as if the holdout had n_y / kappa_y of them, so that the law carries class y's holdout error
kappa_y times over (in variance) while the statistic is computed as on the data.

Why: the test is used against one holdout for many targets. Given that holdout, the difference between its class
histograms and the true ones is fixed, not redrawn; where the target is large against the holdout it is most of
the statistic, and a bootstrap that redraws it with its own variance (kappa = 1) is valid on average over holdouts
only -- measured at holdouts of 1,000 rows against 20,000-row targets, one holdout in twenty rejected a quarter of
its label-shifted targets. Drawing it kappa times larger lifts the critical value above the holdout errors all but
rare holdouts have. How much larger depends on the holdout's share of the statistic's variance, class by class:
:func:`inflation_for_share` (the derivation and measured rates: ``docs/label_shift_test.md``, "Given one holdout").
"""
from __future__ import annotations

import numpy as np
from scipy.stats import norm

#: the test's kappa when ``holdout_inflation`` is None: a number forces that kappa for every class (1: the law
#: averaged over holdouts, the test of commit 7de4d1e; 2, the default: chosen on the Gaussian designs' holdout
#: seeds 0-19, reported on fresh seeds); None derives it per class from the holdout's share of the variance
#: (:func:`class_inflation`, also ``holdout_inflation="derived"``) -- measured not to beat 2 (it keeps power little
#: better and loses the digits design's per-holdout goal: ``docs/label_shift_test.md``, "Given one holdout")
HOLDOUT_INFLATION: float | None = 2.0
#: the level the derived kappa is made for (the issue's goals are stated at 5%)
DESIGN_LEVEL = 0.05
#: the derived kappa covers the holdout whose largest class error (over k classes) is at its (1 - this) quantile
#: -- the holdout one in twenty
HOLDOUT_TAIL = 0.05


def drawn_rows(n_y: np.ndarray, inflation) -> np.ndarray:
    """The holdout rows per class a bootstrap draw takes when class y's noise is inflated by kappa_y >= 1
    (``inflation``: one number for every class, or one per class): ceil(n_y / kappa_y), at least 2 (and at most
    n_y); n_y itself where kappa_y = 1. A class's mean over that many rows has about kappa_y times the variance of
    its mean over n_y rows."""
    n_y = np.asarray(n_y, dtype=np.int64)
    kappa = np.broadcast_to(np.asarray(inflation, dtype=np.float64), n_y.shape)
    rows = np.minimum(n_y, np.maximum(np.ceil(n_y / kappa).astype(np.int64), 2))
    return np.where(kappa == 1.0, n_y, rows)


def holdout_share(n_y: np.ndarray, m: int, q: np.ndarray) -> np.ndarray:
    """(k,) r_y = (1 / n_y) / (1 / n_y + 1 / m_y), m_y = m q_y the target's expected rows of class y: class y's
    holdout error's share of the variance of the statistic's class-y part (its regions' counts weigh the holdout's
    histogram by q_y^2 / n_y, the target's by q_y / m). 0 where q_y = 0, 1 where n_y = 0 < q_y."""
    n_y = np.asarray(n_y, dtype=np.float64)
    m_y = float(m) * np.maximum(np.asarray(q, dtype=np.float64), 0.0)
    total = m_y + n_y
    return np.where(total > 0, m_y / np.where(total > 0, total, 1.0), 0.0)


def inflation_for_share(share, k: int, level: float = DESIGN_LEVEL, tail: float = HOLDOUT_TAIL) -> np.ndarray:
    """kappa(r) >= 1 for a holdout share r in [0, 1] (array or number; ``k`` classes): the smallest kappa with which
    the holdout whose largest class error is at its (1 - ``tail``) quantile -- per class the two-sided normal
    quantile u of 1 - tail_k, tail_k = 1 - (1 - tail)^(1 / k) -- keeps the expected squared statistic given that
    holdout, (1 - r) + r u^2, at or under the level-``level`` critical value of the inflated law,
    (1 - r + kappa r) c^2, c = z_(level / 2):

        kappa(r) = max(1, u^2 / c^2 - (1 - r) (c^2 - 1) / (r c^2)).

    Nondecreasing in r; 1 for r at or under (c^2 - 1) / (u^2 - 1); u^2 / c^2 at r = 1 (2.04 at k = 10, level and
    tail 0.05). Derivation: ``docs/label_shift_test.md``, "Given one holdout"."""
    r = np.clip(np.asarray(share, dtype=np.float64), 0.0, 1.0)
    c2 = float(norm.isf(level / 2.0)) ** 2
    u2 = float(norm.isf(-np.expm1(np.log1p(-tail) / max(int(k), 1)) / 2.0)) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = u2 / c2 - (1.0 - r) * (c2 - 1.0) / (r * c2)
    return np.where(r > 0, np.maximum(kappa, 1.0), 1.0)


def class_inflation(inflation: float | None, n_y: np.ndarray, m: int, q: np.ndarray) -> np.ndarray:
    """(k,) kappa_y of a test against m target rows whose null fit gives class proportions ``q``: ``inflation``
    for every class when it is a number (checked >= 1 by the caller), else :func:`inflation_for_share` of
    :func:`holdout_share` (n_y, m, q)."""
    n_y = np.asarray(n_y)
    if inflation is not None:
        return np.full(n_y.shape, float(inflation))
    return inflation_for_share(holdout_share(n_y, m, q), n_y.size)
