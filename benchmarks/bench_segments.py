"""Estimates per segment: what 100 segments of 10,000 rows cost (issue 22, part 3).

Problem: :class:`labelshift.experiments.well_specified.WellSpecifiedGaussians` ``make(k)`` (k = 10 by default), a
labelled holdout of n rows with BCTS fit on it, and S segments of m rows each, segment s drawn under its own target
prior (Dirichlet(1), seed s) -- what a target with a segment column of S values holds. Timed, as the flow computes
it (the ``reestimate`` flow's default settings, :data:`labelshift.inference.settings.DEFAULTS`):

* ``split``: :func:`labelshift.inference.segments.split_segments` of the S * m segment values;
* ``pooled``: :func:`labelshift.assess_shift` on all S * m rows (what the flow computes without segments too);
* ``segments``: ``assess_shift`` on each segment's rows, one after another (the ``assess-segment`` tasks' work; the
  flow runs them as concurrent Prefect tasks, which only overlaps where numpy releases the GIL), with the label-shift
  test's work on the holdout made once (:meth:`labelshift.Holdout.prepared_for`, as the flow does;
  its cost counted) where this labelshift has it;
* ``threads``: the same on a thread pool of ``--workers`` threads, as the flow's ``assess-segment`` tasks run
  (Prefect's default task runner is a thread pool);
* ``processes``: the same as the flow runs them: a :class:`labelshift.inference.segments.SegmentPool` of
  ``--workers`` worker processes (forked on Linux; the holdout given to each once, each segment's rows sent and its
  report sent back; the pool's start counted), called from ``--workers`` threads;
* where the time goes: the segments again without the label-shift test, then also without the BBSE-soft
  cross-check, or with the Fisher interval instead of the source-aware one.

CPU: one BLAS thread (the flow's scoring also runs with one), wall-clock seconds, the best of ``--repeat`` runs.

    python benchmarks/bench_segments.py                  # S = 100, m = 10,000, k = 10, n = 5,000
    python benchmarks/bench_segments.py --segments 20    # fewer segments of 10,000 rows
    python benchmarks/bench_segments.py --quick          # S = 10, m = 2,000: a smoke test
    python benchmarks/bench_segments.py --write-readme   # also write the section of benchmarks/README.md
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_utils import one_blas_thread  # noqa: E402

one_blas_thread()

import argparse  # noqa: E402
import datetime as _dt  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
import json  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import numpy as np  # noqa: E402

import labelshift  # noqa: E402

from labelshift import AssessmentSettings, Holdout, Target, assess_shift  # noqa: E402
from labelshift.calibration.scaling import BCTS  # noqa: E402
from labelshift.experiments.well_specified import WellSpecifiedGaussians  # noqa: E402
from labelshift.inference.segments import SegmentPool, split_segments  # noqa: E402

from report_utils import cpu_model, publish  # noqa: E402

HEADING = "## Estimates per segment: segments of 10,000 rows (issue 22)"


def problem(k: int, n: int, segments: int, m: int) -> dict:
    """The holdout (calibrated and raw), BCTS, and the segments' rows (calibrated and raw) with their values."""
    pb = WellSpecifiedGaussians.make(k)
    rng = np.random.default_rng(0)
    xh, yh = pb.holdout(n, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = BCTS().fit(xh, yh)
    raw, values = [], []
    for s in range(segments):
        prior = np.random.default_rng([1, s]).dirichlet(np.ones(k))
        xt, _ = pb.draw(prior, m, rng)
        raw.append(xt.astype(np.float32))
        values.append(np.full(m, f"segment-{s:03d}", dtype=object))
    order = rng.permutation(segments * m)             # the segments' rows interleaved, as in a log
    raw_all = np.concatenate(raw)[order]
    return {"cal": cal, "hold": (cal.predict_proba(xh), yh, xh), "raw": raw_all,
            "probs": cal.predict_proba(raw_all.astype(np.float64)), "values": np.concatenate(values)[order]}


def holdout(pb: dict, prepared: bool = False) -> Holdout:
    """The holdout side; ``prepared``: with the label-shift test's work on it made once for the segments (as the
    flow's ``assess-segment`` tasks use it)."""
    probs_h, yh, xh = pb["hold"]
    h = Holdout(probs_h, yh, probs_h.mean(axis=0), outputs=xh, calibrator=pb["cal"])
    return h.prepared_for(pb["probs"]) if prepared else h


def assess(pb: dict, rows=None, shared: Holdout | None = None, **options):
    probs, raw = (pb["probs"], pb["raw"]) if rows is None else (pb["probs"][rows], pb["raw"][rows])
    return assess_shift(shared or holdout(pb), Target(probs, raw), AssessmentSettings(**options))


def segments(pb: dict, parts: list, **options) -> list:
    """Every segment's report, one after another, the holdout's part of the label-shift test made once."""
    shared = holdout(pb, prepared=True)
    return [assess(pb, rows, shared, **options) for rows in parts]


def on_processes(pb: dict, parts: list, workers: int) -> list:
    """The segments' reports as the flow computes them: a :class:`~labelshift.inference.segments.SegmentPool` of
    ``workers`` processes (started here, forked on Linux), called from ``workers`` threads (the ``assess-segment``
    tasks)."""
    with SegmentPool(workers, holdout(pb, prepared=True), AssessmentSettings()) as pool, \
            ThreadPoolExecutor(workers) as threads:
        return list(threads.map(lambda rows: pool.assess(Target(pb["probs"][rows], pb["raw"][rows])), parts))


def on_threads(pool: ThreadPoolExecutor, pb: dict, parts: list) -> list:
    shared = holdout(pb, prepared=True)
    return list(pool.map(lambda rows: assess(pb, rows, shared), parts))


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(pb: dict, repeat: int, workers: int, breakdown: bool = True) -> dict:
    split = split_segments(pb["values"])
    parts = list(split.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = {"split": best(lambda: split_segments(pb["values"]), repeat),
               "pooled": best(lambda: assess(pb), repeat),
               "segments": best(lambda: segments(pb, parts), repeat)}
        with ThreadPoolExecutor(workers) as pool:      # as Prefect's thread pool task runner runs assess-segment
            out["threads"] = best(lambda: on_threads(pool, pb, parts), repeat)
        out["processes"] = best(lambda: on_processes(pb, parts, workers), repeat)
        if breakdown:
            out.update(
                no_test=best(lambda: [assess(pb, rows, label_shift_check=False) for rows in parts], repeat),
                fisher=best(lambda: [assess(pb, rows, label_shift_check=False, interval="fisher")
                                     for rows in parts], repeat),
                no_cross_check=best(lambda: [assess(pb, rows, label_shift_check=False, cross_check=())
                                             for rows in parts], repeat))
    out["workers"] = workers
    return out


def report(args, t: dict) -> list[str]:
    s, m = args.segments, args.rows
    per = lambda key: f"{t[key]:.2f} ({t[key] / s * 1000:.0f} ms a segment)"  # noqa: E731
    return [HEADING, "",
            f"Run of {_dt.date.today().isoformat()} (`python benchmarks/bench_segments.py"
            f"{' --quick' if args.quick else f' --segments {s}'}`; {cpu_model()}, {os.cpu_count()} cores, one BLAS "
            f"thread, load average {os.getloadavg()[0]:.1f} at the end, best of {args.repeat}): "
            f"k = {args.k} classes, holdout n = {args.n:,}, {s} segments of {m:,} rows ({s * m:,} rows), the flow's "
            "default settings (MLLS, source-aware interval, label-shift test, BBSE-soft cross-check, accuracy).", "",
            "| step | seconds |", "|---|---|",
            f"| split the {s * m:,} rows by segment value | {t['split']:.3f} |",
            f"| pooled estimate, all {s * m:,} rows (as without segments) | {t['pooled']:.2f} |",
            f"| {s} segment estimates, one after another | {per('segments')} |",
            f"| the same on {t['workers']} threads (as the `assess-segment` tasks run) | {per('threads')} |",
            f"| the same on {t['workers']} worker processes (`SegmentPool`, as the flow; their start included) "
            f"| {per('processes')} |",
            *([f"| {s} segments without the label-shift test | {per('no_test')} |",
               f"| ... and without the BBSE-soft cross-check | {per('no_cross_check')} |",
               f"| ... or with the Fisher interval instead of the source-aware one | {per('fisher')} |"]
              if "no_test" in t else []), ""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segments", type=int, default=100)
    ap.add_argument("--rows", type=int, default=10_000, help="rows per segment")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--n", type=int, default=5_000, help="holdout rows")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="threads, and processes, of the fanned-out runs")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the rows without the label-shift test")
    ap.add_argument("--json", type=Path, help="also write the measured seconds to this file")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--write-readme", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.segments, args.rows, args.repeat = 10, 2_000, 1
    print(f"labelshift from {Path(labelshift.__file__).parent}", file=sys.stderr)
    pb = problem(args.k, args.n, args.segments, args.rows)
    t = measure(pb, args.repeat, args.workers, breakdown=not args.no_breakdown)
    if args.json:
        args.json.write_text(json.dumps({**vars(args), "json": str(args.json), "seconds": t, "cpu": cpu_model(),
                                         "cores": os.cpu_count()}, indent=2))
    publish(HEADING, report(args, t), args.write_readme)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
