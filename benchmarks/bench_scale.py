"""Scale: prediction logs of 10 million rows, k = 10, as Parquet on a local S3 server, re-estimated end to end.

What it does, in a temporary folder (nothing leaves loopback; every process it starts ends with it):

1. starts SeaweedFS (``weed server``, :class:`tests.fixtures.seaweed.SeaweedServer`) and Prefect's temporary server
   (the one ``labelshift estimate`` would otherwise start for itself, so that its 10-30 s boot is not counted: a
   deployment runs against a lasting server), and uses a SQLite MLflow store with local artifacts;
2. draws a labelled holdout (20000 rows) and ``--rows`` target rows of logits of a 10-class Gaussian model
   (class y: N(sep e_y, I); the target prior is Dirichlet(1), one class absent), and writes the target as
   ``--files`` Parquet files (an int64 ``id`` column and one float32 column per class; row groups of 131072 rows)
   uploaded to a bucket (not timed), and registers the holdout as a reference
   (:func:`labelshift_mlflow.references.register_reference`, BCTS);
3. times ``python -m flows.cli estimate --model models:/bench-scale@production --target s3://.../`` as a
   subprocess: wall time from launch to exit, and the peak resident memory of its process tree (psutil, sampled
   every 20 ms; ``ru_maxrss`` of the child as a check). Each run gets its own copy of the batches under a fresh
   prefix (no watermark). Three runs:
   * *streamed* (this code) at the full size;
   * *streamed* at ``--baseline-rows`` (the first file(s));
   * *in-memory* at ``--baseline-rows``: the same command on the code before streaming (``--baseline-ref``, a git
     revision, exported with ``git archive`` to the temporary folder): whole-batch reads, float64 probabilities,
     a pooled float64 copy, whole-array solver and statistics, corrected Parquet built in memory.
4. runs the same command once more under cProfile and tables each step's cumulative time (:data:`STEPS`; the
   profiler's overhead included), the flow's other work and the time outside the flow (``--skip-profile``: not).

    python benchmarks/bench_scale.py                       # 10M rows in 10 files, baseline at 1M (a few minutes)
    python benchmarks/bench_scale.py --rows 2000000 --files 2 --baseline-rows 1000000   # smaller
    python benchmarks/bench_scale.py --write-readme        # also write the table into benchmarks/README.md
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from report_utils import quiet_services  # noqa: E402

quiet_services()

from report_utils import cpu_model, write_section  # noqa: E402

SECTION = "## Scale: 10 million prediction-log rows from S3"
README = Path(__file__).resolve().parent / "README.md"
MODEL = "bench-scale"
K = 10
NAMES = [f"class-{j}" for j in range(K)]
GOAL_S, GOAL_BYTES = 60.0, 2 * 2**30


def draw_logits(rng, n: int, prior, sep: float) -> tuple[np.ndarray, np.ndarray]:
    y = rng.choice(K, size=n, p=prior)
    z = rng.standard_normal((n, K), dtype=np.float32)
    z[np.arange(n), y] += sep
    return z, y


def write_target(folder: Path, rows: int, files: int, prior, sep: float, seed: int) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    per = [rows // files + (1 if i < rows % files else 0) for i in range(files)]
    paths, start = [], 0
    for i, n in enumerate(per):
        z, _ = draw_logits(rng, n, prior, sep)
        table = pa.table({"id": np.arange(start, start + n, dtype=np.int64),
                          **{c: z[:, j] for j, c in enumerate(NAMES)}})
        path = folder / f"part-{i:03d}.parquet"
        pq.write_table(table, path, row_group_size=131072)
        paths.append(path)
        start += n
    return paths


class PeakRSS:
    """The peak resident memory of a process and its children, sampled every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 0.02):
        import psutil

        self.proc, self.interval, self.peak = psutil.Process(pid), interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        import psutil

        while not self._stop.is_set():
            try:
                procs = [self.proc, *self.proc.children(recursive=True)]
                total = 0
                for p in procs:
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
                self.peak = max(self.peak, total)
            except psutil.Error:
                return
            self._stop.wait(self.interval)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_cli(code: Path, env: dict, model_uri: str, target: str, tracking_uri: str, log: Path,
            cprofile: str | None = None) -> dict:
    profile = ["-m", "cProfile", "-o", cprofile] if cprofile else []
    cmd = [sys.executable, *profile, "-m", "flows.cli", "estimate", "--model", model_uri, "--target", target,
           "--tracking-uri", tracking_uri, "--json"]
    env = dict(env, PYTHONPATH=str(code))
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, cwd=code, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        sampler = PeakRSS(proc.pid)
        out, _ = proc.communicate()
        wall = time.perf_counter() - t0
        peak = sampler.stop()
    maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if proc.returncode != 0:
        raise SystemExit(f"labelshift estimate failed ({proc.returncode}); its log: {log}\n{log.read_text()[-3000:]}")
    import json

    summary = json.loads(out[out.index("{"):])
    return {"wall": wall, "peak": peak, "maxrss": maxrss if maxrss > before * 1024 else None, "summary": summary}


#: the steps of one run, as (label, file, function) whose cumulative time under cProfile is the step's
STEPS = [
    ("download, read, check, calibrate", "tasks/reestimation/scoring.py", "score_for_reestimation"),
    ("repeated rows", "labelshift/inference/repeats.py", "find_repeats"),
    ("MLLS (solve, optimality check)", "labelshift/inference/report.py", "_estimate"),
    ("source-aware interval", "labelshift/inference/source_aware.py", "source_aware_interval"),
    ("expected accuracy", "labelshift/inference/accuracy.py", "expected_accuracy"),
    ("label-shift test", "labelshift/inference/report.py", "_label_shift_part"),
    ("no-shift test", "labelshift/inference/no_shift.py", "no_shift_test"),
    ("identifiability", "labelshift/inference/identifiability.py", "identifiability"),
    ("miscalibration check", "labelshift/inference/report.py", "_miscalibration"),
    ("MLflow: metrics, figure, summary", "flows/reestimate.py", "_log"),
    ("corrected outputs (write, upload)", "flows/reestimate.py", "_write_outputs"),
    ("watermark commit", "flows/reestimate.py", "_commit"),
]


def steps_from_profile(path: str) -> dict[str, float]:
    """Seconds of each step of :data:`STEPS` in the cProfile stats at ``path`` (cumulative, profiler overhead
    included), then the flow's other work (listing, loading the reference, the MLflow run, Prefect's task runs) and
    the command's time outside the flow (start, imports, settings)."""
    import pstats

    stats = pstats.Stats(path).stats

    def cumulative(file: str, function: str) -> float:
        found = [v[3] for (f, _, name), v in stats.items() if f.endswith(file) and name == function]
        if not found:          # renamed or never run: its time would go silently to "other work"
            raise SystemExit(f"bench_scale: the step {file}:{function} is not in the profile; update STEPS")
        return sum(found)

    steps = {label: cumulative(file, fn) for label, file, fn in STEPS}
    total = max(v[3] for v in stats.values())
    in_flow = cumulative("prefect/flows.py", "__call__")
    steps["the flow's other work (listing, reference, MLflow run, Prefect task runs)"] = in_flow - sum(steps.values())
    steps["outside the flow (interpreter start, imports, settings)"] = total - in_flow
    return steps


def gib(n) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def report(args, runs: dict, steps: dict, load: tuple[str, str], command: str) -> str:
    big = runs["streamed-full"]
    lines = [SECTION, "",
             f"`{command}` -- {cpu_model()}, nproc {os.cpu_count()} (shared with other engineers' jobs), Python "
             f"{platform.python_version()}, numpy {np.__version__}. Load average (1, 5, 15 min) before: {load[0]}; "
             f"after: {load[1]}.", "",
             f"Data: {args.rows:,} rows x k = {K} logits (float32 columns plus an int64 id) in {args.files} Parquet "
             f"files on SeaweedFS (loopback), a 20000-row labelled holdout registered as a reference in a SQLite "
             "MLflow store, Prefect's temporary server started beforehand (its boot is not counted). Each figure is "
             "one run of `python -m flows.cli estimate` as a subprocess: wall time from launch to exit, peak RSS "
             "of its process tree (psutil, sampled every 20 ms).", "",
             "| path | rows | wall time | peak RSS | rows / s |", "|---|---|---|---|---|"]
    for key, label in (("streamed-full", "streamed (this code)"), ("streamed-base", "streamed (this code)"),
                       ("memory-base", f"in-memory (before, `{args.baseline_ref[:12]}`)")):
        r = runs.get(key)
        if r is None:
            continue
        lines.append(f"| {label} | {r['rows']:,} | {r['wall']:.1f} s | {gib(r['peak'])} | "
                     f"{r['rows'] / r['wall']:,.0f} |")
    if "memory-base" in runs and "streamed-base" in runs:
        a, b = runs["memory-base"], runs["streamed-base"]
        lines += ["", f"At {a['rows']:,} rows, in the same run: in-memory / streamed wall time "
                      f"{a['wall'] / b['wall']:.2f}x, peak RSS {a['peak'] / b['peak']:.2f}x."]
    met_t, met_m = big["wall"] <= GOAL_S, big["peak"] < GOAL_BYTES
    lines += ["", f"Goals at {args.rows:,} rows: <= {GOAL_S:.0f} s -- {'met' if met_t else 'missed'} "
                  f"({big['wall']:.1f} s); < 2 GiB peak -- {'met' if met_m else 'missed'} ({gib(big['peak'])}).",
              ""]
    if steps:
        wall = steps.pop("profiled_wall")
        lines += [f"Where the time goes: a further run of the same command on the same {args.rows:,} rows under "
                  f"cProfile ({wall:.1f} s with the profiler's overhead, which falls mostly on Python-level loops), "
                  "each step's cumulative time:", "", "| step | seconds |", "|---|---|"]
        lines += [f"| {name} | {sec:.2f} |" for name, sec in steps.items()] + [""]
    lines += ["Memory of the streamed path: two pooled float32 (m, k) arrays, the calibrated probabilities and the raw "
              f"outputs they came from ({args.rows * K * 4 / 2**30:.2f} GiB each here); every pass over them works on "
              "blocks of 65536 rows in float64 (the passes of the source-aware interval and of the expected accuracy "
              "calibrate each block again from the raw outputs); (m,) float64 vectors of 80 MB at 10M rows are the "
              "largest temporaries; batches are streamed to temporary files, read by record batch, and the corrected "
              "outputs written by row group to a temporary file and uploaded from it. BLAS runs single-threaded "
              "inside the passes (`labelshift.rows`)."]
    return "\n".join(lines) + "\n"


def _exported(rev: str, folder: Path) -> Path:
    """The code of git revision ``rev`` exported to ``folder`` (``git archive``); the folder."""
    folder.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def _register_holdout(args, tmp: Path) -> tuple[str, dict]:
    """A SQLite MLflow store under ``tmp`` with the holdout registered as the reference MODEL; (tracking URI, the
    registration's info)."""
    import mlflow
    from mlflow import MlflowClient

    from labelshift_mlflow import register_reference

    hx, hy = draw_logits(np.random.default_rng(args.seed + 2), 20_000, np.full(K, 1 / K), args.sep)
    tracking = f"sqlite:///{tmp / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = tracking
    mlflow.set_tracking_uri(tracking)
    exp_root = (tmp / "mlartifacts").as_uri()
    for name in ("references", "reestimation"):
        MlflowClient(tracking).create_experiment(name, artifact_location=f"{exp_root}/{name}")
    info = register_reference(hx, [NAMES[v] for v in hy], name=MODEL, class_names=NAMES, output_kind="logits",
                              tracking_uri=tracking, id_column="id")
    return tracking, info


def _plan(args, tmp: Path, files: list[Path], rows_of: dict) -> list[tuple[str, Path, list[Path]]]:
    """The runs, in order: (key, code folder, batch files)."""
    base_files, n = [], 0
    while args.baseline_rows and n < args.baseline_rows and len(base_files) < len(files):
        base_files.append(files[len(base_files)])
        n += rows_of[base_files[-1].name]
    plan = [("streamed-full", REPO, files)]
    if args.compare_ref:
        ref = _exported(args.compare_ref, tmp / "compare-code")
        plan = [("compare-full", ref, files), *plan, ("compare-full-2", ref, files), ("streamed-full-2", REPO, files)]
    if base_files:
        old = _exported(args.baseline_ref, tmp / "old-code")
        plan = [("memory-base", old, base_files), ("streamed-base", REPO, base_files), *plan]
    return plan


def _comparisons(args, runs: dict) -> str:
    """The sentences comparing this code with ``--compare-ref`` and with the in-memory baseline (when run)."""
    text = ""
    if "compare-full" in runs:
        this = [runs[k]["wall"] for k in ("streamed-full", "streamed-full-2")]
        ref = [runs[k]["wall"] for k in ("compare-full", "compare-full-2")]
        peak_this = max(runs[k]["peak"] for k in ("streamed-full", "streamed-full-2"))
        peak_ref = max(runs[k]["peak"] for k in ("compare-full", "compare-full-2"))
        text += (f"\nAgainst `{args.compare_ref}` at {args.rows:,} rows in the same run (alternating, two runs each): "
                 f"this code {this[0]:.1f} s and {this[1]:.1f} s, `{args.compare_ref}` {ref[0]:.1f} s and "
                 f"{ref[1]:.1f} s; ratio of the sums {sum(this) / sum(ref):.2f}x; peak RSS {gib(peak_this)} against "
                 f"{gib(peak_ref)}.\n")
    if "memory-base" in runs:
        text += (f"\nThe two paths agree: max |difference| of the target prior at {runs['memory-base']['rows']:,} "
                 f"rows {runs['memory-base']['prior_diff']:.1e}.\n")
    return text


def _arguments(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--baseline-rows", type=int, default=1_000_000,
                    help="size of the in-memory baseline and its streamed twin (whole files of the target; 0: none)")
    ap.add_argument("--baseline-ref", default="ad73794", help="git revision of the in-memory code (before streaming)")
    ap.add_argument("--sep", type=float, default=2.5, help="class separation of the Gaussian logits")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compare-ref", default=None,
                    help="also run the code of this git revision at the full size, in the same run, and report the "
                         "ratio of the wall times (e.g. 7de4d1e: the time of the default path kept)")
    ap.add_argument("--skip-profile", action="store_true")
    ap.add_argument("--cprofile", metavar="FILE", help="keep the stats of the profiled run (python -m pstats FILE)")
    ap.add_argument("--write-readme", action="store_true")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = _arguments(argv)
    command = "python benchmarks/bench_scale.py" + ("" if not (argv or sys.argv[1:]) else
                                                    " " + " ".join(argv if argv is not None else sys.argv[1:]))
    load_before = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    from tests.fixtures.seaweed import SeaweedServer

    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    runs: dict = {}
    steps: dict = {}
    try:
        with SeaweedServer(tmp / "weed") as weed, prefect_test_harness(server_startup_timeout=180):
            saved = {k: os.environ.get(k) for k in weed.env()}
            os.environ.update(weed.env())
            bucket = weed.create_bucket("bench-scale")
            rng = np.random.default_rng(args.seed)
            target_prior = rng.dirichlet(np.ones(K))
            target_prior[0] = 0.0
            target_prior /= target_prior.sum()
            print(f"writing {args.rows:,} rows in {args.files} files ...", file=sys.stderr)
            files = write_target(tmp / "data", args.rows, args.files, target_prior, args.sep, args.seed + 1)
            import pyarrow.parquet as pq

            rows_of = {p.name: int(pq.ParquetFile(p).metadata.num_rows) for p in files}
            tracking, info = _register_holdout(args, tmp)
            client = weed.client()

            def upload(prefix: str, chosen: list[Path]) -> str:
                for p in chosen:
                    client.upload_file(str(p), bucket, f"{prefix}/{p.name}")
                return f"s3://{bucket}/{prefix}/"

            env = dict(os.environ, PREFECT_API_URL=PREFECT_API_URL.value(), LABELSHIFT_HOME=str(tmp / "home"),
                       MLFLOW_TRACKING_URI=tracking)
            plan = _plan(args, tmp, files, rows_of)
            for key, code, chosen in plan:
                target = upload(key, chosen)
                print(f"{key}: {sum(rows_of[p.name] for p in chosen):,} rows ...", file=sys.stderr)
                r = run_cli(code, env, info["model_uri"], target, tracking, tmp / f"{key}.log")
                r["rows"] = sum(rows_of[p.name] for p in chosen)
                runs[key] = r
                print(f"  {r['wall']:.1f} s, peak {gib(r['peak'])} (ru_maxrss {gib(r['maxrss'])}), "
                      f"{r['summary']['verdict']}", file=sys.stderr)
            if "memory-base" in runs:
                a = np.array(runs["memory-base"]["summary"]["result"]["target_prior"])
                b = np.array(runs["streamed-base"]["summary"]["result"]["target_prior"])
                print(f"  in-memory vs streamed target prior: max |diff| {np.abs(a - b).max():.2e}", file=sys.stderr)
                runs["memory-base"]["prior_diff"] = float(np.abs(a - b).max())
            if not args.skip_profile:
                print("the same command under cProfile ...", file=sys.stderr)
                stats = args.cprofile or str(tmp / "estimate.prof")
                r = run_cli(REPO, env, info["model_uri"], upload("profile", files), tracking, tmp / "profile.log", stats)
                steps = dict(steps_from_profile(stats), profiled_wall=r["wall"])
            for k_, v in saved.items():
                if v is None:
                    os.environ.pop(k_, None)
                else:
                    os.environ[k_] = v
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    text = report(args, runs, steps, (load_before, load_after), command)
    text = text.rstrip("\n") + "\n" + _comparisons(args, runs)
    print(text)
    if args.write_readme:
        write_section(SECTION, text, README)
        print(f"written to {README}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
