"""The label-shift test given the holdout: for each of many holdouts, the rate of false Not label shift over many
fresh label-shifted targets (and its power against image shifts), tabled as a distribution over holdouts (median,
90th percentile, maximum), not only pooled (``/work/shared/DESIGN.md``, "One holdout, many runs").

Every holdout is drawn fresh, BCTS is fit on its logits (as the flow does) and :func:`prepare_holdout` is made once
for it; then ``--targets`` targets, each label-shifted (p_t from Dirichlet(1), Dirichlet(10), Dirichlet(0.3) in
turn) and drawn fresh, are tested against it at 5% (``label_shift_test(..., prepared=...)``, the target's seed its
index). A holdout's rate is its false calls / targets; its binomial noise at 5% and 40 targets is sd 3.4 points.

Designs
-------
* ``gauss``: k = 10 Gaussian classes N(mu_y, I_20) (bench_label_shift_test.Gauss with d = 20: a linear model's
  logits a z + c), source prior Dirichlet(5), holdouts of ``--n`` rows, targets of 20,000 fresh rows from the
  generator.
* ``resnet18``: ResNet-18 on Fashion-MNIST (``fashion_resnet18_outputs_h200.npz``): each holdout ``--n`` of the
  10,000 test images (uniform, without replacement), the targets drawn without replacement from the other images
  of the test file, ``m`` = pool / 10 rows (at most 900), and for the power the same rows' outputs on the images
  made darker, noisier, rotated, or one class's look changed (``real_networks.SHIFTS``).
* ``digits``: scikit-learn's logistic regression on its 8x8 digits (the zoo's lr-digits outputs on the 60% of the
  rows it was not trained on, log-probabilities as logits): holdout 500 rows, targets of 55 of the other rows.

``--inflation KAPPA`` sets ``holdout_inflation`` (1: the test before; ``derived``: kappa per class from the holdout's
share of the variance; default: the test's own); ``--others`` adds,
per holdout, the no-shift test's false Shifted on fresh targets at p_t = p_s and the 95% source-aware prior
interval's coverage of the label-shifted targets' p_t; ``--others-inflation KAPPA`` sets both of those'
``holdout_inflation`` (1: as before; default: derived per call, :mod:`labelshift.inference.holdout_conditional`);
``--others-only`` skips the label-shift test (the same holdouts and targets, draw for draw: the test draws nothing
from the holdout's generator); ``--m M`` sets the Gaussian targets' rows (default 20,000); ``--only SEED ...`` runs
those holdout seeds alone.
Results: benchmarks/out/holdout_conditional/DESIGN_nN_sSEED0_TAG.json (per holdout, every target's p-values).

    python benchmarks/bench_holdout_conditional.py gauss --n 1000 --holdouts 20 --inflation 1 --tag before
    python benchmarks/bench_holdout_conditional.py gauss --n 1000 --holdouts 20 --seed0 100 --others --tag after
    python benchmarks/bench_holdout_conditional.py resnet18 --n 1000 --seed0 100 --tag after
    python benchmarks/bench_holdout_conditional.py --summary      # every saved run, as the README's tables
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from report_utils import one_blas_thread  # noqa: E402

one_blas_thread()

import numpy as np  # noqa: E402

from labelshift import BCTS  # noqa: E402
from labelshift.inference.label_shift_test import label_shift_test, prepare_holdout  # noqa: E402
from labelshift.inference.label_shift_test.holdout_noise import HOLDOUT_INFLATION  # noqa: E402
from labelshift.inference.no_shift import no_shift_test  # noqa: E402
from labelshift.inference.source_aware import source_aware_interval  # noqa: E402

OUT = HERE / "out" / "holdout_conditional"
ALPHA = 0.05
FAMILIES = (1.0, 10.0, 0.3)                 # Dirichlet concentration of p_t, in turn
RESNET = HERE / "fashion_resnet18_outputs_h200.npz"
SHIFTS = ("darker", "noisier", "rotated", "class-look")


def _calibrate(z_holdout, y_holdout):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BCTS().fit(z_holdout, y_holdout)


def _others(d, rng, zs, ys, zt, cal, kappa=None) -> list:
    """[the no-shift test's p-value on a fresh target with p_t = p_s (two-sample form, as the report runs it), the
    share of classes whose 95% source-aware interval covers the label-shifted target's p_t, whether that interval
    is trusted, the no-shift test's kappa] (``kappa``: both's holdout_inflation, None derived)."""
    p_s = cal.predict_proba(zs).mean(axis=0)
    if hasattr(d, "no_shift"):
        t0 = no_shift_test(cal.predict_proba(d.no_shift(rng)), None, p_s, source_probs=cal.predict_proba(zs),
                           holdout_inflation=kappa)
        p0, k0 = t0.p_value, t0.holdout_inflation
    else:
        p0 = k0 = float("nan")
    ci = source_aware_interval(zs, ys, zt, cal, holdout_inflation=kappa)
    return [p0, float(np.mean((ci.lower <= d.prior) & (d.prior <= ci.upper))), float(ci.trustworthy), k0]


def _test(S, ys, P, prepared, seed, draws, inflation):
    kw = {} if inflation is None else {"holdout_inflation": inflation}      # None: the test's default
    res = label_shift_test(S, ys, P, prepared=prepared, seed=seed, bootstrap_draws=draws, **kw)
    return [res.p_value, res.extra.get("p_value_regions", res.p_value), res.extra.get("p_value_log_odds", np.nan)]


class _Gauss:
    def __init__(self, n, m=20_000):
        from bench_label_shift_test import Gauss
        self.prob, self.n, self.m = Gauss(k=10, d=20), n, m

    def holdout(self, rng):
        z, y = self.prob.draw(self.prob.source_prior, self.n, rng)
        return z, y

    def targets(self, rng, t, shifts=True):
        self.prior = rng.dirichlet(np.full(10, FAMILIES[t % len(FAMILIES)]))
        return {"label-shift": self.prob.draw(self.prior, self.m, rng)[0]}

    def no_shift(self, rng):
        return self.prob.draw(self.prob.source_prior, self.m, rng)[0]


class _Pool:
    """A finite pool of outputs: holdout from it, targets without replacement from the rest (``m`` rows, class
    counts multinomial(m, p_t) redrawn until each fits its class's rows; the interval's truth is p_t)."""

    def __init__(self, z, y, n, m, shifted=None):
        self.z, self.y, self.n, self.m, self.shifted = z, y, n, m, shifted or {}
        self.rest = None

    def holdout(self, rng):
        idx = rng.permutation(len(self.y))
        self.rest = idx[self.n:]
        return self.z[idx[:self.n]], self.y[idx[:self.n]]

    def targets(self, rng, t, shifts=True, prior=None):
        yr = self.y[self.rest]
        avail = np.bincount(yr, minlength=10)
        while True:
            pi = rng.dirichlet(np.full(10, FAMILIES[t % len(FAMILIES)])) if prior is None else prior
            counts = rng.multinomial(self.m, pi)
            if np.all(counts <= avail):
                break
        rows = np.concatenate([rng.choice(self.rest[yr == c], counts[c], replace=False) for c in range(10)])
        # the prior the target's labels were drawn from (the interval's estimand; its counts / m, the truth before,
        # carry no label-sampling error, so every interval covered them)
        self.prior = pi
        out = {"label-shift": self.z[rows]}
        out.update({s: zs[rows] for s, zs in self.shifted.items() if shifts})
        return out

    def no_shift(self, rng):
        """``m`` rows of the rest at the pool's own class shares (the holdout's population): no shift."""
        prior = self.prior                                  # the label-shifted target's, which the interval needs
        z = self.targets(rng, 0, False, np.bincount(self.y, minlength=10) / len(self.y))["label-shift"]
        self.prior = prior
        return z


def design(name: str, n: int, m: int | None = None):
    if name == "gauss":
        return _Gauss(n, m or 20_000)
    if name == "resnet18":
        d = np.load(RESNET)
        z, y = d["test_logits"].astype(np.float64), d["test_labels"]
        return _Pool(z, y, n, min(900, (len(y) - n) // 10),
                     {s: d[f"{s}_logits"].astype(np.float64) for s in SHIFTS})
    if name == "digits":
        from labelshift.experiments.zoo import sklearn_outputs
        p, y = sklearn_outputs("digits", "logistic", 0.4)
        return _Pool(np.log(np.maximum(p, 1e-12)), y, n, max(50, (len(y) - n) // 10))
    raise SystemExit(f"unknown design {name!r}")


def run(name: str, n: int, holdouts: int, targets: int, seed0: int, draws: int, inflation=None,
        power_targets: int = 10, others: bool = False, others_inflation=None, others_only: bool = False,
        m: int | None = None) -> dict:
    d = design(name, n, m)
    rows = []
    for h in (range(seed0, seed0 + holdouts) if isinstance(holdouts, int) else holdouts):
        t0 = time.perf_counter()
        rng = np.random.default_rng([2020, n, h])
        zs, ys = d.holdout(rng)
        if np.bincount(ys, minlength=10).min() < 5:
            continue
        cal = _calibrate(zs, ys)
        S = cal.predict_proba(zs)
        prepared = prepare_holdout(S, ys)
        ps = {}
        for t in range(targets):
            for kind, zt in d.targets(rng, t, t < power_targets and not others_only).items():
                ps.setdefault(kind, []).append([np.nan] * 3 if others_only else
                                               _test(S, ys, cal.predict_proba(zt), prepared, t, draws, inflation))
                if kind == "label-shift" and (others or others_only):
                    ps.setdefault("others", []).append(_others(d, rng, zs, ys, zt, cal, others_inflation))
        row = {"holdout": h, "seconds": time.perf_counter() - t0,
               **{k: np.asarray(v).tolist() for k, v in ps.items()}}
        rows.append(row)
        false = np.mean(np.asarray(ps["label-shift"])[:, 0] < ALPHA)
        extra = " ".join(f"{k} {np.mean(np.asarray(v)[:, 0] < ALPHA):.2f}" for k, v in ps.items()
                         if k not in ("label-shift", "others"))
        if others or others_only:
            o = np.asarray(ps["others"])
            extra += f" no-shift false Shifted {np.mean(o[:, 0] < ALPHA):.3f} coverage {np.mean(o[:, 1]):.3f}"
        print(f"{name} n={n} holdout {h}: false Not label shift {false:.3f} {extra} ({row['seconds']:.0f} s)",
              flush=True)
    kappa = HOLDOUT_INFLATION if inflation is None else inflation
    kappa = "derived" if kappa is None else kappa           # per class from the holdout's share
    return {"design": name, "n": n, "m": getattr(d, "m", None), "targets": targets, "draws": draws,
            "inflation": kappa, "others_inflation": others_inflation, "rows": rows}


def summarise(res: dict) -> dict:
    """Per-holdout false-call rates of the reported p-value and of each part; power per shift (pooled)."""
    out = {}
    for col, part in enumerate(("reported", "regions", "log-odds")):
        rates = np.array([np.mean(np.asarray(r["label-shift"])[:, col] < ALPHA) for r in res["rows"]])
        out[part] = dict(median=float(np.median(rates)), p90=float(np.quantile(rates, 0.9)),
                         max=float(rates.max()), pooled=float(rates.mean()), holdouts=len(rates),
                         counts=[int(round(x * res["targets"])) for x in rates])
    if "others" in res["rows"][0]:
        o = [np.asarray(r["others"]) for r in res["rows"]]
        shifted = np.array([np.mean(x[:, 0] < ALPHA) for x in o])
        cover = np.array([np.mean(x[:, 1]) for x in o])
        out["no-shift"] = dict(median=float(np.median(shifted)), p90=float(np.quantile(shifted, 0.9)),
                               max=float(shifted.max()), pooled=float(shifted.mean()))
        out["coverage"] = dict(median=float(np.median(cover)), p10=float(np.quantile(cover, 0.1)),
                               min=float(cover.min()), pooled=float(cover.mean()))
        if o[0].shape[1] > 2:            # trusted intervals only (pooled over targets), the no-shift test's kappa
            covs = np.concatenate([x[:, 1] for x in o])
            trusted = np.concatenate([x[:, 2] for x in o]) > 0.5
            out["coverage"].update(trusted_share=float(trusted.mean()),
                                   trusted_pooled=float(covs[trusted].mean()) if trusted.any() else float("nan"))
            out["no-shift"]["kappa"] = float(np.nanmedian(np.concatenate([x[:, 3] for x in o])))
    for s in SHIFTS:
        if s in res["rows"][0]:
            out[f"power {s}"] = float(np.mean([np.mean(np.asarray(r[s])[:, 0] < ALPHA) for r in res["rows"]]))
    return out


def table(paths) -> str:
    """The saved runs as the README's markdown table: per run the false Not label shift of the reported p-value,
    pooled and its distribution over holdouts (counts of 40), and the power against each image shift."""
    head = ("| design | holdout n | kappa | holdout seeds | holdouts x targets | pooled | median | 90th pct | max | "
            "false calls per holdout | power: " + " / ".join(SHIFTS) + " |")
    lines = [head, "|" + "---|" * 11]
    for path in paths:
        res = json.loads(path.read_text())
        if np.all(np.isnan(np.asarray(res["rows"][0]["label-shift"], dtype=float)[:, 0])):
            continue                                        # --others-only: no label-shift test
        s, r = summarise(res), summarise(res)["reported"]
        seeds = [row["holdout"] for row in res["rows"]]
        power = " / ".join(f"{s[f'power {x}']:.0%}" for x in SHIFTS) if f"power {SHIFTS[0]}" in s else "-"
        kappa = res["inflation"] if isinstance(res["inflation"], str) else \
            f"{res['inflation']:g}" + (" (before)" if res["inflation"] == 1 else "")
        lines.append(f"| {res['design']} | {res['n']:,} | {kappa} | {min(seeds)}-{max(seeds)} | "
                     f"{len(seeds)} x {res['targets']} | {r['pooled']:.1%} | {r['median']:.1%} | {r['p90']:.1%} | "
                     f"{r['max']:.1%} | {' '.join(map(str, sorted(r['counts'], reverse=True)))} | {power} |")
    return "\n".join(lines)


def table_others(paths) -> str:
    """The runs with ``--others``: per holdout the no-shift test's false Shifted and the 95% source-aware prior
    interval's coverage (share of classes x targets), as distributions over holdouts."""
    lines = ["| design | holdout n | target m | kappa | holdouts x targets | false Shifted: pooled / median / 90th pct / "
             "max | no-shift kappa | coverage: pooled / median / 10th pct / min | trusted: share / coverage |",
             "|---|---|---|---|---|---|---|---|---|"]
    for path in paths:
        res = json.loads(path.read_text())
        s = summarise(res)
        if "no-shift" not in s:
            continue
        a, c = s["no-shift"], s["coverage"]
        kappa = res.get("others_inflation", 1.0)
        kappa = "derived" if kappa is None else f"{kappa:g}"
        trusted = (f"{c['trusted_share']:.2f} / {c['trusted_pooled']:.3f}" if "trusted_share" in c else "-")
        lines.append(f"| {res['design']} | {res['n']:,} | {res.get('m') or '-'} | {kappa} | {len(res['rows'])} x "
                     f"{res['targets']} | {a['pooled']:.1%} / {a['median']:.1%} / {a['p90']:.1%} / {a['max']:.1%} | "
                     f"{a.get('kappa', 1.0):.3g} | {c['pooled']:.3f} / {c['median']:.3f} / {c['p10']:.3f} / "
                     f"{c['min']:.3f} | {trusted} |")
    return "\n".join(lines)


def _inflation(text: str):
    return text if text == "derived" else float(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("design", nargs="?", default="gauss")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--holdouts", type=int, default=20)
    ap.add_argument("--only", type=int, nargs="*", help="these holdout seeds instead (exploring)")
    ap.add_argument("--targets", type=int, default=40)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--tag", default="run")
    ap.add_argument("--others", action="store_true",
                    help="also the no-shift test's false Shifted and the prior interval's coverage per holdout")
    ap.add_argument("--power-targets", type=int, default=10, help="the first this many targets also shifted")
    ap.add_argument("--inflation", type=_inflation, default=None,
                    help="holdout_inflation: a number or 'derived' (default: the test's)")
    ap.add_argument("--others-inflation", type=float, default=None,
                    help="holdout_inflation of the no-shift test and the interval (default: derived)")
    ap.add_argument("--others-only", action="store_true", help="--others without the label-shift test")
    ap.add_argument("--m", type=int, default=None, help="the Gaussian targets' rows (default 20,000)")
    ap.add_argument("--summary", action="store_true")
    a = ap.parse_args()
    if a.summary:
        print(table(sorted(OUT.glob("*.json"))))
        print(table_others(sorted(OUT.glob("*.json"))))
        return
    res = run(a.design, a.n, a.only or a.holdouts, a.targets, a.seed0, a.draws, a.inflation, a.power_targets, a.others,
              a.others_inflation, a.others_only, a.m)
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{a.design}_n{a.n}_s{a.seed0}_{a.tag}.json"
    path.write_text(json.dumps(res))
    print(path, json.dumps(summarise(res)))


if __name__ == "__main__":
    main()
