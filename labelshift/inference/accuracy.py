"""What the shift costs: the deployed model's expected accuracy on the target, with an interval.

Under label shift p_t(x | y) = p_s(x | y) (Garg et al., NeurIPS 2020, Section 2), so the recall of any fixed rule,
r_y = P(rule(x) = y | y), is the same on source and target. The accuracy of the rule on the target is therefore

    acc_t = sum_y r_y p_t(y),

with r_y measured on the labelled source holdout and p_t estimated by MLLS (eq. (mlls-sample)). Two rules are
reported: the deployed model (argmax of its raw outputs) and the corrected one (argmax_y w_y f_y(x) with f the
calibrated predictor and w the MLLS weights, :func:`labelshift.estimation.diagnostics.correct_predictions`).

The interval's variance adds the target prior's covariance from :func:`labelshift.inference.source_aware.
source_aware_interval` (target sample, calibrator parameters and p_s) to the recall's sampling error on the holdout,
including the covariance between the two (both are computed from the same holdout rows). The formula and what it
does not cover (calibration bias, shift that is not label shift) are in ``docs/accuracy.md``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np
from scipy.stats import norm

from .. import rows as _rows
from .._numbers import finite_or_none, none_as_nan
from .._validation import as_float_array, as_float_rows, check_labels, check_level
from ..errors import InputError
from ..partitions import Moments, add_in_order, combine_moments, is_partitioned
from .source_aware import SourceAwareInterval, source_aware_interval

__all__ = ["AccuracyEstimate", "expected_accuracy", "METHOD"]

#: the ``method`` of the result: the variance is that of the source-aware interval plus the holdout recall's
METHOD = "source-aware"
#: classes above which the target pass takes both rules' target-row influences in one product (_target_terms_rows)
_ONE_PRODUCT_CLASSES = 100


@dataclass(frozen=True)
class AccuracyEstimate:
    """The deployed model's accuracy on the source holdout and its expected accuracy on the target.

    Two estimands, both under the label-shift assumption and a calibrated f (``docs/accuracy.md``):

    * *expected* accuracy on the target population, acc_t = sum_y r_y p_t(y): ``lower``/``upper`` is a confidence
      interval for it (``std_error`` its standard error);
    * the accuracy on the m target rows that were scored (what their labels would show, if they arrived):
      ``batch_lower``/``batch_upper`` is a prediction interval for it around the same point estimate. It is wider,
      by the Bernoulli spread of m rows' correctness.

    Attributes:
        source: accuracy of the deployed model on the n labelled holdout rows.
        source_std_error: its binomial standard error sqrt(a (1 - a) / n).
        expected: sum_y recall_y * p_t_hat(y), recall from the holdout, p_t_hat from MLLS.
        lower, upper: the interval on ``expected`` at ``level`` (normal, clipped to [0, 1]).
        std_error: standard error of ``expected``.
        batch_lower, batch_upper, batch_std_error: the prediction interval for the accuracy on the target rows.
        corrected: the same for the corrected predictions argmax_y w_y f_y(x): sum_y recall'_y p_t_hat(y).
        corrected_lower, corrected_upper, corrected_std_error: its interval (the rule's w and calibrator held fixed,
            see docs/accuracy.md).
        corrected_batch_lower, corrected_batch_upper, corrected_batch_std_error: its prediction interval on the
            target rows.
        per_class_recall: (k,) recall_y of the deployed model on the holdout.
        corrected_per_class_recall: (k,) recall'_y of the corrected rule on the holdout.
        target_prior: (k,) p_t_hat used as weights.
        weights: (k,) the MLLS weights w of the corrected rule (p_t_hat / p_s).
        variance: the parts of std_error^2: ``prior_target`` (target sample), ``prior_holdout`` (calibrator and
            p_s), ``recall`` (holdout recall, binomial, with the small-count floor), ``cross`` (2 Cov(recall,
            prior) through the shared holdout rows; may be negative).
        level: confidence level.
        method: ``"source-aware"``.
        n_source, n_target: holdout and target rows.
        trustworthy, reasons: those of the target-prior interval (an estimate of p_t that is poorly identified
            makes this one poorly identified too).
    """

    source: float
    source_std_error: float
    expected: float
    lower: float
    upper: float
    std_error: float
    batch_lower: float
    batch_upper: float
    batch_std_error: float
    corrected: float
    corrected_lower: float
    corrected_upper: float
    corrected_std_error: float
    corrected_batch_lower: float
    corrected_batch_upper: float
    corrected_batch_std_error: float
    per_class_recall: np.ndarray
    corrected_per_class_recall: np.ndarray
    target_prior: np.ndarray
    weights: np.ndarray
    variance: dict
    level: float
    method: str = METHOD
    n_source: int = 0
    n_target: int = 0
    trustworthy: bool = True
    reasons: list = field(default_factory=list)

    @property
    def change(self) -> float:
        """expected - source: what the shift costs (negative) or gains (positive), in accuracy."""
        return self.expected - self.source

    def covers(self, accuracy: float) -> bool:
        """Whether ``accuracy`` lies in [lower, upper]."""
        return bool(self.lower <= accuracy <= self.upper)

    def summary(self, digits: int = 2) -> str:
        """One line for a verdict, e.g. ``accuracy estimated 0.91 [0.89, 0.93], 0.95 on the source; corrected
        predictions 0.93 [0.91, 0.95]``."""
        f = f"{{:.{digits}f}}"
        s = (f"accuracy estimated {f.format(self.expected)} [{f.format(self.lower)}, {f.format(self.upper)}], "
             f"{f.format(self.source)} on the source; corrected predictions {f.format(self.corrected)} "
             f"[{f.format(self.corrected_lower)}, {f.format(self.corrected_upper)}]")
        return s if self.trustworthy else s + " (untrustworthy: the target prior is poorly identified)"

    def to_dict(self) -> dict:
        """JSON-able: floats (None for nan), lists for the per-class arrays."""
        d = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, np.ndarray):
                d[f.name] = [finite_or_none(x) for x in v]
            elif isinstance(v, dict):
                d[f.name] = {key: finite_or_none(x) for key, x in v.items()}
            elif isinstance(v, bool):
                d[f.name] = v
            elif isinstance(v, (int, np.integer)) and f.name in ("n_source", "n_target"):
                d[f.name] = int(v)
            elif isinstance(v, (float, np.floating)):
                d[f.name] = finite_or_none(v)
            else:
                d[f.name] = list(v) if isinstance(v, list) else v
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "AccuracyEstimate":
        """The estimate that :meth:`to_dict` wrote; ``from_dict(d).to_dict() == d``."""
        if not isinstance(d, dict):
            raise InputError(f"accuracy must be a dict as AccuracyEstimate.to_dict writes it, got {type(d).__name__}.")
        missing = [f.name for f in fields(cls) if f.name not in d and f.name not in ("method", "trustworthy",
                                                                                     "reasons")]
        if missing:
            raise InputError(f"accuracy dict lacks {missing}; pass a dict that AccuracyEstimate.to_dict wrote.")
        kw = {}
        for f in fields(cls):
            if f.name not in d:
                continue
            v = d[f.name]
            if f.name in ("per_class_recall", "corrected_per_class_recall", "target_prior", "weights"):
                kw[f.name] = np.array([none_as_nan(x) for x in v])
            elif f.name == "variance":
                kw[f.name] = {key: none_as_nan(x) for key, x in v.items()}
            elif f.name in ("n_source", "n_target"):
                kw[f.name] = int(v)
            elif f.name in ("method",):
                kw[f.name] = str(v)
            elif f.name == "trustworthy":
                kw[f.name] = bool(v)
            elif f.name == "reasons":
                kw[f.name] = list(v)
            else:
                kw[f.name] = none_as_nan(v)
        return cls(**kw)


# ---------------------------------------------------------------------------------------------------------------
# the variance of sum_y r_y p_t(y)
# ---------------------------------------------------------------------------------------------------------------
def _rule_accuracy(correct, y, counts, pt, cov_t, infl_pt, target_terms, z):
    """Point estimate, standard errors (population, batch) and variance parts for one rule.

    correct: (n,) bools, the rule right on holdout row j; y: (n,) labels; counts: (k,) n_y; pt: (k,) p_t_hat;
    cov_t: (k, k) target part of Cov(p_t_hat); infl_pt: (n, k) holdout influence on p_t_hat; target_terms(r):
    (m, E_i pi_i (1 - pi_i), Var_i(pi_i - phi_i)) over the target rows, pi_i = P(rule right | x_i) and
    phi_i = (target-row influence on p_t_hat) @ r (:func:`_target_terms`, or :func:`_target_terms_rows` in row blocks).
    """
    n = y.shape[0]
    hits = np.bincount(y, weights=correct.astype(np.float64), minlength=counts.size)
    r = hits / counts
    est = float(r @ pt)
    # holdout influence: recall (a ratio of means over the holdout) and the prior, through the same rows
    infl_r = (pt * n / counts)[y] * (correct - r[y])
    infl_p = infl_pt @ r
    infl = infl_r + infl_p
    infl = infl - infl.mean()
    var_h = float(infl @ infl) / n ** 2
    var_rec = float(infl_r @ infl_r) / n ** 2                       # = sum_y p_t(y)^2 r_y (1 - r_y) / n_y
    var_ph = float(infl_p @ infl_p - n * infl_p.mean() ** 2) / n ** 2
    # a class whose holdout recall is 0 or 1 has binomial variance 0; floor r (1 - r) at p0 (1 - p0),
    # p0 = 1 / (n_y + 2) (the plus-two estimate of a proportion with no misses), which leaves other classes alone
    p0 = 1.0 / (counts + 2.0)
    floor = float(np.sum(pt ** 2 * np.maximum(p0 * (1 - p0) - r * (1 - r), 0.0) / counts))
    var_t = float(r @ cov_t @ r)
    var = var_t + var_h + floor
    se = math.sqrt(max(var, 0.0))
    # the accuracy on the m target rows: mean_i c_i, c_i Bernoulli(pi_i) given x_i; its difference from the
    # estimate has target part Var(c_i - phi_i) / m = (E pi (1 - pi) + Var(pi - phi)) / m
    m, mean_pp, var_d = target_terms(r)
    var_batch_t = (mean_pp + var_d) / m
    se_batch = math.sqrt(max(var_batch_t + var_h + floor, 0.0))
    parts = {"prior_target": var_t, "prior_holdout": var_ph, "recall": var_rec + floor,
             "cross": var_h - var_rec - var_ph}

    def clip(v):
        return float(min(max(v, 0.0), 1.0))

    return (r, est, (clip(est - z * se), clip(est + z * se), se),
            (clip(est - z * se_batch), clip(est + z * se_batch), se_batch), parts)


def _target_terms(target_infl, target_correct_prob):
    """target_terms of :func:`_rule_accuracy` from the (m, k) influences and the (m,) pi_i in memory."""
    def terms(r):
        phi = target_infl @ r
        d = target_correct_prob - phi
        return (target_infl.shape[0], float(np.mean(target_correct_prob * (1 - target_correct_prob))),
                float(np.var(d)))
    return terms


def _free_terms_rows(Xt, calibrator, w, F):
    """(mean s_F, H_FF^{-1}) over a large target, s_i = f_i / f_i^T w, H = (1/m) sum_i s_i s_i^T, from the calibrated
    rows made block by block with float64 sums (raw outputs in partitions: :func:`free_sums` on each partition's
    worker, added in partition order)."""
    m = Xt.shape[0]
    ssum, SS = add_in_order(Xt.run(free_sums, calibrator, w)) if is_partitioned(Xt) else free_sums(Xt, calibrator, w)
    return ssum[F] / m, np.linalg.pinv(SS[np.ix_(F, F)] / m, rcond=1e-14, hermitian=True)


def free_sums(Xt, calibrator, w) -> tuple[np.ndarray, np.ndarray]:
    """(sum_i s_i, sum_i s_i s_i^T), s_i = f_i / f_i^T w, over the raw outputs Xt calibrated a row block at a time
    with float64 sums: the pass of :func:`_free_terms_rows` (per partition on rows kept on workers)."""
    m, k = Xt.shape
    ssum, SS = np.zeros(k), np.zeros((k, k))
    with _rows.pass_threads(k):
        for sl in _rows.blocks(m, width=k):
            Pb = calibrator.predict_proba(Xt[sl].astype(np.float64))
            Sb = Pb / (Pb @ w)[:, None]
            ssum += Sb.sum(axis=0)
            SS += Sb.T @ Sb
    return ssum, SS


def _target_terms_rows(Xt, calibrator, w, ps, pinned, free_terms=None):
    """target_terms of both rules (deployed, corrected) for a large target (:func:`labelshift.rows.is_large`): the
    calibrated rows are made block by block from the raw outputs, with float64 sums (two passes: H_FF and mean s_F,
    then the per-rule sums), as the whole-array :func:`_target_influence` and :func:`_target_terms` compute them.
    ``free_terms``: (mean s_F, H_FF^{-1}) as the source-aware interval made them on the same rows
    (``SourceAwareInterval.target_terms``), which saves the first pass. Raw outputs in partitions: both passes run
    on each partition's worker (the calibrator sent along); the per-rule sums are combined by
    :func:`_combined_rule_sums`."""
    m, k = Xt.shape
    F = np.flatnonzero(~pinned)
    sbar, Hinv = free_terms if free_terms is not None else _free_terms_rows(Xt, calibrator, w, F)

    def run(r_dep, r_cor):
        """[(m, mean pi (1 - pi), Var(pi - phi)) for the deployed rule, the same for the corrected rule]."""
        vs = [Hinv @ (ps[F] * r[F]) for r in (r_dep, r_cor)]   # phi_i = (s_i,F - mean s_F) Hinv (p_s,F * r_F)
        # above 100 classes: phi of both rules as one product s_i V - mean s_F V (no (rows, |F|) copies of s_i,F)
        V = np.zeros((k, 2))
        V[F] = np.column_stack(vs)
        centre = sbar @ V[F]
        if is_partitioned(Xt):
            pp, var_d = _combined_rule_sums(Xt.run(rule_sums, calibrator, w, F, sbar, vs, V, centre),
                                            Xt.partition_rows)
            return [(m, float(pp[t] / m), var_d[t]) for t in range(2)]
        pp, ds, dss, _ = rule_sums(Xt, calibrator, w, F, sbar, vs, V, centre)
        mu = ds / m
        return [(m, float(pp[t] / m), float(max(dss[t] / m - mu[t] * mu[t], 0.0))) for t in range(2)]

    return run


def rule_sums(Xt, calibrator, w, F, sbar, vs, V, centre):
    """The per-rule row sums of :func:`_target_terms_rows` over the raw outputs Xt (m, k), calibrated a row block at
    a time: (sum_i pi_i (1 - pi_i), sum_i e_i, sum_i e_i^2, shift), each (2,) for the deployed and the corrected
    rule, with e_i = d_i - shift, d_i = pi_i - phi_i and shift the mean of d over the first block (shifted sums: no
    cancellation in the variance). Per partition on rows kept on workers."""
    m, k = Xt.shape
    pp, ds, dss, shift = np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2)
    with _rows.pass_threads(k):
        for sl in _rows.blocks(m, width=k):
            Pb = calibrator.predict_proba(Xt[sl].astype(np.float64))
            Sb = Pb / (Pb @ w)[:, None]
            Qb = Sb * w
            pis = (Qb[np.arange(Qb.shape[0]), np.argmax(Xt[sl], axis=1)], Qb.max(axis=1))
            phis = Sb @ V - centre if k > _ONE_PRODUCT_CLASSES else None
            for t in range(2):
                pi = pis[t]
                d = pi - (phis[:, t] if phis is not None else (Sb[:, F] - sbar) @ vs[t])
                if sl.start == 0:
                    shift[t] = float(d.mean())
                pp[t] += float(np.sum(pi * (1 - pi)))
                e = d - shift[t]
                ds[t] += float(e.sum())
                dss[t] += float(e @ e)
    return pp, ds, dss, shift


def _combined_rule_sums(parts, counts) -> tuple[np.ndarray, list]:
    """(sum_i pi_i (1 - pi_i), [Var_i(d_i) per rule]) over all rows from the partitions' :func:`rule_sums` (in
    partition order; ``counts`` their rows): each partition's mean of d, shift + sum e / m_p, and centred sum of
    squares, sum e^2 - (sum e)^2 / m_p, combined by Chan's update (:func:`labelshift.partitions.combine_moments`)."""
    pp = add_in_order([part[0] for part in parts])
    moments = [Moments(c, shift + ds / c, np.diag(dss - ds * ds / c))
               for (_, ds, dss, shift), c in zip(parts, counts) if c]
    total = combine_moments(moments)
    return pp, [float(max(v / total.rows, 0.0)) for v in np.diag(total.cross)]


def _target_influence(Pt, w, ps, pinned):
    """(m, k) influence of each target row on p_t_hat = p_s * w_hat with p_s fixed (the target part of the
    source-aware covariance): p_s,F * H_FF^{-1} (s_i,F - mean s_F), s_i = f_i / f_i^T w."""
    m, k = Pt.shape
    S = Pt / (Pt @ w)[:, None]
    F = np.flatnonzero(~pinned)
    SF = S[:, F]
    H = SF.T @ SF / m
    Hinv = np.linalg.pinv(H, rcond=1e-14, hermitian=True)
    out = np.zeros((m, k))
    out[:, F] = ((SF - SF.mean(axis=0)) @ Hinv) * ps[F]
    return out, S


def _accuracy_inputs(holdout_outputs, holdout_labels, target_outputs):
    """The outputs and labels of :func:`expected_accuracy` checked (InputError as documented there). Returns
    (Xh, Xt, y, holdout rows per class as floats)."""
    Xh = as_float_array(holdout_outputs, "holdout_outputs", 2)
    n, k = Xh.shape
    if n == 0 or k < 2:
        raise InputError(f"holdout_outputs has shape {Xh.shape}; pass the model's outputs on the labelled holdout "
                         "rows, one column per class (at least 2).")
    Xt = target_outputs.single() if is_partitioned(target_outputs) else as_float_rows(target_outputs, "target_outputs")
    if Xt.shape[1] != k or Xt.shape[0] == 0:
        raise InputError(f"target_outputs has shape {Xt.shape} but holdout_outputs has {k} class columns; pass "
                         "the same model's outputs on the target rows (at least one row, k columns).")
    y = check_labels(holdout_labels, "holdout_labels", k, n_rows=n)
    counts = np.bincount(y, minlength=k).astype(np.float64)
    missing = np.flatnonzero(counts == 0)
    if missing.size:
        raise InputError(f"holdout_labels has no example of class(es) {missing.tolist()}: their recall, and so the "
                         "accuracy on a target that contains them, is not estimable. Add labelled holdout rows of "
                         "those classes (and refit the calibrator on them).")
    return Xh, Xt, y, counts


def _rules_target_terms(Xt, calibrator, w, ps, pinned, y, counts, correct, correct_c, free_terms=None):
    """The target_terms of :func:`_rule_accuracy` for the deployed and the corrected rule, in row blocks for a
    large target (``free_terms``: as :func:`_target_terms_rows`)."""
    if _rows.is_large(Xt):
        # one large target: its calibrated rows are made block by block, never as a whole (m, k) float64 array
        def recall(c):
            return np.bincount(y, weights=c.astype(np.float64), minlength=counts.size) / counts
        both = _target_terms_rows(Xt, calibrator, w, ps, pinned, free_terms)(recall(correct), recall(correct_c))
        return (lambda r: both[0]), (lambda r: both[1])
    Pt = calibrator.predict_proba(Xt)
    target_infl, S = _target_influence(Pt, w, ps, pinned)
    Q = S * w                                                      # target posteriors under p_t_hat
    return (_target_terms(target_infl, Q[np.arange(Xt.shape[0]), np.argmax(Xt, axis=1)]),
            _target_terms(target_infl, Q.max(axis=1)))


def expected_accuracy(holdout_outputs, holdout_labels, target_outputs, calibrator, *, weights=None,
                      level: float = 0.95, interval: SourceAwareInterval | None = None) -> AccuracyEstimate:
    """The deployed model's expected accuracy on the target, sum_y recall_y p_t(y), with a normal interval whose
    variance includes the target prior's uncertainty (target rows, calibrator and p_s fit on the holdout) and the
    holdout recall's sampling error, correlated through the shared holdout rows; and the same for the predictions
    corrected to the target, argmax_y w_y f_y(x) (Garg et al., NeurIPS 2020: label shift, Section 2; MLLS,
    eq. (mlls-sample)).

    recall_y is the share of the holdout's class-y rows whose argmax of ``holdout_outputs`` is y. Under label shift
    it is the recall on the target as well. The formula: ``docs/accuracy.md``.

    Args:
        holdout_outputs: (n, k) the deployed model's raw outputs (logits, or probabilities if the calibrator was
            fit on probabilities) on the labelled source holdout the calibrator was fit on.
        holdout_labels: (n,) their labels 0..k-1; every class must occur.
        target_outputs: (m, k) the model's raw outputs on the target rows.
        calibrator: a fitted TS, BCTS, VS or NBVS calibrator fit on (holdout_outputs, holdout_labels).
        weights: optional MLLS weights for these rows (as
            :func:`~labelshift.inference.source_aware.source_aware_interval` takes them); None solves MLLS.
        level: confidence level in (0, 1).
        interval: optional result of ``source_aware_interval`` on exactly these inputs (reused, not recomputed);
            its level need not be ``level``.

    Returns:
        :class:`AccuracyEstimate`.

    Raises:
        InputError: level outside (0, 1); mismatched shapes; a class without a holdout example; anything
            ``source_aware_interval`` refuses; an ``interval`` that was not computed on these inputs.
    """
    level = check_level(level, example="e.g. 0.95 for a 95% interval")
    Xh, Xt, y, counts = _accuracy_inputs(holdout_outputs, holdout_labels, target_outputs)
    n, k = Xh.shape
    if interval is None:
        interval = source_aware_interval(Xh, y, Xt, calibrator, level=level, weights=weights)
    elif (not isinstance(interval, SourceAwareInterval) or interval.holdout_influence is None
          or interval.holdout_influence.shape != (n, k) or interval.n_target != Xt.shape[0]):
        raise InputError("interval must be the SourceAwareInterval that source_aware_interval returned for these "
                         "holdout and target rows; pass interval=None to compute it here.")
    z = float(norm.ppf(0.5 * (1.0 + level)))
    pt = np.asarray(interval.target_prior, dtype=np.float64)
    w = np.asarray(interval.weights, dtype=np.float64)
    pinned = np.asarray(interval.pinned, dtype=bool)
    cov_t = np.asarray(interval.covariance_target, dtype=np.float64)
    infl_pt = np.asarray(interval.holdout_influence, dtype=np.float64)

    Ph = calibrator.predict_proba(Xh)
    correct = np.argmax(Xh, axis=1) == y                           # deployed rule: argmax of the raw outputs
    correct_c = np.argmax(Ph * w, axis=1) == y                     # corrected rule: argmax_y w_y f_y(x)
    ps = np.asarray(interval.source_prior, dtype=np.float64)
    terms, terms_c = _rules_target_terms(Xt, calibrator, w, ps, pinned, y, counts, correct, correct_c,
                                         interval.target_terms)
    r, est, (lo, hi, se), (blo, bhi, bse), parts = _rule_accuracy(correct, y, counts, pt, cov_t, infl_pt, terms, z)
    rc, est_c, (clo, chi, cse), (cblo, cbhi, cbse), _ = _rule_accuracy(correct_c, y, counts, pt, cov_t, infl_pt,
                                                                       terms_c, z)
    src = float(correct.mean())
    return AccuracyEstimate(
        source=src, source_std_error=math.sqrt(src * (1 - src) / n), expected=est, lower=lo, upper=hi,
        std_error=se, batch_lower=blo, batch_upper=bhi, batch_std_error=bse, corrected=est_c,
        corrected_lower=clo, corrected_upper=chi, corrected_std_error=cse, corrected_batch_lower=cblo,
        corrected_batch_upper=cbhi, corrected_batch_std_error=cbse, per_class_recall=r,
        corrected_per_class_recall=rc, target_prior=pt.copy(), weights=w.copy(), variance=parts, level=float(level),
        n_source=n, n_target=int(Xt.shape[0]), trustworthy=bool(interval.trustworthy),
        reasons=list(interval.reasons))
