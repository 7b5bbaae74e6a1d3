"""Estimators against public implementations: labelshift versus ``abstention`` and ``quapy``, on the same inputs.

The setting: k = 10 classes, target sets of m = 5000 rows, mild (Dirichlet alpha = 1.0)
and severe (alpha = 0.1) shift, S = 100 seeded target sets per shift. The predictor is synthetic but of the kind
the paper calibrates: class-conditionals N(mu_y, I) in d = 10 dimensions with random means, the Bayes logits
distorted per class (scale 1.5-2.5, i.e. overconfident, plus biases), about 90% accurate (a CIFAR-10 ResNet is
~93%). BCTS is fit on a held-out labelled source set (n = 10000) and its calibrated probabilities are the common
input of every estimator; the source prior p_s is the source label frequencies for all of them.

Compared, with time per estimate (ms) and agreement max |dw| (over all sets and classes) with the reference
(our MLLS, Newton, batched, tol = 1e-10):

* calibration: our ``BCTS`` vs ``abstention.calibration.TempScaling(bias_positions='all')`` (both L-BFGS on the
  same NLL; abstention's L-BFGS tolerances tightened through ``lbfgs_kwargs``): NLL reached, max |dp|, fit time;
* MLLS: our ``MLLS`` (solver "newton", the default, and "em"), batched (one ``estimate`` call on the (S, m, k)
  array) and one-at-a-time (a loop of ``estimate`` calls), through the public API (input checks and the
  Hessian diagnostics included); the bare solvers (``mlls_newton`` default and ``method="ipm"``, ``mlls_em``
  plain and ``accelerate=True``); ``abstention.label_shift.EMImbalanceAdapter`` (tolerance 1e-10 and 1e-12,
  ``max_iterations`` 10^7, p_s from the labels) and quapy's ``EMQ.EM`` (epsilon 1e-12, ``EMQ.MAX_ITER`` raised to
  10^7) -- neither has a batched form;
* BBSE (hard): our ``BBSE`` vs ``abstention.label_shift.BBSEImbalanceAdapter`` (which clips negative weights at
  0, so ours is clipped the same way before comparing);
* a second, more accurate predictor (``--easy-sep``, ~97%), MLLS only: EM converges in fewer iterations there,
  which shrinks the public implementations' cost and so the ratios.

The tolerances differ in kind: ours bounds the error in w (max-norm) and the Frank-Wolfe duality gap;
abstention stops when no p_t(y) moved by more than its tolerance in one EM step, quapy when their mean moved by
less than epsilon -- on a slowly converging problem both stop far from the optimum, which the max |dw| column
shows. Every method runs ``--repeats`` times, interleaved so that all see the same machine load; a time is the
median over the repeats, and a ratio is the median of the per-repeat ratios (same run, same load).

    python benchmarks/bench_estimators.py                    # the full benchmark (a few minutes on 2 cores)
    python benchmarks/bench_estimators.py --quick            # S = 10, 1 repeat: a smoke test
    python benchmarks/bench_estimators.py --write-readme     # also write the tables into benchmarks/README.md

Needs the ``bench`` extra (``pip install -e .[bench]``: abstention, quapy).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import io
import os
import platform
import re
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from labelshift import BBSE, BCTS, MLLS
from labelshift.estimation import solvers
from labelshift.estimation.solvers import newton as solvers_newton  # noqa: E402
from labelshift._validation import check_target_batch  # noqa: E402
from labelshift.calibration import nll, softmax  # noqa: E402
from labelshift.experiments.shift import dirichlet_prior  # noqa: E402

from report_utils import cpu_model, write_section  # noqa: E402

SECTION = "## Estimators against public implementations"
README = Path(__file__).resolve().parent / "README.md"


# ---------------------------------------------------------------------------------------------------------------
# the problem
# ---------------------------------------------------------------------------------------------------------------
class Problem:
    """k Gaussian classes N(mu_y, I_d), a miscalibrated softmax predictor on them, and a draw function."""

    def __init__(self, k: int, d: int, sep: float, rng: np.random.Generator):
        self.k, self.d = k, d
        self.means = rng.normal(size=(k, d)) * sep / np.sqrt(2.0)
        self.source_prior = rng.dirichlet(np.full(k, 5.0))          # a mildly imbalanced source
        self.scale = rng.uniform(1.5, 2.5, size=k)                  # per-class overconfidence
        self.bias = rng.normal(scale=0.5, size=k)

    def logits(self, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        x = self.means[labels] + rng.normal(size=(labels.size, self.d))
        bayes = x @ self.means.T - 0.5 * np.sum(self.means ** 2, axis=1) + np.log(self.source_prior)
        return self.scale * bayes + self.bias


def make_inputs(args, rng):
    prob = Problem(args.k, args.d, args.sep, rng)
    y_src = rng.choice(args.k, size=args.n_source, p=prob.source_prior)
    z_src = prob.logits(y_src, rng)
    shifts = {}
    for name, alpha in (("mild", args.alpha_mild), ("severe", args.alpha_severe)):
        priors = dirichlet_prior(alpha, args.k, rng, size=args.sets)
        labels = np.stack([rng.choice(args.k, size=args.m, p=p) for p in priors])
        z = prob.logits(labels.ravel(), rng).reshape(args.sets, args.m, args.k)
        shifts[name] = dict(alpha=alpha, z=z, labels=labels)
    return prob, y_src, z_src, shifts


# ---------------------------------------------------------------------------------------------------------------
# timing helpers
# ---------------------------------------------------------------------------------------------------------------
def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def machine() -> str:
    cpu = cpu_model()
    blas = ""
    try:
        from threadpoolctl import threadpool_info
        info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        if info:
            libs = sorted({f"{i.get('internal_api')} {i.get('version')} ({i.get('num_threads')} threads)"
                           for i in info})
            blas = ", BLAS: " + " and ".join(libs)
    except ImportError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores (shared), Python {platform.python_version()}, numpy {np.__version__}"
            f"{blas}")


def fmt_ms(sec_per_est: float) -> str:
    ms = 1000.0 * sec_per_est
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def fmt_dw(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}"


# ---------------------------------------------------------------------------------------------------------------
# the methods
# ---------------------------------------------------------------------------------------------------------------
def calibration_rows(z_src, y_src, shifts, k):
    from abstention.calibration import TempScaling

    onehot = np.eye(k)[y_src]
    ours, t_ours = timed(lambda: BCTS().fit(z_src, y_src))
    lbfgs = {"options": {"ftol": 1e-15, "gtol": 1e-10, "maxiter": 10_000}}
    theirs, t_theirs = timed(lambda: TempScaling(bias_positions="all", lbfgs_kwargs=lbfgs)(z_src, onehot))
    z_all = np.concatenate([s["z"].reshape(-1, k) for s in shifts.values()])
    dp = float(np.max(np.abs(ours.predict_proba(z_all) - theirs(z_all))))
    return [
        ("labelshift `BCTS`", nll(ours.predict_proba(z_src), y_src), t_ours, dp),
        ("abstention `TempScaling(bias_positions='all')`", nll(theirs(z_src), y_src), t_theirs, None),
    ], nll(softmax(z_src), y_src), ours


MAIN = ("mlls", "mlls_1", "em", "em_1", "sv_newton", "sv_ipm", "sv_em", "sv_sq", "ab10", "ab12", "qp12",
        "bbse", "bbse_1", "ab_bbse")
SENSITIVITY = ("mlls", "mlls_1", "sv_em", "ab10", "ab12", "qp12")


def run_shift(name, P, src_probs, y_src, repeats, keep=MAIN):
    """The methods ``keep`` on one shift's (S, m, k) calibrated probabilities: times, weights, iterations."""
    from abstention.label_shift import BBSEImbalanceAdapter, EMImbalanceAdapter
    from quapy.method.aggregative import EMQ

    S, m, k = P.shape
    onehot = np.eye(k)[y_src]
    newton = MLLS().fit(src_probs, y_src)
    em = MLLS(solver="em").fit(src_probs, y_src)
    bbse = BBSE().fit(src_probs, y_src)
    ps = newton.source_prior_
    EMQ.MAX_ITER = 10_000_000

    def loop(fn):
        return np.stack([fn(P[s]) for s in range(S)])

    def abst_em(tol):
        def one(Ps):
            adapter = EMImbalanceAdapter(estimate_priors_from_valid_labels=True, tolerance=tol,
                                         max_iterations=10_000_000)
            return adapter(Ps, src_probs, onehot).multipliers
        return lambda: loop(one)

    def quapy_em(Ps):
        prev, _ = EMQ.EM(ps, Ps, epsilon=1e-12)
        return prev / ps

    def abst_bbse(Ps):
        return BBSEImbalanceAdapter(soft=False)(onehot, Ps, src_probs).multipliers

    # id: (label, group, mode, callable returning (S, k) weights or a result with .weights and .iterations)
    methods = {
        "mlls": ("labelshift `MLLS()` (Newton, the default)", "mlls", "batched", lambda: newton.estimate(P)),
        "mlls_1": ("labelshift `MLLS()` (Newton, the default)", "mlls", "one at a time",
                   lambda: loop(lambda x: newton.estimate(x).weights)),
        "em": ("labelshift `MLLS(solver='em')`", "mlls", "batched", lambda: em.estimate(P)),
        "em_1": ("labelshift `MLLS(solver='em')`", "mlls", "one at a time",
                 lambda: loop(lambda x: em.estimate(x).weights)),
        "sv_newton": ("solver `mlls_newton` (SQUAREM warm start + Newton polish)", "mlls", "batched",
                      lambda: solvers.mlls_newton(P, ps)),
        "sv_ipm": ("solver `mlls_newton(method='ipm')` (interior point)", "mlls", "batched",
                   lambda: solvers.mlls_newton(P, ps, method="ipm")),
        "sv_em": ("solver `mlls_em` (plain EM)", "mlls", "batched", lambda: solvers.mlls_em(P, ps)),
        "sv_sq": ("solver `mlls_em(accelerate=True)` (SQUAREM)", "mlls", "batched",
                  lambda: solvers.mlls_em(P, ps, accelerate=True)),
        "ab10": ("abstention `EMImbalanceAdapter`, tolerance 1e-10", "mlls", "one at a time", abst_em(1e-10)),
        "ab12": ("abstention `EMImbalanceAdapter`, tolerance 1e-12", "mlls", "one at a time", abst_em(1e-12)),
        "qp12": ("quapy `EMQ.EM`, epsilon 1e-12", "mlls", "one at a time", lambda: loop(quapy_em)),
        "bbse": ("labelshift `BBSE()` (hard)", "bbse", "batched", lambda: bbse.estimate(P)),
        "bbse_1": ("labelshift `BBSE()` (hard)", "bbse", "one at a time",
                   lambda: loop(lambda x: bbse.estimate(x).weights)),
        "ab_bbse": ("abstention `BBSEImbalanceAdapter(soft=False)`", "bbse", "one at a time",
                    lambda: loop(abst_bbse)),
    }
    methods = {i: methods[i] for i in keep}
    times = {i: [] for i in methods}
    weights, iterations, extra = {}, {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # IllConditionedWarning on a few severe-shift sets, quapy's notices
        for label, _, _, fn in methods.values():        # untimed warm-up of the (cheap) labelshift methods
            if label.startswith(("labelshift", "solver")):
                fn()
        for r in range(repeats):
            for i, (_, _, _, fn) in methods.items():
                out, t = timed(fn)
                times[i].append(t / S)
                weights[i] = np.asarray(getattr(out, "weights", out), dtype=np.float64)
                if hasattr(out, "iterations"):
                    iterations[i] = np.asarray(out.iterations)
            print(f"  {name}: repeat {r + 1}/{repeats} done", file=sys.stderr)
    if "ab10" in methods:       # abstention's own iteration counts, from an untimed verbose pass
        counts = []
        for s in range(S):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                EMImbalanceAdapter(estimate_priors_from_valid_labels=True, tolerance=1e-10, max_iterations=10_000_000,
                                   verbose=True)(P[s], src_probs, onehot)
            found = re.findall(r"Finished on iteration (\d+)", buf.getvalue())
            counts.append(int(found[-1]) if found else -1)
        iterations["ab10"] = np.array(counts)
    if "mlls" in methods:       # the parts of our batched estimate: input check, solver, Hessian diagnostic
        parts = {"check": lambda: check_target_batch(P, "target_probs", k),
                 "solver": lambda: solvers.mlls_newton(P, ps, np.ones((S, m))),
                 "hessian": lambda: solvers.mlls_hessian(P, weights["mlls"], np.ones((S, m)))}
        for i, fn in parts.items():
            times[i] = [timed(fn)[1] / S for _ in range(max(3, repeats))]
        polish, failed = solvers_newton._polish_chunk, []          # untimed: how often the polish hands a set to the IPM

        def counting(*a, **kw):
            out = polish(*a, **kw)
            failed.append(int(np.sum(out[4])))
            return out
        solvers_newton._polish_chunk = counting
        try:
            solvers.mlls_newton(P, ps, np.ones((S, m)))
        finally:
            solvers_newton._polish_chunk = polish
        extra["fallbacks"] = sum(failed)
    rows = {}
    for i in ("check", "solver", "hessian"):
        if i in times:
            rows[i] = dict(label=i, group="part", mode="", t=float(np.median(times[i])), dw=0.0,
                           times=np.array(times[i]), iterations=None)
    for i, (label, group, mode, _) in methods.items():
        if group == "mlls":
            dw = np.abs(weights[i] - weights["mlls"])
        else:
            dw = np.abs(np.clip(weights[i], 0.0, None) - np.clip(weights["bbse"], 0.0, None))
        rows[i] = dict(label=label, group=group, mode=mode, t=float(np.median(times[i])), dw=float(dw.max()),
                       times=np.array(times[i]), iterations=iterations.get(i))
    if "bbse" in weights:
        extra["n_negative_bbse"] = int(np.sum(np.any(weights["bbse"] < 0, axis=1)))
    return rows, extra


def ratio(rows, a, b) -> float:
    """Median over the repeats of time(a) / time(b), each pair measured in the same repeat."""
    return float(np.median(rows[a]["times"] / rows[b]["times"]))


# ---------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------
def _iters(rows, i):
    it = rows[i]["iterations"]
    return f"{np.median(it):.0f} / {it.max()}" if it is not None and it.max() > 0 else "-"


def build_report(args, cal_rows, nll_raw, results, sensitivity, command, elapsed) -> str:
    today = _dt.date.today().isoformat()
    lines = [SECTION, ""]
    lines += [
        f"`benchmarks/bench_estimators.py` compares labelshift with the public implementations a researcher would "
        f"otherwise use, on the same inputs: k = {args.k}, m = {args.m} target rows, S = {args.sets} seeded "
        f"target sets per shift (Dirichlet alpha = {args.alpha_mild} mild, {args.alpha_severe} severe), BCTS "
        f"probabilities of a synthetic miscalibrated softmax model (Gaussian classes, d = {args.d}, per-class "
        f"overconfidence and biases) fit on n = {args.n_source} labelled source rows; p_s = the source label "
        "frequencies for every method. Reference: our `MLLS()` batched (tol 1e-10, certified by the duality "
        "gap). abstention and quapy have no batched form, so they run one set at a time. See the script's "
        "docstring for the details.",
        "",
        f"Produced by `{command}` on {today}; machine: {machine()}. Wall time {elapsed / 60:.1f} min. The machine "
        "is shared with other jobs, so times are medians over the repeats and ratios are medians of per-repeat "
        "ratios measured in the same run.",
        "",
        "### Calibration (fit on the source set)",
        "",
        f"Uncalibrated NLL {nll_raw:.6f}.",
        "",
        "| calibrator | NLL reached | fit time (s) | max \\|dp\\| vs ours (all target rows) |",
        "|---|---|---|---|",
    ]
    for label, value, t, dp in cal_rows:
        lines.append(f"| {label} | {value:.9f} | {t:.2f} | {'' if dp is None else f'{dp:.1e}'} |")
    for shift, (rows, extra, acc) in results.items():
        alpha = args.alpha_mild if shift == "mild" else args.alpha_severe
        title = f"### {shift.capitalize()} shift (alpha = {alpha}; predictor accuracy on the targets {acc:.3f})"
        lines += ["", title, "", "| method | mode | ms per estimate | max \\|dw\\| vs reference | iterations "
                  "(median / max) |", "|---|---|---|---|---|"]
        for i, r in rows.items():
            if r["group"] == "part":
                continue
            ref = " (reference)" if i == "mlls" else ""
            lines.append(f"| {r['label']}{ref} | {r['mode']} | {fmt_ms(r['t'])} | "
                         f"{'-' if ref else fmt_dw(r['dw'])} | {_iters(rows, i)} |")
        ratios = {
            "abstention EM 1e-10 / ours `MLLS()` batched": ratio(rows, "ab10", "mlls"),
            "abstention EM 1e-12 / ours batched": ratio(rows, "ab12", "mlls"),
            "quapy EM 1e-12 / ours batched": ratio(rows, "qp12", "mlls"),
            "abstention EM 1e-10 / ours one at a time": ratio(rows, "ab10", "mlls_1"),
            "ours one at a time / batched": ratio(rows, "mlls_1", "mlls"),
            "abstention BBSE / ours `BBSE()` batched": ratio(rows, "ab_bbse", "bbse"),
        }
        per_iter = rows["ab10"]["t"] / np.mean(rows["ab10"]["iterations"])
        lines += ["", "Ratios (same run): " + "; ".join(f"{k} **{v:.1f}x**" for k, v in ratios.items()) + ".",
                  f"Our batched `MLLS().estimate` = input check {fmt_ms(rows['check']['t'])} + solver "
                  f"{fmt_ms(rows['solver']['t'])} + Hessian diagnostic {fmt_ms(rows['hessian']['t'])} ms per set "
                  "(+ eigenvalues and result assembly). abstention's EM at 1e-10 took "
                  f"{_iters(rows, 'ab10')} iterations (median / max) at {fmt_ms(per_iter)} ms each.",
                  f"BBSE rows compare weights clipped at 0 (abstention clips); {extra['n_negative_bbse']} of "
                  f"{args.sets} sets have a negative unclipped BBSE weight. Iterations: the solvers' own count "
                  "(for the Newton default: SQUAREM cycles + Newton steps; for SQUAREM: cycles of 2-3 EM steps)."]
    if sensitivity:
        lines += ["", f"### A more accurate predictor (class separation {args.easy_sep} instead of {args.sep})", "",
                  "EM needs fewer iterations when the classes are well separated, so the public implementations "
                  "catch up: same protocol, MLLS only.", "",
                  "| shift | accuracy | ours `MLLS()` batched (ms) | ours one at a time (ms) | plain EM iterations "
                  "(median / max) | abstention 1e-10: ms, ratio, max \\|dw\\| | abstention 1e-12: ms, ratio, "
                  "max \\|dw\\| | quapy 1e-12: ms, ratio, max \\|dw\\| |", "|---|---|---|---|---|---|---|---|"]
        for shift, (rows, _, acc) in sensitivity.items():
            cells = [f"{fmt_ms(rows[i]['t'])}, **{ratio(rows, i, 'mlls'):.1f}x**, {fmt_dw(rows[i]['dw'])}"
                     for i in ("ab10", "ab12", "qp12")]
            lines.append(f"| {shift} | {acc:.3f} | {fmt_ms(rows['mlls']['t'])} | {fmt_ms(rows['mlls_1']['t'])} | "
                         f"{_iters(rows, 'sv_em')} | " + " | ".join(cells) + " |")
    lines += analysis(args, results, sensitivity)
    return "\n".join(lines) + "\n"


def analysis(args, results, sensitivity) -> list[str]:
    """The closing notes: what makes the batched MLLS fast, and what bounds the ratio to abstention's EM."""
    rows = results["mild"][0]
    t_ours = rows["mlls"]["t"]
    per_iter = rows["ab10"]["t"] / np.mean(rows["ab10"]["iterations"])
    need = 20.0 * t_ours / per_iter
    out = [
        "", "### Notes", "",
        "* **How the batched MLLS is fast** (all in numpy, `labelshift/estimation/solvers/`): the batch is solved in "
        "cache-sized chunks of sets, each chunk to convergence (a 100-set batch of float64 data is 40 MB, far "
        "beyond the caches; one EM step over all of it costs ~3x more per set than on cached data); each set is "
        "copied once into a (k, m) layout, on which the two passes of an EM step are long contiguous BLAS "
        "operations (~2x faster than m dot products of length 10); the default `mlls_newton` runs SQUAREM-"
        "accelerated EM with float32 passes (half the bytes) to ~1e-5, then 2-4 active-set Newton iterations "
        "with the float64 gradient (a float32 Hessian only steers), certified by the same duality-gap test as "
        "before; the interior-point method remains as `method='ipm'` and as the fallback (used for "
        f"{results['mild'][1]['fallbacks']} + {results['severe'][1]['fallbacks']} of the {2 * args.sets} sets "
        "here). Every set is solved with its own arithmetic, so a batch gives bit-identical results to "
        "one-at-a-time calls and to any other chunking (tested). The input check is 2 passes over cached "
        "blocks instead of 4 full-array passes and a padded copy.",
        f"* **The 20x goal** (batched `MLLS()` vs abstention's EM at 1e-10): "
        f"{ratio(rows, 'ab10', 'mlls'):.1f}x at mild and {ratio(results['severe'][0], 'ab10', 'mlls'):.1f}x at "
        "severe shift here. The ratio is set by how many EM iterations abstention needs: its EM costs "
        f"~{fmt_ms(per_iter)} ms per iteration per set (several full-size temporaries per step, and a sum over "
        f"the 10-wide class axis), while our whole batched estimate costs {fmt_ms(t_ours)} ms, so 20x needs "
        f"their EM to average about {need:.0f} or more iterations per set (here: mean "
        f"{np.mean(rows['ab10']['iterations']):.0f}, median {np.median(rows['ab10']['iterations']):.0f}).",
    ]
    if sensitivity:
        rs = sensitivity["mild"][0]
        out[-1] += (f" With the more accurate predictor EM needs only {_iters(rs, 'sv_em')} iterations at mild "
                    f"shift and the ratio is {ratio(rs, 'ab10', 'mlls'):.1f}x.")
    out[-1] += (" Our time is mostly a fixed cost per set, not iterations: the copy of the set into the "
                "solver's layouts, ~5 SQUAREM cycles (~11 float32 EM steps), 2-4 float64 gradient passes and one "
                "or two Hessians, then the public API's Hessian diagnostic -- roughly 10 MB moved per 0.4 MB set, "
                "mostly within the caches -- plus numpy's per-call overhead on the small (chunk, k) arrays. "
                "For scale, the input check, which reads the batch once from memory, costs "
                f"{fmt_ms(rows['check']['t'])} ms per set. Going much lower would need a compiled kernel that "
                "fuses the two passes of an EM step.")
    return out


def write_readme(section: str) -> None:
    write_section(SECTION, section, README)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--m", type=int, default=5000)
    ap.add_argument("--sets", type=int, default=100)
    ap.add_argument("--d", type=int, default=10)
    ap.add_argument("--sep", type=float, default=1.7, help="class separation (sets the accuracy, ~0.89)")
    ap.add_argument("--easy-sep", type=float, default=2.4,
                    help="separation of a second, more accurate predictor (~0.97), for a short MLLS-only table "
                         "(0: skip)")
    ap.add_argument("--n-source", type=int, default=10_000)
    ap.add_argument("--alpha-mild", type=float, default=1.0)
    ap.add_argument("--alpha-severe", type=float, default=0.1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="S = 10 sets, 1 repeat")
    ap.add_argument("--write-readme", action="store_true", help="write the tables into benchmarks/README.md")
    args = ap.parse_args(argv)
    if args.quick:
        args.sets, args.repeats = 10, 1
    command = "python benchmarks/bench_estimators.py" + ("" if argv is None and len(sys.argv) == 1 else
                                                          " " + " ".join(argv if argv is not None else sys.argv[1:]))
    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    prob, y_src, z_src, shifts = make_inputs(args, rng)
    cal_rows, nll_raw, cal = calibration_rows(z_src, y_src, shifts, args.k)
    src_probs = cal.predict_proba(z_src)
    results = {}
    for name, s in shifts.items():
        P = cal.predict_proba(s["z"].reshape(-1, args.k)).reshape(args.sets, args.m, args.k)
        acc = float(np.mean(P.argmax(axis=2) == s["labels"]))
        rows, extra = run_shift(name, P, src_probs, y_src, args.repeats)
        results[name] = (rows, extra, acc)
    sensitivity = {}
    if args.easy_sep > 0:
        easy = argparse.Namespace(**{**vars(args), "sep": args.easy_sep})
        _, y_e, z_e, shifts_e = make_inputs(easy, np.random.default_rng(args.seed))
        cal_e = BCTS().fit(z_e, y_e)
        for name, s in shifts_e.items():
            P = cal_e.predict_proba(s["z"].reshape(-1, args.k)).reshape(args.sets, args.m, args.k)
            acc = float(np.mean(P.argmax(axis=2) == s["labels"]))
            rows, extra = run_shift(f"{name} (accurate predictor)", P, cal_e.predict_proba(z_e), y_e,
                                    args.repeats, SENSITIVITY)
            sensitivity[name] = (rows, extra, acc)
    report = build_report(args, cal_rows, nll_raw, results, sensitivity, command, time.perf_counter() - t0)
    print(report)
    if args.write_readme:
        write_readme(report)
        print(f"written to {README}", file=sys.stderr)


if __name__ == "__main__":
    main()
