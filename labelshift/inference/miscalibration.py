"""The miscalibration term of MLLS measured and carried (Garg et al., NeurIPS 2020, Section 5: eq. (bound-main)
splits ||w_hat_f - w*|| into a finite-sample part sigma^{-1} O_p(m^{-1/2}) and a miscalibration part
C sigma^{-1} CE(f), Lemma (bound-calib); MLLS is consistent only when f is canonically calibrated,
p_s(y | f(x)) = f(x), Theorem (mlls)).

Temperature-and-bias scaling cannot make some classifiers canonically calibrated (a linear model on classes of
several clusters, naive Bayes on correlated features), and then MLLS's estimate carries a bias that no holdout
removes. Under label shift alone, any feature h(x) of the outputs satisfies the moment identity

    E_t[h(x)] = sum_y p_t(y) E_s[h(x) | y] = A p_t,      A[j, y] = E_s[h_j(x) | y]          (Section 4.1's
                                                                                            distribution matching)

whether or not f is calibrated (BBSE is h = one-hot argmax). With MLLS's own features at its estimate w_hat,
h(x) = f(x) / f(x)^T w_hat, the target side E_t[h] is the MLLS gradient (one pass over the target; eq.
(proof-gradient)) and A is a holdout mean per class, so the *moment estimate* p_c = A^{-1} E_t[h] is consistent
without calibration and, when f is canonically calibrated, about as precise as MLLS (it then solves the same
equations: A p_t = p_s = E_t[h] at MLLS's optimum). Its covariance, with both sides' sampling error,

    V_c = A^{-1} [ Cov_t(h) / m  +  sum_y p_y^2 Cov_s(h | y) / n_y ] A^{-T}

(Cov_t(h) from the holdout's class-conditional moments at p = MLLS's p_t; m the target's rows or their effective
number when rows repeat; n_y the holdout's rows of class y). The estimate of the calibrator and of w_hat enter p_c
only at second order: the identity holds for every h.

What the check does with it (:func:`miscalibration_check`, :func:`widened_interval`):

* **carries it**: the interval shown is the hull of MLLS's interval and p_c +- z sqrt(diag V_c); on a canonically
  calibrated model p_c and MLLS differ by noise (mostly the holdout's, within p_c's standard error) and the
  interval moves a little, on a miscalibrated one it reaches an estimate whose error has no miscalibration term;
* **measures it**: d = p_MLLS - p_c estimates the miscalibration part of eq. (bound-main) in p_t; the statistic
  T = d^T V_c^+ d, chi-square with k - 1 degrees of freedom when d is noise (w_hat^T h = 1 for every row, so
  p_c sums to 1 and V_c has rank k - 1) (V_c bounds the variance of d: the two
  estimates share their target rows and holdout, and d's variance is V_c - V_MLLS for an efficient MLLS), and
  ``implied_bias``, the part of |d_y| beyond its noise;
* **says it**: when T's p-value is below :data:`DEFAULT_THRESHOLD` the check *acts*, and the verdict is
  Untrustworthy with the reason, the numbers and what to do.

Cost: one pass over the target (the MLLS gradient), O(n k^2) on the holdout and k x k algebra; not run above
:data:`MAX_CLASSES` classes.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import chi2, norm

from .._numbers import finite_list, finite_or_none, nan_array, none_as_nan, written_dict
from ..errors import FormatError
from ..estimation.solvers import mlls_gradient

__all__ = ["DEFAULT_THRESHOLD", "MiscalibrationCheck", "miscalibration_check", "widened_interval"]

#: the level of the test of "MLLS and the moment estimate agree" (p-value below it: the check acts): set before the
#: runs; V_c alone as d's variance (no V_MLLS term) was chosen on seeds 0-14 of lr-two-clusters and nb-correlated
#: (n = 3,000) and seeds 0-11 of ten zoo cases; the shallow tree and seeds 1000 on are fresh to both choices
DEFAULT_THRESHOLD = 0.01
#: the most classes the check runs at (its holdout terms cost n k^2)
MAX_CLASSES = 100


@dataclass(frozen=True)
class MiscalibrationCheck:
    """MLLS against the calibration-free moment estimate on one target: the measured miscalibration term (module
    docstring).

    Attributes:
        reference_prior: (k,) the moment estimate p_c = A^{-1} E_t[f / f^T w_hat] (it sums to 1; unclipped:
            noise may take a share a little below 0).
        reference_std_error: (k,) its standard errors (holdout and target parts, sqrt diag V_c).
        difference: (k,) MLLS's p_t minus p_c.
        difference_std_error: (k,) the standard errors the test uses for d (sqrt diag V_c).
        statistic, df, p_value: T = d^T V_c^+ d, its degrees of freedom (the rank of V_c, k - 1) and chi-square
            p-value.
        threshold: the level the check acts at.
        implied_bias: (k,) the part of |d_y| beyond z_{1 - threshold/2} of its standard error (0 when within): the
            least miscalibration bias of MLLS in p_t(y) the data show.
        error: why the check could not run (more than MAX_CLASSES classes, a singular A); None when it ran.
        reference_covariance: V_c (not serialised).
    """

    reference_prior: np.ndarray | None = None
    reference_std_error: np.ndarray | None = None
    difference: np.ndarray | None = None
    difference_std_error: np.ndarray | None = None
    statistic: float = math.nan
    df: int = 0
    p_value: float = math.nan
    threshold: float = DEFAULT_THRESHOLD
    implied_bias: np.ndarray | None = None
    error: str | None = None
    reference_covariance: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def acts(self) -> bool:
        """The check ran and MLLS and the moment estimate disagree beyond their sampling error (p-value <
        threshold)."""
        return self.error is None and bool(self.p_value < self.threshold)

    @property
    def reason(self) -> str | None:
        """One sentence for the verdict when the check acts (the class where the two disagree most); else None."""
        if not self.acts:
            return None
        y = int(np.argmax(np.abs(self.difference)))
        mlls = self.reference_prior[y] + self.difference[y]
        return (f"the calibrated outputs are not canonically calibrated for this model: MLLS and the calibration-free "
                f"moment estimate disagree beyond their sampling error (p = {self.p_value:.2g}; class {y}: MLLS "
                f"{mlls:.3f}, moment estimate {self.reference_prior[y]:.3f} +- {self.reference_std_error[y]:.3f}), "
                f"so MLLS carries a bias of at least {self.implied_bias[y]:.3f} there that no holdout removes (the "
                "miscalibration term); the interval shown includes the moment estimate's. Register the model again "
                "with a calibrator that fits it (e.g. binning), or use estimator 'BBSE-hard', which needs no "
                "calibration")

    def to_dict(self) -> dict:
        """JSON-able (nan as None); the error and the threshold alone when the check could not run."""
        if self.error is not None:
            return {"error": self.error, "threshold": self.threshold}
        return {"reference_prior": finite_list(self.reference_prior),
                "reference_std_error": finite_list(self.reference_std_error),
                "difference": finite_list(self.difference),
                "difference_std_error": finite_list(self.difference_std_error),
                "statistic": finite_or_none(self.statistic), "df": int(self.df),
                "p_value": finite_or_none(self.p_value), "threshold": self.threshold,
                "implied_bias": finite_list(self.implied_bias), "acts": self.acts}

    @classmethod
    def from_dict(cls, d: dict) -> "MiscalibrationCheck":
        """The check :meth:`to_dict` wrote; ``from_dict(d).to_dict() == d``."""
        d = written_dict(d, "miscalibration", ("threshold",))
        if "error" in d:
            return cls(threshold=float(d["threshold"]), error=str(d["error"]))
        d = written_dict(d, "miscalibration", ("reference_prior", "reference_std_error", "difference",
                                               "difference_std_error", "statistic", "df", "p_value", "implied_bias"))
        try:
            return cls(reference_prior=nan_array(d["reference_prior"]),
                       reference_std_error=nan_array(d["reference_std_error"]), difference=nan_array(d["difference"]),
                       difference_std_error=nan_array(d["difference_std_error"]),
                       statistic=none_as_nan(d["statistic"]), df=int(d["df"]), p_value=none_as_nan(d["p_value"]),
                       threshold=float(d["threshold"]), implied_bias=nan_array(d["implied_bias"]))
        except (TypeError, ValueError) as exc:
            raise FormatError(f"miscalibration holds a value that is not a number ({exc}); pass what "
                              "MiscalibrationCheck.to_dict() wrote.") from None


def _moment_terms(holdout_probs: np.ndarray, labels: np.ndarray, weights: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(H, A, counts, fw): the features h_i = f_i / (f_i^T w) of the holdout rows, A[j, y] = E_s[h_j | y] (the
    class means), the class counts n_y and f_i^T w."""
    n, k = holdout_probs.shape
    fw = np.maximum(holdout_probs @ weights, 1e-12)
    H = holdout_probs / fw[:, None]
    sums = np.stack([np.bincount(labels, weights=H[:, j], minlength=k) for j in range(k)], axis=1)   # [y, j]
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    return H, (sums / counts[:, None]).T, counts, fw


def _moment_covariance(H: np.ndarray, A: np.ndarray, labels: np.ndarray, counts: np.ndarray, p: np.ndarray,
                       m_eff: float) -> np.ndarray:
    """V_c = A^{-1} [Cov_t(h) / m + sum_y p_y^2 Cov_s(h | y) / n_y] A^{-T} at the prior ``p`` (clipped at 0), the
    target's covariance of h made from the holdout's class-conditional moments (label shift: E_t[.] = sum_y p_y
    E_s[. | y]), so that no second pass over the target is needed."""
    p = np.maximum(p, 0.0)
    a = p / counts
    second = (H * a[labels][:, None]).T @ H                    # sum_y p_y E_s[h h^T | y]
    mean = A @ p
    target = second - np.outer(mean, mean)
    R = (H - A.T[labels]) * a[labels][:, None]                 # (p_y / n_y)(h_i - A_y)
    holdout = R.T @ R
    Ainv = np.linalg.inv(A)
    return Ainv @ (target / m_eff + holdout) @ Ainv.T


def _wald(d: np.ndarray, V: np.ndarray) -> tuple[float, int]:
    """(d^T V^+ d, rank of V): the pseudo-inverse on V's range (sum-to-zero directions), tiny eigenvalues cut."""
    vals, vecs = np.linalg.eigh(0.5 * (V + V.T))
    keep = vals > max(vals.max(), 0.0) * 1e-10
    if not np.any(keep):
        return math.nan, 0
    proj = vecs[:, keep].T @ d
    return float(np.sum(proj ** 2 / vals[keep])), int(keep.sum())


def miscalibration_check(holdout_probs, labels, target_probs, mlls_weights, mlls_prior, *,
                         effective_rows: float | None = None, threshold: float = DEFAULT_THRESHOLD
                         ) -> MiscalibrationCheck:
    """MLLS's p_t against the calibration-free moment estimate on the same holdout and target (module docstring).

    Args:
        holdout_probs, labels: the calibrated holdout (n, k) (at the target's precision) and its labels.
        target_probs: the calibrated target (m, k); one pass (the MLLS gradient at ``mlls_weights``).
        mlls_weights: (k,) MLLS's w; mlls_prior: (k,) its p_t.
        effective_rows: the target's effective number of rows (repeated rows, :mod:`labelshift.inference.repeats`);
            None: m.
        threshold: the test's level (the check acts below it).

    Returns:
        The :class:`MiscalibrationCheck`; with ``error`` set (never raised) when it cannot be computed (more than
        :data:`MAX_CLASSES` classes; a singular A).
    """
    P, y = np.asarray(holdout_probs, dtype=np.float64), np.asarray(labels, dtype=np.int64)
    k = P.shape[1]
    if k > MAX_CLASSES:
        return MiscalibrationCheck(threshold=threshold, error=f"not computed above {MAX_CLASSES} classes ({k})")
    w = np.maximum(np.asarray(mlls_weights, dtype=np.float64), 0.0)
    H, A, counts, _ = _moment_terms(P, y, w)
    if np.linalg.cond(A) > 1e10:
        return MiscalibrationCheck(threshold=threshold, error="the holdout's class means of f / f^T w are linearly "
                                   "dependent: the moment estimate does not identify p_t")
    g = np.asarray(mlls_gradient(target_probs, w), dtype=np.float64).ravel()
    ref = np.linalg.solve(A, g)
    p_mlls = np.asarray(mlls_prior, dtype=np.float64)
    V_c = _moment_covariance(H, A, y, counts, p_mlls, float(effective_rows or np.shape(target_probs)[0]))
    d = p_mlls - ref
    stat, df = _wald(d, V_c)
    p_value = float(chi2.sf(stat, df)) if df else math.nan
    se_d = np.sqrt(np.maximum(np.diag(V_c), 0.0))
    z = float(norm.ppf(1.0 - threshold / 2.0))
    return MiscalibrationCheck(reference_prior=ref, reference_std_error=np.sqrt(np.maximum(np.diag(V_c), 0.0)),
                               difference=d, difference_std_error=se_d, statistic=stat, df=df, p_value=p_value,
                               threshold=threshold, implied_bias=np.maximum(np.abs(d) - z * se_d, 0.0),
                               reference_covariance=V_c)


def widened_interval(interval, check: MiscalibrationCheck, source_prior):
    """``interval`` (a PriorInterval) widened, per class, to include the moment estimate's Wald interval at the
    same level (reference +- z se, within [0, 1]), the weights' bounds with it (divided by p_s); unchanged when the
    check could not run. The point estimate stays MLLS's. On a canonically calibrated model the two estimates
    differ by noise and the interval moves a little; on a miscalibrated one it reaches the estimate whose error has
    no miscalibration term (docs/intervals.md)."""
    if check.error is not None:
        return interval
    z = float(norm.ppf(0.5 + interval.level / 2.0))
    lower = np.minimum(interval.lower, np.clip(check.reference_prior - z * check.reference_std_error, 0.0, 1.0))
    upper = np.maximum(interval.upper, np.clip(check.reference_prior + z * check.reference_std_error, 0.0, 1.0))
    ps = np.asarray(source_prior, dtype=np.float64)
    return dataclasses.replace(interval, lower=lower, upper=upper, weights_lower=lower / ps, weights_upper=upper / ps)
