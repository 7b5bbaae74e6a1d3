"""The two data sides of an assessment (:func:`labelshift.inference.report.assess_shift`): the labelled source
holdout a deployed classifier was calibrated on (:class:`Holdout`, made once per model and checked when made) and
the unlabelled target set it meets (:class:`Target`, its batches pooled once).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._validation import check_labels, check_prior, check_probabilities
from ..errors import InputError
from ..partitions import is_partitioned
from .label_shift_test import prepare_holdout

__all__ = ["Holdout", "Target", "pooled", "at_precision", "calibrated_probs"]


def pooled(rows) -> np.ndarray | None:
    """One (m, k) array from an array or a list of (m_b, k) batches (None, and rows held in partitions
    (:class:`~labelshift.partitions.PartitionedRows`), stay as they are: never gathered)."""
    if rows is None or isinstance(rows, np.ndarray) or is_partitioned(rows):
        return rows
    if isinstance(rows, Sequence) and not isinstance(rows, (str, bytes)) and len(rows) \
            and all(np.ndim(b) == 2 for b in rows):
        return np.concatenate([np.asarray(b) for b in rows])
    return np.asarray(rows)


def at_precision(holdout: np.ndarray, target) -> np.ndarray:
    """The holdout's probabilities rounded to the precision the target's were given in (e.g. float32, as the flow
    stores them), so that the label-shift test compares like with like: float32 turns every confidence within
    6e-8 of 1 into exactly 1, which the holdout's float64 confidences never reach, and the test would see that
    rounding as a difference between the two (a fraud-like model's target was called Not label shift in 2 of 3
    seeds). The holdout as it is when the target is float64. Rows in partitions: their dtype."""
    dtype = target.dtype if isinstance(target, np.ndarray) or is_partitioned(target) else np.float64
    if not np.issubdtype(dtype, np.floating) or np.finfo(dtype).eps <= np.finfo(np.float64).eps:
        return holdout
    return holdout.astype(dtype).astype(np.float64)


def calibrated_probs(outputs: np.ndarray, calibrator) -> np.ndarray:
    """The float32 calibrated probabilities of (m, k) raw outputs, as the flow stores a target's
    (``calibrator.predict_proba`` of the outputs in float64, rounded to float32); (0, k) for no rows. The transform
    of :meth:`Target.from_partitioned_outputs`, run on each partition where it lives."""
    outputs = np.asarray(outputs)
    if outputs.shape[0] == 0:
        return np.empty(outputs.shape, dtype=np.float32)
    return np.asarray(calibrator.predict_proba(outputs.astype(np.float64)), dtype=np.float32)


@dataclass(frozen=True, eq=False)
class Holdout:
    """The labelled source holdout of a deployed classifier, against which every target set is assessed.

    Attributes:
        probs: (n, k) calibrated outputs on the holdout (error messages call it ``source_probs``).
        labels: (n,) their labels 0..k-1 (``source_labels``).
        prior: (k,) p_s, the source prior the estimators use (``source_prior``; the flow uses the mean calibrated
            prediction on the holdout), kept as given.
        outputs: (n, k) the raw outputs the calibrator takes (the source-aware interval refits the calibrator on
            them), or None.
        calibrator: the fitted calibrator (source-aware interval), or None.
        class_names: k names of the classes (the label-shift test's evidence and the reasons of a verdict name a
            class by them), or None: the classes are called 0..k-1 (names "0".."k-1" are taken as None).
        label_shift_part: the label-shift test's work on this holdout, made once for many targets by
            :meth:`prepared_for` (the segments of a target); None: each assessment makes its own.

    Raises:
        InputError: shapes or values that do not fit together (naming the argument).
    """

    probs: np.ndarray
    labels: np.ndarray
    prior: np.ndarray
    outputs: np.ndarray | None = None
    calibrator: object = None
    class_names: tuple[str, ...] | None = None
    label_shift_part: object = None

    def __post_init__(self):
        probs = check_probabilities(self.probs, "source_probs", 2)
        k = probs.shape[1]
        labels = check_labels(self.labels, "source_labels", k, n_rows=probs.shape[0])
        check_prior(self.prior, "source_prior", k)
        names = self.class_names
        if names is not None:
            names = tuple(str(c) for c in names)
            if len(names) != k:
                raise InputError(f"class_names has {len(names)} names but the holdout has {k} classes; give one "
                                 "name per class, in the order of the model's outputs.")
            if names == tuple(str(c) for c in range(k)):     # the default names are no names
                names = None
        for name, value in (("probs", probs), ("labels", labels), ("class_names", names),
                            ("prior", np.asarray(self.prior, dtype=np.float64))):   # p_s as given
            object.__setattr__(self, name, value)

    @property
    def n_classes(self) -> int:
        return self.probs.shape[1]

    @property
    def names(self) -> list[str]:
        """The class names, "0".."k-1" when the model has none."""
        return list(self.class_names) if self.class_names else [str(c) for c in range(self.n_classes)]

    def prepared_for(self, target) -> "Holdout":
        """This holdout with the label-shift test's work on it made once
        (:func:`~labelshift.inference.label_shift_test.prepare_holdout`, the test's default region rule), at the
        precision of ``target`` (a :class:`Target` or its probabilities), for many assessments against it -- a
        target's segments: each report is the same as without it. ``label_shift_part`` is None when the holdout
        cannot carry the test (each assessment then says why it was not run)."""
        probs = target.probs if isinstance(target, Target) else pooled(target)
        try:
            part = prepare_holdout(at_precision(self.probs, probs if is_partitioned(probs) else np.asarray(probs)),
                                   self.labels)
        except InputError:
            part = None
        return dataclasses.replace(self, label_shift_part=part)


@dataclass(frozen=True, eq=False)
class Target:
    """An unlabelled target set: ``probs``, the (m, k) calibrated outputs (or a list of (m_b, k) batches, pooled
    once here), and ``outputs``, the raw outputs of the same rows in the same order, which the source-aware
    interval needs (or None). Checked against the holdout by :func:`~labelshift.inference.report.assess_shift`."""

    probs: np.ndarray
    outputs: np.ndarray | None = None

    def __post_init__(self):
        object.__setattr__(self, "probs", pooled(self.probs))
        object.__setattr__(self, "outputs", pooled(self.outputs))

    def __len__(self) -> int:
        return int(np.shape(self.probs)[0])

    @classmethod
    def from_partitioned_outputs(cls, outputs, calibrator) -> "Target":
        """The target of raw outputs held in partitions (:class:`~labelshift.partitions.PartitionedRows`): its
        probabilities are the same rows calibrated where each partition lives (:func:`calibrated_probs`, derived
        rows: nothing is gathered or stored), its outputs the partitions themselves."""
        if not is_partitioned(outputs):
            raise InputError("Target.from_partitioned_outputs needs raw outputs held in partitions "
                             f"(labelshift.partitions.PartitionedRows), got {type(outputs).__name__}; build "
                             "Target(probs, outputs) from arrays instead.")
        return cls(outputs.derived(calibrated_probs, calibrator, dtype=np.float32), outputs)

    def rows(self, index) -> "Target":
        """The target restricted to ``index`` (e.g. one segment's rows)."""
        return Target(self.probs[index], None if self.outputs is None else self.outputs[index])
