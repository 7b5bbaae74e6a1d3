"""Many classes: the default re-estimation path at k = 20, 100 and 1,000 classes, its parts, time and peak memory.

The default path is ``labelshift.inference.report.assess_shift`` with the ``reestimate`` flow's defaults (MLLS estimate,
BBSE-soft cross-check, source-aware interval with a BCTS calibrator, the accuracy estimate, the no-shift test, the
label-shift test, the identifiability report), on a BCTS calibrator fit on the holdout's raw logits and p_s = the
mean calibrated holdout prediction, as ``tasks.reestimation.assessment.estimate_shift`` calls it. Its baseline, timed in the
same process right before it, is the MLLS estimate alone (``MLLS().fit(S, y, p_s).estimate(P)``, median of 3): the
issue's goal is the whole path in at most 20 times that (issue 20). The BCTS fit on the holdout, before both, is
timed apart ("BCTS fit"; not part of the path, which takes a fitted calibrator).

Data (all seeds fixed): k Gaussian classes N(mu_y, I_d) in d = min(max(k, 10), 64) dimensions with random means
scaled so that the Bayes classifier is ``--accuracy`` (default 0.9) accurate on balanced classes; the model's
logits are the linear Bayes logits x mu_y - |mu_y|^2 / 2, as float32 (what a deployed model gives); the source
prior is Dirichlet(50) (mildly imbalanced), the target prior Dirichlet(1) (a real label shift). The holdout has n
rows, the target m. The calibrated rows are made block by block: the holdout's as float64, the target's as float32
(as the flow stores its target batches; since session 11 -- ``--target-float64`` gives the float64 of before, 0.8 GB
more at k = 1,000). "RSS before the path" is the peak of the child up to the path (data, calibrator, baseline).

Each case runs in a child process, which reports its own peak resident memory (``resource.getrusage``,
ru_maxrss: data, calibrated outputs and the path together). Each part's time is measured inside the one
``assess_shift`` call, by wrapping the functions ``labelshift.inference.report`` calls (the estimators' fits and
estimates are the remainder, "estimates"). ``--root`` imports ``labelshift`` from another tree (e.g. an export of the
code before this benchmark's changes: ``git archive b7a6e11 labelshift | tar -x -C /tmp/before``), so that before and
after come from the same script; a case that does not finish in ``--timeout`` seconds is reported as such.

    python benchmarks/bench_many_classes.py                                  # k = 20, 100, 1000 (a few minutes)
    python benchmarks/bench_many_classes.py --cases 100:10000:100000 --root /tmp/before --timeout 900
"""
from __future__ import annotations

import argparse
from labelshift import Holdout, Target, AssessmentSettings
import functools
import json
import os
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CASES = "20:10000:50000,100:10000:100000,1000:50000:100000"
PARTS = ("source_aware_interval", "expected_accuracy", "no_shift_test", "label_shift_test", "identifiability")


def synthetic(k: int, n: int, m: int, accuracy: float, seed: int = 0):
    """(holdout logits (n, k) float32, holdout labels, target logits (m, k) float32, target labels): the data of
    the module docstring."""
    import numpy as np
    rng = np.random.default_rng(seed)
    d = min(max(k, 10), 64)
    base = rng.normal(size=(k, d))
    source, target = rng.dirichlet(np.full(k, 50.0)), rng.dirichlet(np.ones(k))

    def draw(mu, prior, rows, r):
        y = r.choice(k, size=rows, p=prior)
        x = mu[y] + r.normal(size=(rows, d))
        return (x @ mu.T - 0.5 * (mu ** 2).sum(axis=1)).astype(np.float32), y

    lo, hi = 0.01, 20.0                          # bisection on the scale of the means: the Bayes accuracy
    for _ in range(30):
        s = (lo * hi) ** 0.5
        z, y = draw(base * s, np.full(k, 1.0 / k), 4000, np.random.default_rng(1))
        lo, hi = (s, hi) if (z.argmax(axis=1) == y).mean() < accuracy else (lo, s)
    mu = base * (lo * hi) ** 0.5
    zs, ys = draw(mu, source, n, rng)
    zt, yt = draw(mu, target, m, rng)
    return zs, ys, zt, yt


def run_case(k: int, n: int, m: int, accuracy: float, label_shift_check: bool = True,
             target_float32: bool = True) -> dict:
    """One case in this process: the MLLS baseline, then the default path with its parts timed. The calibrated
    target rows are float32 (as the flow stores them) unless ``target_float32`` is False (float64, as before
    session 11)."""
    import numpy as np
    from labelshift.inference import report
    from labelshift.calibration import BCTS
    from labelshift.estimation.estimators import MLLS

    from labelshift.rows import blocks
    zs, ys, zt, _ = synthetic(k, n, m, accuracy)
    t = time.perf_counter()
    cal = BCTS().fit(zs, ys)
    fit_s = time.perf_counter() - t
    # the calibrated rows made block by block (no whole float64 copy of the logits): the holdout's float64, the
    # target's float32, as the flow holds them (its target batches are stored as float32)
    S = np.empty(zs.shape)
    for sl in blocks(n, width=k):
        S[sl] = cal.predict_proba(zs[sl].astype(np.float64))
    P = np.empty(zt.shape, dtype=np.float32 if target_float32 else np.float64)
    for sl in blocks(m, width=k):
        P[sl] = cal.predict_proba(zt[sl])
    prior = S.mean(axis=0)
    prior = prior / prior.sum()
    base = []
    for _ in range(3):
        t = time.perf_counter()
        MLLS().fit(S, ys, prior).estimate(P)
        base.append(time.perf_counter() - t)
    data_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    spent = {}
    for name in PARTS:
        fn = getattr(report, name)

        def timed(*args, _fn=fn, _name=name, **kwargs):
            t0 = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                spent[_name] = spent.get(_name, 0.0) + time.perf_counter() - t0
        setattr(report, name, timed)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = report.assess_shift(Holdout(S, ys, prior, outputs=zs, calibrator=cal),
                                  Target(P, zt),
                                  AssessmentSettings(estimator="MLLS", cross_check=["BBSE-soft"], interval="source-aware", label_shift_check=label_shift_check))
    total = time.perf_counter() - t
    lst = rep.label_shift
    return {"k": k, "n": n, "m": m, "holdout_accuracy": float((S.argmax(axis=1) == ys).mean()),
            "mlls_s": float(np.median(base)), "total_s": total, "bcts_fit_s": fit_s, "ratio": total / float(np.median(base)),
            "parts_s": {**spent, "estimates": total - sum(spent.values())},
            "verdict": rep.verdict, "label_shift_p": None if lst is None else float(lst.p_value),
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, "data_rss_gib": data_rss}


SIZE_POWER_CASES = (("size", 0.0), ("shift", 1.0), ("contract", 0.9))


def size_power_replicate(args) -> tuple:
    """One replicate of the label-shift test at k = 100 (the Gauss problem of bench_label_shift_test.py with k = 100,
    d = 16, separation 1.5: 83% accurate): a holdout of n rows, BCTS on it, one target of m rows whose prior cycles
    through that script's four families; ``kind`` 'size' (true label shift), 'shift' (each class mean moved by
    ``amount`` along its own random unit vector) or 'contract' (means moved to ``amount`` x their distance from the
    centroid); ``log_odds`` as label_shift_test's (None: its default, the regions part alone at k = 100; True: both
    parts). Returns (kind, amount, family, [p-value, regions part's, log-odds part's (nan when not run)] or None
    when the test refuses the holdout, seconds of the test)."""
    kind, amount, n, m, seed, root, log_odds = args
    sys.path.insert(0, root)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import numpy as np
    from bench_label_shift_test import PRIOR_FAMILIES, Gauss, _softmax_cal, target_prior
    from labelshift.errors import InputError
    from labelshift.inference.label_shift_test import label_shift_test
    prob = Gauss(k=100, d=16, sep=1.5)
    rng = np.random.default_rng([20, n, m, seed, SIZE_POWER_CASES.index((kind, amount))])
    zs, ys = prob.draw(prob.source_prior, n, rng)
    cal = _softmax_cal(zs, ys)
    family = PRIOR_FAMILIES[seed % len(PRIOR_FAMILIES)]
    pt = target_prior(family, prob.k, prob.source_prior, rng)
    zt, _ = prob.draw(pt, m, rng, shift=amount if kind == "shift" else 0.0,
                      contract=amount if kind == "contract" else 1.0)
    t = time.perf_counter()
    try:
        res = label_shift_test(cal.predict_proba(zs), ys, cal.predict_proba(zt), log_odds=log_odds)
        x = res.extra
        p = [res.p_value, x.get("p_value_regions", res.p_value), x.get("p_value_log_odds", float("nan"))]
    except InputError:                # a class with fewer than MIN_CLASS_ROWS holdout rows: skipped, counted
        p = None
    return kind, amount, family, p, time.perf_counter() - t


def _rate(ok, col: int, level: float = 0.05) -> str:
    """The rejection rate of p-value column ``col`` at ``level`` and its binomial standard error, in %."""
    import numpy as np
    r = float(np.mean(ok[:, col] < level))
    return f"{100 * r:.1f}% +- {100 * (r * (1 - r) / len(ok)) ** 0.5:.1f}"


def size_power(reps: dict, n: int, m: int, root: str, jobs: int, log_odds) -> None:
    """Rejection rates at 5% of the default test and its parts over ``reps[kind]`` replicates per case, with their
    binomial standard errors; one line per replicate on stderr as it comes."""
    from concurrent.futures import ProcessPoolExecutor
    import numpy as np
    tasks = [(kind, amount, n, m, seed, root, log_odds) for kind, amount in SIZE_POWER_CASES
             for seed in range(reps[kind])]
    found = {}
    with ProcessPoolExecutor(jobs) as pool:
        for kind, amount, family, p, sec in pool.map(size_power_replicate, tasks):
            print(f"{kind} {amount} {family} {p} {sec:.1f}s", file=sys.stderr, flush=True)
            found.setdefault((kind, amount), []).append(p)
    print(f"# k = 100 (Gauss, d = 16, separation 1.5), n = {n}, m = {m}, level 5%; +- binomial standard error")
    print(f"# label_shift_test(..., log_odds={log_odds})")
    print("| case | reported p-value < 5% | regions part | log-odds part | reported at 1% | replicates |")
    print("|---|---|---|---|---|---|")
    for (kind, amount), ps in found.items():
        ok = np.array([p for p in ps if p is not None])
        rate = functools.partial(_rate, ok)
        name = {"size": "size: true label shift, 4 prior families",
                "shift": f"power: each class mean moved by {amount:g}",
                "contract": f"power: means moved to {amount:g} x their distance from the centroid"}[kind]
        odds = rate(2) if not np.isnan(ok[:, 2]).any() else "not run"
        print(f"| {name} | {rate(0)} | {rate(1)} | {odds} | {rate(0, 0.01)} | {len(ok)}"
              f"{f' ({len(ps) - len(ok)} skipped)' if len(ok) < len(ps) else ''} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=DEFAULT_CASES, help="k:n:m,... (default %(default)s)")
    ap.add_argument("--accuracy", type=float, default=0.9, help="Bayes accuracy of the model (default 0.9)")
    ap.add_argument("--root", default=str(REPO), help="the tree labelshift is imported from (default: this one)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per case (default 600)")
    ap.add_argument("--size-power", metavar="SIZE,POWER", help="instead: the label-shift test's size and power at "
                    "k = 100 with this many replicates (e.g. 60,30)")
    ap.add_argument("--n", type=int, default=10_000, help="holdout rows of --size-power (default 10000)")
    ap.add_argument("--m", type=int, default=20_000, help="target rows of --size-power (default 20000)")
    ap.add_argument("--jobs", type=int, default=2, help="processes of --size-power (default 2)")
    ap.add_argument("--log-odds", action="store_true", help="--size-power with the log-odds part too (log_odds=True; "
                    "the default above 20 classes leaves it out)")
    ap.add_argument("--no-label-shift-test", action="store_true", help="leave the label-shift test out of the path "
                    "(label_shift_check=False): what the rest costs where the test does not fit")
    ap.add_argument("--target-float64", action="store_true", help="the calibrated target rows as float64 (before "
                    "session 11 the benchmark held them so; the flow holds them as float32)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.size_power:
        size, power = (int(v) for v in args.size_power.split(","))
        size_power({"size": size, "shift": power, "contract": power}, args.n, args.m, args.root, args.jobs,
                   True if args.log_odds else None)
        return
    if args.child:
        sys.path.insert(0, args.root)
        k, n, m = (int(v) for v in args.child.split(":"))
        print(json.dumps(run_case(k, n, m, args.accuracy, not args.no_label_shift_test, not args.target_float64)))
        return
    print(f"# labelshift from {args.root}; {os.cpu_count()} CPUs; Bayes accuracy {args.accuracy}"
          + ("; without the label-shift test" if args.no_label_shift_test else ""))
    print("| k | n | m | holdout acc. | MLLS (s) | default path (s) | ratio | peak RSS (GiB) | "
          "label-shift test | source-aware | accuracy | no-shift | identifiability | estimates | verdict | "
          "BCTS fit (s) | RSS before the path (GiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        cmd = [sys.executable, __file__, "--child", case, "--root", args.root, "--accuracy", str(args.accuracy)] \
            + (["--no-label-shift-test"] if args.no_label_shift_test else []) \
            + (["--target-float64"] if args.target_float64 else [])
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                 env={**os.environ, "PYTHONPATH": args.root})
        except subprocess.TimeoutExpired:
            print(f"| {' | '.join(case.split(':'))} | | not finished in {args.timeout:.0f} s | | | | | | | | | |")
            continue
        if out.returncode != 0:
            print(f"| {' | '.join(case.split(':'))} | failed: {out.stderr.strip().splitlines()[-1:]} |")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        p = r["parts_s"]
        print(f"| {r['k']} | {r['n']} | {r['m']} | {r['holdout_accuracy']:.3f} | {r['mlls_s']:.2f} | "
              f"{r['total_s']:.1f} | {r['ratio']:.1f} | {r['peak_rss_gib']:.2f} | "
              f"{p.get('label_shift_test', 0):.1f} | {p.get('source_aware_interval', 0):.1f} | "
              f"{p.get('expected_accuracy', 0):.1f} | {p.get('no_shift_test', 0):.1f} | "
              f"{p.get('identifiability', 0):.1f} | {p['estimates']:.1f} | {r['verdict']} | "
              f"{r.get('bcts_fit_s', float('nan')):.1f} | {r.get('data_rss_gib', float('nan')):.2f} |", flush=True)


if __name__ == "__main__":
    main()
