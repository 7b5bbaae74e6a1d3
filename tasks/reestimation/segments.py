"""Estimates per segment (issue 22, part 3): read the segment column of the new batches, assess each segment's rows
as one Prefect task per segment (``assess-segment``, fanned out with ``.submit``, computed on worker processes:
:class:`labelshift.inference.segments.SegmentPool`), and log the segments to the
re-estimation's MLflow run (metrics ``segment.<segment>.<name>``, the figure ``figures/segment_priors.png`` and
``reestimation/segments.json``).

Each segment is :func:`labelshift.inference.report.assess_shift` on that segment's rows with the shared holdout and
the run's settings -- exactly what :func:`tasks.reestimation.assessment.estimate_shift` does with the pooled rows --
so a segment's result is the one a run on that segment alone would give. The segments share only the label-shift test's
work on the holdout (:meth:`labelshift.inference.holdout.Holdout.prepared_for`, made once; the same results), nothing
of the targets (``docs/reestimation.md``, "Estimates per segment"; the cost: ``benchmarks/README.md``).
"""
from __future__ import annotations

import hashlib
import json
import time

import numpy as np
from mlflow import MlflowClient
from mlflow.entities import Metric
from prefect import task
from prefect.cache_policies import NO_CACHE

from labelshift.errors import FormatError, InputError, ObjectNotFoundError
from labelshift.figures import figure_png, plot_segment_priors
from labelshift.inference.holdout import Holdout, Target
from labelshift.inference.segments import (SegmentEstimate, SegmentPool, SegmentSettings, adjust_segments,
                                          segment_processes, split_segments, too_small_warning)
from labelshift.inference.settings import AssessmentSettings
from labelshift.monitoring.batches import batch_format, metric_names, read_segments
from labelshift.monitoring.layout import TargetBatch
from labelshift.storage import open_store
from tasks import tracking

__all__ = ["check_segmentable", "read_segment_values", "segment_values_of", "assess_segment", "assess_segments",
           "segment_metrics", "log_segments"]


def check_segmentable(batches: list[TargetBatch], column: str, target: str) -> None:
    """Segments need batches with columns: ``.npy`` batches are refused (naming them), before anything is read."""
    npy = [b.key for b in batches if batch_format(b.key) == "npy"]
    if npy:
        raise InputError(f"segment_column={column!r} needs Parquet batches (a column per row), but the new batches under "
                         f"{target} include .npy arrays, which have no columns ({', '.join(npy[:5])}"
                         f"{' ...' if len(npy) > 5 else ''}); run without segment_column (CLI: without "
                         "--segment-column), or write the batches as Parquet with the segment column.")


@task(name="read-segments", cache_policy=NO_CACHE, persist_result=False)
def read_segment_values(target_uri: str, batches: list[TargetBatch], column: str) -> dict[str, np.ndarray]:
    """The segment value of every row of each new batch, by batch key (:func:`labelshift.monitoring.batches.
    read_segments`); read before the MLflow run starts, so that a bad segment column fails the run with nothing
    written. A batch gone, replaced or unreadable is left out here: scoring skips or rejects it with its reason.

    Raises:
        InputError: a batch lacks the column, or some of its rows have no segment value.
    """
    store = open_store(target_uri)
    out = {}
    for b in batches:
        try:
            data = store.get_bytes(b.key)
        except ObjectNotFoundError:
            continue
        if hashlib.sha256(data).hexdigest() != b.checksum:
            continue
        try:
            out[b.key] = read_segments(data, store.url(b.key), column)
        except FormatError:
            continue
    return out


def segment_values_of(values: dict[str, np.ndarray], scored) -> np.ndarray:
    """The segment values of the pooled scored rows (the good batches' values in their order)."""
    parts = []
    for b, probs in zip(scored.batches, scored.probs):
        v = values.get(b.key)
        if v is None or len(v) != len(probs):
            raise InputError(f"batch {b.key}: its segment values ({'none' if v is None else len(v)}) do not match "
                             f"its {len(probs)} scored rows; it changed while the run read it -- run again.")
        parts.append(v)
    return np.concatenate(parts) if parts else np.array([], dtype=object)


@task(name="assess-segment", task_run_name="assess-segment-{name}", cache_policy=NO_CACHE, persist_result=False)
def assess_segment(pool: SegmentPool, name: str, target: Target, min_size: int) -> SegmentEstimate:
    """One segment: ``assess_shift`` on its rows with the shared holdout and the run's settings, on one of the
    pool's worker processes (or in this task's thread when the pool has none)."""
    return SegmentEstimate(name, len(target), min_size, pool.assess(target))


def assess_segments(holdout: Holdout, target: Target, values: np.ndarray, settings: AssessmentSettings,
                    segments: SegmentSettings) -> tuple[list[SegmentEstimate], str | None]:
    """Every segment of ``target`` (its rows split by ``values``), in the order of their names: those with at least
    ``segments.min_size`` rows assessed as concurrent ``assess-segment`` tasks on a
    :class:`~labelshift.inference.segments.SegmentPool` of ``segments.processes`` worker processes (0: automatic;
    :func:`~labelshift.inference.segments.segment_processes`), the others reported as too small (with their size).
    A segment whose assessment raises is reported as failed, with the error: it never fails the run, whose pooled
    estimate stands. The assessed segments' tests are then read over the run
    (:func:`~labelshift.inference.segments.adjust_segments` with ``segments.correction``): their adjusted p-values
    decide each segment's verdict. Returns the segments and, when most rows lie in segments too small to assess,
    a warning that says so (:func:`~labelshift.inference.segments.too_small_warning`)."""
    futures, results, min_size = {}, {}, segments.min_size
    split = split_segments(values)
    assessed = [name for name, rows in split.items() if len(rows) >= min_size]
    for name in split.keys() - set(assessed):
        results[name] = SegmentEstimate(name, len(split[name]), min_size)
    if assessed:
        shared = holdout.prepared_for(target)           # the label-shift test's holdout part, made once
        workers = segment_processes(segments.processes, len(assessed), sum(len(split[name]) for name in assessed))
        with SegmentPool(workers, shared, settings) as pool:
            for name in assessed:
                futures[name] = assess_segment.submit(pool, name, target.rows(split[name]), min_size)
            for name, future in futures.items():
                try:
                    results[name] = future.result()
                except Exception as exc:        # one segment's failure is reported, never the pooled run's
                    results[name] = SegmentEstimate(name, len(split[name]), min_size,
                                                    error=f"{type(exc).__name__}: {exc}")
    return (adjust_segments([results[name] for name in sorted(results)], segments.correction),
            too_small_warning(split, segments))


def segment_metrics(segments: list[SegmentEstimate], class_names) -> dict[str, float]:
    """MLflow metrics per segment: ``segment.<s>.n_rows``, ``segment.<s>.too_small`` and ``segment.<s>.failed``
    always; for an assessed
    segment also ``target_prior_<c>``, ``prior_lower_<c>``, ``prior_upper_<c>``, ``total_variation``,
    ``no_shift_p_value``, ``label_shift_p_value`` (each test's own), ``no_shift_p_adjusted``,
    ``label_shift_p_adjusted`` (over the run's segments, :func:`~labelshift.inference.segments.adjust_segments`),
    ``shifted`` and ``not_label_shift`` (read through the adjusted values), ``trustworthy`` and
    ``accuracy_expected``, ``accuracy_lower``, ``accuracy_upper``. ``<s>`` and ``<c>`` are made metric-safe
    (:func:`labelshift.monitoring.batches.metric_names`); numbers that are not finite are left out."""
    out: dict[str, float] = {}
    for key, seg in zip(metric_names([s.name for s in segments]), segments):
        at = f"segment.{key}."
        out[at + "n_rows"], out[at + "too_small"] = seg.n_rows, float(seg.too_small)
        out[at + "failed"] = float(seg.error is not None)
        if seg.report is None:
            continue
        r = seg.report
        classes = metric_names(class_names) if class_names else [str(c) for c in range(r.n_classes)]
        for i, c in enumerate(classes):
            out[f"{at}target_prior_{c}"] = r.target_prior[i]
            out[f"{at}prior_lower_{c}"] = r.interval.lower[i]
            out[f"{at}prior_upper_{c}"] = r.interval.upper[i]
        out.update({at + "total_variation": r.total_variation, at + "no_shift_p_value": r.no_shift_test.p_value,
                    at + "shifted": float(seg.shifted), at + "trustworthy": float(r.trustworthy)})
        if seg.no_shift_p is not None:
            out[at + "no_shift_p_adjusted"] = seg.no_shift_p.adjusted
        if r.label_shift is not None:
            out[at + "label_shift_p_value"] = r.label_shift.p_value
            out[at + "not_label_shift"] = float(seg.not_label_shift)
        if seg.label_shift_p is not None:
            out[at + "label_shift_p_adjusted"] = seg.label_shift_p.adjusted
        if r.accuracy is not None:
            out.update({at + "accuracy_expected": r.accuracy.expected, at + "accuracy_lower": r.accuracy.lower,
                        at + "accuracy_upper": r.accuracy.upper})
    return {k: float(v) for k, v in out.items() if np.isfinite(float(v))}


@task(name="log-segments", cache_policy=NO_CACHE, persist_result=False)
def log_segments(tracking_uri: str, run_id: str, segments: list[SegmentEstimate], source_prior, class_names,
                 level: float, step: int, title: str) -> None:
    """The segments' metrics (:func:`segment_metrics`, at ``step``), their records (``reestimation/segments.json``)
    and the figure of their priors side by side (``figures/segment_priors.png``)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, step) for k, v in segment_metrics(segments, class_names).items()]
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i:i + 1000])
    records = [s.to_dict() for s in segments]
    client.log_text(run_id, json.dumps(records, indent=1), "reestimation/segments.json")
    figure = plot_segment_priors(source_prior, [r for r in records if "target_prior" in r],
                                 class_names=class_names, level=level, title=title)
    tracking.log_bytes(client, run_id, figure_png(figure), "figures/segment_priors.png")
