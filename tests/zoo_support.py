"""The zoo's runner: one case of :mod:`labelshift.experiments.zoo` and one seed through the default re-estimation
path of prediction-log mode, and what came out (shared by ``tests/unit/tasks/test_classifier_zoo.py`` and ``benchmarks/bench_zoo.py``).

What :func:`run_case` does is what the flow does, step by step, with the flow's own code and without MLflow,
Prefect or a store:

1. **register the reference** (:func:`labelshift_mlflow.references.register_reference`): the holdout checked by
   :func:`labelshift.monitoring.batches.check_reference`, the calibrator made by ``labelshift_mlflow.references._calibrator`` (BCTS,
   input kind from the declared output kind) and fit on the checked outputs, saved as JSON (``to_dict``) and the holdout
   stored as float32 (:func:`labelshift_mlflow.artifacts.log_source_holdout`);
2. **load it** (:func:`labelshift_mlflow.references.load_reference`): the calibrator read back (:func:`load_calibrator`), the
   holdout as float64, ``source_probs`` the calibrated holdout and p_s their mean
   (:attr:`labelshift_mlflow.references.ReferenceBundle.source_prior`);
3. **score the target** (``tasks.reestimation.scoring._score_logs``): the target outputs written as one .npy batch and read
   back through :func:`labelshift.monitoring.batches.iter_output_chunks` (float32 chunks, checked), calibrated chunk by
   chunk into float32 probabilities, the float32 raw outputs kept for the source-aware interval;
4. **assess** (:func:`tasks.reestimation.assessment.estimate_shift`, the task's function) with the defaults of
   :class:`flows.params.ReestimateParameters` (MLLS, BBSE-soft cross-check, source-aware interval at 0.95,
   significance 0.05, the label-shift test at that level; the accuracy comes with the source-aware interval).

Recorded (:class:`ZooRun`): an exception (type, message, and the innermost frame of this repository it came from) or
the verdict and its reasons; whether the 95% interval on each class's target prior covers the truth -- the
population prior the target's labels were drawn from (the paper's w* = p_t / p_s) and, beside it, the target set's
empirical label frequencies.
"""
from __future__ import annotations

import io
import json
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from labelshift.monitoring.batches import OutputSpec, check_reference, default_class_names, iter_output_chunks
from labelshift.calibration import load_calibrator
from labelshift.experiments.zoo import ZooCase
from labelshift.inference.report import NOT_LABEL_SHIFT

REPO = Path(__file__).resolve().parents[1]
#: the verdicts that hand out an estimate (coverage is measured over these runs)
TRUSTED_VERDICTS = ("Shifted", "No shift")


@dataclass(frozen=True)
class ZooRun:
    """One case, one seed, through the default path.

    Attributes:
        case, seed: what ran.
        error: ``"Type: message"`` when the path raised; None otherwise.
        origin: where it raised, ``path:line in function`` (the innermost frame in this repository).
        verdict: the report's verdict (None after an error).
        reasons: why it is untrustworthy (the report's reasons), plus the label-shift test's line when that
            test rejected.
        covers: (k,) whether the interval on p_t(y) covers the population target prior, per class (None after an
            error).
        covers_empirical: the same for the target set's label frequencies.
        seconds: wall time of steps 1-4.
    """

    case: str
    seed: int
    error: str | None = None
    origin: str | None = None
    verdict: str | None = None
    reasons: tuple[str, ...] = ()
    covers: np.ndarray | None = None
    covers_empirical: np.ndarray | None = None
    seconds: float = 0.0

    @property
    def trusted(self) -> bool:
        """The verdict hands out an estimate (Shifted or No shift)."""
        return self.verdict in TRUSTED_VERDICTS

    @property
    def not_label_shift(self) -> bool:
        return self.verdict == NOT_LABEL_SHIFT


def _reference(case: ZooCase, seed: int):
    """Steps 1-2: the reference registered from this seed's holdout and loaded back, as a ReferenceBundle."""
    from labelshift_mlflow.references import ReferenceBundle, _calibrator

    h = case.holdout(seed)
    names = tuple(default_class_names(case.n_classes))
    checked = check_reference(h.outputs, h.labels, names, case.output_kind)
    fitted = _calibrator("BCTS", case.output_kind).fit(checked.outputs, checked.labels)
    cal = load_calibrator(json.loads(json.dumps(fitted.to_dict(), allow_nan=False)))
    stored = checked.outputs.astype(np.float32).astype(np.float64)
    return ReferenceBundle(uri=f"zoo:{case.name}", name=case.name, version="1", alias=None, run_id="", mode="outputs",
                           class_names=names, output_kind=case.output_kind, calibrator_name="BCTS", calibrator=cal,
                           source_probs=cal.predict_proba(stored), source_labels=checked.labels.astype(np.int64),
                           id_column=None, source_outputs=stored)


def _scored(bundle, outputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Step 3: (float32 calibrated probabilities, float32 raw outputs) of the target written as one .npy batch."""
    buf = io.BytesIO()
    np.save(buf, np.asarray(outputs))
    spec = OutputSpec(bundle.class_names, bundle.output_kind)
    raw = np.concatenate(list(iter_output_chunks(buf.getvalue(), "npy", spec, "zoo-target.npy")))
    probs = np.empty(raw.shape, dtype=np.float32)
    probs[:] = bundle.calibrator.predict_proba(raw.astype(np.float64))
    return probs, raw


def default_report(case: ZooCase, seed: int):
    """Steps 1-4 for one seed: (the ShiftReport of the default path, the target set). Raises what the path raises."""
    from flows.params import ReestimateParameters
    from labelshift.inference.holdout import Target
    from tasks.reestimation.assessment import estimate_shift

    p = ReestimateParameters()
    bundle = _reference(case, seed)
    target = case.target(seed)
    probs, raw = _scored(bundle, target.outputs)
    report = estimate_shift.fn(bundle.holdout, Target(probs, raw), p.assessment())
    return report, target


def origin_of(exc: BaseException) -> str:
    """``path:line in function`` of the innermost traceback frame inside this repository (else the innermost)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if str(REPO) in f.filename and "zoo_support" not in f.filename] or frames
    if not ours:
        return "?"
    f = ours[-1]
    path = Path(f.filename)
    shown = path.relative_to(REPO) if str(REPO) in f.filename else path.name
    return f"{shown}:{f.lineno} in {f.name}"


def run_case(case: ZooCase, seed: int) -> ZooRun:
    """Run one case and seed through the default path (:func:`default_report`) and record what came out; any
    exception is recorded, not raised."""
    t0 = time.perf_counter()
    try:
        report, target = default_report(case, seed)
    except Exception as exc:     # recorded: "never an error on valid input" is what is measured
        return ZooRun(case.name, seed, error=f"{type(exc).__name__}: {exc}", origin=origin_of(exc),
                      seconds=time.perf_counter() - t0)
    reasons = list(report.reasons)
    if report.label_shift_ok is False and report.label_shift_summary:
        reasons.append(report.label_shift_summary)
    return ZooRun(case.name, seed, verdict=report.verdict, reasons=tuple(reasons),
                  covers=np.asarray(report.interval.covers(target.prior)),
                  covers_empirical=np.asarray(report.interval.covers(target.empirical_prior)),
                  seconds=time.perf_counter() - t0)
