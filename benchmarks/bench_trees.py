"""The default re-estimation path of two source trees, timed in alternation on the same data: a refactor's check.

Imports ``labelshift`` (its public API only: ``BCTS``, ``assess_shift``, which a refactor keeps) from each ``--root``
in a child process, runs ``assess_shift`` with the ``reestimate`` flow's settings (MLLS, BBSE-soft cross-check, the
source-aware interval on a BCTS calibrator, the label-shift test, the accuracy estimate) on seeded Gaussian-class
logits, and reports the median wall time of ``--repeats`` calls per tree, the ratio to the first tree, and whether the
reports' JSON is identical. Children run alternately (A, B, A, B, ...), so a change in the machine's load touches both.

    python benchmarks/bench_trees.py --roots /tmp/before,. --cases 3:2000:20000,10:5000:100000,20:5000:50000
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, sys, time, hashlib
import numpy as np
sys.path.insert(0, sys.argv[1])
from labelshift import BCTS, assess_shift
k, n, m = (int(v) for v in sys.argv[2].split(":"))
rng = np.random.default_rng(k * 1000 + 7)
mu = rng.normal(size=(k, max(k, 10))) * 1.6
def logits(y):
    x = mu[y] + rng.normal(size=(len(y), mu.shape[1]))
    return (x @ mu.T - 0.5 * (mu ** 2).sum(1)).astype(np.float32)
ys = rng.choice(k, n, p=rng.dirichlet(np.full(k, 50.0)))
yt = rng.choice(k, m, p=rng.dirichlet(np.ones(k)))
Xs, Xt = logits(ys), logits(yt)
cal = BCTS().fit(Xs, ys)
S, P = cal.predict_proba(Xs), cal.predict_proba(Xt)
ps = S.mean(0) / S.mean(0).sum()
t0 = time.perf_counter()
try:                                    # the API since issue 30: holdout, target and settings as objects
    from labelshift import AssessmentSettings, Holdout, Target
    rep = assess_shift(Holdout(S, ys, ps, outputs=Xs, calibrator=cal), Target(P, Xt), AssessmentSettings())
except ImportError:                     # a tree before it
    rep = assess_shift(S, ys, P, source_prior=ps, estimator="MLLS", cross_check=["BBSE-soft"],
                       interval="source-aware", source_outputs=Xs, target_outputs=Xt, calibrator=cal)
dt = time.perf_counter() - t0
digest = hashlib.sha256(json.dumps(rep.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:16]
print(json.dumps({"seconds": dt, "verdict": str(rep.verdict), "digest": digest}))
"""


def run(root: str, case: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(Path(root).resolve()), case], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--roots", default="/tmp/before,.", help="comma-separated trees; the first is the baseline")
    ap.add_argument("--cases", default="3:2000:20000,10:5000:100000,20:5000:50000", help="k:n:m,...")
    ap.add_argument("--repeats", type=int, default=3, help="calls per tree and case (default 3)")
    a = ap.parse_args()
    roots = a.roots.split(",")
    print(f"| k | n | m | {' | '.join(f'{r} (s)' for r in roots)} | ratio to {roots[0]} | same report |")
    print("|---|---|---|" + "---|" * len(roots) + "---|---|")
    for case in a.cases.split(","):
        runs = {r: [] for r in roots}
        for _ in range(a.repeats):
            for r in roots:
                runs[r].append(run(r, case))
        med = {r: statistics.median(x["seconds"] for x in runs[r]) for r in roots}
        same = len({x["digest"] for r in roots for x in runs[r]}) == 1
        ratios = ", ".join(f"{med[r] / med[roots[0]]:.2f}" for r in roots[1:])
        print(f"| {' | '.join(case.split(':'))} | {' | '.join(f'{med[r]:.2f}' for r in roots)} | {ratios} | "
              f"{'yes' if same else 'no'} |", flush=True)


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"\n{time.perf_counter() - t0:.0f} s")
