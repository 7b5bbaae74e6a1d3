"""Re-estimation: the statistics of one re-estimation, and the ``reestimate`` flow against the same steps as plain code.

Two measurements, each with its baseline timed in the same run (the machine is shared and noisy, so a time is the
median over ``--repeats`` and a ratio is the median of the per-repeat ratios, the two sides measured one right
after the other):

1. **The statistics** (:mod:`labelshift.inference.intervals`, :mod:`labelshift.inference.no_shift`,
   :mod:`labelshift.inference.identifiability`) on k = 10 classes. The probabilities are the exact Bayes
   posteriors of a mixture of Gaussian classes N(mu_y, I_d) (d = 10, random means, ~90% accurate) under a mildly
   imbalanced source prior -- calibrated on the source, as the calibrator is meant to make them -- fit on n = 10000
   labelled source rows; the target rows are drawn from a Dirichlet(1) target prior (all seeds fixed). For m in
   {1000, 10000, 100000} target rows: the baseline ``MLLS().fit(source).estimate(P)``, then ``fisher_interval``,
   ``no_shift_test``, ``identifiability`` (with the hard confusion matrix and the Fisher interval) and
   ``bootstrap_interval(n_bootstrap=200)``, each as seconds per call and as a ratio to the baseline at the same m. Short calls are repeated until a timing lasts ``--min-time`` seconds. A second, smaller table does
   the same with one class absent from the target, so that its weight is pinned at w = 0 and the profile-likelihood
   bounds of the pinned class (bisection on the exact log-likelihood) are computed.

2. **The whole flow per run** versus a plain-Python sequence of the same calls. In a temporary folder: the 3-class
   Gaussian classifier of ``tests/reestimation_support.py`` registered with its BCTS calibrator and source holdout
   in a SQLite MLflow store; ``--batches`` new batches of ``--rows`` rows in a fresh local target folder per run
   (two sizes by default, 5000 and 50000 rows per batch, to see what grows with the data).
   *flow*: ``reestimate(...)`` in this process against Prefect's temporary server (``prefect_test_harness``;
   flow-run heartbeats off, as ``labelshift estimate`` runs it there), the default parameters. *plain*: the flow's
   body with the Prefect layer removed -- find_new_batches, load_bundle, start the MLflow run, load_batch + forward
   (the raw outputs kept as float32, as the flow keeps them) + calibrate, ``estimate_shift.fn`` (the undecorated task
   function) with the raw outputs, the figure, MLflow logging, ``write_outputs.fn``, commit_watermark, the monitor
   point, end of the run. Both sides assess with the flow's defaults,
   :data:`labelshift.inference.settings.DEFAULTS` (MLLS, the source-aware interval, BBSE-soft cross-check, the
   label-shift test): like with like.
   Both sides get identical batches (written twice, to two folders), and their estimates are checked to agree. The
   model bundle is cached in the process after the first load, so the first (cold) flow run is reported on its own
   line and the repeats are warm; the server's startup is reported separately too. Each repeat also times an empty
   flow of the same shape (four no-op tasks, log lines, a markdown artifact, a named final state with data): what
   Prefect itself costs per run on the same server at that moment.

    python benchmarks/bench_reestimate.py                     # the full benchmark (a few minutes on 2 cores)
    python benchmarks/bench_reestimate.py --quick             # m up to 10000, 1 repeat: a smoke test
    python benchmarks/bench_reestimate.py --write-readme      # also write the tables into benchmarks/README.md
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from report_utils import quiet_services  # noqa: E402

quiet_services()

from labelshift import BBSE, MLLS  # noqa: E402
from labelshift.errors import IllConditionedWarning  # noqa: E402
from labelshift.inference.settings import DEFAULTS  # noqa: E402
from labelshift.inference.identifiability import identifiability  # noqa: E402
from labelshift.inference.intervals import bootstrap_interval, fisher_interval  # noqa: E402
from labelshift.inference.no_shift import no_shift_test  # noqa: E402

from report_utils import cpu_model, write_section  # noqa: E402

SECTION = "## Re-estimation: uncertainty statistics and the reestimate flow"
README = Path(__file__).resolve().parent / "README.md"
MODEL_NAME = "bench-reestimate"


# ---------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------
def machine() -> str:
    cpu = cpu_model()
    versions = [f"Python {platform.python_version()}", f"numpy {np.__version__}"]
    for mod in ("prefect", "mlflow", "torch"):
        try:
            versions.append(f"{mod} {__import__(mod).__version__}")
        except Exception:
            pass
    return f"{cpu}, nproc {os.cpu_count()} (shared with other jobs), {', '.join(versions)}"


def median(values) -> float:
    return float(np.median(np.asarray(values, dtype=np.float64)))


def fmt_s(seconds: float) -> str:
    """Seconds with 3 significant digits, in plain notation down to 1e-5."""
    if seconds >= 100:
        return f"{seconds:.0f}"
    if seconds >= 1e-5:
        return f"{seconds:.3g}" if seconds >= 1e-3 else f"{seconds:.6f}".rstrip("0")
    return f"{seconds:.1e}"


def fmt_ratio(r: float) -> str:
    return f"{r:.3g}"


# ---------------------------------------------------------------------------------------------------------------
# part 1: the statistics of one re-estimation
# ---------------------------------------------------------------------------------------------------------------
class GaussianClasses:
    """k classes N(mu_y, I_d); ``posteriors`` are the exact Bayes p_s(y|x) under the source prior."""

    def __init__(self, k: int, d: int, sep: float, rng: np.random.Generator):
        self.k = k
        self.means = rng.normal(size=(k, d)) * sep / np.sqrt(2.0)
        self.source_prior = rng.dirichlet(np.full(k, 5.0))

    def draw(self, prior, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        y = rng.choice(self.k, size=m, p=prior)
        x = self.means[y] + rng.normal(size=(m, self.means.shape[1]))
        z = x @ self.means.T - 0.5 * np.sum(self.means ** 2, axis=1) + np.log(self.source_prior)
        z -= z.max(axis=1, keepdims=True)
        P = np.exp(z)
        P /= P.sum(axis=1, keepdims=True)
        return P, y


def _per_call(fn, number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def statistics_case(problem: GaussianClasses, S, ys, prior, m: int, seed: int, *, bootstrap: bool = True) -> dict:
    """The calls timed at one m: name -> (label, zero-argument callable); plus facts about the estimate."""
    P, _ = problem.draw(prior, m, np.random.default_rng(seed))
    fitted = MLLS().fit(S, ys)
    p = fitted.source_prior_
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IllConditionedWarning)
        est = fitted.estimate(P)
    w = est.weights
    confusion = BBSE(soft=False).fit(S, ys).confusion_
    n_source = len(ys)
    ci = fisher_interval(P, w, p)
    calls = {
        "base": ("`MLLS().fit(source).estimate(P)` (baseline)", lambda: MLLS().fit(S, ys).estimate(P)),
        "fit": (f"of which `MLLS().fit(source)` (n = {len(ys)} labelled rows)", lambda: MLLS().fit(S, ys)),
        "estimate": ("of which `.estimate(P)` on a fitted MLLS", lambda: fitted.estimate(P)),
        "fisher": ("`fisher_interval(P, w, p_s)`", lambda: fisher_interval(P, w, p)),
        "test": ("`no_shift_test(P, w, p_s, source_probs=S)` (two-sample, as the flow)",
                 lambda: no_shift_test(P, w, p, source_probs=S)),
        "lr": ("`no_shift_test(P, w, p_s)` (likelihood ratio, p_s known)", lambda: no_shift_test(P, w, p)),
        "ident": ("`identifiability(P, w, p_s, confusion=C, n_source=n, interval=ci)`",
                  lambda: identifiability(P, w, p, confusion=confusion, n_source=n_source, interval=ci)),
    }
    if bootstrap:
        calls["boot"] = ("`bootstrap_interval(P, p_s, estimator=mlls, n_bootstrap=200)`",
                         lambda: bootstrap_interval(P, p, estimator=fitted, n_bootstrap=200, seed=0))
    return {"calls": calls, "pinned": int(np.sum(ci.pinned)), "flagged": bool(np.all(est.ill_conditioned)),
            "m_sigma": m * float(np.min(est.diagnostic))}


def run_statistics(args, problem, S, ys, prior, *, bootstrap: bool = True, label: str = "") -> dict:
    """Time every call at every m: a calibration pass (also the warm-up) picks how many calls make one timing,
    then ``repeats`` passes, the calls interleaved within each pass. Returns per m: times and ratios."""
    out = {}
    for i, m in enumerate(args.m):
        case = statistics_case(problem, S, ys, prior, m, args.seed + 100 + i, bootstrap=bootstrap)
        calls = case["calls"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", IllConditionedWarning)
            number = {}
            for key, (_, fn) in calls.items():
                t1 = _per_call(fn, 1)
                number[key] = max(1, min(10_000, math.ceil(args.min_time / max(t1, 1e-7))))
            times = {key: [] for key in calls}
            for _ in range(args.repeats):
                gc.collect()
                for key, (_, fn) in calls.items():
                    times[key].append(_per_call(fn, number[key]))
        ratios = {key: median(np.array(times[key]) / np.array(times["base"])) for key in calls}
        out[m] = {"labels": {k: v[0] for k, v in calls.items()}, "t": {k: median(v) for k, v in times.items()},
                  "ratio": ratios, "number": number, "pinned": case["pinned"], "flagged": case["flagged"],
                  "m_sigma": case["m_sigma"]}
        print(f"  {label}m = {m}: " + ", ".join(f"{k} {fmt_s(out[m]['t'][k])} s" for k in calls)
              + f" (pinned classes {case['pinned']})", file=sys.stderr)
    return out


# ---------------------------------------------------------------------------------------------------------------
# part 2: the reestimate flow against the plain sequence
# ---------------------------------------------------------------------------------------------------------------
def write_batches(folder: Path, arrays: list[np.ndarray]) -> None:
    folder.mkdir(parents=True)
    for j, x in enumerate(arrays):
        np.save(folder / f"day-{j + 1}.npy", x)


def run_flow(model_uri: str, target: Path, tracking_uri: str, experiment: str) -> tuple[float, dict]:
    """One ``reestimate`` run in this process, as ``labelshift estimate`` runs it on the temporary server."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.reestimate import reestimate

    t0 = time.perf_counter()
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        state = reestimate(model=model_uri, target=str(target), tracking_uri=tracking_uri,
                           mlflow_experiment=experiment, return_state=True)
    wall = time.perf_counter() - t0
    if not state.is_completed():
        raise SystemExit(f"the reestimate flow failed: {state.name}: {state.message}")
    return wall, state.result()


def make_skeleton_flow():
    """A flow of the reestimate flow's shape with no work in it: four tasks (no cache, no persisted result) that
    return their argument, a log line each, a markdown artifact and a named Completed state with data. Its time is
    what Prefect itself adds to a run."""
    from prefect import flow, get_run_logger, task
    from prefect.artifacts import create_markdown_artifact
    from prefect.cache_policies import NO_CACHE
    from prefect.states import Completed

    @task(name="noop", cache_policy=NO_CACHE, persist_result=False)
    def noop(x):
        return x

    @flow(name="bench-skeleton", log_prints=False)
    def skeleton(model: str = "models:/x@y", target: str | None = None, n_tasks: int = 4):
        logger = get_run_logger()
        out = []
        for i in range(n_tasks):
            out.append(noop(i))
            logger.info("task %d of %d done", i + 1, n_tasks)
        create_markdown_artifact(markdown="# Done\n", key="bench-skeleton", description="skeleton verdict")
        return Completed(name="Done", message="done", data={"verdict": "Done", "tasks": out})

    return skeleton


def run_skeleton(skeleton) -> float:
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    t0 = time.perf_counter()
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        state = skeleton(return_state=True)
    wall = time.perf_counter() - t0
    if not state.is_completed():
        raise SystemExit(f"the skeleton flow failed: {state.name}: {state.message}")
    return wall


def run_plain(model_uri: str, target: Path, tracking_uri: str, experiment: str) -> tuple[dict, dict]:
    """The flow's body without Prefect: the same calls in the same order, each step timed. Returns
    ({step: seconds}, summary)."""
    from runtime import environment as settings_mod
    from flows.summary import headline as _headline
    from labelshift.monitoring.inputs import load_batch
    from labelshift.monitoring.listing import find_new_batches
    from labelshift.monitoring.watermark import commit_watermark
    from labelshift.storage import open_store
    from tasks.reestimation.assessment import estimate_shift
    from labelshift_mlflow.registry import load_bundle
    from tasks.reestimation.outputs import write_outputs
    from tasks.reestimation.runs import (end_run, history_record, log_reestimation, render_figure,
                                         start_reestimation_run, sync_monitor)
    from labelshift_mlflow.scores import forward
    from labelshift.inference.holdout import Target
    from labelshift.rows import joined
    from tasks.tracking import check_tracking_server, git_commit

    steps: dict[str, float] = {}
    clock = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        steps[name] = steps.get(name, 0.0) + now - clock[0]
        clock[0] = now

    calibrator = "BCTS"
    settings = DEFAULTS          # the flow's defaults, as the flow side runs them (not a setting of its own)
    env = settings_mod.resolve(tracking_uri=tracking_uri, experiment_name=experiment)
    target_uri = str(target)
    store = open_store(target_uri)
    batches, watermark = find_new_batches(store)
    lap("find new batches")
    check_tracking_server(env.tracking_uri)
    bundle = load_bundle(model_uri, tracking_uri=env.tracking_uri, calibrator=calibrator)
    lap("load model bundle (cached)")
    sequence = watermark.sequence + 1
    params = dict(model=model_uri, model_version=bundle.version, target=store.uri, calibrator=calibrator,
                  estimator=settings.estimator, cross_check=",".join(settings.cross_check), interval=settings.interval,
                  level=settings.level, significance=settings.significance, n_bootstrap=settings.n_bootstrap,
                  seed=settings.seed, n_batches=len(batches), max_interval_width=settings.max_interval_width)
    tags = {"prefect.flow_run_id": "", "prefect.flow_run_name": "", "labelshift.sequence": str(sequence)}
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    lap("git commit")
    runs = start_reestimation_run(env.tracking_uri, env.experiment_name, env.artifact_root, model_name=bundle.name,
                                  target_url=store.uri, run_name=f"reestimate-{sequence}", params=params, tags=tags,
                                  sequence=sequence)
    lap("MLflow: start run (+ monitor run)")
    arrays = [load_batch(store, b, input_shape=bundle.input_shape) for b in batches]
    lap("read + check batches")
    outputs = [forward(bundle.model, x, 1024).astype(np.float32) for x in arrays]   # kept as the flow keeps them
    probs = [bundle.calibrator.predict_proba(o.astype(np.float64)) for o in outputs]
    lap("forward + calibrate")
    report = estimate_shift.fn(bundle.holdout, Target(joined(probs), joined(outputs)), settings)
    lap("estimate_shift (MLLS + BBSE fits, interval, tests, identifiability)")
    word = report.verdict
    summary = {
        "verdict": word, "headline": _headline(report), "sequence": sequence, "model": bundle.describe(),
        "target": store.uri, "batches": [b.key for b in batches], "result": report.to_dict(),
        "mlflow": runs.summary(env.tracking_uri),
        "prefect_flow_run_id": None, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    record = history_record(report, runs.run_id, bundle.name)
    figure = render_figure(report, [*watermark.history, dict(record, sequence=sequence)], report.interval.level,
                           f"{bundle.name} v{bundle.version}: target prior, run {sequence}")
    lap("figure (matplotlib PNG)")
    log_reestimation(env.tracking_uri, runs, report, summary, figure)
    lap("MLflow: metrics + summary + figure")
    summary["outputs"] = write_outputs(target_uri, batches, probs, report.weights.tolist(), summary)
    lap("write corrected predictions + summaries")
    committed = commit_watermark(store, watermark, batches, record)
    lap("commit watermark")
    sync_monitor(env.tracking_uri, runs.monitor_run_id, committed.history, bundle.name)
    end_run(env.tracking_uri, runs.run_id, "FINISHED")
    lap("MLflow: monitor point + end run")
    return steps, summary


def compare_flow_plain(args, rows: int, fresh_arrays, tmp: Path, model_uri: str, tracking_uri: str, experiment: str,
                       skeleton) -> dict:
    """``--flow-repeats`` runs of each side on batches of ``rows`` rows (the same batches for both, the order
    alternating), and the empty flow after each pair."""
    flow_t, flow_inside, plain_t, plain_steps, ratios, max_dp, skel_t = [], [], [], [], [], 0.0, []
    verdicts = set()
    for r in range(args.flow_repeats):
        arrays = fresh_arrays(rows)
        for side in ("flow", "plain"):
            write_batches(tmp / f"{side}-{rows}-{r}", arrays)
        order = ("flow", "plain") if r % 2 == 0 else ("plain", "flow")
        got = {}
        for side in order:
            gc.collect()
            folder = tmp / f"{side}-{rows}-{r}"
            if side == "flow":
                wall, summary = run_flow(model_uri, folder, tracking_uri, experiment)
                flow_t.append(wall)
                flow_inside.append(summary["seconds"])
            else:
                t0 = time.perf_counter()
                steps, summary = run_plain(model_uri, folder, tracking_uri, experiment)
                plain_t.append(time.perf_counter() - t0)
                plain_steps.append(steps)
            got[side] = summary
            verdicts.add(summary["verdict"])
        gc.collect()
        skel_t.append(run_skeleton(skeleton))
        a = np.array(got["flow"]["result"]["target_prior"])
        b = np.array(got["plain"]["result"]["target_prior"])
        max_dp = max(max_dp, float(np.max(np.abs(a - b))))
        ratios.append(flow_t[-1] / plain_t[-1])
        print(f"  {args.batches} x {rows} rows, repeat {r + 1}: flow {flow_t[-1]:.3f} s (body {flow_inside[-1]:.3f} "
              f"s), plain {plain_t[-1]:.3f} s, ratio {ratios[-1]:.2f}; empty flow {skel_t[-1]:.3f} s",
              file=sys.stderr)
    steps = {name: median([st[name] for st in plain_steps]) for name in plain_steps[0]}
    return {"flow": median(flow_t), "flow_inside": median(flow_inside), "plain": median(plain_t),
            "ratio": median(ratios), "ratios": ratios, "skeleton": median(skel_t), "steps": steps, "max_dp": max_dp,
            "flow_best": min(flow_t), "plain_best": min(plain_t), "skeleton_best": min(skel_t),
            "inside_best": min(flow_inside),
            "verdicts": sorted(verdicts), "n_target": args.batches * rows}


def run_flow_benchmark(args) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="labelshift-bench-reestimate-"))
    cwd = os.getcwd()
    saved_env = {k: os.environ.get(k) for k in ("LABELSHIFT_HOME", "PREFECT_HOME")}
    try:
        os.chdir(tmp)                           # MLflow's default artifact folders land here, not in the repo
        os.environ["LABELSHIFT_HOME"] = str(tmp / "home")
        os.environ["PREFECT_HOME"] = str(tmp / "prefect")      # Prefect's local state (results) too; before import
        from prefect.testing.utilities import prefect_test_harness

        from tests.reestimation_support import SHIFTED_PRIOR, draw, register_model

        tracking_uri = f"sqlite:///{tmp / 'mlflow.db'}"
        experiment = "bench-reestimation"
        t0 = time.perf_counter()
        info = register_model(tracking_uri, MODEL_NAME, n_holdout=args.holdout)
        t_register = time.perf_counter() - t0
        print(f"  registered {info['model_uri']} in {t_register:.1f} s", file=sys.stderr)
        rng = np.random.default_rng(args.seed)

        def fresh_arrays(rows: int):
            return [draw(SHIFTED_PRIOR, rows, rng)[0] for _ in range(args.batches)]

        t0 = time.perf_counter()
        with prefect_test_harness(server_startup_timeout=180):
            startup = time.perf_counter() - t0
            print(f"  Prefect temporary server up in {startup:.1f} s", file=sys.stderr)
            from labelshift_mlflow import registry as tasks_mod

            tasks_mod._BUNDLES.clear()
            target = tmp / "first-flow"
            write_batches(target, fresh_arrays(args.rows[0]))
            t_first, first = run_flow(info["model_uri"], target, tracking_uri, experiment)
            load_seconds = max((b.load_seconds for b in tasks_mod._BUNDLES.values()), default=float("nan"))
            print(f"  first flow run {t_first:.2f} s (model bundle load {load_seconds:.2f} s): {first['verdict']}",
                  file=sys.stderr)
            # one warm run of each side outside the timing (first plain call: its imports and code paths)
            for side in ("flow", "plain"):
                write_batches(tmp / f"warm-{side}", fresh_arrays(args.rows[0]))
                (run_flow if side == "flow" else run_plain)(info["model_uri"], tmp / f"warm-{side}", tracking_uri,
                                                            experiment)
            skeleton = make_skeleton_flow()
            run_skeleton(skeleton)
            sizes = {rows: compare_flow_plain(args, rows, fresh_arrays, tmp, info["model_uri"], tracking_uri,
                                              experiment, skeleton) for rows in args.rows}
        return {"register": t_register, "startup": startup, "first": t_first, "first_load": load_seconds,
                "verdict": first["verdict"], "sizes": sizes}
    finally:
        os.chdir(cwd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------------------------
def statistics_table(stats: dict, keys: list[str]) -> list[str]:
    ms = list(stats)
    labels = stats[ms[0]]["labels"]
    lines = ["| call | " + " | ".join(f"m = {m}: s (ratio)" for m in ms) + " |",
             "|---|" + "---|" * len(ms)]
    for key in keys:
        if key not in labels:
            continue
        cells = []
        for m in ms:
            t, r = stats[m]["t"][key], stats[m]["ratio"][key]
            cells.append(f"{fmt_s(t)}" + ("" if key == "base" else f" ({fmt_ratio(r)})"))
        lines.append(f"| {labels[key]} | " + " | ".join(cells) + " |")
    return lines


def flag_note(stats: dict) -> str:
    flagged = [m for m, s in stats.items() if s["flagged"]]
    if not flagged:
        return ""
    return (" MLLS flags the estimate as ill-conditioned at " + ", ".join(
        f"m = {m} (m sigma_free = {stats[m]['m_sigma']:.2g} < 4)" for m in flagged) + "; the same calls are timed.")


def build_report(args, stats, pinned_stats, flow, command: str, elapsed: float) -> str:
    today = _dt.date.today().isoformat()
    lines = [SECTION, "",
             "`benchmarks/bench_reestimate.py` times what one re-estimation costs: (1) the statistics of "
             "`labelshift.inference` (intervals, no-shift test, identifiability) against the MLLS estimate they accompany, "
             "and (2) the whole `reestimate` flow "
             "against the same steps called as plain Python. See the script's docstring for the details.", "",
             f"Produced by `{command}` on {today}; machine: {machine()}. Wall time {elapsed / 60:.1f} min. Times are "
             f"medians over {args.repeats} repeats (statistics) and {args.flow_repeats} repeats (flow); ratios are "
             "medians of per-repeat ratios, both sides measured one after the other in the same run.", ""]
    if stats:
        lines += [f"### The statistics of one re-estimation (k = {args.k})", "",
                  f"Exact Bayes posteriors of {args.k} Gaussian classes (d = {args.d}, source accuracy "
                  f"{args.accuracy:.3f}), MLLS fit on n = {args.n_source} labelled source rows; target prior a "
                  "Dirichlet(1) draw. Seconds per call, and in parentheses the ratio to the baseline at the same m."
                  + flag_note(stats), ""]
        lines += statistics_table(stats, ["base", "fit", "estimate", "fisher", "test", "lr", "ident", "boot"])
        if pinned_stats:
            pm = list(pinned_stats)
            pins = ", ".join(f"{pinned_stats[m]['pinned']} at m = {m}" for m in pm)
            lines += ["", f"With one class absent from the target (classes pinned at w = 0: {pins}), the calls "
                      "that do extra work for pinned classes:", ""]
            lines += statistics_table(pinned_stats, ["base", "fisher", "ident"])
    if flow:
        sizes = flow["sizes"]
        cols = list(sizes)
        head = " | ".join(f"{args.batches} x {rows} rows" for rows in cols)
        verdicts = sorted({v for z in sizes.values() for v in z["verdicts"]})
        max_dp = max(z["max_dp"] for z in sizes.values())

        def row(label, fmt):
            return f"| {label} | " + " | ".join(fmt(sizes[c]) for c in cols) + " |"

        lines += ["", "### The reestimate flow against the plain sequence", "",
                  f"Per run: {args.batches} new batches of the 3-class 2-D Gaussian model of "
                  "`tests/reestimation_support.py` in a fresh local target folder, SQLite MLflow, default parameters "
                  f"({DEFAULTS.estimator}, {DEFAULTS.interval} interval, {', '.join(DEFAULTS.cross_check)} cross-check, "
                  "label-shift test; both sides alike); verdicts: " + ", ".join(verdicts) + ". The two "
                  f"sides' target priors agree to {max_dp:.1e}. Seconds per run, median / best of "
                  f"{args.flow_repeats} (other jobs' bursts of load show up in single repeats; the best is the "
                  "cost without them):", "",
                  f"| run | {head} |", "|---|" + "---|" * len(cols),
                  row("plain sequence (same calls, no Prefect)", lambda z: f"{z['plain']:.3f} / {z['plain_best']:.3f}"),
                  row("`reestimate` flow, in process on the temporary server",
                      lambda z: f"{z['flow']:.3f} / {z['flow_best']:.3f}"),
                  row("of which inside the flow body (the flow's own `summary['seconds']`)",
                      lambda z: f"{z['flow_inside']:.3f} / {z['inside_best']:.3f}"),
                  row("difference flow - plain", lambda z: f"{z['flow'] - z['plain']:.3f} / "
                                                           f"{z['flow_best'] - z['plain_best']:.3f}"),
                  row("an empty flow of the same shape (4 no-op tasks, log lines, markdown artifact, state)",
                      lambda z: f"{z['skeleton']:.3f} / {z['skeleton_best']:.3f}"),
                  row("**ratio flow / plain**: median of the per-repeat ratios / ratio of the bests",
                      lambda z: f"**{z['ratio']:.2f}** / {z['flow_best'] / z['plain_best']:.2f}"),
                  row("per-repeat ratios", lambda z: ", ".join(f"{r:.2f}" for r in z["ratios"])),
                  "", f"Not in the ratios: the first flow run of the process (cold, {args.batches} x {cols[0]} rows) "
                  f"took {flow['first']:.2f} s, of which {flow['first_load']:.2f} s loading the model bundle from "
                  "MLflow (then cached in the process); the Prefect temporary server took "
                  f"{flow['startup']:.1f} s to start (once per process).", "",
                  "Where the plain sequence spends its time (median seconds per step, share of the run):", "",
                  f"| step | {head} |", "|---|" + "---|" * len(cols)]
        for name in sizes[cols[0]]["steps"]:
            cells = []
            for c in cols:
                st = sizes[c]["steps"]
                cells.append(f"{st[name]:.4f} ({100 * st[name] / sum(st.values()):.0f}%)")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "### Reading the numbers", ""]
    lines += interpretation(stats, pinned_stats, flow)
    return "\n".join(lines) + "\n"


def interpretation(stats, pinned_stats, flow) -> list[str]:
    out = []
    if stats:
        ms = list(stats)
        big, small = stats[ms[-1]], stats[ms[0]]
        cheap = max(max(s["ratio"][k] for k in ("fisher", "test", "ident")) for s in stats.values())
        out.append(
            f"* The Fisher interval, the no-shift test and the identifiability report each cost at most "
            f"{cheap:.2g}x the MLLS estimate at the same m: each is a few passes over the (m, k) rows (the input "
            "check, the optimality check of the given weights by their gradient, one Hessian "
            "H = (1/m) sum f f^T / (f^T w)^2 or one log-likelihood) plus k x k linear algebra, while the estimate "
            "itself runs several EM steps and Newton iterations over the same rows. The "
            "identifiability report adds the SVD of the k x k confusion matrix, which does not grow with m. "
            f"At m = {ms[0]} all of them are dominated by fixed per-call costs (input checks, small numpy calls): "
            f"the baseline is {fmt_s(small['t']['base'])} s, of which `.fit` on the source rows (input checks and "
            f"the label counts) is {fmt_s(small['t']['fit'])} s.")
        if "boot" in big["t"]:
            br = [stats[m]["ratio"]["boot"] for m in ms]
            per = [stats[m]["t"]["boot"] / 200 / stats[m]["t"]["estimate"] for m in ms]
            out.append(
                f"* The bootstrap is the one expensive statistic: {', '.join(f'{r:.0f}x' for r in br)} the baseline "
                f"at m = {', '.join(str(m) for m in ms)}, for its 200 re-solves; per replicate that is "
                f"{', '.join(f'{r:.2f}x' for r in per)} one `.estimate(P)` on the full set. The replicates go "
                "through the batched MLLS solver in chunks of ~32 MB of resampled rows (the gather `P[rows]` "
                "writes 200 x m x k doubles in all), which removes the per-call overhead that dominates small m; "
                "at large m a replicate costs about a full estimate plus its share of the gather. At m = "
                f"{ms[-1]} one bootstrap "
                f"interval takes {fmt_s(big['t']['boot'])} s, so the bootstrap is the option for BBSE (which has no "
                "likelihood) or a check, not for a scheduled run (whose default, the source-aware interval, "
                "`benchmarks/bench_intervals.py` times).")
        if pinned_stats:
            pm = list(pinned_stats)
            fr = ", ".join(f"{pinned_stats[m]['ratio']['fisher']:.2g}x" for m in pm)
            ir = ", ".join(f"{pinned_stats[m]['ratio']['ident']:.2g}x" for m in pm)
            out.append(
                f"* A class pinned at w = 0 costs more: Fisher interval {fr} and identifiability {ir} the estimate "
                f"(m = {', '.join(str(m) for m in pm)}), for the bisection on the exact log-likelihood that gives "
                "the pinned class its one-sided bound: the tangent covariance with that class freed, then up to ~40 "
                "bisection steps, each a log of the m row likelihoods.")
    if flow:
        sizes = flow["sizes"]
        cols = list(sizes)
        z = sizes[cols[0]]
        steps = z["steps"]
        top = sorted(steps.items(), key=lambda kv: -kv[1])[:3]
        total = sum(steps.values())
        est = steps.get("estimate_shift (MLLS + BBSE fits, interval, tests, identifiability)", 0.0)
        mlflow_t = sum(t for n, t in steps.items() if n.startswith("MLflow"))
        out.append(
            f"* The plain sequence takes {z['plain']:.2f} s per run on {z['n_target']} rows, and the numbers are a "
            f"small part of it: `estimate_shift` (three estimator fits, MLLS, the BBSE cross-check, interval, tests, "
            f"identifiability) is {est:.3f} s ({100 * est / total:.0f}%), while MLflow's SQLite calls take "
            f"{mlflow_t:.2f} s ({100 * mlflow_t / total:.0f}%). The three largest steps: "
            + "; ".join(f"{n} {t:.3f} s" for n, t in top) + ".")
        gap = z["flow_best"] - z["plain_best"]
        inside = z["inside_best"] - z["plain_best"]
        outside = z["flow_best"] - z["inside_best"]
        body = (f"About {inside:.2f} s of the gap is inside the flow body and {outside:.2f} s around it"
                if inside >= 0.02 else
                f"Almost all of the gap is around the flow body ({outside:.2f} s; the body is within "
                f"{abs(inside):.2f} s of the plain sequence)")
        share = z["skeleton_best"] / gap
        why = (f"{100 * share:.0f}% of the gap" if share >= 0.8 else
               f"{100 * share:.0f}% of the gap; the real flow has 14 validated parameters instead of 3, more log "
               "lines, and real task arguments and results")
        text = (
            f"* The flow takes {z['flow']:.2f} s, {z['ratio']:.2f}x the plain sequence (best runs: "
            f"{z['flow_best']:.2f} s against {z['plain_best']:.2f} s, {z['flow_best'] / z['plain_best']:.2f}x). "
            f"The gap between the bests, {gap:.2f} s, is Prefect's cost per run, not work that grows with the data: "
            f"an empty flow of the same shape takes {z['skeleton_best']:.2f} s at best on the same server ({why}). "
            f"{body}: in the body Prefect adds the "
            "four task runs (load-model, score-batches, estimate-shift, write-outputs -- each a task run whose states "
            "are reported to the Prefect server) and the log lines; around it, it creates the flow run, validates "
            "the parameters, writes the markdown artifact and sets the final state.")
        if len(cols) > 1:
            zl = sizes[cols[-1]]
            text += (
                f" With {cols[-1] // cols[0]}x the rows ({zl['n_target']}) the gap between the bests is "
                f"{zl['flow_best'] - zl['plain_best']:.2f} s and their ratio "
                f"{zl['flow_best'] / zl['plain_best']:.2f} (median ratio {zl['ratio']:.2f}): the per-row work of "
                f"this tiny model grows the plain run only to {zl['plain_best']:.2f} s at best (the figure and the "
                "MLflow calls do not grow with the rows), so the ratio falls only where the model or the data make "
                "the run itself longer.")
        text += " Either way it is a fraction of a second per scheduled run."
        out.append(text)
        out.append(
            f"* Cold start: the first run of a process took {flow['first']:.1f} s, of which {flow['first_load']:.2f} s "
            "loading the model version, its calibrator and source holdout from MLflow (a served deployment does this "
            "once per model version, `labelshift estimate` once per command); the rest is one-time work of a fresh "
            "process (the first matplotlib figure, Prefect's first flow and task runs). The temporary Prefect "
            f"server took {flow['startup']:.0f} s to start (none with a lasting server).")
    return out


def write_readme(section: str) -> None:
    write_section(SECTION, section, README)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes of the statistics (default 3)")
    ap.add_argument("--flow-repeats", type=int, default=None,
                    help="timed runs of each side of the flow comparison (default: --repeats + 2)")
    ap.add_argument("--m", type=int, nargs="+", default=[1000, 10_000, 100_000], help="target sizes")
    ap.add_argument("--k", type=int, default=10, help="classes of the statistics benchmark")
    ap.add_argument("--d", type=int, default=10, help="input dimension of the Gaussian classes")
    ap.add_argument("--sep", type=float, default=1.7, help="class separation (sets the accuracy, ~0.9)")
    ap.add_argument("--n-source", type=int, default=10_000, help="labelled source rows the estimators are fit on")
    ap.add_argument("--min-time", type=float, default=0.2,
                    help="short calls are repeated until one timing lasts this many seconds")
    ap.add_argument("--batches", type=int, default=2, help="target batches per flow run")
    ap.add_argument("--rows", type=int, nargs="+", default=[5000, 50_000],
                    help="rows per target batch; the flow comparison is run for each value (default 5000 50000)")
    ap.add_argument("--holdout", type=int, default=4000, help="labelled source holdout of the registered model")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-statistics", action="store_true", help="only the flow comparison")
    ap.add_argument("--skip-flow", action="store_true", help="only the statistics")
    ap.add_argument("--no-pinned", action="store_true", help="skip the table with a class absent from the target")
    ap.add_argument("--quick", action="store_true", help="m = 1000 and 10000, 1 repeat; 2 flow repeats at 5000 rows")
    ap.add_argument("--write-readme", action="store_true",
                    help=f"write the report into {README.relative_to(REPO)} (section '{SECTION[3:]}')")
    args = ap.parse_args(argv)
    if args.quick:
        args.m, args.repeats, args.flow_repeats, args.min_time, args.rows = [1000, 10_000], 1, 2, 0.05, [5000]
    if args.flow_repeats is None:
        args.flow_repeats = args.repeats + 2
    command = "python benchmarks/bench_reestimate.py" + ("" if argv is None and len(sys.argv) == 1 else
                                                          " " + " ".join(argv if argv is not None else sys.argv[1:]))
    t0 = time.perf_counter()
    stats = pinned_stats = flow = None
    if not args.skip_statistics:
        rng = np.random.default_rng(args.seed)
        problem = GaussianClasses(args.k, args.d, args.sep, rng)
        S, ys = problem.draw(problem.source_prior, args.n_source, np.random.default_rng(args.seed + 1))
        args.accuracy = float(np.mean(S.argmax(axis=1) == ys))
        prior = np.random.default_rng(args.seed + 2).dirichlet(np.ones(args.k))
        print("statistics (k = %d, accuracy %.3f):" % (args.k, args.accuracy), file=sys.stderr)
        stats = run_statistics(args, problem, S, ys, prior)
        if not args.no_pinned:
            absent = prior.copy()
            absent[int(np.argmin(problem.source_prior))] = 0.0      # the rarest source class is gone
            absent /= absent.sum()
            pinned_stats = run_statistics(args, problem, S, ys, absent, bootstrap=False, label="one class absent, ")
    if not args.skip_flow:
        print("reestimate flow against the plain sequence:", file=sys.stderr)
        flow = run_flow_benchmark(args)
    report = build_report(args, stats, pinned_stats, flow, command, time.perf_counter() - t0)
    print(report)
    if args.write_readme:
        write_readme(report)
        print(f"written to {README}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
