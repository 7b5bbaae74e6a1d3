"""Coverage, width and speed of the source-aware interval (:mod:`labelshift.inference.source_aware`) against the present
target-only Fisher interval (:func:`labelshift.inference.intervals.fisher_interval`).

The problem (:class:`labelshift.experiments.well_specified.WellSpecifiedGaussians`, ``make(k)``, seed 0): k Gaussian
classes N(3 e_y, I_k) under a mildly imbalanced source prior; the model's logits are the exact posterior logits
times 1.8 plus a per-class bias, so BCTS is well specified (it contains the exact posterior). Per seed, as a user
runs it: draw a target prior from Dirichlet(alpha 1_k); draw n labelled holdout rows from the source; fit BCTS on
them; p_s = the mean calibrated holdout prediction; draw m target rows from the target prior; MLLS; both intervals
at level 0.95 on the same estimate. The truth to cover is the drawn (population) target prior.

Per cell (k, alpha, n, m), over the seeds:

* coverage of free classes (w_hat_y > PIN_TOL), Fisher and source-aware, with the binomial standard error
  sqrt(c (1 - c) / N) of the source-aware coverage (N = free class-intervals; the classes of one seed are nearly
  independent here, as the prior is redrawn per seed);
* classes pinned at w = 0 apart: how many, and the coverage of each interval's one-sided [0, U] on them;
* width / oracle: the root-mean-square width of the intervals on free classes over 2 z RMSE, RMSE the root mean
  square error of the estimate over the seeds -- each seed has a fresh holdout and a fresh target, so RMSE is the
  spread of the estimate over both; an exact normal interval has ratio 1 (mean se^2 = mean error^2);
* the share of estimates reported untrustworthy by the source-aware interval.

The timing table runs on one problem at m = 100,000, k = 10 (median over repeats; the machine is shared).

``--null-seeds N`` also measures the false-alarm rate of the ``reestimate`` flow's no-shift test (the two-sample
test of :func:`labelshift.inference.no_shift.no_shift_test` with the calibrated holdout as its source side) on null
draws: the same per-seed procedure with the target drawn from the source prior itself, N seeds per (k, n, m) of
``--null-n`` x ``--null-m`` (default n in {500, 1,000, 5,000}, m in {1,000, 20,000}; goal <= 7% at the nominal 5%). On
the same draws it also reports the earlier form of the test (each side's own covariance, chi^2 reference) for
comparison. ``--power-seeds N`` adds the rejection rate under a mild shift: the target prior drawn per seed from
Dirichlet(c p_s), centred on the source prior, c = ``--power-concentration`` (default 1,000).

    python benchmarks/bench_intervals.py                    # the whole grid (about 15 min of CPU on 2 cores)
    python benchmarks/bench_intervals.py --quick            # a smoke test
    python benchmarks/bench_intervals.py --write-readme     # also write the section of benchmarks/README.md
    python benchmarks/bench_intervals.py --skip-grid --skip-timing --null-seeds 2000 --power-seeds 400 \
        --workers 1 --write-readme                          # only the no-shift test's table (subsection)
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
from scipy.linalg import null_space  # noqa: E402
from scipy.stats import chi2, norm  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from labelshift.calibration.scaling import BCTS, NBVS, TemperatureScaling, VectorScaling  # noqa: E402
from labelshift.experiments.well_specified import WellSpecifiedGaussians  # noqa: E402
from labelshift.inference.source_aware import source_aware_interval  # noqa: E402
from labelshift.estimation.solvers import mlls_newton  # noqa: E402
from labelshift.inference.intervals import fisher_interval  # noqa: E402
from labelshift.inference.no_shift import no_shift_test  # noqa: E402

from report_utils import cpu_model, run_chunks, write_section  # noqa: E402

SECTION = "## Intervals that include the holdout's error (source-aware vs Fisher)"
NULL_SUBSECTION = "### False alarms of the no-shift test"
SIGNIFICANCE = 0.05
LEVEL = 0.95


# ---------------------------------------------------------------------------------------------------------------
# one seed of one cell
# ---------------------------------------------------------------------------------------------------------------
CALIBRATORS = {"BCTS": BCTS, "TS": TemperatureScaling, "VS": VectorScaling, "NBVS": NBVS}


def run_seed(k: int, alpha: float, n: int, m: int, seed: int, calibrator: str = "BCTS") -> dict:
    problem = WellSpecifiedGaussians.make(k)
    rng = np.random.default_rng([k, int(round(alpha * 1000)), n, m, seed])
    prior = rng.dirichlet(alpha * np.ones(k))
    Xh, yh = problem.holdout(n, rng)
    Xt, _ = problem.draw(prior, m, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = CALIBRATORS[calibrator]().fit(Xh, yh)
        r = source_aware_interval(Xh, yh, Xt, cal, level=LEVEL)
        once = source_aware_interval(Xh, yh, Xt, cal, level=LEVEL, weights=r.weights, holdout_inflation=1.0)
    f = r.target_only
    return {"prior": prior, "est": r.target_prior, "pinned": r.pinned, "cov_new": r.covers(prior),
            "cov_fisher": f.covers(prior), "width_new": r.width, "width_fisher": f.width,
            "cov_once": once.covers(prior), "width_once": once.width, "kappa": r.extra["holdout_inflation"],
            "trustworthy": r.trustworthy}


def _run_chunk(args):
    k, alpha, n, m, seeds, calibrator = args
    return (k, alpha, n, m), [run_seed(k, alpha, n, m, s, calibrator) for s in seeds]


def unpooled_p_value(P: np.ndarray, S: np.ndarray) -> float:
    """The earlier form of the two-sample test, kept here for comparison only: each side's own covariance,
    T = d^T [Sigma_hat_t / m + Sigma_hat_s / n]^+ d, against chi^2 with k - 1 degrees of freedom."""
    (m, k), n = P.shape, S.shape[0]
    U = null_space(np.ones((1, k)))
    d = U.T @ (P.mean(axis=0) - S.mean(axis=0))
    V = U.T @ (np.cov(P, rowvar=False) / m + np.cov(S, rowvar=False) / n) @ U
    return float(chi2.sf(d @ np.linalg.solve(V, d), k - 1))


def run_null_seed(k: int, n: int, m: int, seed: int, calibrator: str = "BCTS",
                  concentration: float | None = None) -> tuple[float, float, float, float]:
    """(p-value of the flow's no-shift test, p-value of the earlier unpooled form, p-value of the flow's test with
    the holdout counted once (``holdout_inflation=1``, the test before issue 38), the default's kappa) on one draw:
    the target is drawn from the source prior (``concentration=None``) or from a prior drawn from
    Dirichlet(concentration p_s)."""
    problem = WellSpecifiedGaussians.make(k)
    rng = np.random.default_rng([k, 0, n, m, seed, 7])
    Xh, yh = problem.holdout(n, rng)
    prior = problem.source_prior
    if concentration is not None:
        prior = np.random.default_rng([k, n, m, seed, 98]).dirichlet(concentration * prior)
    Xt, _ = problem.draw(prior, m, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = CALIBRATORS[calibrator]().fit(Xh, yh)
        S, P = cal.predict_proba(Xh), cal.predict_proba(Xt)
        ps = S.mean(axis=0)
        ps = ps / ps.sum()
        w = np.maximum(mlls_newton(P, ps).weights, 0.0)
        test = no_shift_test(P, w, ps, source_probs=S)
        once = no_shift_test(P, w, ps, source_probs=S, holdout_inflation=1.0)
        return float(test.p_value), unpooled_p_value(P, S), float(once.p_value), float(test.holdout_inflation)


def _run_null_chunk(args):
    k, n, m, seeds, calibrator, concentration = args
    return (k, n, m, concentration), [run_null_seed(k, n, m, s, calibrator, concentration) for s in seeds]


def _rate(pvals) -> tuple[float, float, int]:
    """(rejection rate at SIGNIFICANCE, its binomial se, count)."""
    pvals = np.asarray(pvals)
    rate = float(np.mean(pvals < SIGNIFICANCE))
    return rate, float(np.sqrt(rate * (1 - rate) / len(pvals))), len(pvals)


def null_sizes(ks, ns, ms, seeds: int, workers: int, calibrator: str, power_seeds: int = 0,
               concentration: float = 1000.0) -> dict:
    """{(k, n, m): {"null": (rate, se, seeds), "null_unpooled": ..., and with power seeds "power", "power_unpooled"}}
    at SIGNIFICANCE; the cells' chunks run biggest first."""
    tasks = []
    for k in ks:
        for n in ns:
            for m in ms:
                for count, conc in ((seeds, None), (power_seeds, concentration)):
                    step = max(1, count // 8)
                    for s0 in range(0, count, step):
                        tasks.append((k, n, m, list(range(s0, min(count, s0 + step))), calibrator, conc))
    tasks.sort(key=lambda t: -(t[0] * (t[1] + t[2])))
    pvals = run_chunks(_run_null_chunk, tasks, workers, time.perf_counter())
    out: dict = {}
    for (k, n, m, conc), pairs in pvals.items():
        name = "null" if conc is None else "power"
        pairs = np.asarray(pairs)
        cell = out.setdefault((k, n, m), {})
        cell[name], cell[f"{name}_unpooled"] = _rate(pairs[:, 0]), _rate(pairs[:, 1])
        cell[f"{name}_once"], cell["kappa"] = _rate(pairs[:, 2]), float(np.median(pairs[:, 3]))
    return out


def null_report(sizes: dict, command: str, wall: float, calibrator: str, concentration: float = 1000.0) -> str:
    with_power = any("power" in cell for cell in sizes.values())
    lines = [NULL_SUBSECTION, "",
             f"The flow's no-shift test (`no_shift_test(P, w, p_s, source_probs=S)`: Hotelling's two-sample test of "
             f"the mean calibrated prediction, target against the holdout, pooled covariance, F reference, the "
             f"holdout counted kappa times; `docs/uncertainty.md`) on null draws: the target is drawn from the source "
             f"prior, {calibrator} refit on every holdout (a fresh holdout per seed: the rates are averaged over "
             f"holdouts), nominal level {SIGNIFICANCE:g}. *kappa = 1* is the test with the holdout counted once (before "
             f"issue 38), *unpooled* the earlier form (each side's own covariance, chi^2 reference), both on the same "
             f"draws. Produced by `{command}` on "
             f"{_dt.date.today().isoformat()} ({wall / 60:.1f} min on {os.cpu_count()} shared cores). "
             "Goal: false alarms at most 7% in every cell."
             + (f" *Power*: rejection rate when the target prior is drawn per seed from Dirichlet({concentration:g} "
                "p_s), a mild shift centred on the source prior (unpooled / kappa = 1 / now)." if with_power else ""),
             "",
             "| k | n | m | kappa | false alarms | se | seeds | goal | kappa = 1 | unpooled |"
             + (" power unpooled / kappa = 1 / now | power seeds |" if with_power else ""),
             "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if with_power else "")]
    met = 0
    for (k, n, m), cell in sorted(sizes.items()):
        rate, se, count = cell["null"]
        old, _, _ = cell["null_unpooled"]
        once, _, _ = cell["null_once"]
        met += rate <= 0.07
        row = (f"| {k} | {n} | {m} | {cell['kappa']:.2f} | {100 * rate:.1f}% | {100 * se:.1f}% | {count} | "
               f"{'met' if rate <= 0.07 else 'missed'} | {100 * once:.1f}% | {100 * old:.1f}% |")
        if with_power:
            if "power" in cell:
                (pw, _, pcount), (pw_old, _, _), (pw_once, _, _) = (cell["power"], cell["power_unpooled"],
                                                                    cell["power_once"])
                row += f" {100 * pw_old:.1f}% / {100 * pw_once:.1f}% / {100 * pw:.1f}% | {pcount} |"
            else:
                row += " - | 0 |"
        lines.append(row)
    lines += ["", f"Goal met in {met} of {len(sizes)} cells."]
    return "\n".join(lines) + "\n"


def write_null_subsection(text: str) -> None:
    """Put the subsection at the end of the benchmark's section of benchmarks/README.md (replacing an older one)."""
    import re

    from report_utils import README

    readme = README.read_text()
    section = re.search(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", readme, re.S | re.M)
    if section is None:
        raise SystemExit(f"benchmarks/README.md has no section {SECTION!r}; run the grid with --write-readme first")
    body = section.group(0)
    body = re.sub(rf"^{re.escape(NULL_SUBSECTION)}\n.*?(?=^### |^## |\Z)", "", body, flags=re.S | re.M)
    body = body.rstrip("\n") + "\n\n" + text + "\n"
    README.write_text(readme[:section.start()] + body + readme[section.end():])


def summarise(rows: list[dict]) -> dict:
    pinned = np.concatenate([r["pinned"] for r in rows])
    free = ~pinned
    err = np.concatenate([r["est"] - r["prior"] for r in rows])[free]
    z = norm.ppf(0.5 * (1 + LEVEL))
    rmse = float(np.sqrt(np.mean(err ** 2)))
    out = {"seeds": len(rows), "n_free": int(free.sum()), "n_pinned": int(pinned.sum()),
           "untrustworthy": float(np.mean([not r["trustworthy"] for r in rows]))}
    out["kappa"] = float(np.median([r.get("kappa", 1.0) for r in rows]))
    for name in ("new", "fisher", "once"):
        if f"cov_{name}" not in rows[0]:
            continue
        cov = np.concatenate([r[f"cov_{name}"] for r in rows])
        width = np.concatenate([r[f"width_{name}"] for r in rows])
        out[f"cov_{name}"] = float(cov[free].mean())
        out[f"pin_{name}"] = float(cov[pinned].mean()) if pinned.any() else float("nan")
        out[f"ratio_{name}"] = float(np.sqrt(np.mean(width[free] ** 2)) / (2 * z * rmse))
    c = out["cov_new"]
    out["se_new"] = float(np.sqrt(c * (1 - c) / max(out["n_free"], 1)))
    return out


# ---------------------------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------------------------
def timing(n: int, m: int, k: int, repeats: int) -> list[tuple[str, tuple[float, float]]]:
    """(label, (median wall seconds, median CPU seconds)) per call; one BLAS thread (set at the top)."""
    problem = WellSpecifiedGaussians.make(k)
    rng = np.random.default_rng(12345)
    Xh, yh = problem.holdout(n, rng)
    cal = BCTS().fit(Xh, yh)
    out = []
    for label, prior in (("all classes present", np.full(k, 1.0 / k)),
                         ("one class absent (pinned at w = 0)", np.r_[0.0, np.full(k - 1, 1.0 / (k - 1))])):
        Xt, _ = problem.draw(prior, m, rng)
        ps = cal.predict_proba(Xh).mean(axis=0)
        P = cal.predict_proba(Xt)
        w = np.maximum(mlls_newton(P, ps).weights, 0.0)

        def best(fn, *fargs, **fkw):
            wall, cpu = [], []
            for _ in range(repeats):
                t0, c0 = time.perf_counter(), time.process_time()
                fn(*fargs, **fkw)
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            return float(np.median(wall)), float(np.median(cpu))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out.append((f"{label}: `source_aware_interval(..., weights=w)` (MLLS estimate given)",
                        best(source_aware_interval, Xh, yh, Xt, cal, weights=w)))
            out.append((f"{label}: `source_aware_interval(...)` (solves MLLS too)",
                        best(source_aware_interval, Xh, yh, Xt, cal)))
            out.append((f"{label}: `mlls_newton` alone (the estimate)", best(mlls_newton, P, ps)))
            out.append((f"{label}: `fisher_interval(P, w, p_s)` (target only, for reference)",
                        best(fisher_interval, P, w, ps)))
    return out


# ---------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------
def inflation_table(results: dict) -> str:
    """The grid's cells before (the holdout counted once, ``holdout_inflation=1``) and now (the default kappa), on
    the same draws: coverage of the free classes and width/oracle."""
    lines = ["| k | alpha | n | m | seeds | median kappa | cov kappa = 1 | **cov now** | se | width/oracle kappa = 1 | "
             "**width/oracle now** |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (k, alpha, n, m), c in sorted(results.items()):
        lines.append(f"| {k} | {alpha:g} | {n} | {m} | {c['seeds']} | {c['kappa']:.3f} | {c['cov_once']:.3f} | "
                     f"**{c['cov_new']:.3f}** | {c['se_new']:.3f} | {c['ratio_once']:.2f} | **{c['ratio_new']:.2f}** |")
    return "\n".join(lines)


def fmt(x, digits=3):
    return "-" if x != x else f"{x:.{digits}f}"


def build_report(args, results, times, wall, command) -> str:
    """The README section. ``wall`` and ``command`` describe the run that produced the grid (which may have been
    saved with --save and loaded with --load)."""
    z_lo, z_hi = 0.93, 0.97
    lines = [SECTION, "",
             "`benchmarks/bench_intervals.py` measures the source-aware interval of `labelshift.inference.source_aware` "
             f"(its covariance includes the {args.calibrator} calibrator's parameters and p_s, both fit on the n-row "
             "labelled holdout; derivation and limits in `docs/intervals.md`) against the present target-only Fisher "
             "interval, on the problem of the script's docstring"
             + (f", where {args.calibrator} is well specified" if args.calibrator in ("BCTS", "VS") else
                f", where {args.calibrator} is NOT well specified (the model's per-class bias is outside it)")
             + ". Nominal level 0.95; truth = "
             "the population target prior drawn from Dirichlet(alpha).",
             "",
             f"Produced by `{command}` on {_dt.date.today().isoformat()}; machine: {cpu_model()}, "
             f"nproc {os.cpu_count()} (shared with other jobs), Python {platform.python_version()}, numpy "
             f"{np.__version__}; {args.workers} worker process(es), grid wall time {wall / 60:.1f} min (the machine was "
             "shared with other jobs). Seeds per cell: "
             f"{args.seeds3} at k = 3, {args.seeds10} at k = 10 (each seed: fresh prior, holdout and target).",
             "",
             "Columns: *cov* = coverage of the free classes (w_hat > 1e-8); *se* = its binomial standard error; "
             "*pinned* = class-intervals pinned at w = 0 and the coverage of their one-sided [0, U] (Fisher / new); "
             "*width/oracle* = RMS width over 2 z RMSE of the estimate over fresh holdouts and targets (1 = exact); "
             "*untr.* = share of seeds the new interval reports untrustworthy. Goal: new cov in [0.93, 0.97], "
             "width/oracle <= 1.3.",
             "",
             "| k | alpha | n | m | Fisher cov | **new cov** | se | pinned: n, Fisher / new cov | width/oracle Fisher "
             "| **width/oracle new** | untr. | goals |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    n_ok = n_cells = 0
    misses = []
    for (k, alpha, n, m), s in sorted(results.items(), key=lambda kv: (kv[0][0], -kv[0][1], kv[0][2], kv[0][3])):
        ok_cov = z_lo <= s["cov_new"] <= z_hi
        ok_w = s["ratio_new"] <= 1.3
        n_cells += 1
        n_ok += ok_cov and ok_w
        if not (ok_cov and ok_w):
            misses.append(f"k = {k}, alpha = {alpha:g}, n = {n}, m = {m}: cov {s['cov_new']:.3f}, "
                          f"width/oracle {s['ratio_new']:.2f}")
        pin = (f"{s['n_pinned']}: {fmt(s['pin_fisher'])} / {fmt(s['pin_new'])}" if s["n_pinned"] else "0")
        lines.append(f"| {k} | {alpha:g} | {n} | {m} | {fmt(s['cov_fisher'])} | **{fmt(s['cov_new'])}** | "
                     f"{fmt(s['se_new'])} | {pin} | {fmt(s['ratio_fisher'], 2)} | **{fmt(s['ratio_new'], 2)}** | "
                     f"{fmt(s['untrustworthy'], 2)} | {'met' if ok_cov and ok_w else 'missed'} |")
    lines += ["", f"Goals met in {n_ok} of {n_cells} cells."]
    if misses:
        lines += ["Missed: " + "; ".join(misses) + "."]
    if times:
        lines += ["", f"### Time at m = {args.time_m}, k = 10 (n = {args.time_n}; median of {args.repeats}; one BLAS "
                  "thread)", ""]
        if getattr(args, "timing_command", command) != command:
            lines += [f"Timed by `{args.timing_command}` (the grid above was loaded from the run that saved it).", ""]
        lines += [f"Measured on {cpu_model()} with a load average of {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
                  "cores, so the wall times include waiting for a core; CPU time is the process's own.", "",
                  "| call | wall (s) | CPU (s) |", "|---|---|---|"]
        lines += [f"| {name} | {w:.4f} | {c:.4f} |" for name, (w, c) in times]
        lines += ["", "Goal: under 0.1 s at m = 100,000, k = 10."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", default=[500, 1000, 5000], help="holdout sizes")
    ap.add_argument("--m", type=int, nargs="+", default=[1000, 20_000, 100_000], help="target sizes")
    ap.add_argument("--k", type=int, nargs="+", default=[3, 10], help="numbers of classes")
    ap.add_argument("--alpha", type=float, nargs="+", default=[1.0, 0.3], help="Dirichlet concentrations")
    ap.add_argument("--seeds3", type=int, default=160, help="seeds per cell at k = 3")
    ap.add_argument("--seeds10", type=int, default=60, help="seeds per cell at k = 10 (and any k > 3)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes")
    ap.add_argument("--calibrator", choices=sorted(CALIBRATORS), default="BCTS",
                    help="calibrator fit on the holdout (BCTS and VS are well specified here; TS and NBVS are not: "
                         "the model's per-class bias is outside them)")
    ap.add_argument("--repeats", type=int, default=7, help="timing repeats")
    ap.add_argument("--time-m", type=int, default=100_000)
    ap.add_argument("--time-n", type=int, default=1000)
    ap.add_argument("--skip-grid", action="store_true")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--quick", action="store_true", help="k = 3, n = 1000, m = 1000 and 20000, 30 seeds")
    ap.add_argument("--save", type=Path, help="write the grid's per-cell summaries (and the run's settings) as JSON")
    ap.add_argument("--load", type=Path, help="report the grid saved by --save instead of running it")
    ap.add_argument("--write-readme", action="store_true", help="write the section into benchmarks/README.md")
    ap.add_argument("--null-seeds", type=int, default=0,
                    help="seeds per cell of the no-shift test's false-alarm table (0: not run)")
    ap.add_argument("--null-n", type=int, nargs="+", default=[500, 1000, 5000],
                    help="holdout sizes of the false-alarm table")
    ap.add_argument("--null-m", type=int, nargs="+", default=[1000, 20_000], help="target sizes of the false-alarm table")
    ap.add_argument("--power-seeds", type=int, default=0,
                    help="seeds per cell of the false-alarm table's power column (0: not run)")
    ap.add_argument("--power-concentration", type=float, default=1000.0,
                    help="the mild shift of the power column: target prior ~ Dirichlet(c p_s)")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.m, args.k, args.alpha, args.seeds3, args.seeds10, args.repeats = \
            [1000], [1000, 20_000], [3], [1.0], 30, 20, 3
    command = "python benchmarks/bench_intervals.py" + (" " + " ".join(sys.argv[1:] if argv is None else argv)
                                                        if (argv or sys.argv[1:]) else "")
    t0 = time.perf_counter()
    null_text = None
    if args.null_seeds:
        sizes = null_sizes(args.k, args.null_n, args.null_m, args.null_seeds, args.workers, args.calibrator,
                           args.power_seeds, args.power_concentration)
        null_text = null_report(sizes, command, time.perf_counter() - t0, args.calibrator, args.power_concentration)
        print(null_text)
        if args.skip_grid and args.skip_timing and not args.load:
            if args.write_readme:
                write_null_subsection(null_text)
                print("written to benchmarks/README.md", file=sys.stderr)
            return 0
        t0 = time.perf_counter()
    results = {}
    grid_wall = None
    args.timing_command = command
    if args.load:
        saved = json.loads(args.load.read_text())
        command, grid_wall = saved["command"], saved["wall"]
        for name in ("seeds3", "seeds10", "workers", "calibrator"):
            setattr(args, name, saved.get(name, "BCTS" if name == "calibrator" else None))
        results = {tuple(c["key"]): c["summary"] for c in saved["cells"]}
    elif not args.skip_grid:
        tasks = []
        for k in args.k:
            seeds = args.seeds3 if k <= 3 else args.seeds10
            for alpha in args.alpha:
                for n in args.n:
                    for m in args.m:
                        step = max(1, seeds // 8)
                        for s0 in range(0, seeds, step):
                            tasks.append((k, alpha, n, m, list(range(s0, min(seeds, s0 + step))),
                                          args.calibrator))
        tasks.sort(key=lambda t: -t[3] * t[0])          # big cells first: better packing over the workers
        rows = run_chunks(_run_chunk, tasks, args.workers, t0)
        results = {key: summarise(v) for key, v in rows.items()}
        grid_wall = time.perf_counter() - t0
        if args.save:
            args.save.write_text(json.dumps({
                "command": command, "wall": grid_wall, "seeds3": args.seeds3, "seeds10": args.seeds10,
                "workers": args.workers, "calibrator": args.calibrator, "cells": [{"key": list(k), "summary": v} for k, v in results.items()]},
                indent=1))
    times = None if args.skip_timing else timing(args.time_n, args.time_m, 10, args.repeats)
    report = build_report(args, results, times, grid_wall or 0.0, command)
    if results and "cov_once" in next(iter(results.values())):
        print(inflation_table(results))
    if null_text:
        report = report.rstrip("\n") + "\n\n" + null_text
    print(report)
    if args.write_readme and args.calibrator != "BCTS":
        print("not written to benchmarks/README.md: its section is the BCTS (well-specified) run", file=sys.stderr)
    elif args.write_readme:
        write_section(SECTION, report)
        print("written to benchmarks/README.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
