"""A test of "no shift" for an MLLS label-shift estimate (Garg et al., NeurIPS 2020, Section 4.2).

Notation: f_i = f(x_i), the calibrated source posterior on target row i (i = 1..m, k classes); p_s the source
prior; W = {w >= 0, p_s^T w = 1}; L_m(w) = (1/m) sum_i log f_i^T w, eq. (mlls-sample); w_hat its maximiser; the
target prior is p_t = p_s * w.

* :func:`no_shift_test` -- H0: w = 1, as a likelihood-ratio test (f and p_s known) or a two-sample test of the mean
  calibrated prediction (source side estimated too).

The derivations and the measured size are in ``docs/uncertainty.md``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import null_space
from scipy.stats import chi2
from scipy.stats import f as f_dist

from .. import rows as _rows
from .._numbers import finite_or_none, none_as_nan, written_dict
from .._validation import check_level, check_probabilities
from ..errors import InputError
from ..partitions import NOT_PARTITIONED, is_partitioned
from .holdout_conditional import check_inflation, no_shift_inflation
from .mlls_inputs import check_inputs, check_mle, dot_rows, mean_cov
from .repeats import clustered_covariance


@dataclass(frozen=True)
class NoShiftTest:
    """Result of :func:`no_shift_test`.

    Attributes:
        statistic: the likelihood ratio 2 m [L_m(w_hat) - L_m(1)], or Hotelling's T^2 of the two-sample test; >= 0.
        dof: k - 1 (fewer for the two-sample test when a direction has no variance on either side).
        p_value: P(chi^2_dof >= statistic) for the likelihood ratio; for the two-sample test
            P(F(dof, n + m - dof - 1) >= statistic (n + m - dof - 1) / ((n + m - 2) dof)), Hotelling's law.
        method: ``"likelihood-ratio"`` (f and p_s known) or ``"two-sample"`` (mean prediction, target vs source).
        n_target: m.
        n_source: the labelled source examples behind p_s (two-sample test only).
        holdout_inflation: kappa, the factor on the holdout mean's covariance in the two-sample form (1: counted
            once, the test valid on average over holdouts; the likelihood-ratio form always 1).
    """

    statistic: float
    dof: int
    p_value: float
    method: str = "likelihood-ratio"
    n_target: int | None = None
    n_source: int | None = None
    holdout_inflation: float = 1.0

    def rejects(self, significance: float = 0.05) -> bool:
        """True when "no shift" is rejected at this significance level (p_value < significance)."""
        significance = check_level(significance, "significance")
        return bool(self.p_value < significance)

    def to_dict(self) -> dict:
        return {"statistic": finite_or_none(self.statistic), "dof": int(self.dof), "p_value": finite_or_none(self.p_value),
                "method": self.method, "n_target": None if self.n_target is None else int(self.n_target),
                "n_source": self.n_source, "holdout_inflation": float(self.holdout_inflation)}

    @classmethod
    def from_dict(cls, d: dict) -> "NoShiftTest":
        """The test that :meth:`to_dict` wrote (None read back as nan); ``from_dict(d).to_dict() == d``."""
        d = written_dict(d, "no_shift_test", ("statistic", "dof", "p_value"))
        return cls(statistic=none_as_nan(d["statistic"]), dof=int(d["dof"]), p_value=none_as_nan(d["p_value"]),
                   method=str(d.get("method", "likelihood-ratio")), n_target=d.get("n_target"),
                   n_source=d.get("n_source"), holdout_inflation=float(d.get("holdout_inflation", 1.0)))


def no_shift_test(target_probs, weights, source_prior, *, source_probs=None, repeats=None,
                  holdout_inflation=None) -> NoShiftTest:
    """Test of H0: w = 1 (no label shift, p_t = p_s).

    With ``source_probs=None`` f and p_s are taken as known: the likelihood-ratio test against the MLLS estimate
    (eq. mlls-sample), Lambda = 2 m [L_m(w_hat) - L_m(1)], clipped at 0, against chi^2 with k - 1 degrees of
    freedom (asymptotic).

    With ``source_probs`` (the calibrated outputs on the n labelled source examples the calibrator and p_s were fit
    on; what the ``reestimate`` flow uses): the two-sample Hotelling test of the mean calibrated prediction,
    T^2 = d^T [Sigma_pool (1/m + kappa/n)]^+ d with d = mu_hat_t - mu_hat_s and Sigma_pool the pooled within-sample
    covariance ((m - 1) Sigma_hat_t + (n - 1) Sigma_hat_s) / (n + m - 2), in an orthonormal basis of the sum-zero
    subspace (``dof`` drops for a direction without variance on either side), referred to Hotelling's law
    (n + m - 2) dof / (n + m - dof - 1) F(dof, n + m - dof - 1). It does not use ``weights``.

    Under H0 and the label-shift assumption target and source rows have one distribution, so one covariance (the
    pooled one estimates it); with kappa = 1 the two-sample p-value is close to uniform over holdouts (exact for
    Gaussian rows), and any label shift with an invertible soft confusion matrix moves the mean, so the test is
    consistent. Given one holdout its mean's error is fixed; kappa > 1 counts it kappa times so that the rate of
    false Shifted given the holdout is at most the level for all but the unluckiest holdouts
    (:func:`~labelshift.inference.holdout_conditional.no_shift_inflation`: the holdout at the 99th percentile of
    its error sees 5%). Derivation, measured size and power: ``docs/uncertainty.md`` ("No-shift test", "Given one
    holdout").

    Rows that repeat (``repeats``, :class:`~labelshift.inference.repeats.Repeats`, some copies counted as one draw):
    the two-sample form takes the target mean's covariance from its clusters, (1/m^2) sum_g w_g (f_g - mu_hat_t)
    (f_g - mu_hat_t)^T over the distinct rows (w_g = c_g^2 for a collapsed group, :func:`~labelshift.inference.
    repeats.clustered_covariance`), beside kappa Sigma_pool / n for the source mean, and Hotelling's law with the
    effective target size m_eff = m^2 / sum_g w_g in place of m (and in rho = m_eff / n of kappa); the
    likelihood-ratio form scales Lambda by m_eff / m.

    ``target_probs`` may be rows held in partitions (:class:`labelshift.partitions.PartitionedRows`): every pass
    over them is then a map over the partitions and a reduce (the target moments of the two-sample form combined by
    Chan's formula); ``repeats`` is not supported there yet.

    Args: as :func:`fisher_interval` (``weights`` = the MLLS estimate, or None to solve it here; used by the
    likelihood-ratio form); ``source_probs``: (n, k) calibrated source outputs; ``holdout_inflation``: kappa of the
    two-sample form, None (the default) derived from m / n and dof, a number >= 1 fixes it (1: the test valid on
    average over holdouts, as before); recorded in the result.
    """
    repeats = repeats if repeats is not None and repeats.adjusts else None
    kappa = check_inflation(holdout_inflation)
    P, p = check_inputs(target_probs, source_prior)
    if repeats is not None and is_partitioned(P):
        raise InputError("repeated rows: the clustered covariance of the target mean needs the rows themselves; "
                         + NOT_PARTITIONED)
    m, k = P.shape
    if source_probs is None:
        w = check_mle(P, weights, p)
        if is_partitioned(P):                   # one map-reduce: sum_i log(f_i^T w / f_i^T 1), row by row
            stat = 2.0 * _rows.log_ratio_sum(P, w, np.ones(k))
        else:
            sums = _rows.row_dot(P, np.ones(k)) if _rows.is_large(P) else P.sum(axis=1)
            stat = 2.0 * float(np.sum(np.log(dot_rows(P, w) / sums)))
        stat = max(stat, 0.0) * (1.0 if repeats is None else repeats.effective_rows / m)
        return NoShiftTest(statistic=stat, dof=k - 1, p_value=float(chi2.sf(stat, k - 1)), n_target=m)
    S = check_probabilities(source_probs, "source_probs", 2)
    if S.shape[1] != k:
        raise InputError(f"source_probs has {S.shape[1]} class columns but target_probs has {k}; pass the calibrated "
                         "outputs of the same classifier on its labelled source data.")
    n = S.shape[0]
    if n < 2 or m < 2:
        raise InputError(f"the two-sample test needs at least 2 rows on each side, got n = {n} source and m = {m} "
                         "target rows.")
    return _two_sample(P, S, repeats, kappa)


def _two_sample(P: np.ndarray, S: np.ndarray, repeats, kappa: float | None) -> NoShiftTest:
    """The two-sample form of :func:`no_shift_test` on checked inputs (kappa None: derived)."""
    (m, k), n = P.shape, S.shape[0]
    # rows sum to 1, so the means and their difference live in the sum-zero subspace: work in an orthonormal basis
    # U (k, k-1) of it; a direction without variance on either side (a class never predicted) carries no test
    U = null_space(np.ones((1, k)))
    mean_t, cov_t = mean_cov(P)
    mean_s, cov_s = mean_cov(S)
    diff = U.T @ (mean_t - mean_s)
    pooled = ((m - 1) * cov_t + (n - 1) * cov_s) / (n + m - 2)
    if repeats is None:
        m_eff, target_part = float(m), pooled / m
    else:                                   # the target mean's variance from its clusters of repeated rows
        repeats.check(m)
        m_eff = float(repeats.effective_rows)
        target_part = clustered_covariance(lambda rows: P[rows], repeats, k, mean_t) / m
    total = n + (m if repeats is None else max(int(round(m_eff)), 2))

    def statistic(factor: float) -> tuple[float, int]:
        cov = U.T @ (target_part + factor * pooled / n) @ U
        lam, V = np.linalg.eigh(0.5 * (cov + cov.T))
        keep = lam > max(float(lam.max()), 0.0) * 1e-12
        proj = V[:, keep].T @ diff
        return float(np.sum(proj ** 2 / lam[keep])), int(np.sum(keep))

    stat, dof = statistic(1.0)
    if kappa is None:
        kappa = no_shift_inflation(n, m_eff, dof) if dof > 0 else 1.0
    if kappa != 1.0:
        stat, dof = statistic(kappa)
    # the pooled covariance of n + m rows around two means has rank <= n + m - 2, so dof <= n + m - 2 and the
    # F law's second degrees of freedom, n + m - dof - 1, are >= 1 (the max guards against rounding in the rank)
    if dof > 0:
        df2 = max(total - dof - 1, 1)
        p_value = float(f_dist.sf(stat * df2 / ((total - 2) * dof), dof, df2))
    else:
        p_value = 1.0
    return NoShiftTest(statistic=stat, dof=dof, p_value=p_value, method="two-sample", n_target=m, n_source=n,
                       holdout_inflation=float(kappa))
