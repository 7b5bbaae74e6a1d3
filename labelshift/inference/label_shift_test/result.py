"""The result of the label-shift test: :class:`LabelShiftTest` (the verdict, the statistic, the p-values of its two
parts and the evidence, to and from a dict) and its :class:`Region` items; the two parts' p-values combined by
:func:`combine_p_values` (``docs/label_shift_test.md``, "Reading it")."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..._numbers import finite_or_none, none_as_nan
from ...errors import InputError
# what the log-odds part adds to the result (extra and to_dict), and which of those are numbers read back as floats
_LOG_ODDS_FLOATS = ("p_value_regions", "p_value_log_odds", "log_odds_statistic", "log_odds_class_share",
                    "p_value_log_odds_diagonal", "p_value_log_odds_block", "p_value_log_odds_sum",
                    "log_odds_block_statistic", "log_odds_sum_statistic")
_LOG_ODDS_KEYS = _LOG_ODDS_FLOATS + ("log_odds_moments", "log_odds_class", "log_odds_where", "log_odds_draws_used")

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

        regions = tuple(Region(name=str(r["name"]), predicted_classes=tuple(int(c) for c in r["predicted_classes"]),
                               confidence_low=float(r["confidence_low"]), confidence_high=float(r["confidence_high"]),
                               observed=float(r["observed"]), expected=float(r["expected"]), z=none_as_nan(r["z"]),
                               holdout_rows=int(r["holdout_rows"])) for r in d["regions"])
        return cls(statistic=none_as_nan(d["statistic"]), dof=int(d["dof"]), p_value=none_as_nan(d["p_value"]),
                   weights=np.asarray([none_as_nan(v) for v in d["weights"]]),
                   source_prior=np.asarray([none_as_nan(v) for v in d["source_prior"]]), regions=regions,
                   class_z=np.asarray([none_as_nan(v) for v in d["class_z"]]), n_target=int(d["n_target"]),
                   n_holdout=int(d["n_holdout"]), bonferroni_z=none_as_nan(d["bonferroni_z"]),
                   method=str(d.get("method", "likelihood-ratio")),
                   extra={"calibration": d.get("calibration", "chi2"),
                          "p_value_chi2": none_as_nan(d.get("p_value_chi2", d["p_value"])),
                          "bootstrap_draws": d.get("bootstrap_draws"),
                          "bootstrap_draws_used": d.get("bootstrap_draws_used"),
                          **{key: (none_as_nan(d[key]) if key in _LOG_ODDS_FLOATS else d[key])
                             for key in _LOG_ODDS_KEYS if key in d}})


def combine_p_values(p_regions: float, p_log_odds: float, regions_share: float = REGIONS_SHARE) -> float:
    """The reported p-value of the two parts: min(1, p_regions / a, p_log_odds / (1 - a)) with a =
    ``regions_share``, a weighted Bonferroni bound -- a level alpha test rejects when the regions part is below
    a alpha or the log-odds part below (1 - a) alpha, so its size is at most alpha whatever the dependence between
    the parts (each exact)."""
    return float(min(1.0, p_regions / regions_share, p_log_odds / (1.0 - regions_share)))
