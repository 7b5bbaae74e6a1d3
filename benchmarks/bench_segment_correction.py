"""Many segments, one verdict each: false alarms and power of the segments' verdicts without a correction and with
Holm or Benjamini-Hochberg across the segments (issue 29).

Problem (as ``bench_segments.py``): :class:`labelshift.experiments.well_specified.WellSpecifiedGaussians`
``make(k)`` (k = 10), per run (seed) a fresh labelled holdout of n = 5,000 rows with BCTS fit on it, and segments of
m = 10,000 rows each, assessed with the ``reestimate`` flow's default settings against that one holdout (a
:class:`labelshift.inference.segments.SegmentPool`, the label-shift test's holdout part made once, as the flow):

* 100 truly label-shifted segments: 10 at the source prior (no shift at all) and 90 under their own Dirichlet(1)
  prior;
* 6 segments that are *not* label-shifted: Dirichlet(1) prior, and one class's look changed -- that class's inputs
  moved by ``--mild`` (3 segments) or ``--strong`` (3) noise standard deviations along a random direction (its
  logits by ``scale * sep * shift * u``), the model not retrained.

Run A reads the 100 label-shifted segments together; run B reads 94 of them (the 10 unshifted among them) with the 6
violated ones, 100 in all. Each run's verdicts come from :func:`labelshift.inference.segments.adjust_segments` with
each correction (``none`` is the reading before issue 29). Counted per run: the label-shifted segments called "Not
label shift" (false alarms; A and B), the unshifted segments called "Shifted" (false alarms of the no-shift test,
run A), and the violated segments called "Not label shift" (power, run B). The reports are computed once per seed;
their p-values are kept in ``benchmarks/out/segment_correction.json``.

    python benchmarks/bench_segment_correction.py --seeds 10                  # 10 runs
    python benchmarks/bench_segment_correction.py --seeds 100 --workers 16    # on a 16-core machine
    python benchmarks/bench_segment_correction.py --quick                     # 20 + 3 segments of 2,000 rows
    python benchmarks/bench_segment_correction.py --from-json FILE --write-readme   # the table from kept results
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_utils import one_blas_thread  # noqa: E402

one_blas_thread()

import argparse  # noqa: E402
import datetime as _dt  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import numpy as np  # noqa: E402

from labelshift.calibration.scaling import BCTS  # noqa: E402
from labelshift.experiments.well_specified import WellSpecifiedGaussians  # noqa: E402
from labelshift.inference.multiplicity import CORRECTIONS, correction_label  # noqa: E402
from labelshift import AssessmentSettings, Holdout, Target  # noqa: E402
from labelshift.inference.segments import SegmentEstimate, SegmentPool, adjust_segments  # noqa: E402
from report_utils import cpu_model, publish  # noqa: E402

#: the flow's default settings, as each segment of a run is assessed
SETTINGS = AssessmentSettings()

HEADING = "## Many segments, one verdict each: corrections across segments (issue 29)"
OUT = Path(__file__).resolve().parent / "out" / "segment_correction.json"
UNSHIFTED, SHIFTED, MILD, STRONG = 10, 90, 3, 3


def segments_of_seed(seed: int, k: int, n: int, m: int, mild: float, strong: float, counts: tuple) -> tuple:
    """The holdout side and the segments' (kind, calibrated rows, raw rows) of one run; kinds "unshifted",
    "shifted", "mild", "strong"."""
    unshifted, shifted, n_mild, n_strong = counts
    pb = WellSpecifiedGaussians.make(k)
    rng = np.random.default_rng([29, seed])
    xh, yh = pb.holdout(n, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = BCTS().fit(xh, yh)
    ph = cal.predict_proba(xh)
    holdout = Holdout(ph, yh, ph.mean(axis=0), outputs=xh, calibrator=cal)
    kinds = ["unshifted"] * unshifted + ["shifted"] * shifted + ["mild"] * n_mild + ["strong"] * n_strong
    segs = []
    for kind in kinds:
        prior = pb.source_prior if kind == "unshifted" else rng.dirichlet(np.ones(k))
        raw, y = pb.draw(prior, m, rng)
        if kind in ("mild", "strong"):                # one class's look changed: its inputs moved along u
            c = int(rng.integers(k))
            u = rng.standard_normal(k)
            raw[y == c] += pb.scale * pb.sep * (mild if kind == "mild" else strong) * u / np.linalg.norm(u)
        raw = raw.astype(np.float32)                  # as the flow keeps the outputs
        segs.append((kind, cal.predict_proba(raw.astype(np.float64)), raw))
    return holdout, segs


def assess_seed(seed: int, args) -> list[tuple[str, object]]:
    """Every segment's report of one run (kind, ShiftReport), on ``args.workers`` worker processes."""
    holdout, segs = segments_of_seed(seed, args.k, args.n, args.rows, args.mild, args.strong, args.counts)
    holdout = holdout.prepared_for(segs[0][1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with SegmentPool(args.workers, holdout, SETTINGS) as pool, \
                ThreadPoolExecutor(max(1, args.workers)) as threads:
            reports = list(threads.map(lambda s: pool.assess(Target(s[1], s[2])), segs))
    return [(kind, r) for (kind, _, _), r in zip(segs, reports)]


def reading(assessed: list[tuple[str, object]], correction: str) -> dict:
    """Runs A and B of one seed read with ``correction``: the counts of the docstring."""
    kinds = [kind for kind, _ in assessed]
    run_a = [i for i, kind in enumerate(kinds) if kind in ("unshifted", "shifted")]
    violated = [i for i, kind in enumerate(kinds) if kind in ("mild", "strong")]
    run_b = run_a[:len(run_a) - len(violated)] + violated
    out = {}
    for name, members in (("A", run_a), ("B", run_b)):
        segs = adjust_segments([SegmentEstimate(f"s{i}", 0, 0, assessed[i][1]) for i in members], correction)
        verdicts = {i: str(s.verdict) for i, s in zip(members, segs)}
        out[name] = {kind: sum(verdicts[i] == "Not label shift" for i in members if kinds[i] == kind)
                     for kind in ("unshifted", "shifted", "mild", "strong")}
        out[name]["shifted_unshifted"] = sum(verdicts[i] == "Shifted" for i in members if kinds[i] == "unshifted")
    return out


def record(assessed) -> list[dict]:
    """What is kept of a seed's reports: kind, the two p-values (6 significant digits), trustworthy."""
    return [{"kind": kind, "label_shift_p": None if r.label_shift is None else _g6(r.label_shift.p_value),
             "no_shift_p": _g6(r.no_shift_test.p_value), "trustworthy": bool(r.trustworthy)} for kind, r in assessed]


def _g6(p: float) -> float:
    return float(f"{float(p):.6g}")


def table(runs: list[dict], counts: tuple) -> list[str]:
    """The table over the runs: per correction, false alarms per run (mean, max, runs with any) and power."""
    unshifted, shifted, n_mild, n_strong = counts
    run_a, run_b = unshifted + shifted, unshifted + shifted - n_mild - n_strong
    lines = [f"| correction | label-shifted segments called Not label shift, run A ({run_a}): mean per run [max] | "
             f"runs with any (A) | the same, run B ({run_b} label-shifted) | power on the violated segments of run B: "
             f"mild ({n_mild} a run) | strong ({n_strong} a run) | false share of run B's Not label shift (FDR: mean "
             f"over runs, 0 where none) | unshifted segments called Shifted, run A ({unshifted}): mean [max] |",
             "|---|---|---|---|---|---|---|---|"]
    for correction in ("none", "holm", "bh"):
        a = [r[correction]["A"] for r in runs]
        b = [r[correction]["B"] for r in runs]
        false_a = [x["unshifted"] + x["shifted"] for x in a]
        false_b = [x["unshifted"] + x["shifted"] for x in b]
        called_b = [f + x["mild"] + x["strong"] for f, x in zip(false_b, b)]
        shares = [f / max(1, c) for f, c in zip(false_b, called_b)]
        shifted_false = [x["shifted_unshifted"] for x in a]
        mild = sum(x["mild"] for x in b) / max(1, n_mild * len(b))
        strong = sum(x["strong"] for x in b) / max(1, n_strong * len(b))
        name = "none (before)" if correction == "none" else correction_label(correction)
        lines.append(f"| {name} | {np.mean(false_a):.2f} [{max(false_a)}] | {sum(f > 0 for f in false_a)} of "
                     f"{len(a)} | {np.mean(false_b):.2f} [{max(false_b)}] | {100 * mild:.0f}% | {100 * strong:.0f}% "
                     f"| {100 * np.mean(shares):.1f}% | {np.mean(shifted_false):.2f} "
                     f"[{max(shifted_false)}] |")
    return lines


def readings_from_records(records: list[list[dict]], significance: float = 0.05) -> list[dict]:
    """The runs' readings recomputed from kept p-values (``--from-json``): each record stands in for its report,
    with the flow's verdict precedence (:attr:`SegmentEstimate.verdict`)."""
    from types import SimpleNamespace

    out = []
    for seed in records:
        assessed = [(r["kind"], _stand_in(r, significance, SimpleNamespace)) for r in seed]
        out.append({c: reading(assessed, c) for c in CORRECTIONS})
    return out


def _stand_in(r: dict, significance: float, ns):
    """A stand-in of a ShiftReport with the attributes :func:`adjust_segments` and the verdict read."""
    label_shift = None if r["label_shift_p"] is None else ns(p_value=r["label_shift_p"])
    rep = ns(label_shift=label_shift, no_shift_test=ns(p_value=r["no_shift_p"]), trustworthy=r["trustworthy"],
             label_shift_level=significance, significance=significance,
             label_shift_ok=None if label_shift is None else not r["label_shift_p"] < significance,
             shifted=r["no_shift_p"] < significance)
    return rep


def tail(records: list[list[dict]], levels=(0.05, 0.01, 0.001, 0.0005)) -> str:
    """How often the label-shift test's p-value of a label-shifted segment falls below each level (all runs
    pooled): a valid test's at most the level; Holm over S segments reads it down to level / S."""
    p = np.array([r["label_shift_p"] for seed in records for r in seed
                  if r["kind"] in ("unshifted", "shifted") and r["label_shift_p"] is not None])
    return ", ".join(f"below {a:g}: {100 * np.mean(p < a):.2f}%" for a in levels) + f" ({len(p):,} p-values)"


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[1], timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def report(args, runs: list[dict], seconds: float, meta: dict, records: list[list[dict]]) -> list[str]:
    counts = tuple(meta["counts"])
    return [HEADING, "",
            f"Run of {meta['date']} at commit {meta['commit']} (`{meta['command']}`; {meta['cpu']}, {meta['cores']} "
            f"cores, {meta['workers']} worker processes; {seconds / 60:.1f} min): k = {meta['k']} classes, a fresh "
            f"holdout of n = {meta['n']:,} rows per run, segments of {meta['rows']:,} rows, the flow's default "
            f"settings (level 0.05 for both tests), {len(runs)} runs (seeds 0-{len(runs) - 1}"
            f"{'; ' + meta['note'] if meta.get('note') else ''}). Run A: "
            f"{counts[0]} segments at the source prior and {counts[1]} under Dirichlet(1) priors, all truly "
            f"label-shifted; run B: {counts[0] + counts[1] - counts[2] - counts[3]} of them with {counts[2]} "
            f"segments whose class's look changed by {meta['mild']} noise sd (mild) and {counts[3]} by "
            f"{meta['strong']} (strong). Problem and counts: the docstring of "
            "`benchmarks/bench_segment_correction.py`.", "", *table(runs, counts), "",
            f"The label-shift test's p-values of the label-shifted segments, all runs pooled: {tail(records)}.", ""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="runs (a fresh holdout and fresh segments each)")
    ap.add_argument("--seed-start", type=int, default=0)
    ap.add_argument("--rows", type=int, default=10_000, help="rows per segment")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--n", type=int, default=5_000, help="holdout rows")
    ap.add_argument("--mild", type=float, default=0.4, help="the mild violation: noise sd the class is moved by")
    ap.add_argument("--strong", type=float, default=0.8, help="the strong violation")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes")
    ap.add_argument("--json", type=Path, default=OUT, help="where the p-values are kept")
    ap.add_argument("--from-json", type=Path, help="recompute the table from kept p-values, assess nothing")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--write-readme", action="store_true")
    args = ap.parse_args(argv)
    args.counts = (UNSHIFTED, SHIFTED, MILD, STRONG)
    if args.quick:
        args.counts, args.rows, args.seeds = (4, 16, 1, 2), 2_000, min(args.seeds, 2)
    if args.from_json:
        kept = json.loads(args.from_json.read_text())
        runs = readings_from_records(kept["records"])
        publish(HEADING, report(args, runs, kept["seconds"], kept["meta"], kept["records"]), args.write_readme)
        return 0
    t0 = time.perf_counter()
    meta = {"date": _dt.date.today().isoformat(), "commit": commit(), "cpu": cpu_model(), "cores": os.cpu_count(),
            "workers": args.workers, "k": args.k, "n": args.n, "rows": args.rows, "mild": args.mild,
            "strong": args.strong, "counts": list(args.counts),
            "command": "python benchmarks/bench_segment_correction.py " + " ".join(sys.argv[1:] if argv is None
                                                                                  else argv)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    records, runs = [], []
    for seed in range(args.seed_start, args.seed_start + args.seeds):
        assessed = assess_seed(seed, args)
        records.append(record(assessed))
        runs.append({c: reading(assessed, c) for c in CORRECTIONS})
        seconds = time.perf_counter() - t0
        print(f"seed {seed}: Not label shift among the label-shifted, run A: none "
              f"{sum(runs[-1]['none']['A'][k] for k in ('unshifted', 'shifted'))}, Holm "
              f"{sum(runs[-1]['holm']['A'][k] for k in ('unshifted', 'shifted'))} ({seconds:.0f} s)",
              file=sys.stderr, flush=True)
        # kept after every run, so that a run stopped early leaves what it measured
        args.json.write_text(json.dumps({"meta": meta, "seconds": seconds, "records": records},
                                        separators=(",", ":")))
    publish(HEADING, report(args, runs, seconds, meta, records), args.write_readme)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
