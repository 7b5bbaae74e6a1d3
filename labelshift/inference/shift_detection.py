"""Is it label shift at all? A goodness-of-fit test of the label-shift assumption on the calibrated outputs.

Under label shift (Garg, Wu, Balakrishnan & Lipton, "A Unified View of Label Shift Estimation", NeurIPS 2020,
Section 2: p_t(x | y) = p_s(x | y)) every function g of the input has

    E_t[g(x)] = sum_y p_t(y) E_s[g(x) | y] = E_s[w(y) g(x)],        w(y) = p_t(y) / p_s(y),

in particular every function of the classifier's calibrated output f(x). A new class, covariate shift or a broken
input pipeline changes p(x | y), and with it the distribution of f(x) in ways that no reweighting of the holdout's
classes reproduces. :func:`label_shift_test` checks this identity on regions of the output simplex (predicted
class x confidence bin, set on the labelled holdout) by a likelihood ratio whose null fit estimates w and the
holdout's class-conditional histograms jointly (p-value from a parametric bootstrap of that fit by default), and,
up to 20 classes, on the log-odds profiles inside each predicted class (:mod:`labelshift.inference._log_odds`);
the reported p-value splits the level 30/70 between the two parts (:func:`combine_p_values`). A Wald form with the
MLLS weights is kept for comparison (``method="wald"``). Derivation, measured size and power, and what to do when
it fires: ``docs/label_shift_test.md``.

    from labelshift.inference.shift_detection import label_shift_test
    res = label_shift_test(holdout_probs, holdout_labels, target_probs)   # calibrated outputs, holdout labels
    if res.rejects(0.05):
        print(res.summary())          # "Not label shift: p = ... (regions chi2 = ..., p = ...; log-odds ...); ..."
    prepared = prepare_holdout(holdout_probs, holdout_labels)           # many targets against one holdout
    res = label_shift_test(holdout_probs, holdout_labels, target_probs, prepared=prepared)     # the same result
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from scipy.linalg import null_space
from scipy.stats import chi2, norm

from .. import rows as _rows
from ._log_odds import BLOCK_MAX_CLASSES, HoldoutSide, holdout_side, log_odds_test
from ._sequential import DRAW_BATCH, STOP_EXCEEDANCES, sequential_p_value
from ._sparse_null import CLASS_Z_BLOCK_CLASSES, class_block_z, own_regions, sparse_bootstrap_null, sparse_null_fit
from ._squarem import squarem_batch
from .._validation import check_given_weights, check_labels, check_prior, check_probabilities
from ..errors import InputError
from ..estimation.solvers import PIN_TOL, mlls_gradient, mlls_newton
from .._numbers import finite_or_none

__all__ = ["LabelShiftTest", "Region", "label_shift_test", "PreparedHoldout", "prepare_holdout", "MIN_HOLDOUT",
           "MIN_CLASS_ROWS", "MIN_TARGET", "MIN_REGION_ROWS", "MAX_CONFIDENCE_BINS", "BOOTSTRAP_DRAWS", "CALIBRATIONS",
           "STOP_EXCEEDANCES", "sequential_p_value"]

#: the test refuses holdouts smaller than this (its size is measured from n = 500 up; see docs/label_shift_test.md)
MIN_HOLDOUT = 200
#: ... and holdouts with fewer than this many examples of some class (its class-conditional region frequencies
#: would rest on a handful of rows)
MIN_CLASS_ROWS = 5
#: ... and target sets smaller than this
MIN_TARGET = 50
#: default: a confidence bin must hold at least this many holdout rows (the degenerate-bin rule)
MIN_REGION_ROWS = 25
#: default: at most this many confidence bins per predicted class
MAX_CONFIDENCE_BINS = 4

# |p_s^T w - 1| above this: the weights are not in W
_SUM_TOL = 1e-6
# eigenvalues of the (sum-zero) covariance below this fraction of the largest are treated as zero
_EIG_REL = 1e-10
# q_y at or below this counts as pinned at 0 in the null fit (one more degree of freedom)
_Q_TOL = 1e-6
#: the two forms of the test
METHODS = ("likelihood-ratio", "wald")
#: the reference distributions of the likelihood ratio: a parametric bootstrap from the fitted null, or chi^2
CALIBRATIONS = ("bootstrap", "chi2")
#: default number of bootstrap draws
BOOTSTRAP_DRAWS = 200
#: up to this many classes the regions' null fit and its bootstrap run on the dense (classes, regions) table (where
#: the measured size and power tables were made); above, on a support fixed by the holdout (_sparse_null) -- the
#: same limit as the log-odds part's block statistic, so that one number says where the many-class forms begin
DENSE_MAX_CLASSES = BLOCK_MAX_CLASSES
# what the log-odds part adds to the result (extra and to_dict), and which of those are numbers read back as floats
_LOG_ODDS_FLOATS = ("p_value_regions", "p_value_log_odds", "log_odds_statistic", "log_odds_class_share",
                    "p_value_log_odds_diagonal", "p_value_log_odds_block", "p_value_log_odds_sum",
                    "log_odds_block_statistic", "log_odds_sum_statistic")
_LOG_ODDS_KEYS = _LOG_ODDS_FLOATS + ("log_odds_moments", "log_odds_class", "log_odds_where", "log_odds_draws_used")
# pseudo-count (spread over the regions by their pooled holdout frequency) in the holdout variance of each class
_SMOOTH = 1.0
# the share of the level given to the regions part when both parts are combined (combine_p_values): 0.3, as the
# log-odds part was the more powerful one against every alternative measured (docs/label_shift_test.md, "Reading it")
REGIONS_SHARE = 0.3


@dataclass(frozen=True)
class Region:
    """One region of the output simplex and how the target disagrees with the reweighted holdout there.

    Attributes:
        name: e.g. ``"predicted class 3, confidence 0.52-0.81"`` (class names when given).
        predicted_classes: the argmax classes of the region (one, or several for the pooled rarely-predicted ones).
        confidence_low, confidence_high: the bin of max_y f_y(x): low <= confidence < high (the last bin of a class
            includes 1).
        observed: fraction of target rows in the region.
        expected: fraction expected under label shift, sum_y p_t_hat(y) * (fraction of holdout class y in it).
        z: standardised residual (observed - expected) / its standard error under the null.
        holdout_rows: holdout rows in the region.
    """

    name: str
    predicted_classes: tuple
    confidence_low: float
    confidence_high: float
    observed: float
    expected: float
    z: float
    holdout_rows: int

    def to_dict(self) -> dict:
        return {"name": self.name, "predicted_classes": [int(c) for c in self.predicted_classes],
                "confidence_low": float(self.confidence_low), "confidence_high": float(self.confidence_high),
                "observed": float(self.observed), "expected": float(self.expected), "z": finite_or_none(self.z),
                "holdout_rows": int(self.holdout_rows)}


@dataclass(frozen=True)
class LabelShiftTest:
    """Result of :func:`label_shift_test`: a test of H0 "target = source under label shift" (p_t(x|y) = p_s(x|y)).

    Attributes:
        statistic: likelihood ratio 2 (l_1 - l_0) of the region counts (default), or the Wald statistic
            D^T Sigma^+ D (``method="wald"``); >= 0.
        dof: likelihood ratio: regions - classes with a positive weight under the null fit; Wald: rank of Sigma.
        p_value: with the log-odds part (default): min(1, p_regions / 0.3, p_log_odds / 0.7) (``combine_p_values``,
            ``REGIONS_SHARE`` = 0.3), the parts in ``extra``
            (``p_value_regions``, ``p_value_log_odds``, ``log_odds_statistic``, ``log_odds_where`` the predicted
            class whose profile differs most, ``log_odds_class_share`` its part of the statistic; the log-odds
            part's three statistics' own p-values ``p_value_log_odds_diagonal``, ``p_value_log_odds_block`` and
            ``p_value_log_odds_sum``, ``log_odds_sum_statistic`` and ``log_odds_block_statistic``: the block ones
            nan above BLOCK_MAX_CLASSES classes). p_regions, and
            p_value without the log-odds part: (``calibration="bootstrap"``): (1 + #{draws with statistic* >=
            statistic}) / (B + 1), B
            draws of the parametric bootstrap from the null fit (beyond every draw: the smaller of 1/(B+1) and the
            chi^2 tail, so that levels below 1/(B+1) can still reject), or 10 / L once the 10th draw reaching the
            statistic is draw L (the bootstrap then stops: ``extra["bootstrap_draws_used"]`` = L; the log-odds part
            stops when each of its statistics has 10 draws reaching it and then reports their weighted Bonferroni,
            ``extra["log_odds_draws_used"]`` the draws computed; every decision at levels up to 0.05 -- 0.078 with
            the log-odds part -- is that of all B draws, ``docs/label_shift_test.md``); ``calibration="chi2"``
            (and the Wald form): P(chi^2_dof >= statistic), asymptotic. ``extra["p_value_chi2"]`` holds the chi^2
            p-value in both cases.
        weights: the weights w the expected fractions use (k,): the null fit's (a binned MLLS that also uses the
            target to refine the class-conditional histograms) for the likelihood ratio, the MLLS weights for Wald.
        source_prior: p_s the weights are relative to (k,).
        regions: every region, sorted by |z|, largest first (the evidence).
        class_z: per predicted class c, the standardised residual of the fraction of target rows predicted c
            (all its confidence bins together); nan for classes pooled with others.
        n_target, n_holdout: m and n.
        bonferroni_z: |z| above which a region counts as disagreeing: Phi^{-1}(1 - alpha / (2 * number of regions))
            at alpha = 0.05.
        method: ``"likelihood-ratio"`` or ``"wald"``.
    """

    statistic: float
    dof: int
    p_value: float
    weights: np.ndarray
    source_prior: np.ndarray
    regions: tuple
    class_z: np.ndarray
    n_target: int
    n_holdout: int
    bonferroni_z: float
    method: str = "likelihood-ratio"
    extra: dict = field(default_factory=dict)

    def rejects(self, significance: float = 0.05) -> bool:
        """True when label shift is rejected at this significance level (p_value < significance)."""
        if isinstance(significance, bool) or not isinstance(significance, (int, float, np.floating)) \
                or not 0.0 < significance < 1.0:
            raise InputError(f"significance must be a probability strictly between 0 and 1 (e.g. 0.05), got "
                             f"{significance!r}.")
        return bool(self.p_value < significance)

    def disagreeing(self, limit: int = 5) -> list:
        """The regions whose |z| exceeds the Bonferroni threshold, largest first, at most ``limit`` of them; when
        none does, the single largest one (so that a rejection always names where to look)."""
        out = [r for r in self.regions if abs(r.z) > self.bonferroni_z][:limit]
        return out if out else list(self.regions[:1])

    def summary(self, significance: float = 0.05, limit: int = 3, show_level: bool = False) -> str:
        """One line for a report: the verdict, the statistic, the p-value and where the target disagrees; with
        ``show_level``, also the level the verdict was reached at (for a level other than the report's usual one)."""
        head = ("Not label shift" if self.rejects(significance) else "Consistent with label shift")
        level = f" (test level {significance:g})" if show_level else ""
        if "p_value_log_odds" in self.extra:
            x = self.extra
            parts = [f"{head}: p = {self.p_value:.3g}{level} (regions chi2 = {self.statistic:.1f} on {self.dof} dof, "
                     f"p = {x['p_value_regions']:.3g}; log-odds profiles p = {x['p_value_log_odds']:.3g})"]
        else:
            parts = [f"{head}: chi2 = {self.statistic:.1f} on {self.dof} dof, p = {self.p_value:.3g}{level}"]
        if self.rejects(significance):
            x = self.extra
            # each part's evidence when that part alone rejects at its share of the level (combine_p_values); a
            # result stored under another split may reject with neither part below its share: then the part
            # nearer to its share speaks
            speaks = {"regions"}
            if "p_value_log_odds" in x:
                ratios = {"regions": x["p_value_regions"] / REGIONS_SHARE,
                          "log_odds": x["p_value_log_odds"] / (1.0 - REGIONS_SHARE)}
                speaks = {part for part, r in ratios.items() if r < significance} or {min(ratios, key=ratios.get)}
            if "log_odds" in speaks:
                parts.append(f"rows {x['log_odds_where']} lean towards other classes unlike the holdout's "
                             f"({100 * x['log_odds_class_share']:.0f}% of the log-odds statistic)")
            if "regions" in speaks:
                parts.append("; ".join(f"{r.name}: {100 * r.observed:.1f}% of target vs {100 * r.expected:.1f}% "
                                       f"expected (z = {r.z:+.1f})" for r in self.disagreeing(limit)))
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {"statistic": finite_or_none(self.statistic), "dof": int(self.dof), "p_value": finite_or_none(self.p_value),
                "method": self.method, "n_target": int(self.n_target), "n_holdout": int(self.n_holdout),
                "weights": [finite_or_none(v) for v in self.weights], "source_prior": [finite_or_none(v) for v in self.source_prior],
                "bonferroni_z": finite_or_none(self.bonferroni_z), "class_z": [finite_or_none(v) for v in self.class_z],
                "calibration": self.extra.get("calibration", "chi2"),
                "p_value_chi2": finite_or_none(self.extra.get("p_value_chi2", self.p_value)),
                "bootstrap_draws": self.extra.get("bootstrap_draws"),
                "bootstrap_draws_used": self.extra.get("bootstrap_draws_used"),
                **{key: (finite_or_none(self.extra[key]) if isinstance(self.extra[key], float) else self.extra[key])
                   for key in _LOG_ODDS_KEYS if key in self.extra},
                "disagreeing": [r.to_dict() for r in self.disagreeing()],
                "regions": [r.to_dict() for r in self.regions]}

    @classmethod
    def from_dict(cls, d: dict) -> "LabelShiftTest":
        """The result that :meth:`to_dict` wrote (None read back as nan; ``disagreeing`` is recomputed from the
        regions); ``from_dict(d).to_dict() == d``."""
        missing = [key for key in ("statistic", "dof", "p_value", "n_target", "n_holdout", "weights", "source_prior",
                                   "bonferroni_z", "class_z", "regions") if key not in (d if isinstance(d, dict) else {})]
        if missing:
            raise InputError(f"a label-shift test dict lacks {', '.join(missing)}; pass what LabelShiftTest.to_dict() "
                             "wrote.")

        def num(v) -> float:
            return math.nan if v is None else float(v)

        regions = tuple(Region(name=str(r["name"]), predicted_classes=tuple(int(c) for c in r["predicted_classes"]),
                               confidence_low=float(r["confidence_low"]), confidence_high=float(r["confidence_high"]),
                               observed=float(r["observed"]), expected=float(r["expected"]), z=num(r["z"]),
                               holdout_rows=int(r["holdout_rows"])) for r in d["regions"])
        return cls(statistic=num(d["statistic"]), dof=int(d["dof"]), p_value=num(d["p_value"]),
                   weights=np.asarray([num(v) for v in d["weights"]]),
                   source_prior=np.asarray([num(v) for v in d["source_prior"]]), regions=regions,
                   class_z=np.asarray([num(v) for v in d["class_z"]]), n_target=int(d["n_target"]),
                   n_holdout=int(d["n_holdout"]), bonferroni_z=num(d["bonferroni_z"]),
                   method=str(d.get("method", "likelihood-ratio")),
                   extra={"calibration": d.get("calibration", "chi2"),
                          "p_value_chi2": num(d.get("p_value_chi2", d["p_value"])),
                          "bootstrap_draws": d.get("bootstrap_draws"),
                          "bootstrap_draws_used": d.get("bootstrap_draws_used"),
                          **{key: (num(d[key]) if key in _LOG_ODDS_FLOATS else d[key])
                             for key in _LOG_ODDS_KEYS if key in d}})


# ---------------------------------------------------------------------------------------------------------------
# regions of the output simplex
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Regions:
    group: np.ndarray          # (k,) group index of each predicted class (classes pooled share one)
    group_offset: np.ndarray   # (G,) first region index of each group
    inner_edges: np.ndarray    # (G, B-1) inner confidence edges per group, padded with +inf
    n_regions: int
    members: list              # per group: tuple of predicted classes
    bounds: list               # per region: (group, low, high)

    def assign(self, probs: np.ndarray) -> np.ndarray:
        pred = probs.argmax(axis=1)
        conf = probs[np.arange(probs.shape[0]), pred]
        g = self.group[pred]
        if self.inner_edges.shape[1] == 0:
            return self.group_offset[g]
        return self.group_offset[g] + (conf[:, None] >= self.inner_edges[g]).sum(axis=1)


def _make_regions(probs: np.ndarray, min_rows: int, max_bins: int) -> _Regions:
    """Regions from the holdout outputs: per predicted class c with n_c holdout rows, B_c = min(max_bins,
    n_c // min_rows) confidence bins at the holdout's quantiles of max_y f_y (duplicate edges merged), so every
    bin holds at least ``min_rows`` holdout rows up to ties. Classes predicted fewer than ``min_rows`` times are
    pooled into one region (with one bin)."""
    k = probs.shape[1]
    pred = probs.argmax(axis=1)
    conf = probs[np.arange(probs.shape[0]), pred]
    counts = np.bincount(pred, minlength=k)
    rare = tuple(int(c) for c in np.flatnonzero(counts < min_rows))
    members = [(int(c),) for c in range(k) if counts[c] >= min_rows]
    if rare:
        members.append(rare)
    group = np.empty(k, dtype=np.int64)
    edges_per_group = []
    for gi, mem in enumerate(members):
        group[list(mem)] = gi
        sel = np.isin(pred, mem)
        nb = max(1, min(max_bins, int(sel.sum()) // min_rows)) if len(mem) == 1 else 1
        if nb > 1:
            e = np.quantile(conf[sel], np.arange(1, nb) / nb)
            e = np.unique(e[(e > conf[sel].min()) & (e <= conf[sel].max())])
        else:
            e = np.empty(0)
        edges_per_group.append(e)
    width = max((len(e) for e in edges_per_group), default=0)
    inner = np.full((len(members), width), np.inf)
    offsets = np.zeros(len(members), dtype=np.int64)
    bounds = []
    r = 0
    for gi, e in enumerate(edges_per_group):
        inner[gi, :len(e)] = e
        offsets[gi] = r
        full = np.concatenate([[0.0], e, [1.0]])
        for b in range(len(e) + 1):
            bounds.append((gi, float(full[b]), float(full[b + 1])))
        r += len(e) + 1
    return _Regions(group=group, group_offset=offsets, inner_edges=inner, n_regions=r, members=members,
                    bounds=bounds)


def _region_name(members: tuple, low: float, high: float, class_names) -> str:
    name = (lambda c: str(class_names[c])) if class_names is not None else str
    if len(members) == 1:
        what = f"predicted class {name(members[0])}"
    else:
        what = "predicted class in {" + ", ".join(name(c) for c in members) + "} (rarely predicted on the holdout)"
    if low <= 0.0 and high >= 1.0:
        return what
    return f"{what}, confidence {low:.2f}-{high:.2f}"


# ---------------------------------------------------------------------------------------------------------------
# input checks and MLLS
# ---------------------------------------------------------------------------------------------------------------
def _check_int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise InputError(f"{name} must be an integer >= {low}, got {value!r}.")
    return int(value)


def _mlls_weights(P: np.ndarray, p: np.ndarray, weights) -> np.ndarray:
    k = P.shape[1]
    if weights is None:
        return np.maximum(mlls_newton(P, p).weights, 0.0)
    w = check_given_weights(
        weights, k, p, sum_tol=_SUM_TOL,
        shape_fix="pass the MLLS weights estimated on these target_probs (or weights=None to solve MLLS here).",
        sign_fix="the test needs the MLLS estimate, which lies in W = {w >= 0, sum_y w_y p_s(y) = 1}. Pass MLLS "
                 "weights or weights=None.",
        sum_fix="Pass the MLLS weights estimated with the holdout's class frequencies as source prior "
                "(MLLS().fit(holdout_probs, holdout_labels)), or weights=None to solve MLLS here.")
    if not _rows_positive(P, w):
        raise InputError("weights give zero likelihood to some target rows (f_i^T w = 0): they are not the MLLS "
                         "estimate for these target_probs. Pass weights=None to solve MLLS here.")
    gap = float(np.max(mlls_gradient(P, w) / p) - 1.0)
    tol = max(1e-3 / P.shape[0], 1e-8)
    if gap > tol:
        raise InputError(f"weights are not the MLLS maximiser for these target_probs (duality gap {gap:.3g} > "
                         f"{tol:.3g}); the null covariance is derived at the maximum. Pass "
                         "MLLS().fit(holdout_probs, holdout_labels).estimate(target_probs).weights, or weights=None.")
    return w


def _rows_positive(P: np.ndarray, w: np.ndarray) -> bool:
    """Whether f_i^T w > 0 on every row (a large set in row blocks, without a float64 copy of it)."""
    if not _rows.is_large(P):
        return not np.any(P @ w <= 0)
    return all(not np.any(P[sl].astype(np.float64) @ w <= 0) for sl in _rows.blocks(P.shape[0], width=P.shape[1]))


def _assign_rows(regions: _Regions, P: np.ndarray) -> np.ndarray:
    """The region of every row: a large set in row blocks (the same assignments, memory of one block)."""
    if not _rows.is_large(P):
        return regions.assign(P)
    out = np.empty(P.shape[0], dtype=np.int64)
    for sl in _rows.blocks(P.shape[0], width=P.shape[1]):
        out[sl] = regions.assign(P[sl])
    return out


def _tangent_inverse(H: np.ndarray, p: np.ndarray, free: np.ndarray) -> np.ndarray:
    """K = Z (Z^T H_FF Z)^{-1} Z^T on the free coordinates F (0 elsewhere), Z an orthonormal basis of
    {d_F : p_F^T d_F = 0}: the linearisation of the MLLS estimating equations (see docs/label_shift_test.md)."""
    k = H.shape[0]
    K = np.zeros((k, k))
    idx = np.flatnonzero(free)
    if idx.size < 2:
        return K
    Z = null_space(p[idx][None, :])
    A = Z.T @ H[np.ix_(idx, idx)] @ Z
    lam, V = np.linalg.eigh(0.5 * (A + A.T))
    lam = np.maximum(lam, max(1e-14 * float(lam.max()), 1e-300))
    B = Z @ V
    K[np.ix_(idx, idx)] = (B / lam) @ B.T
    return K


def _null_fit(N: np.ndarray, T: np.ndarray, q0: np.ndarray, tol: float = 1e-12, max_iter: int = 20_000):
    """Maximum likelihood under H0 of the region counts: holdout N[y, r] ~ Multinomial(n_y, pi_y), target
    T[r] ~ Multinomial(m, sum_y q_y pi_y), jointly over pi (k x J, rows in the simplex) and q (the simplex), by
    EM (the target rows' classes are the missing data). Returns (pi, q, 2 (l_1 - l_0), iterations), l_1 the
    unrestricted maximum (pi_y = N_y / n_y, target frequencies T / m)."""
    k, J = N.shape
    n_y = N.sum(axis=1)
    m = T.sum()
    pooled = (N.sum(axis=0) + T) / (n_y.sum() + m)
    pi = (N + pooled[None, :]) / (n_y[:, None] + 1.0)          # strictly positive start (EM keeps zeros at zero)
    q = np.maximum(np.asarray(q0, dtype=np.float64), 1e-3 / k)
    q /= q.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        l1 = float(np.sum(np.where(N > 0, N * np.log(N / n_y[:, None]), 0.0))
                   + np.sum(np.where(T > 0, T * np.log(T / m), 0.0)))

    def loglik(pi, q):
        mix = q @ pi
        with np.errstate(divide="ignore"):
            a = np.where(N > 0, N * np.log(np.where(N > 0, pi, 1.0)), 0.0).sum()
            b = np.where(T > 0, T * np.log(np.where(T > 0, mix, 1.0)), 0.0).sum()
        return float(a + b)

    def em(pi, q):
        joint = q[:, None] * pi                                 # (k, J)
        mix = joint.sum(axis=0)
        resp = joint * np.where(mix > 0, T / np.where(mix > 0, mix, 1.0), 0.0)[None, :]   # T_r * rho[y, r]
        tq = resp.sum(axis=1)
        return (N + resp) / (n_y + tq)[:, None], tq / m

    # EM accelerated by SQUAREM (Varadhan & Roland 2008, step S3), each extrapolation checked to increase the
    # likelihood (else the plain double EM step is kept)
    prev = loglik(pi, q)
    it = 0
    while it < max_iter:
        pi1, q1 = em(pi, q)
        pi2, q2 = em(pi1, q1)
        it += 2
        r = np.concatenate([(pi1 - pi).ravel(), q1 - q])
        v = np.concatenate([(pi2 - pi1).ravel(), q2 - q1]) - r
        nv = float(np.linalg.norm(v))
        best = (pi2, q2, loglik(pi2, q2))
        if nv > 0:
            alpha = -float(np.linalg.norm(r)) / nv
            if alpha < -1.0:
                th = np.concatenate([pi.ravel(), q]) - 2 * alpha * r + alpha ** 2 * v
                pi3 = np.maximum(th[:k * J].reshape(k, J), 1e-300)
                q3 = np.maximum(th[k * J:], 0.0)
                pi3 /= pi3.sum(axis=1, keepdims=True)
                q3 /= q3.sum()
                pi3, q3 = em(pi3, q3)
                it += 1
                l3 = loglik(pi3, q3)
                if l3 > best[2]:
                    best = (pi3, q3, l3)
        pi, q, cur = best
        if cur - prev <= tol * max(1.0, abs(cur)):
            break
        prev = cur
    stat = max(2.0 * (l1 - loglik(pi, q)), 0.0)
    return pi, q, stat, it


def _null_fit_batch(N: np.ndarray, T: np.ndarray, q0: np.ndarray, pi0: np.ndarray | None = None,
                    tol: float = 1e-9, max_iter: int = 500) -> np.ndarray:
    """:func:`_null_fit` for B data sets at once (N: (B, k, J), T: (B, J), q0: (k,)): the same SQUAREM-accelerated
    EM (extrapolation kept only where it raises the likelihood), vectorised over the batch, each draw stopping on
    its own; started at (pi0, q0) when pi0 (k, J) is given (the bootstrap: the draws lie near the fit they come
    from), else as :func:`_null_fit`. Returns the B statistics 2 (l_1 - l_0)."""
    B, k, J = N.shape
    n_y = N.sum(axis=2)                                          # (B, k)
    m = T.sum(axis=1)                                            # (B,)
    Npos, Tpos = N > 0, T > 0
    l1 = np.where(Npos, N * np.log(np.where(Npos, N, 1.0) / np.maximum(n_y, 1.0)[:, :, None]), 0.0).sum(axis=(1, 2)) \
        + np.where(Tpos, T * np.log(np.where(Tpos, T, 1.0) / m[:, None]), 0.0).sum(axis=1)
    if pi0 is None:
        pooled = (N.sum(axis=1) + T) / (n_y.sum(axis=1) + m)[:, None]
        pi = (N + pooled[:, None, :]) / (n_y[:, :, None] + 1.0)
    else:
        pi = np.maximum(np.asarray(pi0, dtype=np.float64), 1e-8)
        pi = np.broadcast_to(pi / pi.sum(axis=1, keepdims=True), (B, k, J)).copy()
    q = np.maximum(np.asarray(q0, dtype=np.float64), 1e-3 / k)
    q = np.broadcast_to(q / q.sum(), (B, k)).copy()

    def loglik(pi, q, a):
        mix = np.einsum("bk,bkj->bj", q, pi)
        Np, Tp = Npos[a], Tpos[a]
        x = np.where(Np, N[a] * np.log(np.where(Np, pi, 1.0)), 0.0).sum(axis=(1, 2))
        return x + np.where(Tp, T[a] * np.log(np.where(Tp, np.maximum(mix, 1e-300), 1.0)), 0.0).sum(axis=1)

    def em(pi, q, Na, Ta, nya, ma):
        joint = q[:, :, None] * pi
        mix = joint.sum(axis=1)
        resp = joint * np.where(mix > 0, Ta / np.where(mix > 0, mix, 1.0), 0.0)[:, None, :]
        tq = resp.sum(axis=2)
        return (Na + resp) / (nya + tq)[:, :, None], tq / ma[:, None]

    squarem_batch(pi, q, (N, T, n_y, m), em, loglik, lambda p3: p3 / p3.sum(axis=2, keepdims=True), tol,
                  max_iter)
    return np.maximum(2.0 * (l1 - loglik(pi, q, slice(None))), 0.0)


def _bootstrap_null(pi: np.ndarray, q: np.ndarray, n_y: np.ndarray, m: int, draws: int, seed: int,
                    batch: int | None = None):
    """Parametric bootstrap of the likelihood ratio from the fitted null: holdout counts N*_y ~ Multinomial(n_y,
    pi_y) with the holdout's class sizes, target counts T* ~ Multinomial(m, sum_y q_y pi_y), each refitted by the
    batched EM. Yields the statistics of ``batch`` draws at a time (all ``draws`` at once when None), in draw
    order: the draws are made up front, so that each draw's statistic does not depend on the batching and a
    consumer that stops early (:func:`sequential_p_value`) leaves the later draws unfitted."""
    rng = np.random.default_rng([seed, 0x15])
    k, J = pi.shape
    pi = np.maximum(pi, 0.0)
    pi = pi / pi.sum(axis=1, keepdims=True)
    mix = q @ pi
    mix = mix / mix.sum()
    Nb = rng.multinomial(n_y.astype(np.int64), pi, size=(draws, k)).astype(np.float64)
    Tb = rng.multinomial(int(m), mix, size=draws).astype(np.float64)
    for sl in _rows.blocks(draws, batch or draws):
        yield _null_fit_batch(Nb[sl], Tb[sl], q, pi)


def _world_shares(regions: _Regions, pi: np.ndarray, q: np.ndarray, p: np.ndarray, iterations: int = 100):
    """For the log-odds part's bootstrap world: a function of target output rows Z (T, k) giving each class's share
    of every row under the null fit (pi, q). Within a row the shares start from the calibrated posterior under the
    fitted shift, (q_y / p_y) f_y normalised (the E-step of MLLS, eq. mlls-sample); then, by iterative proportional
    fitting, the rows of each region r are rescaled per class until they split among the classes as the regions'
    fit says, q_y pi_y[r] / sum_y' q_y' pi_y'[r]. Calibration thus only orders the rows inside a region; how many
    of a region's rows each class gets comes from the holdout's labels (shares by region alone blur the classes'
    profiles inside a region; why this world: ``docs/label_shift_test.md``). A row of a region the fit gives no
    mass gets share 0 everywhere."""
    joint = q[:, None] * pi
    mix = joint.sum(axis=0)
    rho = np.where(mix > 0, joint / np.where(mix > 0, mix, 1.0), 0.0)          # (k, J): class shares per region
    k, J = rho.shape
    ratio = q / p

    def shares(Z: np.ndarray) -> np.ndarray:
        r = regions.assign(Z)
        want = np.bincount(r, minlength=J)[:, None] * rho.T                    # (J, k): the class totals per region
        R = Z * ratio[None, :]
        cell = (r[:, None] * k + np.arange(k)).ravel()                         # (row, class) -> region r, class
        for _ in range(iterations):
            R /= np.maximum(R.sum(axis=1, keepdims=True), 1e-300)
            # every class's total per region in one pass (the same sums, row after row, as one bincount a class)
            have = np.bincount(cell, weights=R.ravel(), minlength=J * k).reshape(J, k)
            scale = np.where(have > 0, want / np.maximum(have, 1e-300), 0.0)     # at most 1e300 x rows: finite
            if np.all(np.abs(scale[have > 0] - 1.0) < 1e-8):
                break
            R *= scale[r]
        return R / np.maximum(R.sum(axis=1, keepdims=True), 1e-300)
    return shares


def combine_p_values(p_regions: float, p_log_odds: float, regions_share: float = REGIONS_SHARE) -> float:
    """The reported p-value of the two parts: min(1, p_regions / a, p_log_odds / (1 - a)) with a =
    ``regions_share``, a weighted Bonferroni bound -- a level alpha test rejects when the regions part is below
    a alpha or the log-odds part below (1 - a) alpha, so its size is at most alpha whatever the dependence between
    the parts (each exact)."""
    return float(min(1.0, p_regions / regions_share, p_log_odds / (1.0 - regions_share)))


def _holdout_cov(N: np.ndarray, pi, q: np.ndarray) -> np.ndarray:
    """Covariance of sum_y q_y pi_hat_y from the holdout's class-conditional region frequencies: sum_y q_y^2
    (diag(pi_y) - pi_y pi_y^T) / n_y, with pi the given (null-fitted) frequencies, or when None the holdout's own
    with a pseudo-count _SMOOTH spread by the pooled frequencies (a region where class y was never seen still gets
    a variance)."""
    k, J = N.shape
    n_y = N.sum(axis=1)
    if pi is None:
        pooled = N.sum(axis=0) / n_y.sum()
        pi = (N + _SMOOTH * pooled[None, :]) / (n_y[:, None] + _SMOOTH)
    if k > DENSE_MAX_CLASSES:            # the same sum as one product: k J^2 work instead of k passes over J x J
        a = q ** 2 / n_y
        return np.diag(a @ pi) - (pi.T * a) @ pi
    out = np.zeros((J, J))
    for c in range(k):
        out += (q[c] ** 2 / n_y[c]) * (np.diag(pi[c]) - np.outer(pi[c], pi[c]))
    return out


def _wald_target_cov(P, w, p, bt, pi, observed, J) -> np.ndarray:
    """Per-row covariance of the target part of D for the Wald form: IF_i = e_{r_i} - A K psi_i, A = G diag(p_s),
    psi_i = f_i / f_i^T w, K the tangent inverse of the MLLS information (docs/label_shift_test.md)."""
    m, k = P.shape
    if _rows.is_large(P):                    # in row blocks, float64 sums
        H, psi_bar, R = np.zeros((k, k)), np.zeros(k), np.zeros((J, k))
        with _rows.pass_threads(k):
            for sl in _rows.blocks(m, width=k):
                B = P[sl].astype(np.float64)
                psi = B / (B @ w)[:, None]
                H += psi.T @ psi
                psi_bar += psi.sum(axis=0)
                for c in range(k):
                    R[:, c] += np.bincount(bt[sl], weights=psi[:, c], minlength=J)
        H, psi_bar = H / m, psi_bar / m
    else:
        psi = P / (P @ w)[:, None]
        H = psi.T @ psi / m
        psi_bar = psi.mean(axis=0)
        R = np.zeros((J, k))
        for c in range(k):
            R[:, c] = np.bincount(bt, weights=psi[:, c], minlength=J)
    K = _tangent_inverse(H, p, w > PIN_TOL)
    R /= m
    cov_e = np.diag(observed) - np.outer(observed, observed)
    cross = (R - np.outer(observed, psi_bar)) @ ((pi.T * p[None, :]) @ K).T
    AK = (pi.T * p[None, :]) @ K
    return cov_e - cross - cross.T + AK @ (H - np.outer(psi_bar, psi_bar)) @ AK.T


def _wald(D: np.ndarray, sigma: np.ndarray) -> tuple[float, int]:
    """D^T Sigma^+ D in the sum-zero subspace (the regions partition the simplex) and the rank."""
    J = D.shape[0]
    U = null_space(np.ones((1, J)))
    C = U.T @ sigma @ U
    lam, V = np.linalg.eigh(0.5 * (C + C.T))
    keep = lam > max(float(lam.max()), 0.0) * _EIG_REL
    proj = V[:, keep].T @ (U.T @ D)
    return float(np.sum(proj ** 2 / lam[keep])), int(keep.sum())


# ---------------------------------------------------------------------------------------------------------------
# the holdout's part, computed once for many targets
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class PreparedHoldout:
    """What :func:`label_shift_test` computes from the labelled holdout alone -- its regions and their class
    counts, and the log-odds part's holdout moments -- made once by :func:`prepare_holdout` and passed to every
    test against that holdout (``label_shift_test(..., prepared=...)``, e.g. each segment of a target), which
    then gives exactly the result it gives without it.

    Attributes:
        holdout_probs, holdout_labels: the holdout it was made from (float64 (n, k), int (n,)).
        min_region_rows, max_confidence_bins: the region rule it was made with.
        regions: the regions of the output simplex; N (k, J): the holdout rows of each class in each.
        log_odds: the log-odds part's holdout side, or None (not prepared: computed by each test that runs it).
    """

    holdout_probs: np.ndarray
    holdout_labels: np.ndarray
    min_region_rows: int
    max_confidence_bins: int
    regions: _Regions
    N: np.ndarray
    log_odds: HoldoutSide | None

    def matches(self, holdout_probs: np.ndarray, holdout_labels: np.ndarray, min_region_rows: int,
                max_confidence_bins: int) -> bool:
        """Whether it was made from this holdout (the same values) with this region rule."""
        return (self.min_region_rows == min_region_rows and self.max_confidence_bins == max_confidence_bins
                and self.holdout_probs.shape == np.shape(holdout_probs)
                and np.array_equal(self.holdout_labels, holdout_labels)
                and np.array_equal(self.holdout_probs, holdout_probs))


def prepare_holdout(holdout_probs, holdout_labels, *, min_region_rows: int = MIN_REGION_ROWS,
                    max_confidence_bins: int = MAX_CONFIDENCE_BINS, log_odds: bool | None = None) -> PreparedHoldout:
    """The holdout's part of :func:`label_shift_test` (same arguments, same defaults), for many tests against one
    holdout: the regions and the holdout's counts in them, and -- when ``log_odds`` (None: up to
    BLOCK_MAX_CLASSES classes) -- the log-odds part's holdout moments.

    Raises:
        InputError: as :func:`label_shift_test` for the holdout (too small, a class with too few rows).
    """
    Ph, y, n_y = _holdout_inputs(holdout_probs, holdout_labels)
    min_region_rows = _check_int(min_region_rows, "min_region_rows", 1)
    max_confidence_bins = _check_int(max_confidence_bins, "max_confidence_bins", 1)
    k = Ph.shape[1]
    regions = _make_regions(Ph, min_region_rows, max_confidence_bins)
    N = np.zeros((k, regions.n_regions))
    np.add.at(N, (y, regions.assign(Ph)), 1.0)
    side = holdout_side(Ph, y, k) if _check_log_odds(log_odds, k) else None
    return PreparedHoldout(holdout_probs=Ph, holdout_labels=y, min_region_rows=min_region_rows,
                           max_confidence_bins=max_confidence_bins, regions=regions, N=N, log_odds=side)


# ---------------------------------------------------------------------------------------------------------------
# the test
# ---------------------------------------------------------------------------------------------------------------
class _TestInputs(NamedTuple):
    """The checked inputs of :func:`label_shift_test`."""
    Ph: np.ndarray              # (n, k) calibrated holdout outputs
    y: np.ndarray               # (n,) holdout labels
    Pt: np.ndarray              # (m, k) calibrated target outputs
    n_y: np.ndarray             # (k,) holdout rows per class
    p: np.ndarray               # (k,) the source prior
    w_given: np.ndarray | None  # the given MLLS weights (checked), or None
    min_region_rows: int
    max_confidence_bins: int
    bootstrap_draws: int
    seed: int
    log_odds: bool


class _RegionCounts(NamedTuple):
    """The regions of the output simplex and the rows in each: holdout N (k, J) by class, target T (J,)."""
    regions: _Regions
    N: np.ndarray
    T: np.ndarray
    observed: np.ndarray        # (J,) target fraction per region
    target_regions: np.ndarray  # (m,) each target row's region


class _RegionsFit(NamedTuple):
    """The regions part of the test: statistic, dof, p-value, the weights and prior q under H0, the histograms pi,
    the expected fractions, observed - expected (D) and its covariance."""
    stat: float
    dof: int
    p_value: float
    w: np.ndarray
    q: np.ndarray
    pi: np.ndarray
    expected: np.ndarray
    D: np.ndarray
    sigma: np.ndarray
    extra: dict


def _check_holdout_size(n: int) -> None:
    if n < MIN_HOLDOUT:
        raise InputError(f"the holdout has n = {n} rows, fewer than MIN_HOLDOUT = {MIN_HOLDOUT}: the null "
                         "distribution of the test rests on the holdout's class-conditional output frequencies and "
                         "is not reliable with so few rows (its size is measured for n >= 500). Collect a larger "
                         "labelled holdout.")


def _class_rows(y: np.ndarray, k: int) -> np.ndarray:
    """The holdout's rows per class (k,); InputError when a class has fewer than MIN_CLASS_ROWS."""
    n_y = np.bincount(y, minlength=k)
    few = np.flatnonzero(n_y < MIN_CLASS_ROWS)
    if few.size:
        raise InputError(f"holdout_labels has fewer than MIN_CLASS_ROWS = {MIN_CLASS_ROWS} examples of class(es) "
                         f"{few.tolist()} (counts {n_y[few].tolist()}); the test needs each class's outputs on the "
                         "holdout to know what that class looks like. Add labelled holdout examples of those "
                         "classes.")
    return n_y


def _holdout_inputs(holdout_probs, holdout_labels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The holdout checked as :func:`label_shift_test` checks it: (probabilities (n, k), labels, rows per class)."""
    Ph = check_probabilities(holdout_probs, "holdout_probs", 2)
    n, k = Ph.shape
    y = check_labels(holdout_labels, "holdout_labels", k, n_rows=n)
    _check_holdout_size(n)
    return Ph, y, _class_rows(y, k)


def _test_inputs(holdout_probs, holdout_labels, target_probs, weights, source_prior, min_region_rows,
                 max_confidence_bins, class_names, method, calibration, bootstrap_draws, seed,
                 log_odds) -> _TestInputs:
    """The arguments of :func:`label_shift_test` checked (InputError as documented there)."""
    Ph = check_probabilities(holdout_probs, "holdout_probs", 2)
    n, k = Ph.shape
    Pt = check_probabilities(target_probs, "target_probs", 2)
    m = Pt.shape[0]
    if Pt.shape[1] != k:
        raise InputError(f"target_probs has {Pt.shape[1]} class columns but holdout_probs has {k}; both must be the "
                         "calibrated outputs of the same classifier (same classes, same order).")
    y = check_labels(holdout_labels, "holdout_labels", k, n_rows=n)
    min_region_rows = _check_int(min_region_rows, "min_region_rows", 1)
    max_confidence_bins = _check_int(max_confidence_bins, "max_confidence_bins", 1)
    if class_names is not None and len(class_names) != k:
        raise InputError(f"class_names has {len(class_names)} entries but there are {k} classes.")
    _check_holdout_size(n)
    if m < MIN_TARGET:
        raise InputError(f"target_probs has m = {m} rows, fewer than MIN_TARGET = {MIN_TARGET}; test a larger "
                         "target batch (or several batches together).")
    n_y = _class_rows(y, k)
    if method not in METHODS:
        raise InputError(f"method must be one of {METHODS}, got {method!r}.")
    if calibration not in CALIBRATIONS:
        raise InputError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}.")
    bootstrap_draws = _check_int(bootstrap_draws, "bootstrap_draws", 19)
    log_odds = _check_log_odds(log_odds, k)
    seed = _check_int(seed, "seed", 0)
    p = n_y / n if source_prior is None else check_prior(source_prior, "source_prior", k)
    w_given = None if weights is None else _mlls_weights(Pt, p, weights)
    return _TestInputs(Ph=Ph, y=y, Pt=Pt, n_y=n_y, p=p, w_given=w_given, min_region_rows=min_region_rows,
                       max_confidence_bins=max_confidence_bins, bootstrap_draws=bootstrap_draws, seed=seed,
                       log_odds=log_odds)


def _check_log_odds(log_odds, k: int) -> bool:
    """``log_odds`` as a bool, None meaning the default for k classes; InputError for anything else."""
    if log_odds is None:
        # the default: the log-odds part up to BLOCK_MAX_CLASSES classes; above, its measured size at k = 100 was
        # far above the level (docs/label_shift_test.md, "Many classes"), the regions part's was not
        log_odds = k <= BLOCK_MAX_CLASSES
    if not isinstance(log_odds, (bool, np.bool_)):
        raise InputError(f"log_odds must be True or False (or None, the default for the number of classes), got "
                         f"{log_odds!r}.")
    return log_odds


def _region_counts(inp: _TestInputs, prepared: PreparedHoldout | None = None) -> _RegionCounts:
    """The regions made from the holdout (or ``prepared``'s) and the holdout (by class) and target rows in each;
    InputError when they leave the test no degrees of freedom."""
    n, k = inp.Ph.shape
    regions = (_make_regions(inp.Ph, inp.min_region_rows, inp.max_confidence_bins) if prepared is None
               else prepared.regions)
    J = regions.n_regions
    if J < k + 2:
        raise InputError(f"the holdout gives only {J} regions of the output simplex (at least {inp.min_region_rows} "
                         f"holdout rows per region), fewer than k + 2 = {k + 2}: the test has no degrees of freedom "
                         f"left after estimating the {k} class weights. Collect a larger labelled holdout (n = {n} "
                         "now; the size is measured from n = 500 at k = 10), or lower min_region_rows.")
    target_regions = _assign_rows(regions, inp.Pt)
    if prepared is None:
        N = np.zeros((k, J))
        np.add.at(N, (inp.y, regions.assign(inp.Ph)), 1.0)
    else:
        N = prepared.N.copy()
    T = np.bincount(target_regions, minlength=J).astype(np.float64)
    return _RegionCounts(regions=regions, N=N, T=T, observed=T / inp.Pt.shape[0], target_regions=target_regions)


def _likelihood_ratio_fit(inp: _TestInputs, rc: _RegionCounts, calibration: str) -> _RegionsFit:
    """The likelihood-ratio form: the null fit by EM (dense, or on a restricted support above DENSE_MAX_CLASSES),
    its p-value from the parametric bootstrap or chi^2, and the evidence per region."""
    k, J = rc.N.shape
    m, p, n_y, N = inp.Pt.shape[0], inp.p, inp.n_y, rc.N
    q0 = p if inp.w_given is None else p * inp.w_given
    dense = k <= DENSE_MAX_CLASSES
    region_group = np.array([b[0] for b in rc.regions.bounds])
    own = None if dense else own_regions(rc.regions.group, region_group)
    pi, q, stat, iters = _null_fit(N, rc.T, q0) if dense else sparse_null_fit(N, rc.T, q0, own, region_group)
    free = q > _Q_TOL
    dof = J - int(free.sum())
    # evidence: the holdout's own histograms reweighted by the null fit's q (what "the holdout reweighted by
    # w" predicts), against the target; sd from both samples' multinomial variances
    expected = q @ (N / n_y[:, None])
    sigma = (np.diag(expected) - np.outer(expected, expected)) / m + _holdout_cov(N, None, q)
    p_chi2 = float(chi2.sf(stat, dof))
    extra = {"em_iterations": iters, "calibration": calibration, "p_value_chi2": p_chi2}
    if calibration == "bootstrap":
        draws, seed = inp.bootstrap_draws, inp.seed
        batches = (_bootstrap_null(pi, q, n_y, m, draws, seed, DRAW_BATCH) if dense
                   else sparse_bootstrap_null(pi, q, n_y, m, draws, seed, own, region_group, DRAW_BATCH))
        p_value, exceed, used = sequential_p_value(stat, batches, draws)
        if exceed == 0:
            # beyond every draw: the bootstrap resolves no p-value below 1/(B+1), so a level below that could
            # never reject; there the chi^2 tail (conservative under the null, as measured) says how far out
            p_value = min(p_value, p_chi2)
        extra.update(bootstrap_draws=draws, seed=seed, bootstrap_draws_used=used)
    else:
        p_value = p_chi2
    return _RegionsFit(stat=stat, dof=dof, p_value=p_value, w=q / p, q=q, pi=pi, expected=expected,
                       D=rc.observed - expected, sigma=sigma, extra=extra)


def _wald_fit(inp: _TestInputs, rc: _RegionCounts) -> _RegionsFit:
    """The Wald form: D = observed - expected at the MLLS weights, D^T Sigma^+ D against chi^2."""
    Pt, p, J, m = inp.Pt, inp.p, rc.regions.n_regions, inp.Pt.shape[0]
    w = inp.w_given if inp.w_given is not None else np.maximum(mlls_newton(Pt, p).weights, 0.0)
    q = p * w
    pi = rc.N / inp.n_y[:, None]
    expected = q @ pi
    D = rc.observed - expected
    sigma = _wald_target_cov(Pt, w, p, rc.target_regions, pi, rc.observed, J) / m + _holdout_cov(rc.N, None, q)
    stat, dof = _wald(D, sigma)
    p_value = float(chi2.sf(stat, dof)) if dof > 0 else 1.0
    return _RegionsFit(stat=stat, dof=dof, p_value=p_value, w=w, q=q, pi=pi, expected=expected, D=D, sigma=sigma,
                       extra={})


def _with_log_odds(inp: _TestInputs, rc: _RegionCounts, fit: _RegionsFit, method: str, class_names,
                   side: HoldoutSide | None = None) -> _RegionsFit:
    """The regions fit with the log-odds part added: both p-values in ``extra``, the reported one combined by
    :func:`combine_p_values`."""
    # the second look (labelshift/inference/_log_odds.py); the two p-values are combined by a weighted Bonferroni
    # bound (combine_p_values), so the combined test keeps its level whatever the dependence between them
    # its bootstrap world is the completed data of a null fit (the regions' fit; for the Wald form, one is made)
    if method != "likelihood-ratio":
        pi, q_null = _null_fit(rc.N, rc.T, inp.p)[:2]
    else:
        pi, q_null = fit.pi, fit.q
    part = log_odds_test(inp.Ph, inp.y, inp.Pt, inp.bootstrap_draws, inp.seed,
                         _world_shares(rc.regions, pi, q_null, inp.p), q_null, side)
    extra = dict(fit.extra)
    extra.update(p_value_regions=fit.p_value, p_value_log_odds=part.p_value, log_odds_statistic=part.statistic,
                 p_value_log_odds_diagonal=part.p_value_diagonal, p_value_log_odds_block=part.p_value_block,
                 p_value_log_odds_sum=part.p_value_sum, log_odds_block_statistic=part.block_statistic,
                 log_odds_sum_statistic=part.sum_statistic, log_odds_draws_used=part.draws_used,
                 log_odds_moments=part.moments, log_odds_class=int(np.argmax(part.class_share)),
                 log_odds_class_share=float(np.max(part.class_share)),
                 log_odds_where=_region_name((int(np.argmax(part.class_share)),), 0.0, 1.0, class_names))
    return fit._replace(p_value=combine_p_values(fit.p_value, part.p_value), extra=extra)


def _region_evidence(rc: _RegionCounts, fit: _RegionsFit, class_names) -> tuple:
    """The regions as :class:`Region` items with their z_R = D_R / sd_R, largest |z| first."""
    z = fit.D / np.sqrt(np.maximum(np.diag(fit.sigma), 1e-300))
    holdout_rows = rc.N.sum(axis=0).astype(int)
    items = []
    for r, (g, lo, hi) in enumerate(rc.regions.bounds):
        mem = tuple(rc.regions.members[g])
        items.append(Region(name=_region_name(mem, lo, hi, class_names), predicted_classes=mem,
                            confidence_low=lo, confidence_high=hi, observed=float(rc.observed[r]),
                            expected=float(fit.expected[r]), z=float(z[r]), holdout_rows=int(holdout_rows[r])))
    items.sort(key=lambda it: -abs(it.z))
    return tuple(items)


def _class_z(regions: _Regions, fit: _RegionsFit, k: int) -> np.ndarray:
    """(k,) z of each predicted class's regions together (nan for a pooled class)."""
    if k > CLASS_Z_BLOCK_CLASSES:        # from sigma's diagonal blocks (_sparse_null.class_block_z)
        owner = np.array([b[0] for b in regions.bounds])
        return class_block_z(owner, regions.members, fit.D, fit.sigma, k)
    class_z = np.full(k, np.nan)
    for g, mem in enumerate(regions.members):
        if len(mem) != 1:
            continue
        a = np.zeros(regions.n_regions)
        a[[r for r, b in enumerate(regions.bounds) if b[0] == g]] = 1.0
        v = float(a @ fit.sigma @ a)
        class_z[mem[0]] = float(a @ fit.D) / math.sqrt(v) if v > 0 else np.nan
    return class_z


def _test_result(inp: _TestInputs, rc: _RegionCounts, fit: _RegionsFit, method: str,
                 class_names) -> LabelShiftTest:
    """The :class:`LabelShiftTest` of a fit."""
    (m, k), n, J = inp.Pt.shape, inp.Ph.shape[0], rc.regions.n_regions
    items = _region_evidence(rc, fit, class_names)
    bonf = float(norm.isf(0.05 / (2 * J)))
    return LabelShiftTest(statistic=fit.stat, dof=fit.dof, p_value=fit.p_value, weights=fit.w, source_prior=inp.p,
                          regions=items, class_z=_class_z(rc.regions, fit, k), n_target=m, n_holdout=n,
                          bonferroni_z=bonf, method=method,
                          extra={"n_regions": J, "min_region_rows": inp.min_region_rows,
                                 "max_confidence_bins": inp.max_confidence_bins, **fit.extra})


def label_shift_test(holdout_probs, holdout_labels, target_probs, *, weights=None, source_prior=None,
                     min_region_rows: int = MIN_REGION_ROWS, max_confidence_bins: int = MAX_CONFIDENCE_BINS,
                     class_names=None, method: str = "likelihood-ratio", calibration: str = "bootstrap",
                     bootstrap_draws: int = BOOTSTRAP_DRAWS, seed: int = 0,
                     log_odds: bool | None = None, prepared: PreparedHoldout | None = None) -> LabelShiftTest:
    """Test H0: the target differs from the source by label shift only (p_t(x | y) = p_s(x | y), Garg et al. 2020,
    Section 2), from the calibrated outputs of one classifier on a labelled holdout and on unlabelled target rows.

    Under H0, for each region R of the output simplex, P_t(f(x) in R) = sum_y p_t(y) P_s(f(x) in R | y). Regions:
    predicted class x confidence bin (max_y f_y), bins at holdout quantiles holding at least ``min_region_rows``
    holdout rows each, at most ``max_confidence_bins`` per predicted class; classes predicted fewer than
    ``min_region_rows`` times on the holdout are pooled into one region (the degenerate-bin rule).

    ``method="likelihood-ratio"`` (default): the likelihood ratio of the multinomial model in which the class
    weights (a binned MLLS) and the holdout's class-conditional histograms are fitted jointly under H0 (EM), against
    free target frequencies; its reference law is a parametric bootstrap of the null fit (``calibration=
    "bootstrap"``, ``bootstrap_draws`` draws, p = (1 + #{LR* >= LR}) / (B + 1)) or chi^2 with J - k dof
    (``"chi2"``; conservative under shifted priors). ``method="wald"``: the MLLS weights with a delta-method
    covariance, kept for comparison (liberal under severe shift). ``log_odds=True`` adds the log-odds profiles
    inside each predicted class (:mod:`labelshift.inference._log_odds`); the reported ``p_value`` is then
    ``combine_p_values(p_regions, p_log_odds)`` = min(1, p_regions / 0.3, p_log_odds / 0.7) (weighted Bonferroni,
    :data:`REGIONS_SHARE` = 0.3), both parts in ``extra``. Per-region z-scores rank where the target disagrees
    (they ignore the estimation of w; the p-value does not).

    Assumes independent rows; the regions and the calibrator (both fit on the holdout) are held fixed. Validity
    does not need calibrated outputs (the identity holds for any fixed f), only the regions' meaning does. It
    cannot see a violation that leaves f(x) a mixture of the holdout's class-conditional laws (e.g. drift along
    directions the classifier ignores). Statistic, null fit, bootstrap, evidence and cost:
    ``docs/label_shift_test.md`` ("The statistic and its null distribution"); measured size and power:
    ``benchmarks/README.md`` ("Label-shift test: size and power").

    Args:
        holdout_probs: (n, k) calibrated outputs on the labelled holdout (the rows the calibrator was fit on).
        holdout_labels: (n,) integer labels 0..k-1; every class needs at least :data:`MIN_CLASS_ROWS` rows.
        target_probs: (m, k) calibrated outputs on the target rows.
        weights: the MLLS weights for these target rows relative to ``source_prior`` (checked for optimality): the
            starting point of the null fit (likelihood ratio) or the weights tested (Wald); None (default) starts
            the null fit at w = 1, or solves MLLS here for Wald.
        source_prior: p_s; default the holdout's class frequencies (what ``MLLS().fit`` uses).
        min_region_rows, max_confidence_bins: the region rule above.
        class_names: optional k names used in the region names.
        method: ``"likelihood-ratio"`` (default) or ``"wald"``.
        calibration: reference law of the likelihood ratio: ``"bootstrap"`` (default) or ``"chi2"``; ignored by
            the Wald form (chi^2).
        bootstrap_draws: B, at least 19 (default :data:`BOOTSTRAP_DRAWS` = 200; the smallest p-value is 1/(B+1)).
        seed: seed of the bootstrap draws (default 0: the same inputs give the same p-value).
        log_odds: add the log-odds part; it uses ``bootstrap_draws`` and ``seed`` too. None (default): for
            k <= BLOCK_MAX_CLASSES = 20 classes, not above (its size at k = 100 is not the level, see the docs).
        prepared: optional, :func:`prepare_holdout` of this holdout with this region rule, for many tests against
            one holdout: its work on the holdout is reused (the result is the same).

    Returns:
        :class:`LabelShiftTest`.

    Raises:
        InputError: shapes or classes that do not match, a class with too few holdout rows, a holdout smaller than
            :data:`MIN_HOLDOUT` or a target smaller than :data:`MIN_TARGET`, weights that are not the MLLS optimum,
            ``prepared`` made from another holdout or region rule.
    """
    inp = _test_inputs(holdout_probs, holdout_labels, target_probs, weights, source_prior, min_region_rows,
                       max_confidence_bins, class_names, method, calibration, bootstrap_draws, seed, log_odds)
    if prepared is not None and not prepared.matches(inp.Ph, inp.y, inp.min_region_rows, inp.max_confidence_bins):
        raise InputError("prepared was made from another holdout or region rule than this test's; pass "
                         "prepare_holdout(holdout_probs, holdout_labels) of this holdout with the same "
                         "min_region_rows and max_confidence_bins, or prepared=None.")
    rc = _region_counts(inp, prepared)
    fit = _likelihood_ratio_fit(inp, rc, calibration) if method == "likelihood-ratio" else _wald_fit(inp, rc)
    if inp.log_odds:
        fit = _with_log_odds(inp, rc, fit, method, class_names, None if prepared is None else prepared.log_odds)
    return _test_result(inp, rc, fit, method, class_names)
