"""The assessment of one target set: the estimate of the target prior, its interval, the test of "no shift", the
test of the label-shift assumption itself, the identifiability report and the cross-checks, as one typed
:class:`ShiftReport` made by :func:`assess_shift`.

:meth:`ShiftReport.to_dict` is the JSON form the ``reestimate`` flow stores (the ``result`` of its summary, in the
store and in MLflow) and :meth:`ShiftReport.from_dict` reads it back. What the numbers mean, and why the test is a
two-sample one, is in ``docs/reestimation.md`` and ``docs/uncertainty.md``.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from .. import rows as _rows
from .._validation import check_probabilities
from ..errors import FormatError, InputError, NotMaximiserError
from .accuracy import AccuracyEstimate, expected_accuracy
from .source_aware import SUPPORTED_CALIBRATORS, SourceAwareInterval, min_holdout_rows, source_aware_interval
from .repeats import Repeats, find_repeats
from .holdout import Holdout, Target, at_precision
from .settings import DEFAULTS, AssessmentSettings, check_setting
from .label_shift_test import (MAX_CONFIDENCE_BINS, MIN_REGION_ROWS, MIN_TARGET, LabelShiftTest, PreparedHoldout,
                               label_shift_test)
from ..estimation.registry import make_estimator
from ..estimation.solvers import confusion_matrix
from .identifiability import Identifiability, identifiability
from .miscalibration import MiscalibrationCheck, miscalibration_check, widened_interval
from .intervals import PriorInterval, bootstrap_interval, fisher_interval
from .no_shift import NoShiftTest, no_shift_test

__all__ = ["CrossCheck", "LargestChange", "ShiftReport", "assess_shift", "label_shift_holdout", "check_holdout",
           "joint_confusion", "finite", "Verdict", "VERDICTS", "NOT_LABEL_SHIFT", "verdict_of"]


class Verdict(StrEnum):
    """The verdict of a re-estimation, one word for the operator. A ``str`` (each member equals its value), so it
    is written to JSON, MLflow tags and Prefect state names as that string.

    A :class:`ShiftReport` gives one of the first four (:data:`VERDICTS`); the last two are the ``reestimate``
    flow's when it has nothing to assess.
    """

    #: the label-shift assumption itself is rejected (the weights then mean nothing)
    NOT_LABEL_SHIFT = "Not label shift"
    UNTRUSTWORTHY = "Untrustworthy"
    SHIFTED = "Shifted"
    NO_SHIFT = "No shift"
    #: every new batch was rejected or skipped
    NO_VALID_DATA = "No valid data"
    #: no batch arrived since the last run
    NO_NEW_DATA = "No new data"


#: the verdict when the label-shift assumption itself is rejected (the weights then mean nothing)
NOT_LABEL_SHIFT = Verdict.NOT_LABEL_SHIFT
#: the verdicts of a report, in the order they take precedence: data that are not label-shifted get no estimate,
#: and an untrustworthy estimate is not called shifted
VERDICTS = (Verdict.NOT_LABEL_SHIFT, Verdict.UNTRUSTWORTHY, Verdict.SHIFTED, Verdict.NO_SHIFT)

#: the estimator whose likelihood the test's companion diagnostics (the identifiability report) are computed on
_LIKELIHOOD = "MLLS"


def verdict_of(not_label_shift: bool, trustworthy: bool, shifted: bool) -> Verdict:
    """The verdict of a report's readings, in the precedence of :data:`VERDICTS`: "Not label shift" wins over
    everything, then "Untrustworthy" over the no-shift test."""
    if not_label_shift:
        return Verdict.NOT_LABEL_SHIFT
    if not trustworthy:
        return Verdict.UNTRUSTWORTHY
    return Verdict.SHIFTED if shifted else Verdict.NO_SHIFT


@dataclass(frozen=True)
class CrossCheck:
    """Another estimator's answer on the same target set, or why it gave none.

    Attributes:
        method: the estimator's name (:data:`labelshift.estimation.registry.REESTIMATION_ESTIMATORS`).
        target_prior, weights: its estimate, shape (k,); None when it failed.
        error: the message of its failure (e.g. BBSE refusing a singular confusion matrix); None when it succeeded.
    """

    method: str
    target_prior: np.ndarray | None = None
    weights: np.ndarray | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict:
        if self.error is not None:
            return {"error": self.error}
        return {"target_prior": np.asarray(self.target_prior).tolist(), "weights": np.asarray(self.weights).tolist()}

    @classmethod
    def from_dict(cls, method: str, d: dict) -> "CrossCheck":
        if not isinstance(d, dict) or not ("error" in d or "target_prior" in d):
            raise FormatError(f"cross_check[{method!r}] must be a dict with 'target_prior' and 'weights' or with "
                              f"'error', as CrossCheck.to_dict() writes; got {d!r}.")
        if "error" in d:
            return cls(method, error=str(d["error"]))
        return cls(method, target_prior=np.asarray(d["target_prior"], dtype=np.float64),
                   weights=None if d.get("weights") is None else np.asarray(d["weights"], dtype=np.float64))


@dataclass(frozen=True)
class LargestChange:
    """The class whose prior moved most between source and target (largest |p_t(y) - p_s(y)|)."""

    label: int
    source: float
    target: float

    @property
    def change(self) -> float:
        return self.target - self.source

    def to_dict(self) -> dict:
        return {"class": self.label, "source": self.source, "target": self.target, "change": self.change}


@dataclass(frozen=True)
class ShiftReport:
    """Result of :func:`assess_shift`: is the target label distribution shifted, by how much, and can the estimate
    be trusted.

    Attributes:
        method: the estimator of the target prior (a name of
            :data:`labelshift.estimation.registry.REESTIMATION_ESTIMATORS`).
        source_prior: p_s, shape (k,).
        target_prior: its estimate p_t = w * p_s (renormalised, :class:`labelshift.Estimate`), shape (k,).
        weights: the estimated w = p_t / p_s, shape (k,).
        interval: the confidence interval per class on p_t and w (source-aware, Fisher or bootstrap).
        no_shift_test: the test of H0: w = 1.
        label_shift: the test of the label-shift assumption
            (:func:`labelshift.inference.label_shift_test.label_shift_test`); None when it was not run (see
            ``label_shift_error``).
        label_shift_error: why the label-shift test could not run (e.g. too small a holdout); None when it ran or
            was not asked for.
        identifiability: the identifiability report of the MLLS estimate (Section 5 of the paper).
        cross_check: other estimators' answers, by name, in the order asked for.
        significance: the level of the no-shift test (the target counts as shifted when its p-value is below it),
            and of the label-shift test unless ``label_shift_significance`` is set.
        n_target: the number of target rows m.
        converged: the estimator reached its tolerance.
        accuracy: the deployed model's accuracy on the holdout and its expected accuracy on the target, with an
            interval (:func:`labelshift.inference.accuracy.expected_accuracy`); None unless the interval is
            source-aware.
        label_shift_significance: a level of its own for the label-shift test (e.g. 0.01, so that true label
            shift withholds the outputs less often); None: the test uses ``significance``
            (:attr:`label_shift_level` is the one in force).
        miscalibration: MLLS against the calibration-free moment estimate p_c = A^{-1} E_t[f / f^T w], the
            measured miscalibration term of eq. (bound-main)
            (:func:`labelshift.inference.miscalibration.miscalibration_check`); the interval always includes p_c's,
            and when the two differ beyond their sampling error the check acts and the estimate is untrustworthy
            (its sentence among :attr:`reasons`). None when not run (another estimator than MLLS, or
            ``miscalibration_check=False``).
        failures: one plain sentence per part of the assessment that could not be computed on this (valid) input,
            e.g. the source-aware interval on a holdout that does not identify the calibrator; the estimate is then
            untrustworthy (they are among :attr:`reasons`). Empty when every part was computed.

    Derived: :attr:`shifted`, :attr:`label_shift_level`, :attr:`label_shift_ok`, :attr:`trustworthy`, :attr:`reasons`,
    :attr:`verdict`, :attr:`total_variation`, :attr:`largest_change`, :attr:`n_classes`.
    """

    method: str
    source_prior: np.ndarray
    target_prior: np.ndarray
    weights: np.ndarray
    interval: PriorInterval
    no_shift_test: NoShiftTest
    identifiability: Identifiability
    significance: float
    n_target: int
    converged: bool = True
    cross_check: dict[str, CrossCheck] = field(default_factory=dict)
    label_shift: LabelShiftTest | None = None
    label_shift_error: str | None = None
    accuracy: AccuracyEstimate | None = None
    label_shift_significance: float | None = None
    failures: list[str] = field(default_factory=list)
    repeats: Repeats | None = None
    miscalibration: MiscalibrationCheck | None = None

    @property
    def n_classes(self) -> int:
        return int(len(self.target_prior))

    @property
    def shifted(self) -> bool:
        """The no-shift test rejects w = 1 at :attr:`significance`."""
        return bool(self.no_shift_test.rejects(self.significance))

    @property
    def label_shift_level(self) -> float:
        """The level the label-shift test is judged at: :attr:`label_shift_significance` when set, else
        :attr:`significance`."""
        return self.significance if self.label_shift_significance is None else self.label_shift_significance

    @property
    def label_shift_ok(self) -> bool | None:
        """The label-shift test does not reject at :attr:`label_shift_level`; None when it was not run."""
        if self.label_shift is None:
            return None
        return not self.label_shift.rejects(self.label_shift_level)

    @property
    def label_shift_tested(self) -> bool:
        """The report carries an outcome of the label-shift test (a result, or why it could not run)."""
        return self.label_shift is not None or self.label_shift_error is not None

    @property
    def reasons(self) -> list[str]:
        """Why the estimate is not trustworthy: the identifiability report's reasons, then the interval's, then the
        parts that could not be computed (:attr:`failures`), then the miscalibration check's when it acts."""
        mis = self.miscalibration.reason if self.miscalibration is not None else None
        return [*self.identifiability.reasons, *(getattr(self.interval, "reasons", None) or []), *self.failures,
                *([mis] if mis else [])]

    @property
    def trustworthy(self) -> bool:
        """No identifiability check failed, the interval is trustworthy and every part was computed (the reasons are
        in :attr:`reasons`) and the miscalibration check does not act."""
        return bool(self.identifiability.trustworthy) and bool(getattr(self.interval, "trustworthy", True)) \
            and not self.failures and not (self.miscalibration is not None and self.miscalibration.acts)

    @property
    def verdict(self) -> Verdict:
        """One word for the operator, one of :data:`VERDICTS` (:func:`verdict_of` its tests and trust)."""
        return verdict_of(self.label_shift_ok is False, self.trustworthy, self.shifted)

    @property
    def label_shift_summary(self) -> str | None:
        """One line on the label-shift test: its verdict, statistic, p-value and where the target disagrees; or
        why it was not run (None when it was not asked for). With a level of its own
        (:attr:`label_shift_significance`) the line names that level; without one it reads as it always did."""
        if self.label_shift is not None:
            return self.label_shift.summary(self.label_shift_level,
                                            show_level=self.label_shift_significance is not None)
        if self.label_shift_error is not None:
            return f"Label-shift test not run: {self.label_shift_error}"
        return None

    @property
    def total_variation(self) -> float:
        """(1/2) sum_y |p_t(y) - p_s(y)|."""
        return 0.5 * float(np.abs(self.target_prior - self.source_prior).sum())

    @property
    def largest_change(self) -> LargestChange:
        top = int(np.argmax(np.abs(self.target_prior - self.source_prior)))
        return LargestChange(top, float(self.source_prior[top]), float(self.target_prior[top]))

    def to_dict(self) -> dict:
        """JSON-able: the ``result`` of the ``reestimate`` flow's summary (lists of floats; nan as None inside
        the interval, the test and the identifiability report)."""
        change = self.target_prior - self.source_prior
        top = int(np.argmax(np.abs(change)))
        return {
            "method": self.method, "n_target": int(self.n_target), "n_classes": self.n_classes,
            "source_prior": self.source_prior.tolist(), "target_prior": self.target_prior.tolist(),
            "weights": self.weights.tolist(), "interval": self.interval.to_dict(),
            "no_shift_test": self.no_shift_test.to_dict(), "identifiability": self.identifiability.to_dict(),
            "cross_check": {name: check.to_dict() for name, check in self.cross_check.items()},
            "significance": self.significance,
            # only when set, so that a report without its own level is written as before
            **({"label_shift_significance": self.label_shift_significance}
               if self.label_shift_significance is not None else {}),
            "shifted": self.shifted, "trustworthy": self.trustworthy,
            "total_variation": self.total_variation,
            "largest_change": {"class": top, "source": float(self.source_prior[top]),
                               "target": float(self.target_prior[top]), "change": float(change[top])},
            "converged": bool(self.converged),
            **({"label_shift_test": (self.label_shift.to_dict() if self.label_shift is not None
                                     else {"error": self.label_shift_error}),
                "label_shift_ok": self.label_shift_ok, "label_shift_summary": self.label_shift_summary}
               if self.label_shift_tested else {}),
            **({"accuracy": self.accuracy.to_dict()} if self.accuracy is not None else {}),
            # only when some part failed, so that a complete report is written as before
            **({"failures": list(self.failures)} if self.failures else {}),
            # only when target rows repeat, so that a report of distinct rows is written as before
            **({"repeats": self.repeats.to_dict(), "repeats_summary": self.repeats_summary}
               if self.repeats_summary is not None else {}),
            # only when it ran, so that a report without it is written as before
            **({"miscalibration": self.miscalibration.to_dict()} if self.miscalibration is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ShiftReport":
        """The report that :meth:`to_dict` wrote (e.g. ``summary["result"]`` of a stored summary JSON).

        The derived entries (``n_classes``, ``shifted``, ``trustworthy``, ``total_variation``,
        ``largest_change``) are recomputed from the others, so ``from_dict(d).to_dict() == d`` for every ``d``
        that :meth:`to_dict` wrote. Dicts written before the label-shift test existed (no ``label_shift_test``)
        read back without one, and dicts without ``label_shift_significance`` (written before it existed, or
        without a level of its own) judge the label-shift test at ``significance``; dicts without ``failures``
        (written before it existed, or with every part computed) read back with none. Raises FormatError when an
        entry is missing.
        """
        if not isinstance(d, dict):
            raise FormatError(f"a shift report must be a dict as ShiftReport.to_dict() writes, got "
                              f"{type(d).__name__}.")
        missing = [k for k in ("method", "n_target", "source_prior", "target_prior", "weights", "interval",
                               "no_shift_test", "identifiability", "significance") if k not in d]
        if missing:
            raise FormatError(f"the shift report lacks {', '.join(missing)}; pass the 'result' of a re-estimation "
                              "summary (ShiftReport.to_dict()).")
        lst, lst_error = None, None
        stored = d.get("label_shift_test")
        if stored is not None:
            if not isinstance(stored, dict):
                raise FormatError(f"label_shift_test must be a dict as LabelShiftTest.to_dict() writes, or "
                                  f"{{'error': ...}}; got {stored!r}.")
            if "error" in stored:
                lst_error = str(stored["error"])
            else:
                lst = LabelShiftTest.from_dict(stored)
        interval = d["interval"]
        interval_cls = SourceAwareInterval if isinstance(interval, dict) and \
            interval.get("method") == "source-aware" else PriorInterval
        return cls(method=str(d["method"]), source_prior=np.asarray(d["source_prior"], dtype=np.float64),
                   target_prior=np.asarray(d["target_prior"], dtype=np.float64),
                   weights=np.asarray(d["weights"], dtype=np.float64),
                   interval=interval_cls.from_dict(interval),
                   no_shift_test=NoShiftTest.from_dict(d["no_shift_test"]),
                   identifiability=Identifiability.from_dict(d["identifiability"]),
                   significance=float(d["significance"]), n_target=int(d["n_target"]),
                   converged=bool(d.get("converged", True)),
                   cross_check={name: CrossCheck.from_dict(name, c) for name, c in (d.get("cross_check") or {}).items()},
                   label_shift=lst, label_shift_error=lst_error,
                   accuracy=AccuracyEstimate.from_dict(d["accuracy"]) if d.get("accuracy") else None,
                   label_shift_significance=_stored_level(d.get("label_shift_significance")),
                   failures=[str(f) for f in d.get("failures") or []],
                   repeats=Repeats.from_dict(d["repeats"]) if d.get("repeats") else None,
                   miscalibration=(MiscalibrationCheck.from_dict(d["miscalibration"]) if d.get("miscalibration")
                                   else None))

    @property
    def repeats_summary(self) -> str | None:
        """One sentence on the target rows that repeat and what that changed; None when no row repeats."""
        if self.repeats is None:
            return None
        return self.repeats.summary(test=self.label_shift is not None,
                                    interval=getattr(self.interval, "method", "") != "bootstrap")

    @property
    def accuracy_summary(self) -> str | None:
        """One phrase on the deployed model's accuracy, e.g. "accuracy estimated 0.91 [0.89, 0.93], 0.95 on the
        source"; None without an accuracy estimate."""
        acc = self.accuracy
        if acc is None:
            return None
        return (f"accuracy estimated {acc.expected:.2f} [{acc.lower:.2f}, {acc.upper:.2f}], {acc.source:.2f} on the "
                "source")


def _stored_level(value) -> float | None:
    """``label_shift_significance`` as a stored report holds it: None (absent) or a level in (0, 1)."""
    if value is None:
        return None
    try:
        return check_setting("label_shift_significance", value)
    except InputError:
        raise FormatError(f"label_shift_significance must be a level strictly between 0 and 1 as "
                          f"ShiftReport.to_dict() writes, or absent; got {value!r}.") from None


def finite(x) -> bool:
    """``x`` is a number (not None) and finite: what the stored JSON keeps (nan and inf are written as None)."""
    return x is not None and math.isfinite(float(x))


def joint_confusion(probs, labels) -> np.ndarray:
    """The joint confusion matrix C[predicted, true] of the hard predictions on labelled source data (entries sum
    to 1; the matrix BBSE inverts, Lipton et al. 2018), computed directly so that the identifiability report has
    it even when BBSE refuses a singular one."""
    probs = np.asarray(probs)
    return confusion_matrix(probs, labels, probs.shape[1], soft=False)


def check_holdout(source_labels, n_classes: int, *, interval: str = DEFAULTS.interval, calibrator=None) -> None:
    """The labelled source holdout can carry a re-estimation with this interval; InputError naming the fix if not.

    Every class needs a holdout example (p_s(y), the calibrator's bias and the class-conditional outputs of a class
    without one are not estimable); ``interval="source-aware"`` also needs a calibrator whose parameters it knows
    (:data:`labelshift.inference.source_aware.SUPPORTED_CALIBRATORS`) and a holdout large enough to refit it
    (:func:`labelshift.inference.source_aware.min_holdout_rows`).
    """
    labels = np.asarray(source_labels)
    counts = np.bincount(labels.astype(np.int64), minlength=n_classes) if labels.size else np.zeros(n_classes, int)
    missing = np.flatnonzero(counts[:n_classes] == 0).tolist()
    if missing:
        raise InputError(f"the labelled source holdout has no example of class(es) {missing}: their source prior, "
                         "calibration and class-conditional outputs cannot be estimated. Add labelled holdout rows of "
                         "those classes and register the model (or reference) again with them, so that the "
                         "calibrator is refit on a holdout that covers every class.")
    if interval != "source-aware":
        return
    kind = getattr(calibrator, "kind", None)
    if kind not in SUPPORTED_CALIBRATORS:
        raise InputError(f"interval 'source-aware' needs a scaling calibrator ({', '.join(SUPPORTED_CALIBRATORS)}) "
                         f"whose parameters it can propagate, got {kind or type(calibrator).__name__!r}; use "
                         "calibrator BCTS (the default), or interval 'bootstrap' or 'fisher' (both treat the "
                         "calibrator and p_s as known).")
    need = min_holdout_rows(kind, n_classes)
    if labels.size < need:
        raise InputError(f"the labelled source holdout has {labels.size} rows, too few to refit the {kind} calibrator "
                         f"and estimate its error: interval 'source-aware' needs at least {need}. Label more "
                         "holdout rows and register the model again, or use interval 'fisher' (which treats the "
                         "calibrator and p_s as known, and is too short when the target is not small next to the "
                         "holdout).")


#: how a part of the assessment fails numerically on valid input (an InputError, also a ValueError, is the user's)
_NUMERICAL_FAILURES = (ArithmeticError, ValueError, np.linalg.LinAlgError)


def _source_aware_parts(source_outputs, labels, raw_target, calibrator, pooled, prior, weights,
                        level, repeats: Repeats | None = None, class_names=None
                        ) -> tuple[PriorInterval, AccuracyEstimate | None, list[str]]:
    """The source-aware interval and the expected accuracy of :func:`assess_shift`, and one plain sentence per part
    that could not be computed on this input.

    An InputError (the user's: e.g. a calibrator fit on other rows) propagates. A numerical failure of the interval
    (a singular or non-finite matrix where the holdout does not identify the calibrator) gives the target-only
    Fisher interval of the same estimate, without the accuracy, and a sentence that says so; one of the accuracy
    estimate gives no accuracy and a sentence. Either makes the report Untrustworthy (:attr:`ShiftReport.failures`).
    An accuracy refused with an InputError (e.g. a class the holdout never predicts right) is left out, as before.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # its checks are reported as reasons, as data
            try:
                ci = source_aware_interval(source_outputs, labels, raw_target, calibrator, level=level,
                                           weights=weights, repeats=repeats, class_names=class_names)
            except NotMaximiserError:            # the rows made again from the raw outputs: solve MLLS on them
                weights = None
                ci = source_aware_interval(source_outputs, labels, raw_target, calibrator, level=level,
                                           repeats=repeats, class_names=class_names)
    except InputError:
        raise
    except _NUMERICAL_FAILURES as exc:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ci = fisher_interval(pooled, weights, prior, level=level, repeats=repeats)
        return ci, None, [f"the interval that includes the holdout's error could not be computed "
                          f"({type(exc).__name__}: {exc}; most likely the holdout does not identify the calibrator's "
                          "parameters): the interval shown is the target-only one, which leaves that error out, and "
                          "the accuracy is not estimated"]
    try:
        accuracy = expected_accuracy(source_outputs, labels, raw_target, calibrator, weights=weights, level=level,
                                     interval=ci)
    except InputError:                  # e.g. a class the holdout never predicts right: reported without it
        return ci, None, []
    except _NUMERICAL_FAILURES as exc:
        return ci, None, [f"the expected accuracy on the target could not be computed ({type(exc).__name__}: {exc})"]
    return ci, accuracy, []


def _checked_target(target_probs, n_classes: int) -> np.ndarray:
    """A target's (pooled) probabilities as a checked (m, k) float array."""
    pooled = check_probabilities(target_probs, "target_probs", 2)
    if pooled.shape[1] != n_classes:
        raise InputError(f"target_probs has {pooled.shape[1]} class columns but source_probs has {n_classes}; pass "
                         "the calibrated outputs of the same classifier on both.")
    return pooled


def _raw_target(interval: str, source_outputs, target_outputs, n_target: int):
    """The raw target outputs the source-aware interval needs (pooled), checked against the target; None for the
    other intervals."""
    if interval != "source-aware":
        return None
    if source_outputs is None or target_outputs is None:
        raise InputError("interval 'source-aware' needs the classifier's raw outputs on the holdout and the target "
                         "(source_outputs, target_outputs) and the calibrator; pass them, or use interval "
                         "'fisher'.")
    raw_target = target_outputs
    if np.shape(raw_target)[0] != n_target:
        raise InputError(f"target_outputs has {np.shape(raw_target)[0]} rows but target_probs has "
                         f"{n_target}; pass the raw outputs of the same target rows, in the same order.")
    return raw_target


def _solved(estimate) -> np.ndarray | None:
    """An MLLS estimate's weights for the statistics that check their optimality: those of a converged solve
    (certified to the solver's duality gap), or None when it did not converge -- each statistic then solves MLLS
    on its own rows rather than refusing the weights."""
    return np.asarray(estimate.weights) if np.all(estimate.converged) else None


@dataclass(frozen=True)
class _Estimates:
    """The fitted main estimator, its estimate, the MLLS estimate (the basis of the identifiability report and the
    tests) and the cross-checks."""

    main_fit: object
    main: object
    mlls: object
    checks: dict[str, CrossCheck]


def _estimate(holdout_probs, labels, prior, pooled, estimator: str, cross_check: list[str]) -> _Estimates:
    """Fit ``estimator``, MLLS and the cross-check estimators on the holdout and estimate on the pooled target.

    A cross-check estimator that fails to fit (e.g. BBSE refusing a singular confusion matrix) is reported with its
    error; the main one failing raises. With another main estimator, MLLS is always shown beside it."""
    fits = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # flags are reported in the identifiability report, as data
        for method in dict.fromkeys([estimator, _LIKELIHOOD, *cross_check]):
            try:
                fits[method] = make_estimator(method).fit(holdout_probs, labels, prior)
            except Exception as exc:             # e.g. BBSE refusing a singular confusion matrix
                fits[method] = exc
        if isinstance(fits[estimator], Exception):
            raise fits[estimator]
        main = fits[estimator].estimate(pooled)
        mlls = fits[_LIKELIHOOD].estimate(pooled) if estimator != _LIKELIHOOD else main
        checks = {}
        for method in dict.fromkeys([*cross_check, *([_LIKELIHOOD] if estimator != _LIKELIHOOD else [])]):
            if method == estimator:
                continue
            fit = fits[method]
            if isinstance(fit, Exception):
                checks[method] = CrossCheck(method, error=str(fit))
                continue
            other = mlls if method == _LIKELIHOOD else fit.estimate(pooled)
            checks[method] = CrossCheck(method, target_prior=np.asarray(other.target_prior),
                                        weights=np.asarray(other.weights))
    return _Estimates(fits[estimator], main, mlls, checks)


def _interval(interval: str, est: _Estimates, pooled, prior, *, level, n_bootstrap, seed, source_outputs, labels,
              raw_target, calibrator, repeats: Repeats | None = None, class_names=None
              ) -> tuple[PriorInterval, AccuracyEstimate | None, list[str]]:
    """The interval asked for, the expected accuracy (source-aware only) and the parts that could not be
    computed (:func:`_source_aware_parts`). The source-aware and Fisher intervals count target rows that repeat as
    clusters (``repeats``); the bootstrap resamples rows as they are."""
    if interval == "bootstrap":
        return bootstrap_interval(pooled, prior, estimator=est.main_fit, level=level, n_bootstrap=n_bootstrap,
                                  seed=seed), None, []
    if interval == "source-aware":
        return _source_aware_parts(source_outputs, labels, raw_target, calibrator, pooled, prior, _solved(est.main),
                                   level, repeats, class_names)
    return fisher_interval(pooled, _solved(est.main), prior, level=level, repeats=repeats), None, []


def _label_shift_part(holdout, labels, pooled, mlls_weights, prior, class_names,
                      prepared: PreparedHoldout | None = None, repeats: Repeats | None = None,
                      holdout_inflation: float | None = None) -> tuple[LabelShiftTest | None, str | None]:
    """The label-shift test with the MLLS weights, or why it was not run: a holdout it cannot use (an InputError,
    e.g. too small for its regions) or a numerical failure on valid input is recorded as "not run", never raised.
    ``holdout``: the calibrated holdout at the target's precision (:func:`~labelshift.inference.holdout.at_precision`); ``prepared``
    (:func:`label_shift_holdout`) is used when it was made from this holdout at this precision. When target rows
    repeat (``repeats.adjusts``) the test runs on the distinct rows (their null fit starts at w = 1: their prior is
    not the target's), a label-shifted sample again (``labelshift.inference.repeats``)."""
    if prepared is not None and not prepared.matches(holdout, labels, MIN_REGION_ROWS, MAX_CONFIDENCE_BINS):
        prepared = None
    weights = None if mlls_weights is None else np.maximum(np.asarray(mlls_weights), 0.0)
    if repeats is not None and repeats.adjusts:
        if repeats.kept_rows < MIN_TARGET:
            return None, (f"the target's {repeats.n_rows:,} rows hold only {repeats.kept_rows:,} rows once each "
                          f"copy of a repeated row is counted once, fewer than the {MIN_TARGET} the test needs; "
                          "collect more distinct target rows (a longer window, or several batches together)")
        pooled, weights = pooled[repeats.test_rows], None
    try:
        return label_shift_test(holdout, labels, pooled, weights=weights, source_prior=prior,
                                class_names=class_names, prepared=prepared,
                                holdout_inflation=holdout_inflation), None
    except InputError as exc:
        return None, str(exc)
    except _NUMERICAL_FAILURES as exc:
        return None, f"it could not be computed on this input ({type(exc).__name__}: {exc})"


def _checks(holdout: Holdout, rounded, pooled, est: _Estimates, ci, repeats: Repeats,
            settings: AssessmentSettings):
    """The no-shift test, the label-shift test (or why not; None, None when not asked for) and the identifiability
    report of :func:`assess_shift`, with k x k decompositions on one BLAS thread above 100 classes. ``rounded``:
    the holdout at the target's precision."""
    probs, labels, prior = holdout.probs, holdout.labels, holdout.prior
    with _rows.decomposition_threads(holdout.n_classes):
        test = no_shift_test(pooled, _solved(est.mlls), prior, source_probs=probs, repeats=repeats)
        lst, lst_error = (_label_shift_part(rounded, labels, pooled, _solved(est.mlls), prior, holdout.class_names,
                                            holdout.label_shift_part, repeats,
                                            settings.label_shift_holdout_inflation)
                          if settings.label_shift_check else (None, None))
        ident = identifiability(pooled, _solved(est.mlls), prior, confusion=joint_confusion(probs, labels),
                                n_source=len(labels), interval=ci if settings.estimator == _LIKELIHOOD else None,
                                max_relative_width=settings.max_interval_width, estimator=settings.estimator,
                                hessian=est.mlls.extra.get("hessian"), class_names=holdout.class_names)
    return test, lst, lst_error, ident


def _miscalibration(rounded, labels, pooled, est: _Estimates, repeats: Repeats) -> MiscalibrationCheck:
    """The miscalibration check of the MLLS estimate (:func:`miscalibration_check`), with the target's effective
    rows when rows repeat. A numerical failure is recorded as the check's error, never raised."""
    eff = repeats.effective_rows if repeats is not None and repeats.adjusts else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return miscalibration_check(rounded, labels, pooled, est.mlls.weights, est.mlls.target_prior,
                                        effective_rows=eff)
    except _NUMERICAL_FAILURES as exc:
        return MiscalibrationCheck(error=f"it could not be computed on this input ({type(exc).__name__}: {exc})")


def _checked_arguments(holdout, target, settings) -> tuple[Holdout, Target, AssessmentSettings]:
    """The arguments of :func:`assess_shift` as their types (a bare target array becomes a :class:`Target`);
    InputError naming the one of another type."""
    if not isinstance(holdout, Holdout):
        raise InputError(f"holdout must be a labelshift.inference.holdout.Holdout(probs, labels, prior, ...), got "
                         f"{type(holdout).__name__}; build it once from the labelled source holdout.")
    if not isinstance(settings, AssessmentSettings):
        raise InputError(f"settings must be a labelshift.inference.settings.AssessmentSettings, got "
                         f"{type(settings).__name__}; e.g. AssessmentSettings(interval='fisher').")
    return holdout, target if isinstance(target, Target) else Target(target), settings


def _few_distinct_rows(repeats: Repeats) -> list[str]:
    """A sentence when the target's rows, each repeated row counted once, are too few to estimate from (fewer than
    the label-shift test's MIN_TARGET); none otherwise."""
    if not repeats.adjusts or repeats.kept_rows >= MIN_TARGET:
        return []
    return [f"the target's {repeats.n_rows:,} rows repeat only {repeats.kept_rows:,} distinct rows (an effective "
            f"sample of {repeats.effective_rows:,.1f} rows): too few to estimate the target prior; collect more "
            "distinct target rows"]


def label_shift_holdout(holdout: Holdout, target_probs) -> PreparedHoldout | None:
    """The label-shift test's work on ``holdout`` at the precision of ``target_probs``
    (:meth:`Holdout.prepared_for` keeps it on the holdout), or None when the holdout cannot carry the test."""
    return holdout.prepared_for(target_probs).label_shift_part


def assess_shift(holdout: Holdout, target, settings: AssessmentSettings = DEFAULTS) -> ShiftReport:
    """Estimate the target prior on ``target`` and say whether it shifted and whether to trust it.

    The estimators are fit on the labelled holdout with its prior p_s. The interval is
    :func:`~labelshift.inference.source_aware.source_aware_interval` (MLLS; includes the holdout's error),
    :func:`~labelshift.inference.intervals.fisher_interval` (MLLS, eq. (mlls-sample); target only) or
    :func:`~labelshift.inference.intervals.bootstrap_interval`; the label-shift test is
    :func:`~labelshift.inference.label_shift_test.label_shift_test` with the MLLS weights (recorded as "not run",
    with the reason, when the holdout cannot carry it); the no-shift test is
    :func:`~labelshift.inference.no_shift.no_shift_test`; the identifiability report is the MLLS estimate's
    (Section 5, eq. (bound-main)). MLLS is fit whatever the estimator is and shown beside another as a cross-check;
    a cross-check that fails is reported with its error. ``docs/reestimation.md`` explains the numbers.

    Args:
        holdout: the labelled source holdout (:class:`~labelshift.inference.holdout.Holdout`: calibrated outputs,
            labels, p_s; the raw outputs and the calibrator for ``interval="source-aware"``; class names).
        target: a :class:`~labelshift.inference.holdout.Target` (calibrated outputs, and the raw ones for the
            source-aware interval), or its (m, k) calibrated outputs (or a list of batches) alone.
        settings: the :class:`~labelshift.inference.settings.AssessmentSettings` (default: the ``reestimate``
            flow's defaults).

    Returns:
        The :class:`ShiftReport`.

    Raises:
        InputError: a holdout without an example of some class (or, for ``"source-aware"``, too small, an
            unsupported calibrator, no raw outputs), a target that does not fit the holdout; whatever the main
            estimator raises (e.g. IllConditionedError).
    """
    holdout, target, settings = _checked_arguments(holdout, target, settings)
    check_holdout(holdout.labels, holdout.n_classes, interval=settings.interval, calibrator=holdout.calibrator)
    pooled = _checked_target(target.probs, holdout.n_classes)
    raw_target = _raw_target(settings.interval, holdout.outputs, target.outputs, pooled.shape[0])
    prior = holdout.prior
    estimator = settings.estimator

    est = _estimate(holdout.probs, holdout.labels, prior, pooled, estimator, settings.cross_check)
    rounded = at_precision(holdout.probs, target.probs)   # the holdout at the target's precision
    repeats = find_repeats(pooled, rounded)
    ci, accuracy, failures = _interval(settings.interval, est, pooled, prior, level=settings.level,
                                       n_bootstrap=settings.n_bootstrap, seed=settings.seed,
                                       source_outputs=holdout.outputs, labels=holdout.labels, raw_target=raw_target,
                                       calibrator=holdout.calibrator, repeats=repeats,
                                       class_names=holdout.class_names)
    failures += _few_distinct_rows(repeats)
    test, lst, lst_error, ident = _checks(holdout, rounded, pooled, est, ci, repeats, settings)
    mis = (_miscalibration(rounded, holdout.labels, pooled, est, repeats)
           if estimator == _LIKELIHOOD and settings.miscalibration_check else None)
    ci = widened_interval(ci, mis, prior) if mis is not None else ci
    significance = settings.significance
    return ShiftReport(method=estimator, source_prior=prior, target_prior=np.asarray(est.main.target_prior),
                       weights=np.asarray(est.main.weights), interval=ci, no_shift_test=test, identifiability=ident,
                       significance=significance, n_target=int(pooled.shape[0]),
                       converged=bool(np.all(est.main.converged)), cross_check=est.checks, label_shift=lst,
                       label_shift_error=lst_error, accuracy=accuracy,
                       label_shift_significance=settings.label_shift_significance, failures=failures,
                       repeats=repeats, miscalibration=mis)
