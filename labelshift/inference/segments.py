"""Estimates per segment: the rows of a target split by the value of a segment column (a region, a channel, a customer
group), each segment assessed on its own rows against the one shared labelled holdout.

:func:`split_segments` groups row indices by segment value (read and checked by
:func:`labelshift.monitoring.batches.read_segments`); :class:`SegmentEstimate` is one segment's result -- the
:class:`~labelshift.inference.report.ShiftReport` of :func:`~labelshift.inference.report.assess_shift` on that
segment's rows, or "too small" with its size when it has fewer rows than the minimum (:data:`MIN_SEGMENT_SIZE`; why
200: ``docs/reestimation.md``, "Estimates per segment").
What sharing the holdout means for the segments' intervals is said there too. :func:`adjust_segments` reads the
segments' tests over the run's family of segments (Holm by default, :mod:`labelshift.inference.multiplicity`), and
the adjusted p-values decide each segment's :attr:`SegmentEstimate.verdict`. :class:`SegmentPool` assesses many
segments against one holdout on worker processes (:func:`segment_processes` says how many).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..errors import InputError
from .multiplicity import SEGMENT_CORRECTION, AdjustedPValue, adjust_p_values, check_correction
from .holdout import Holdout, Target
from .report import ShiftReport, Verdict, assess_shift, verdict_of
from .settings import AssessmentSettings, Bound

__all__ = ["MIN_SEGMENT_SIZE", "PROCESS_ROWS", "SEGMENT_BOUNDS", "SEGMENT_CORRECTION", "SEGMENT_PROCESSES",
           "SegmentEstimate", "SegmentPool", "SegmentSettings", "too_small_warning", "adjust_segments",
           "correction_record", "segment_processes",
           "split_segments", "usable_cpus"]

#: the fewest rows a segment is assessed on; smaller segments are reported as too small, with their size
MIN_SEGMENT_SIZE = 200
#: worker processes for the segments: 0 = automatic (one per CPU this process may use, at most one per segment, when
#: the segments hold at least :data:`PROCESS_ROWS` rows in all; else none), 1 = none (each segment in the calling
#: thread), N = N
SEGMENT_PROCESSES = 0
#: rows of assessed segments from which 0 (automatic) starts worker processes: 5 segments of 10,000 rows, 1-2 s of
#: work at k = 10 (0.2-0.4 s a segment), against the workers' start -- forked, 16 of them took 48 segments (13.4 s
#: of work) in 1.24 s on the lent 16-core machine (benchmarks/README.md, "Estimates per segment")
PROCESS_ROWS = 50_000
#: the ranges of the numeric segment settings (the ``reestimate`` flow's parameters take theirs from here)
SEGMENT_BOUNDS: dict[str, Bound] = {"min_size": Bound(ge=20), "processes": Bound(ge=0, le=1024)}


@dataclass(frozen=True)
class SegmentSettings:
    """How a target's segments are assessed besides the pooled estimate.

    Attributes:
        column: the column whose value names each row's segment.
        min_size: segments with fewer rows are reported as too small (with their size) instead of assessed.
        processes: worker processes (:func:`segment_processes`: 0 automatic, 1 none, N).
        correction: how the segments' tests are read over the run (:data:`~labelshift.inference.multiplicity.
            CORRECTIONS`).

    Raises:
        InputError: an empty column name, a number out of its range (:data:`SEGMENT_BOUNDS`), an unknown
            correction.
    """

    column: str
    min_size: int = MIN_SEGMENT_SIZE
    processes: int = SEGMENT_PROCESSES
    correction: str = SEGMENT_CORRECTION

    def __post_init__(self):
        if not isinstance(self.column, str) or not self.column.strip():
            raise InputError(f"segment column must be a column name, got {self.column!r}.")
        for name, bound in SEGMENT_BOUNDS.items():      # named as the flow's parameters are
            object.__setattr__(self, name, bound.checked({"min_size": "min_segment_size",
                                                          "processes": "segment_processes"}[name],
                                                         getattr(self, name), integer=True))
        check_correction(self.correction)


def too_small_warning(split: dict[str, np.ndarray], settings: SegmentSettings) -> str | None:
    """A sentence when most of the rows lie in segments too small to assess (a column with about one value per
    row, an id, gives thousands of one-row segments), else None."""
    sizes = np.array([len(rows) for rows in split.values()], dtype=np.int64)
    small = sizes < settings.min_size
    rows, small_rows = int(sizes.sum()), int(sizes[small].sum())
    if not rows or 2 * small_rows <= rows:
        return None
    return (f"segment column {settings.column!r} has {len(sizes):,} values over {rows:,} rows: {int(small.sum()):,} "
            f"segments, holding {small_rows:,} rows ({100 * small_rows / rows:.0f}%), have fewer than "
            f"{settings.min_size} rows and are not assessed. A column with about one value per row (an id) makes "
            "every segment too small: choose a column that groups rows (a region, a channel), or lower "
            "min_segment_size (CLI: --min-segment-size).")


def split_segments(values: np.ndarray) -> dict[str, np.ndarray]:
    """Row indices (int64, ascending) of each segment, by segment value, the values in sorted order."""
    values = np.asarray(values, dtype=object)
    names, inverse = np.unique(values.astype(str), return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=len(names)))[:-1]
    return {str(n): rows.astype(np.int64) for n, rows in zip(names, np.split(order, bounds))}


@dataclass(frozen=True)
class SegmentEstimate:
    """One segment's result: its name, its number of rows, and the assessment of its rows (None when it has fewer
    than ``min_size`` rows: too small to assess; or when the assessment failed, with the ``error``).

    ``label_shift_p`` and ``no_shift_p``: the report's label-shift and no-shift p-values adjusted over the run's
    segments (:func:`adjust_segments`); they decide :attr:`verdict`. None before the adjustment (or for a test that
    was not run): the report's own reading at the single-test level then decides."""

    name: str
    n_rows: int
    min_size: int
    report: ShiftReport | None = None
    error: str | None = None
    label_shift_p: AdjustedPValue | None = None
    no_shift_p: AdjustedPValue | None = None

    @property
    def too_small(self) -> bool:
        return self.report is None and self.error is None

    @property
    def not_label_shift(self) -> bool | None:
        """The label-shift test rejects, read over the segments when adjusted; None when it was not run."""
        if self.report is None or self.report.label_shift is None:
            return None
        return self.label_shift_p.rejects if self.label_shift_p is not None else self.report.label_shift_ok is False

    @property
    def shifted(self) -> bool | None:
        """The no-shift test rejects, read over the segments when adjusted; None without a report."""
        if self.report is None:
            return None
        return self.no_shift_p.rejects if self.no_shift_p is not None else self.report.shifted

    @property
    def verdict(self) -> Verdict | None:
        """The segment's verdict with :attr:`ShiftReport.verdict`'s precedence (Not label shift, Untrustworthy,
        Shifted, No shift), its two tests read through the adjusted p-values; None without a report. The report's
        own ``verdict`` is the one the segment alone would get."""
        if self.report is None:
            return None
        return verdict_of(bool(self.not_label_shift), self.report.trustworthy, bool(self.shifted))

    def to_dict(self) -> dict:
        """A compact, JSON-ready record: name, rows, and either ``too_small`` or the verdict, the prior with its
        interval, the total variation, the tests' p-values and the expected accuracy with its interval. Adjusted
        over the segments (:func:`adjust_segments`), also ``label_shift_p_adjusted``, ``no_shift_p_adjusted`` and
        ``verdict_alone`` (the segment's verdict at the single-test level); ``verdict`` and ``label_shift_ok`` are
        then read through the adjusted p-values."""
        base = {"name": self.name, "rows": self.n_rows, "too_small": self.too_small}
        if self.error is not None:
            return {**base, "verdict": "Failed", "reason": self.error}
        if self.report is None:
            return {**base, "verdict": "Too small",
                    "reason": f"{self.n_rows} rows, fewer than the minimum segment size {self.min_size}"}
        r = self.report
        lst = r.label_shift
        acc = r.accuracy
        adjusted = {}
        if self.label_shift_p is not None or self.no_shift_p is not None:
            adjusted = {"verdict_alone": str(r.verdict),
                        "label_shift_p_adjusted": _adjusted(self.label_shift_p),
                        "no_shift_p_adjusted": _adjusted(self.no_shift_p)}
        return {**base, "verdict": str(self.verdict), "target_prior": r.target_prior.tolist(),
                "lower": r.interval.lower.tolist(), "upper": r.interval.upper.tolist(),
                "total_variation": float(r.total_variation), "no_shift_p_value": float(r.no_shift_test.p_value),
                "label_shift_p_value": None if lst is None else float(lst.p_value),
                "label_shift_ok": None if self.not_label_shift is None else not self.not_label_shift,
                "trustworthy": bool(r.trustworthy), **adjusted,
                "accuracy": None if acc is None else
                {"expected": float(acc.expected), "lower": float(acc.lower), "upper": float(acc.upper)}}


def _adjusted(p: AdjustedPValue | None) -> float | None:
    return None if p is None or not np.isfinite(p.adjusted) else float(p.adjusted)


def adjust_segments(segments: Sequence[SegmentEstimate],
                    correction: str = SEGMENT_CORRECTION) -> list[SegmentEstimate]:
    """The segments with their tests read over the run: each test's p-values across the assessed segments adjusted
    by ``correction`` (:data:`~labelshift.inference.multiplicity.CORRECTIONS`; Holm by default: why in
    ``docs/reestimation.md``, "Many segments, few false alarms") -- the label-shift tests as one family, judged at
    the report's label-shift level, the no-shift tests as another, at its significance. The family of a test is
    the segments whose report has a finite p-value of it (too small and failed segments have none). The adjusted
    values decide each segment's :attr:`SegmentEstimate.verdict`; the reports are unchanged."""
    correction = check_correction(correction)
    assessed = [s for s in segments if s.report is not None]
    ls = np.array([np.nan if s.report.label_shift is None else s.report.label_shift.p_value for s in assessed],
                  dtype=np.float64)
    ns = np.array([s.report.no_shift_test.p_value for s in assessed], dtype=np.float64)
    ls_adj, ns_adj = adjust_p_values(ls, correction), adjust_p_values(ns, correction)
    ls_family, ns_family = int(np.isfinite(ls).sum()), int(np.isfinite(ns).sum())
    out = {}
    for i, s in enumerate(assessed):
        r = s.report
        out[id(s)] = replace(
            s, label_shift_p=None if r.label_shift is None else
            AdjustedPValue(float(ls[i]), float(ls_adj[i]), correction, ls_family, r.label_shift_level),
            no_shift_p=AdjustedPValue(float(ns[i]), float(ns_adj[i]), correction, ns_family, r.significance))
    return [out.get(id(s), s) for s in segments]


def correction_record(segments: Sequence[SegmentEstimate]) -> dict | None:
    """How the segments' tests were read, JSON-ready: ``{"method", "label_shift_tests", "no_shift_tests"}`` (the
    families' sizes); None when they were not adjusted (:func:`adjust_segments`)."""
    label_shift = [s.label_shift_p for s in segments if s.label_shift_p is not None]
    no_shift = [s.no_shift_p for s in segments if s.no_shift_p is not None]
    if not label_shift and not no_shift:
        return None
    method = (label_shift or no_shift)[0].method
    return {"method": method, "label_shift_tests": label_shift[0].family if label_shift else 0,
            "no_shift_tests": no_shift[0].family if no_shift else 0}


def segment_processes(requested: int, segments: int, rows: int) -> int:
    """Worker processes for ``segments`` assessments of ``rows`` rows in all: ``requested``, or with 0 one per CPU
    this process may use (:func:`usable_cpus`) if ``rows`` reaches :data:`PROCESS_ROWS` (else 1); never more than
    ``segments``. 1 or fewer means none (the calling thread assesses)."""
    if requested < 0:
        raise InputError(f"segment processes must be 0 (automatic) or more, got {requested}")
    if requested == 0:
        requested = usable_cpus() if rows >= PROCESS_ROWS else 1
    return max(1, min(requested, segments))


def usable_cpus(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """CPUs this process may run on (its affinity), capped by a cgroup v2 CPU quota (a container's ``--cpus``)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return cpus


_WORKER_COMMON: dict = {}


def _start_worker(common: dict) -> None:
    """A worker's start: keep the holdout side and the settings; BLAS on one thread (the processes are the
    parallelism); Ctrl-C left to the parent (which stops the workers); and end when the parent ends, however it
    ends -- a forked worker would otherwise outlive a killed parent, holding the pipes it inherited (among them
    the one :mod:`runtime.lifetime`'s watchdog waits on)."""
    from ..rows import one_blas_thread_for_life

    _WORKER_COMMON.clear()
    _WORKER_COMMON.update(common)
    one_blas_thread_for_life()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()


def _exit_with_parent(parent: int, every_s: float = 0.5) -> None:
    while os.getppid() == parent:
        time.sleep(every_s)
    os._exit(1)


def _assess(common: dict, target: Target) -> ShiftReport:
    return assess_shift(common["holdout"], target, common["settings"])


def _assess_in_worker(target: Target) -> ShiftReport:
    return _assess(_WORKER_COMMON, target)


class SegmentPool:
    """:func:`~labelshift.inference.report.assess_shift` on many targets (a target's segments) against one
    holdout, on ``processes`` worker processes; with ``processes <= 1`` in the calling thread.

    Every segment shares the ``holdout`` (best with the label-shift test's part made once:
    :meth:`~labelshift.inference.holdout.Holdout.prepared_for`) and the ``settings``. They go to each worker once,
    when it starts; :meth:`assess` then sends one segment's rows and returns its report, the same report
    ``assess_shift(holdout, target, settings)`` gives in this process, to rounding (the worker's BLAS runs on one
    thread; tested to a relative 1e-7). On Linux the workers are forked from this process, with
    labelshift imported and the holdout in memory; a worker runs only numpy and scipy code (OpenBLAS is fork-safe;
    the modules it imports are loaded already), ends with ``os._exit``, and ends too when this process ends
    (:func:`_start_worker`). ``spawn`` and ``forkserver`` import the caller's ``__main__`` -- the ``labelshift``
    command or Prefect's engine: prefect and mlflow -- in every worker, and loky (joblib's pool) started its 16
    workers one after another (48 segments in 25.7 s against 1.24 s forked: benchmarks/README.md, "Estimates per
    segment"). Elsewhere: ``spawn``. A segment whose worker died is assessed in the calling thread.
    :meth:`assess` may be called from many threads at once (the flow's ``assess-segment`` tasks); use the pool as
    a context manager, which stops the workers on exit.
    """

    def __init__(self, processes: int, holdout: Holdout, settings: AssessmentSettings):
        self.processes = int(processes)
        common = self.common = {"holdout": holdout, "settings": settings}
        self._executor = None
        if self.processes > 1:
            context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
            self._executor = ProcessPoolExecutor(self.processes, mp_context=context, initializer=_start_worker,
                                                 initargs=(common,))

    def assess(self, target: Target) -> ShiftReport:
        """One segment's :class:`~labelshift.inference.report.ShiftReport` (its errors raised here)."""
        if self._executor is not None:
            try:
                return self._executor.submit(_assess_in_worker, target).result()
            except BrokenProcessPool:   # a worker died (killed for memory?): this segment in the calling thread
                pass
        return _assess(self.common, target)

    def close(self, cancel: bool = False) -> None:
        """Stop the workers once they are done (with ``cancel``, after the segments already started)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=cancel)
            self._executor = None

    def __enter__(self) -> "SegmentPool":
        return self

    def __exit__(self, exc_type, *exc_info) -> None:
        self.close(cancel=exc_type is not None)
