"""Whether a label-shift estimate can be trusted (Garg et al., NeurIPS 2020, Section 5).

Notation: f_i = f(x_i), the calibrated source posterior on target row i (i = 1..m, k classes); p_s the source
prior; W = {w >= 0, p_s^T w = 1}; L_m(w) = (1/m) sum_i log f_i^T w, eq. (mlls-sample); w_hat its maximiser; the
target prior is p_t = p_s * w.

* :func:`identifiability` -- whether the reported estimate can be trusted, relative to each class's share: for MLLS
  each class's relative error and the pinned classes' bounds (the confusion matrix of a BBSE cross-check is
  information); for BBSE sigma_min(C) sqrt(n_source) >= BBSE_FLAG_SNR; optionally a maximum interval width.

It treats f and p_s as known. The derivation and how its thresholds were chosen are in ``docs/uncertainty.md``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import eigh as scipy_eigh

from .._numbers import finite_or_none, none_as_nan, written_dict
from .._validation import as_float_array
from ..errors import InputError
from ..estimation.diagnostics import confusion_condition
from ..estimation.estimators import BBSE_FLAG_SNR, MLLS_FLAG_M_SIGMA
from ..estimation.solvers import PIN_TOL, mlls_hessian, restricted_min_eigenvalue
from .intervals import PriorInterval, fisher_interval, pinned_bounds, tangent_covariance
from .mlls_inputs import check_inputs, check_mle
#: the worst standard error of w that still counts as identified: 1 / sqrt(MLLS_FLAG_M_SIGMA) = 1/2
MAX_STANDARD_ERROR = 1.0 / math.sqrt(MLLS_FLAG_M_SIGMA)
#: the largest relative error of a free class's estimate that still counts as identified: the standard error of
#: p_t(y) over max(p_t(y), p_s(y)) (= that of w_y over max(w_y, 1)); how it was chosen: ``docs/uncertainty.md``
MAX_RELATIVE_ERROR = 0.5

#: the estimators whose estimate is judged by the MLLS likelihood's own information (the others, BBSE, by the
#: conditioning of the confusion matrix they invert)
_LIKELIHOOD_ESTIMATORS = ("MLLS",)
#: the classes named in a reason about poorly estimated classes (the worst first); the rest are counted
_NAMED_CLASSES = 5


@dataclass(frozen=True)
class Identifiability:
    """Result of :func:`identifiability`: the numbers that say whether the estimate can be trusted.

    Attributes:
        min_hessian_eigenvalue: sigma, the minimum eigenvalue of H = (1/m) sum_i f_i f_i^T / (f_i^T w_hat)^2
            (Section 5, eq. bound-main).
        min_free_eigenvalue: the same on the coordinates with w_y > PIN_TOL.
        confusion_sigma_min, confusion_condition: smallest singular value and condition number of the given
            confusion matrix (None when none was given).
        n_source: labelled source examples behind the confusion matrix (None when not given).
        n_target: m.
        trustworthy: no reason below applies.
        reasons: one sentence per failed check, naming the number and its threshold.
        confusion_snr: sigma_min(C) sqrt(n_source) (None without a confusion matrix).
        pinned_bounds: per class, the one-standard-error upper bound on w_y for classes pinned at 0 (None for
            free classes); ``docs/uncertainty.md``.
        max_weight_width: the widest interval on w (None unless ``max_relative_width`` was given).
        relative_errors: per class, the standard error of w_y over max(w_y, 1) -- that of p_t(y) over the larger
            of its estimate and its source share -- (None for pinned classes; empty when not computed).
        estimator: the estimator judged: ``"MLLS"`` (its relative errors and pinned bounds give the reasons, the
            confusion matrix is information about a BBSE cross-check) or a BBSE one (the confusion matrix's
            conditioning gives the reason).
        notes: information that is not a reason (e.g. the conditioning of the BBSE cross-check's matrix).
    """

    min_hessian_eigenvalue: float
    min_free_eigenvalue: float
    confusion_sigma_min: float | None
    confusion_condition: float | None
    n_source: int | None
    n_target: int
    trustworthy: bool
    reasons: list[str]
    confusion_snr: float | None = None
    pinned_bounds: list = field(default_factory=list)
    max_weight_width: float | None = None
    relative_errors: list = field(default_factory=list)
    estimator: str = "MLLS"
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"min_hessian_eigenvalue": finite_or_none(self.min_hessian_eigenvalue),
                "min_free_eigenvalue": finite_or_none(self.min_free_eigenvalue),
                "confusion_sigma_min": None if self.confusion_sigma_min is None else finite_or_none(self.confusion_sigma_min),
                "confusion_condition": None if self.confusion_condition is None else finite_or_none(self.confusion_condition),
                "confusion_snr": None if self.confusion_snr is None else finite_or_none(self.confusion_snr),
                "n_source": self.n_source, "n_target": int(self.n_target), "trustworthy": bool(self.trustworthy),
                "reasons": list(self.reasons), "pinned_bounds": [None if b is None else finite_or_none(b)
                                                                 for b in self.pinned_bounds],
                "max_weight_width": None if self.max_weight_width is None else finite_or_none(self.max_weight_width),
                "relative_errors": [None if e is None else finite_or_none(e) for e in self.relative_errors],
                "estimator": self.estimator, "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, d: dict) -> "Identifiability":
        """The report that :meth:`to_dict` wrote (a None number read back as nan where one is required, as None
        where it is optional); ``from_dict(d).to_dict() == d``. Dicts written before ``relative_errors``,
        ``estimator`` and ``notes`` existed read back with none, ``"MLLS"`` and none."""
        d = written_dict(d, "identifiability", ("min_hessian_eigenvalue", "min_free_eigenvalue", "n_target",
                                            "trustworthy"))
        return cls(min_hessian_eigenvalue=none_as_nan(d["min_hessian_eigenvalue"]),
                   min_free_eigenvalue=none_as_nan(d["min_free_eigenvalue"]),
                   confusion_sigma_min=d.get("confusion_sigma_min"), confusion_condition=d.get("confusion_condition"),
                   n_source=d.get("n_source"), n_target=int(d["n_target"]), trustworthy=bool(d["trustworthy"]),
                   reasons=list(d.get("reasons") or []), confusion_snr=d.get("confusion_snr"),
                   pinned_bounds=list(d.get("pinned_bounds") or []), max_weight_width=d.get("max_weight_width"),
                   relative_errors=list(d.get("relative_errors") or []), estimator=str(d.get("estimator", "MLLS")),
                   notes=list(d.get("notes") or []))


def _min_eigenvalue(H: np.ndarray) -> float:
    """The smallest eigenvalue of the symmetric ``H`` (only that one is computed)."""
    return float(scipy_eigh(H, eigvals_only=True, subset_by_index=[0, 0])[0])


def _weight_std_errors(H: np.ndarray, w: np.ndarray, p: np.ndarray, free: np.ndarray, m: int,
                       interval: PriorInterval | None) -> np.ndarray:
    """(k,) the standard error of each free w_y: the MLLS interval's own when given (source-aware: target and
    holdout error together; Fisher or bootstrap: its error on p_t over p_s), else the target-only Fisher one of
    :func:`fisher_interval`; nan for pinned classes."""
    se = getattr(interval, "weights_std_error", None)
    if se is None and interval is not None and interval.std_error is not None:
        se = np.asarray(interval.std_error, dtype=np.float64) / p
    if se is None:
        se = np.sqrt(np.clip(np.diag(tangent_covariance(H, p, free)), 0.0, None) / m)
    return np.where(free, np.asarray(se, dtype=np.float64), np.nan)


def class_label(y: int, class_names=None) -> str:
    """How a reason names class ``y``: "class 3", or "class 'cat'" when the classes have names."""
    return f"class {class_names[y]!r}" if class_names is not None else f"class {y}"


def weight_label(y: int, class_names=None) -> str:
    """How a reason names the weight of class ``y``: "w_3", or "w_cat" when the classes have names."""
    return f"w_{class_names[y]}" if class_names is not None else f"w_{y}"


def _poorly_estimated(relative: np.ndarray, w: np.ndarray, p: np.ndarray, class_names=None) -> str | None:
    """The reason naming the free classes whose relative error exceeds MAX_RELATIVE_ERROR (worst first), or None."""
    bad = np.flatnonzero(np.nan_to_num(relative, nan=0.0) > MAX_RELATIVE_ERROR)
    if not bad.size:
        return None
    bad = bad[np.argsort(-relative[bad])]
    named = ", ".join(f"{class_label(y, class_names)} (source share {p[y]:.2%}, target estimate {p[y] * w[y]:.2%}: relative error "
                      f"{relative[y]:.2f})" for y in bad[:_NAMED_CLASSES])
    more = f" and {bad.size - _NAMED_CLASSES} more" if bad.size > _NAMED_CLASSES else ""
    return (f"{bad.size} of {len(w)} classes too poorly estimated to trust: {named}{more}. Relative error = the "
            f"standard error of the class's target share over the larger of its estimate and its source share; above "
            f"{MAX_RELATIVE_ERROR:g} (MAX_RELATIVE_ERROR) its interval cannot tell the class's share from zero or "
            "from twice as much. More target rows, or more labelled holdout rows of those classes, would narrow it")


def _confusion_check(confusion, n_source, k: int) -> tuple[float, float, float, str | None]:
    """(condition number, sigma_min, snr = sigma_min sqrt(n_source), the sentence when snr < BBSE_FLAG_SNR)."""
    C = as_float_array(confusion, "confusion", 2)
    if C.shape != (k, k):
        raise InputError(f"confusion has shape {C.shape} but there are {k} classes; pass the k x k joint "
                         "confusion matrix of the same classifier.")
    if np.any(C < 0) or abs(C.sum() - 1.0) > 1e-4:
        raise InputError(f"confusion must be the joint confusion matrix (non-negative entries summing to 1, "
                         f"e.g. BBSE().fit(...).confusion_); its entries sum to {C.sum():.6g}.")
    if n_source is None or isinstance(n_source, bool) or not isinstance(n_source, (int, np.integer)) \
            or n_source < 1:
        raise InputError(f"n_source must be the (positive integer) number of labelled source examples the "
                         f"confusion matrix was estimated from, got {n_source!r}.")
    cond, sigma_c = confusion_condition(C)
    snr = sigma_c * math.sqrt(n_source)
    sentence = None
    if not snr >= BBSE_FLAG_SNR:
        sentence = (f"confusion matrix near singular: sigma_min(C) * sqrt(n_source) = {sigma_c:.3g} * "
                    f"sqrt({n_source}) = {snr:.3g} < {BBSE_FLAG_SNR:g} (BBSE_FLAG_SNR; condition number {cond:.3g}), "
                    "so its sampling noise can make it singular")
    return cond, sigma_c, snr, sentence


def _width_check(P, w, p, interval, max_relative_width, level, class_names=None) -> tuple[float, str | None]:
    """(the widest interval on w, the sentence when it exceeds ``max_relative_width``)."""
    if isinstance(max_relative_width, bool) or not isinstance(max_relative_width, (int, float, np.floating)) \
            or not max_relative_width > 0:
        raise InputError(f"max_relative_width must be a positive number, got {max_relative_width!r}.")
    if interval is None:
        interval = fisher_interval(P, w, p, level=level)
    widths = np.asarray(interval.weights_upper) - np.asarray(interval.weights_lower)
    y = int(np.argmax(widths))
    max_width = float(widths[y])
    if max_width <= max_relative_width:
        return max_width, None
    return max_width, (f"interval too wide: the {interval.level:.0%} {interval.method} interval on "
                       f"{weight_label(y, class_names)} is "
                       f"[{interval.weights_lower[y]:.3g}, {interval.weights_upper[y]:.3g}], width {max_width:.3g} > "
                       f"max_relative_width = {max_relative_width:g}")


def identifiability(target_probs, weights, source_prior, *, confusion=None, n_source: int | None = None,
                    max_relative_width: float | None = None, interval: PriorInterval | None = None,
                    level: float = 0.95, estimator: str = "MLLS", hessian=None, class_names=None) -> Identifiability:
    """Is the reported estimate identified by the data? Judged on the estimate that is reported, relative to each
    class's share (the reasons are in ``docs/uncertainty.md``):

    * ``estimator="MLLS"`` (Section 5 of the paper): each free class's relative error -- the standard error of
      w_y over max(w_y, 1), from ``interval`` when given (the MLLS interval in use) or the Fisher information --
      at most MAX_RELATIVE_ERROR; for each pinned class, its one-standard-error bound on w_y at most
      MAX_STANDARD_ERROR. The confusion matrix, when given, is information about a BBSE cross-check (``notes``).
    * a BBSE estimator: sigma_min(C) sqrt(n_source) >= BBSE_FLAG_SNR (Lipton et al., 2018).
    * either: the interval on w no wider than ``max_relative_width`` (when given).

    Args:
        target_probs, weights, source_prior: as :func:`fisher_interval` (``weights``: the MLLS estimate or None).
        confusion: optional (k, k) *joint* confusion matrix of the classifier on labelled source data (entries sum
            to 1, index [predicted, true]; e.g. ``BBSE().fit(...).confusion_``). Needs ``n_source``.
        n_source: the number of labelled source examples ``confusion`` was estimated from.
        max_relative_width: optional bound on the width of the interval on each w_y (= width on p_t(y) / p_s(y)).
        interval: the MLLS interval in use (source-aware, Fisher or bootstrap); default the Fisher interval.
        level: level of that default interval.
        estimator: the estimator whose estimate is reported, a name of
            :data:`labelshift.estimation.registry.REESTIMATION_ESTIMATORS`.
        class_names: optional k names the reasons call the classes by (else 0..k-1).
        hessian: optional (k, k) :func:`~labelshift.estimation.solvers.mlls_hessian` at ``weights`` on these rows,
            already computed (the MLLS estimate's ``extra["hessian"]`` above 100 classes); None computes it.

    Raises:
        InputError: inputs as :func:`fisher_interval`; a confusion matrix that is not a k x k joint one, or without
            ``n_source``; a ``max_relative_width`` that is not positive; an interval for another k.
    """
    P, p = check_inputs(target_probs, source_prior)
    w = check_mle(P, weights, p)
    m, k = P.shape
    if interval is not None and len(interval.weights) != k:
        raise InputError(f"interval has {len(interval.weights)} classes but target_probs has {k}.")
    H = mlls_hessian(P, w) if hessian is None else as_float_array(hessian, "hessian", 2)
    if H.shape != (k, k):
        raise InputError(f"hessian has shape {H.shape} but there are {k} classes; pass mlls_hessian(target_probs, "
                         "weights) of these rows, or None.")
    free = w > PIN_TOL
    likelihood = estimator in _LIKELIHOOD_ESTIMATORS
    reasons, notes = [], []
    relative = _weight_std_errors(H, w, p, free, m, interval) / np.maximum(w, 1.0)
    bounds = [None] * k
    if likelihood:
        reasons.append(_poorly_estimated(relative, w, p, class_names))
        if not free.all():
            b1 = pinned_bounds(P, w, H, p, free, 1.0)
            for y in np.flatnonzero(~free):
                bounds[y] = float(b1[y])
                if not b1[y] <= MAX_STANDARD_ERROR:
                    reasons.append(
                        f"{class_label(y, class_names)} is estimated at w = 0 but not identified: its "
                        f"one-standard-error upper bound on {weight_label(y, class_names)} is {b1[y]:.3g} > {MAX_STANDARD_ERROR:g} (the likelihood is nearly flat when mass moves "
                        "into that class)")
    sigma_c = cond = snr = None
    if confusion is not None:
        cond, sigma_c, snr, sentence = _confusion_check(confusion, n_source, k)
        if sentence is not None:
            (notes if likelihood else reasons).append(
                sentence if not likelihood else f"BBSE cross-check: {sentence} (information only: the reported MLLS "
                                                "estimate is judged by its own relative errors)")
    elif n_source is not None:
        raise InputError("n_source was given without confusion; pass the joint confusion matrix it belongs to.")
    max_width = None
    if max_relative_width is not None:
        max_width, sentence = _width_check(P, w, p, interval, max_relative_width, level, class_names)
        reasons.append(sentence)
    reasons = [r for r in reasons if r is not None]
    return Identifiability(min_hessian_eigenvalue=_min_eigenvalue(H),
                           min_free_eigenvalue=float(restricted_min_eigenvalue(H, free)),
                           confusion_sigma_min=sigma_c, confusion_condition=cond,
                           n_source=None if n_source is None else int(n_source), n_target=m,
                           trustworthy=not reasons, reasons=reasons, confusion_snr=snr, pinned_bounds=bounds,
                           max_weight_width=max_width,
                           relative_errors=[None if not math.isfinite(e) else float(e) for e in relative],
                           estimator=str(estimator), notes=notes)
