"""The miscalibration term (issue item 4): MLLS's bias on classifiers no temperature-and-bias calibration makes
canonically calibrated, against the holdout's size, and the coverage of the default path's 95% interval.

Each case of :class:`labelshift.experiments.zoo.MisspecifiedCase` (a logistic regression on 4 classes of two
clusters each, Gaussian naive Bayes on correlated features, and a depth-3 tree kept back from tuning), with its
holdout resized to ``--sizes`` rows, runs per seed through ``tests/zoo_support.py``'s default path (the reference
registered as the flow does, BCTS, MLLS, the source-aware interval, the label-shift test). Per case and holdout
size: the bias of MLLS and of BBSE-hard in a class's share (the mean over seeds of estimate - population p_t, the
largest over classes, with its standard error), the verdicts, the coverage of the interval over all runs and over
the runs a verdict trusts (Shifted or No shift), and, when the report carries it, how often the miscalibration check
acted (``labelshift/inference/miscalibration.py``).

    python benchmarks/bench_miscalibration.py --seeds 40 --sizes 3000,30000,140000 --jobs 2
    python benchmarks/bench_miscalibration.py ... --write-readme --label before
    python benchmarks/bench_miscalibration.py --zoo gauss-k2,gauss-k10,... --seeds 30   # the zoo, check off and on

``--zoo`` runs the zoo's cases (well-specified Gaussians, scikit-learn models) through the default path twice per
seed, on the same reference and target, with the check off (``miscalibration_check=False``: the report as before
it existed) and on: how often the check acts, the verdicts that change, the coverage over trusted runs off and on,
and the interval's width on over off (the cost of carrying the moment estimate on models it does not need).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report_utils import one_blas_thread, quiet_services  # noqa: E402

one_blas_thread()
quiet_services()

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime as _dt  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from labelshift.estimation.registry import make_estimator  # noqa: E402
from labelshift.experiments.zoo import case  # noqa: E402
from labelshift.inference.report import VERDICTS  # noqa: E402
from tests.zoo_support import TRUSTED_VERDICTS  # noqa: E402

from report_utils import cpu_model, publish, run_chunks  # noqa: E402

SECTION = "## The miscalibration term: MLLS on classifiers no BCTS calibrates"
README = Path(__file__).resolve().parent / "README.md"
CASES = ("lr-two-clusters", "nb-correlated", "tree-shallow")


def one_run(task: tuple) -> tuple[tuple[str, int], list[dict]]:
    """Worker: (case, holdout rows, seed) -> ((case, rows), [one run's record]): the steps of
    ``tests/zoo_support.py``'s :func:`default_report`, and BBSE-hard fit on the same reference and target."""
    from flows.params import ReestimateParameters
    from labelshift.inference.holdout import Target
    from tasks.reestimation.assessment import estimate_shift
    from tests.zoo_support import _reference, _scored

    name, n, seed = task
    c = dataclasses.replace(case(name), n=n)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            bundle, target = _reference(c, seed), c.target(seed)
            probs, raw = _scored(bundle, target.outputs)
            report = estimate_shift.fn(bundle.holdout, Target(probs, raw), ReestimateParameters().assessment())
        except Exception as exc:      # recorded, as bench_zoo does
            return (name, n), [{"error": f"{type(exc).__name__}: {exc}"}]
        seconds = time.perf_counter() - t0
        fit = make_estimator("BBSE-hard").fit(bundle.source_probs, bundle.source_labels, bundle.source_prior)
        bbse = np.asarray(fit.estimate(probs.astype(np.float64)).target_prior)
    mis = getattr(report, "miscalibration", None)
    return (name, n), [{"error": None, "verdict": str(report.verdict),
                        "mlls": np.asarray(report.target_prior) - target.prior, "bbse": bbse - target.prior,
                        "covers": np.asarray(report.interval.covers(target.prior)),
                        "acted": None if mis is None else bool(mis.acts), "seconds": seconds}]


#: cases beside the zoo's, by name (``--real``: ResNet-18's Fashion-MNIST logits, the digits model), made in
#: main before the workers fork (their prior rules are closures, which do not pickle)
EXTRA: dict = {}


def real_cases() -> dict:
    """ResNet-18 (its shipped logits) and the digits model, the designs of ``bench_real_networks.py`` that hold
    label shift exactly (fresh, repeated, no shift)."""
    import bench_real_networks as real

    made = real.cases({"resnet18": real.RESNET})
    keep = ("resnet18/fresh", "resnet18/repeated", "resnet18/no-shift", "resnet18/no-shift-repeated",
            "lr-digits/fresh", "lr-digits/repeated")
    return {name: made[name] for name in keep if name in made}


def zoo_run(task: tuple) -> tuple[str, list[dict]]:
    """Worker: (zoo case, seed) -> (case, [the default path with the check off and on, on the same data])."""
    from flows.params import ReestimateParameters
    from labelshift.inference.holdout import Target
    from tasks.reestimation.assessment import estimate_shift
    from tests.zoo_support import _reference, _scored

    name, seed = task
    c = EXTRA[name] if name in EXTRA else case(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            bundle, target = _reference(c, seed), c.target(seed)
            probs, raw = _scored(bundle, target.outputs)
            on = ReestimateParameters().assessment()
            reports = [estimate_shift.fn(bundle.holdout, Target(probs, raw), s)
                       for s in (dataclasses.replace(on, miscalibration_check=False), on)]
        except Exception as exc:
            return name, [{"error": f"{type(exc).__name__}: {exc}"}]
    off_r, on_r = reports
    mis = on_r.miscalibration
    return name, [{"error": None, "verdicts": (str(off_r.verdict), str(on_r.verdict)),
                   "covers": [np.asarray(r.interval.covers(target.prior)) for r in reports],
                   "width": [float(np.mean(r.interval.upper - r.interval.lower)) for r in reports],
                   "acted": mis is not None and mis.acts, "ran": mis is not None and mis.error is None}]


def zoo_table(runs: dict[str, list[dict]]) -> list[str]:
    lines = ["| case | runs | check ran | check acted | verdicts changed (off -> on) | coverage over trusted runs, "
             "off -> on: mean / worst class (runs) | width on / off |", "|---|---|---|---|---|---|---|"]
    for name, rs in runs.items():
        done = [r for r in rs if r["error"] is None]
        if not done:
            lines.append(f"| {name} | {len(rs)} | all raised ||||")
            continue
        changed = Counter(f"{a} -> {b}" for a, b in (r["verdicts"] for r in done) if a != b)
        cov = []
        for i in (0, 1):
            hits = [r["covers"][i] for r in done if r["verdicts"][i] in TRUSTED_VERDICTS]
            cov.append("–" if not hits else f"{np.mean(hits):.3f} / {np.mean(np.stack(hits), axis=0).min():.2f} "
                       f"({len(hits)})")
        ratio = np.mean([r["width"][1] / r["width"][0] for r in done if r["width"][0] > 0])
        lines.append(f"| {name} | {len(done)} | {np.mean([r['ran'] for r in done]):.0%} | "
                     f"{np.mean([r['acted'] for r in done]):.0%} | "
                     f"{', '.join(f'{v} {k}' for k, v in changed.items()) or 'none'} | {cov[0]} -> {cov[1]} | "
                     f"{ratio:.2f} |")
    return lines


def summarise(runs: list[dict]) -> dict:
    done = [r for r in runs if r["error"] is None]
    if not done:
        return {"runs": len(runs), "errors": len(runs)}
    mlls, bbse = np.stack([r["mlls"] for r in done]), np.stack([r["bbse"] for r in done])
    covers = np.stack([r["covers"] for r in done])
    trusted = np.array([r["verdict"] in TRUSTED_VERDICTS for r in done])

    def worst_bias(err):
        mean, se = err.mean(axis=0), err.std(axis=0, ddof=1) / np.sqrt(len(err))
        y = int(np.argmax(np.abs(mean)))
        return abs(mean[y]), se[y]

    acted = [r["acted"] for r in done if r["acted"] is not None]
    return {"runs": len(runs), "errors": len(runs) - len(done), "mlls": worst_bias(mlls), "bbse": worst_bias(bbse),
            "mlls_rmse": float(np.sqrt((mlls ** 2).mean())), "bbse_rmse": float(np.sqrt((bbse ** 2).mean())),
            "verdicts": Counter(r["verdict"] for r in done), "cov_all": (covers.mean(), covers.mean(axis=0).min()),
            "cov_trusted": ((covers[trusted].mean(), covers[trusted].mean(axis=0).min()) if trusted.any()
                            else (float("nan"), float("nan"))),
            "n_trusted": int(trusted.sum()), "acted": (float(np.mean(acted)) if acted else None),
            "seconds": float(np.median([r["seconds"] for r in done]))}


def table(rows: dict) -> list[str]:
    lines = ["| case | holdout n | runs | MLLS bias (se) | BBSE-hard bias (se) | RMSE MLLS / BBSE-hard | "
             + " / ".join(VERDICTS[::-1]) + " | coverage, all runs: mean / worst class | coverage, trusted runs "
             "(runs) | check acted | s/run |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (name, n), s in rows.items():
        if "mlls" not in s:
            lines.append(f"| {name} | {n:,} | {s['runs']} | all {s['errors']} runs raised |||||||")
            continue
        v = " / ".join(str(s["verdicts"].get(x, 0)) for x in VERDICTS[::-1])
        acted = "–" if s["acted"] is None else f"{100 * s['acted']:.0f}%"
        raised = f" ({s['errors']} raised)" if s["errors"] else ""
        lines.append(f"| {name} | {n:,} | {s['runs']}{raised} | "
                     f"{s['mlls'][0]:.3f} ({s['mlls'][1]:.3f}) | {s['bbse'][0]:.3f} ({s['bbse'][1]:.3f}) | "
                     f"{s['mlls_rmse']:.3f} / {s['bbse_rmse']:.3f} | {v} | {s['cov_all'][0]:.3f} / "
                     f"{s['cov_all'][1]:.2f} | {s['cov_trusted'][0]:.3f} / {s['cov_trusted'][1]:.2f} "
                     f"({s['n_trusted']}) | {acted} | {s['seconds']:.1f} |")
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--seeds", type=int, default=40, help="seeds per case and holdout size (default 40)")
    ap.add_argument("--first-seed", type=int, default=0, help="the first seed (fresh seeds: e.g. 1000)")
    ap.add_argument("--sizes", default="3000,30000,140000", help="holdout rows, comma-separated")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated MisspecifiedCase names")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--zoo", default="", help="zoo cases to run with the check off and on (instead of the "
                    "misspecified cases); 'real' adds ResNet-18 on Fashion-MNIST and the digits model")
    ap.add_argument("--label", default="", help="a word for the heading, e.g. 'before' or 'after'")
    ap.add_argument("--write-readme", action="store_true", help="also write the table into benchmarks/README.md")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    import tasks.reestimation.assessment  # noqa: F401  (imported once here, before the workers fork)
    import tasks.reestimation.references  # noqa: F401
    if args.zoo:
        return zoo_main(args, argv)
    for name in names:
        case(name).holdout(0)                     # the pools made once, before the workers fork
    work = [(n, size, s) for n in names for size in sizes for s in range(args.first_seed,
                                                                            args.first_seed + args.seeds)]
    t0 = time.perf_counter()
    got = run_chunks(one_run, work, max(1, args.jobs), t0)
    rows = {(n, size): summarise(got[(n, size)]) for n in names for size in sizes if (n, size) in got}
    section = SECTION + (f" ({args.label})" if args.label else "")
    lines = [section, "", f"{_run_line(argv, t0)} Bias: the mean over seeds of the "
             "estimate minus the population p_t, for the class where it is largest (standard error in brackets); "
             "coverage of the 95% interval on p_t (mean over classes / worst class). The cases: "
             "`labelshift/experiments/zoo.py` (MisspecifiedCase); the path: `tests/zoo_support.py`.", "",
             *table(rows)]
    publish(section, lines, args.write_readme, README)
    return 0


def _run_line(argv, t0: float) -> str:
    """The command, the machine and the minutes of a run, as each section opens."""
    argv_text = " ".join(argv if argv is not None else sys.argv[1:])
    return (f"Run {_dt.date.today().isoformat()}: `python benchmarks/{Path(__file__).name} {argv_text}` on "
            f"{cpu_model()}, nproc {os.cpu_count()} (shared), Python {platform.python_version()}, numpy "
            f"{np.__version__}; {(time.perf_counter() - t0) / 60:.0f} min.")


def zoo_main(args, argv) -> int:
    """``--zoo``: the zoo's cases with the check off and on."""
    names = [n.strip() for n in args.zoo.split(",") if n.strip() and n.strip() != "real"]
    if "real" in args.zoo.split(","):
        EXTRA.update(real_cases())
        names += list(EXTRA)
    work = [(n, s) for n in names for s in range(args.first_seed, args.first_seed + args.seeds)]
    t0 = time.perf_counter()
    got = run_chunks(zoo_run, work, max(1, args.jobs), t0)
    section = "## The miscalibration check on the zoo: off and on" + (f" ({args.label})" if args.label else "")
    lines = [section, "", f"{_run_line(argv, t0)} Each seed's reference and target once, assessed with "
             "the check off (the report as before it) and on. Coverage of the 95% interval on the population p_t "
             "over the runs called Shifted or No shift; width: the mean over classes of upper - lower, on over off, "
             "averaged over runs.", "", *zoo_table({n: got.get(n, []) for n in names})]
    publish(section, lines, args.write_readme, README)
    return 0


if __name__ == "__main__":
    sys.exit(main())
