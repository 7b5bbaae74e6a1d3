"""Stopping the label-shift test's bootstrap early: the same decisions as all 200 draws, at a fraction of the draws.

Both parts of the test stop drawing once enough draws reach their statistics (Besag & Clifford's sequential p-value,
:mod:`labelshift.inference.label_shift_test.sequential`). This script runs every replicate twice on the same inputs -- as shipped,
and with the stopping rule switched off (all ``bootstrap_draws`` = 200 draws: the fixed-B test, whose p-values are
bit for bit those of the code before the rule) -- and reports, per cell:

* how many decisions differ at the 5% and the 1% level (by construction none should: every p-value the rule changes
  is above 0.0498 for the regions part and above 0.1 for the log-odds part);
* the rejection rate at 5% (the same in both runs when no decision differs);
* the draws the stopping rule used, on average, in each part (of 200);
* the test's time with the rule over its time without (same process, same inputs, alternately).

Problems: the Gaussian cells of ``bench_label_shift_test.py`` (k = 10, BCTS refit on every holdout; target priors
cycling through none, Dirichlet(10), Dirichlet(1), Dirichlet(0.3)): true label shift (size), class means moved by
1 in random directions and pulled to 0.9 x their distance from the centroid (power); and the many-class problem of
``bench_many_classes.py`` at k = 100 (regions part only, the default above 20 classes). The replicates' seeds are
``--seed-start`` onwards (default 20,000: seeds no setting was chosen on).

    python benchmarks/bench_early_stop.py                  # 100 replicates a cell (about 10 min on 2 cores)
    python benchmarks/bench_early_stop.py --reps 20        # a smoke test
    python benchmarks/bench_early_stop.py --write-readme   # also write the section of benchmarks/README.md
"""
from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_utils import one_blas_thread  # noqa: E402

one_blas_thread()

import bench_label_shift_test as blst  # noqa: E402
from report_utils import cpu_model, publish  # noqa: E402

import labelshift.inference.label_shift_test.log_odds as _log_odds  # noqa: E402
import labelshift.inference.label_shift_test.regions_fit as _regions_fit  # noqa: E402
from labelshift.inference.label_shift_test import label_shift_test  # noqa: E402
from labelshift import BCTS  # noqa: E402
from labelshift.errors import InputError  # noqa: E402

HEADING = "## Label-shift test: stopping the bootstrap early"
_SEQUENTIAL = _regions_fit.sequential_p_value
_STOPPING = _log_odds.stopping_draw


def early_stop(on: bool) -> None:
    """Switch the stopping rule of both parts on (as shipped) or off (all the draws)."""
    _regions_fit.sequential_p_value = _SEQUENTIAL if on else (lambda s, b, d: _SEQUENTIAL(s, b, d, exceedances=10 ** 9))
    _log_odds.stopping_draw = _STOPPING if on else (lambda *args: None)


def both(S, ys, P) -> dict | None:
    """The test as shipped and without the rule on the same inputs: p-values, draws used, seconds."""
    out = {}
    for on in (True, False):
        early_stop(on)
        t0 = time.perf_counter()
        try:
            res = label_shift_test(S, ys, P)
        except InputError:
            return None
        finally:
            early_stop(True)
        x = res.extra
        out[on] = {"p": res.p_value, "seconds": time.perf_counter() - t0, "regions": x["bootstrap_draws_used"],
                   "log_odds": x.get("log_odds_draws_used")}
    return out


def gauss_cell(kind: str, shift: float, n: int, m: int, reps: int, seed0: int) -> list:
    prob = blst.Gauss()
    out = []
    for seed in range(seed0, seed0 + reps):
        rng = np.random.default_rng([11, n, m, seed, int(shift * 1000)])
        zs, ys = prob.draw(prob.source_prior, n, rng)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cal = BCTS().fit(zs, ys)
        family = blst.PRIOR_FAMILIES[seed % len(blst.PRIOR_FAMILIES)]
        pt = blst.target_prior(family, prob.k, prob.source_prior, rng)
        zt, _ = prob.draw(pt, m, rng, shift=shift if kind == "shift" else 0.0,
                          contract=shift if kind == "contract" else 1.0)
        out.append(both(cal.predict_proba(zs), ys, cal.predict_proba(zt)))
    return out


def many_cell(k: int, n: int, m: int, reps: int, seed0: int) -> list:
    import bench_many_classes as bmc
    out = []
    for seed in range(seed0, seed0 + reps):
        zs, ys, zt, _ = bmc.synthetic(k, n, m, 0.9, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cal = BCTS().fit(zs.astype(np.float64), ys)
        out.append(both(cal.predict_proba(zs.astype(np.float64)), ys, cal.predict_proba(zt.astype(np.float64))))
    return out


def row(name: str, results: list) -> str:
    done = [r for r in results if r is not None]
    differ = {a: sum((r[True]["p"] < a) != (r[False]["p"] < a) for r in done) for a in (0.05, 0.01)}
    rate = np.mean([r[True]["p"] < 0.05 for r in done])
    regions = np.mean([r[True]["regions"] for r in done])
    lo = [r[True]["log_odds"] for r in done if r[True]["log_odds"] is not None]
    ratio = sum(r[True]["seconds"] for r in done) / sum(r[False]["seconds"] for r in done)
    skipped = len(results) - len(done)
    return (f"| {name} | {len(done)}{f' ({skipped} skipped)' if skipped else ''} | {differ[0.05]} | {differ[0.01]} | "
            f"{100 * rate:.1f}% | {regions:.0f} | {f'{np.mean(lo):.0f}' if lo else 'not run'} | {ratio:.2f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=100, help="replicates per cell (default 100)")
    ap.add_argument("--many-reps", type=int, default=10, help="replicates of the k = 100 cell (default 10)")
    ap.add_argument("--seed-start", type=int, default=20_000, help="first replicate seed (default 20000)")
    ap.add_argument("--write-readme", action="store_true", help="write the section of benchmarks/README.md")
    a = ap.parse_args(argv)
    t0 = time.time()
    cells = [("Gaussian k = 10, true label shift (size), n = 1,000, m = 2,000", ("size", 0.0, 1000, 2000)),
             ("Gaussian k = 10, true label shift (size), n = 5,000, m = 20,000", ("size", 0.0, 5000, 20_000)),
             ("Gaussian k = 10, means moved by 1 (power), n = 1,000, m = 2,000", ("shift", 1.0, 1000, 2000)),
             ("Gaussian k = 10, means pulled to 0.9 (power), n = 1,000, m = 2,000", ("contract", 0.9, 1000, 2000))]
    lines = [HEADING, "",
             f"`python benchmarks/bench_early_stop.py` ({_dt.date.today()}, {cpu_model()}, one BLAS thread; what it "
             "runs: the script's docstring). Each replicate runs the test as shipped and with the stopping rule off "
             f"(all 200 draws); seeds from {a.seed_start}.", "",
             "| cell | replicates | decisions that differ at 5% | at 1% | rejected at 5% | regions draws used "
             "(mean of 200) | log-odds draws used (mean of 200) | time with the rule / without |",
             "|---|---|---|---|---|---|---|---|"]
    for name, (kind, shift, n, m) in cells:
        lines.append(row(name, gauss_cell(kind, shift, n, m, a.reps, a.seed_start)))
        print(lines[-1], f"({time.time() - t0:.0f} s)", file=sys.stderr)
    lines.append(row("many classes k = 100, label shift, n = 10,000, m = 100,000", many_cell(100, 10_000, 100_000,
                                                                                             a.many_reps,
                                                                                             a.seed_start)))
    lines.append("")
    lines.append(f"Total {time.time() - t0:.0f} s.")
    publish(HEADING, lines, a.write_readme)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
