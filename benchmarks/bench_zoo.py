"""A zoo of classifiers through the default re-estimation path (issue 20): exceptions, verdicts, interval coverage
and how often a truly label-shifted target is called "Not label shift".

Every case of :mod:`labelshift.experiments.zoo` (near-separable, under- and over-confident, a rare class, a
fraud-like binary model, k from 2 to 1,000, a tiny holdout or target, a class absent from the target, random-forest
probabilities with exact 0s, 1s and ties, float16 logits, scikit-learn models on iris, wine, breast_cancer and
digits) runs for each seed through ``tests/zoo_support.py``'s :func:`run_case`: the reference registered and loaded
as the flow does (BCTS fit on the holdout, p_s the mean calibrated holdout prediction), the target scored as a
prediction-log batch, then ``estimate_shift`` with the defaults of ``flows.params.ReestimateParameters`` (MLLS,
BBSE-soft cross-check, source-aware 95% interval, the label-shift test at 5%, the accuracy).

Per case: runs, exceptions (with the message and where it came from), verdict counts, the coverage of the 95%
interval over the runs that hand out an estimate (verdict Shifted or No shift) -- the mean over classes and the worst
class -- and the "Not label shift" rate (every target of the zoo is truly label-shifted: the outputs' class
conditionals are the holdout's). The truth to cover is the population prior the target's labels were drawn from
(the paper's w* = p_t / p_s; as in bench_intervals.py); the coverage of the target set's empirical label
frequencies is shown beside it. Issue 20's goals: no exception; coverage >= 0.93 on average, no class below 0.90;
Not label shift <= 7%.

A run longer than ``--timeout`` seconds or needing more than ``--memory-gib`` of address space is stopped and counted
under its own column (k = 1,000 today), so one case cannot take the machine.

    python benchmarks/bench_zoo.py --seeds 5 --cases separable,fraud    # a smoke test
    python benchmarks/bench_zoo.py --seeds 30 --slow-seeds 1 --jobs 2   # the table of benchmarks/README.md
    python benchmarks/bench_zoo.py ... --write-readme --label before     # also write it there, as "before" figures
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report_utils import one_blas_thread, quiet_services  # noqa: E402

one_blas_thread()
quiet_services()

import argparse  # noqa: E402
import datetime as _dt  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from labelshift.experiments.zoo import CASES, case  # noqa: E402
from labelshift.inference.report import VERDICTS  # noqa: E402
from tests.zoo_support import ZooRun, run_case  # noqa: E402

from report_utils import cpu_model, publish, run_chunks  # noqa: E402

SECTION = "## Zoo of classifiers: the default path on every kind of model"
README = Path(__file__).resolve().parent / "README.md"
GOAL_MEAN, GOAL_WORST, GOAL_NLS = 0.93, 0.90, 0.07


class RunTimeout(BaseException):
    """Raised by the alarm inside a run (a BaseException, so that no ``except Exception`` of the path absorbs it)."""


def _alarm(signum, frame):
    raise RunTimeout()


def one_run(task: tuple) -> tuple[str, list]:
    """Worker: (case name, seed, timeout s, memory cap GiB) -> (case name, [ZooRun]); a run past the timeout or the
    memory cap is recorded with error "Timeout" or "MemoryError"."""
    name, seed, timeout, memory_gib = task
    cap = int(memory_gib * 2 ** 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(timeout))
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = run_case(case(name), seed)
    except RunTimeout:
        run = ZooRun(name, seed, error=f"Timeout: stopped after {timeout:.0f} s", seconds=time.perf_counter() - t0)
    except MemoryError as exc:
        run = ZooRun(name, seed, error=f"MemoryError: over the {memory_gib:g} GiB cap ({exc})",
                     seconds=time.perf_counter() - t0)
    finally:
        signal.alarm(0)
    return name, [run]


def coverage(runs: list[ZooRun], empirical: bool = False) -> tuple[float, float, int]:
    """(mean over classes, worst class, runs) of the interval's coverage over the runs that hand out an estimate;
    nan without such runs."""
    hits = [r.covers_empirical if empirical else r.covers for r in runs if r.trusted]
    if not hits:
        return float("nan"), float("nan"), 0
    per_class = np.mean(np.stack(hits), axis=0)
    return float(per_class.mean()), float(per_class.min()), len(hits)


def summarise(name: str, runs: list[ZooRun]) -> dict:
    """One table row of a case."""
    done = [r for r in runs if r.error is None]
    errors = Counter(r.error.split(":")[0] for r in runs if r.error is not None)
    verdicts = Counter(r.verdict for r in done)
    mean, worst, trusted = coverage(done)
    e_mean, e_worst, _ = coverage(done, empirical=True)
    nls = verdicts.get("Not label shift", 0) / len(done) if done else float("nan")
    return {"case": case(name), "runs": len(runs), "errors": errors, "verdicts": verdicts, "mean": mean,
            "worst": worst, "trusted": trusted, "e_mean": e_mean, "e_worst": e_worst, "nls": nls,
            "seconds": float(np.median([r.seconds for r in runs]))}


def _mark(ok: bool) -> str:
    return "" if ok else " ✗"


def _cov(mean: float, worst: float, n: int) -> str:
    if n == 0:
        return "–"
    return f"{mean:.3f}{_mark(mean >= GOAL_MEAN)} / {worst:.2f}{_mark(worst >= GOAL_WORST)}"


def table(rows: list[dict]) -> list[str]:
    lines = ["| case | k | n | m | runs | exceptions | " + " / ".join(VERDICTS[::-1]) + " | coverage, mean / worst "
             "class (runs) | empirical-frequency coverage | Not label shift | s/run |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["case"]
        n = getattr(c, "n", None)
        errs = ", ".join(f"{v} {k}" for k, v in r["errors"].items()) or "0"
        verdicts = " / ".join(str(r["verdicts"].get(v, 0)) for v in VERDICTS[::-1])
        nls = "–" if np.isnan(r["nls"]) else f"{100 * r['nls']:.0f}%{_mark(r['nls'] <= GOAL_NLS)}"
        lines.append(f"| {c.name} | {c.n_classes:,} | {'split' if n is None else f'{n:,}'} | {c.m:,} | {r['runs']} | "
                     f"{errs}{_mark(not r['errors'])} | {verdicts} | {_cov(r['mean'], r['worst'], r['trusted'])} "
                     f"({r['trusted']}) | {_cov(r['e_mean'], r['e_worst'], r['trusted'])} | {nls} | "
                     f"{r['seconds']:.1f} |")
    return lines


def _shape(message: str) -> str:
    """A message with its numbers replaced by #, cut to its first 100 characters."""
    return re.sub(r"[-+]?\d[\d.e+-]*", "#", message)[:100]


def messages(runs: dict[str, list[ZooRun]]) -> list[str]:
    """The distinct exceptions (with where they came from) and the most frequent reasons, per case."""
    out = []
    for name, rs in runs.items():
        kinds = [(_shape(r.error), r.origin) for r in rs if r.error is not None]     # messages alike but for numbers
        errors = Counter(kinds)
        example = {kind: r.error[:240] for kind, r in zip(kinds, (r for r in rs if r.error is not None))}
        for key, cnt in errors.most_common(3):
            out.append(f"- **{name}**, {cnt} run(s): `{example[key]}`" + (f" (raised at `{key[1]}`)" if key[1] else ""))
        reasons = Counter(reason.split(":")[0][:90] for r in rs if r.verdict == "Untrustworthy" for reason in r.reasons)
        if reasons:
            out.append(f"- {name}, Untrustworthy because: " + "; ".join(f"{why} ({cnt})" for why, cnt
                                                                          in reasons.most_common(3)))
    return out


def _commit() -> str:
    try:
        sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "labelshift", "tasks",
                                "flows"], capture_output=True, text=True).stdout.strip()
        return sha + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--seeds", type=int, default=30, help="seeds (runs) per fast case (default 30)")
    ap.add_argument("--slow-seeds", type=int, default=1, help="seeds per slow case, k = 100 and 1,000 (default 1)")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all); " + ", ".join(CASES))
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take (default 600)")
    ap.add_argument("--memory-gib", type=float, default=6.0, help="address-space cap of a worker in GiB (default 6)")
    ap.add_argument("--label", default="", help="a word for the heading, e.g. 'before' (today's code) or 'after': "
                    "each label has a section of its own in the README")
    ap.add_argument("--write-readme", action="store_true", help="also write the table into benchmarks/README.md")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.cases.split(",") if n.strip()] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"bench_zoo.py: no case {', '.join(unknown)}; the cases are {', '.join(CASES)}", file=sys.stderr)
        return 2
    work = [(n, s, args.timeout, args.memory_gib) for n in names
             for s in range(args.seeds if case(n).fast else args.slow_seeds)]
    import tasks.reestimation.assessment  # noqa: F401  (imported once here, before the workers fork)
    import tasks.reestimation.references  # noqa: F401

    commit = _commit()                            # the code the runs use (read before they start)

    t0 = time.perf_counter()
    got = run_chunks(one_run, work, max(1, args.jobs), t0)
    runs = {n: sorted(got.get(n, []), key=lambda r: r.seed) for n in names}
    rows = [summarise(n, rs) for n, rs in runs.items() if rs]
    elapsed = time.perf_counter() - t0
    section = SECTION + (f" ({args.label})" if args.label else "")
    argv_text = " ".join(argv if argv is not None else sys.argv[1:])
    lines = [section, "", f"Run {_dt.date.today().isoformat()} on commit {commit}.", "",
             f"`python benchmarks/{Path(__file__).name} {argv_text}` on {cpu_model()}, nproc {os.cpu_count()} (shared "
             f"with other jobs), Python {platform.python_version()}, numpy {np.__version__}; {elapsed / 60:.0f} min. "
             f"Seeds: {args.seeds} per fast case, {args.slow_seeds} per slow case (k = 100, 1,000; a run stopped after "
             f"{args.timeout:.0f} s or at {args.memory_gib:g} GiB counts as an exception). Cases, the runner and "
             "the truth: the docstrings of `labelshift/experiments/zoo.py`, `tests/zoo_support.py` and this script.",
             "", "Columns: verdict counts in the order " + " / ".join(VERDICTS[::-1]) + "; coverage of the 95% "
             "interval over the runs called Shifted or No shift (in brackets), of the population target prior "
             "(mean over classes / worst class) and of the target set's label frequencies; Not label shift as a "
             f"share of the runs without exception (every target is truly label-shifted); median seconds per run. "
             f"✗ marks a missed goal (no exception; coverage >= {GOAL_MEAN} mean, >= {GOAL_WORST} worst; Not label "
             f"shift <= {100 * GOAL_NLS:.0f}%).", "", *table(rows), "", "Exceptions and reasons:", "",
             *(messages(runs) or ["- none"])]
    publish(section, lines, args.write_readme, README)
    return 0


if __name__ == "__main__":
    sys.exit(main())
