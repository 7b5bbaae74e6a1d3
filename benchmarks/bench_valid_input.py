"""Valid input never raises, at any size: `labelshift estimate` on prediction logs of 1, 5 and 20 million rows whose
rows repeat (a few tens of thousands of items scored again and again, as production logs repeat) or are distinct.

What it does, in a temporary folder (nothing leaves loopback; every process it starts ends with it):

1. trains a scikit-learn logistic regression on 4 Gaussian classes in 20 dimensions (class means N(0, 1.2^2 I),
   unit covariance) and registers its float32 log-probabilities on a labelled holdout of ``--holdout`` rows as a
   reference (:func:`labelshift_mlflow.references.register_reference`, BCTS, output kind "logits");
2. for each size and kind writes the target as Parquet files of at most ``--file-rows`` rows (an int64 id and one
   float32 column per class; a label-shifted prior, class 0 at a third of its source share): *repeated* draws each
   row from ``--items`` scored items (the issue's case: 31,000 items), *distinct* scores a fresh row each time;
3. times ``python -m flows.cli estimate --model ... --target DIR --json`` as a subprocess against Prefect's temporary
   server started beforehand (its boot is not counted) and a SQLite MLflow store: exit code, verdict, wall time
   from launch to exit and the peak resident memory of its process tree (psutil, sampled every 20 ms).
   ``--baseline-ref`` also runs the code of that git revision on the issue's case (3 files of 600,000 rows from
   31,000 items) and on the same sizes' repeated targets (``git archive`` into the temporary folder).

    python benchmarks/bench_valid_input.py                          # 1M, 5M, 20M x repeated, distinct (~10 min)
    python benchmarks/bench_valid_input.py --sizes 1000000 --kinds repeated --baseline-ref 7de4d1e
    python benchmarks/bench_valid_input.py --write-readme           # also write the table into benchmarks/README.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from report_utils import quiet_services  # noqa: E402

quiet_services()

from bench_scale import PeakRSS, gib  # noqa: E402
from report_utils import cpu_model, write_section  # noqa: E402

SECTION = "## Valid input never raises: 1, 5 and 20 million rows, repeated and distinct (issue 38)"
README = Path(__file__).resolve().parent / "README.md"
MODEL = "bench-valid-input"
K, DIM = 4, 20
NAMES = [f"class-{j}" for j in range(K)]
TARGET_PRIOR = np.array([1 / 12, 11 / 36, 11 / 36, 11 / 36])     # class 0 at a third of its source share


class Model:
    """4 Gaussian classes and a logistic regression fit on them; ``scores`` are its float32 log-probabilities."""

    def __init__(self, seed: int):
        from sklearn.linear_model import LogisticRegression

        rng = np.random.default_rng(seed)
        self.means = 1.2 * rng.standard_normal((K, DIM))
        x, y = self.draw(rng, 20_000, np.full(K, 1 / K))
        self.clf = LogisticRegression(max_iter=1000).fit(x, y)

    def draw(self, rng, n: int, prior) -> tuple[np.ndarray, np.ndarray]:
        y = rng.choice(K, size=n, p=prior)
        return self.means[y] + rng.standard_normal((n, DIM)), y

    def scores(self, x: np.ndarray) -> np.ndarray:
        return self.clf.predict_log_proba(x).astype(np.float32)


def write_target(folder: Path, model: Model, rows: int, kind: str, items: int, file_rows: int, seed: int) -> None:
    """``rows`` target rows as Parquet files of at most ``file_rows`` rows, repeated draws of ``items`` scored items
    or each row fresh."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    pool = model.scores(model.draw(rng, items, TARGET_PRIOR)[0]) if kind == "repeated" else None
    for i, start in enumerate(range(0, rows, file_rows)):
        n = min(file_rows, rows - start)
        z = pool[rng.integers(0, items, n)] if pool is not None else model.scores(model.draw(rng, n, TARGET_PRIOR)[0])
        table = pa.table({"id": np.arange(start, start + n, dtype=np.int64),
                          **{c: z[:, j] for j, c in enumerate(NAMES)}})
        pq.write_table(table, folder / f"part-{i:03d}.parquet", row_group_size=131072)


def run_cli(code: Path, env: dict, target: Path, tracking: str, log: Path) -> dict:
    """One ``labelshift estimate`` as a subprocess: exit code, verdict (or the error's last line), wall, peak RSS."""
    cmd = [sys.executable, "-m", "flows.cli", "estimate", "--model", f"models:/{MODEL}@production", "--target",
           str(target), "--tracking-uri", tracking, "--json"]
    t0 = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, cwd=code, env=dict(env, PYTHONPATH=str(code)), stdout=subprocess.PIPE,
                                stderr=err, text=True)
        sampler = PeakRSS(proc.pid)
        out, _ = proc.communicate()
        wall, peak = time.perf_counter() - t0, sampler.stop()
    if proc.returncode == 0:
        verdict = json.loads(out[out.index("{"):])["verdict"]
    else:
        lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
        verdict = lines[-1][:160] if lines else "(no output)"
    return {"rc": proc.returncode, "verdict": verdict, "wall": wall, "peak": peak}


def table(runs: list[dict]) -> list[str]:
    lines = ["| code | target rows | rows | files | exit | verdict (or error) | wall time | peak RSS |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['code']} | {r['kind']} | {r['rows']:,} | {r['files']} | {r['rc']} | {r['verdict']} | "
                     f"{r['wall']:.1f} s | {gib(r['peak'])} |")
    return lines


def plan(args) -> list[tuple[str, str, int, int]]:
    """(code, kind, rows, file_rows) of each run."""
    runs = [("this", kind, rows, args.file_rows) for rows in args.sizes for kind in args.kinds]
    if args.baseline_ref:
        runs = [("base", "repeated", 1_800_000, 600_000), ("this", "repeated", 1_800_000, 600_000)] + runs + \
               [("base", "repeated", rows, args.file_rows) for rows in args.sizes if "repeated" in args.kinds]
    return runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=lambda s: [int(float(v)) for v in s.split(",")],
                    default=[1_000_000, 5_000_000, 20_000_000])
    ap.add_argument("--kinds", type=lambda s: s.split(","), default=["repeated", "distinct"])
    ap.add_argument("--items", type=int, default=31_000, help="scored items a repeated target draws its rows from")
    ap.add_argument("--file-rows", type=int, default=2_000_000)
    ap.add_argument("--holdout", type=int, default=5_000)
    ap.add_argument("--baseline-ref", default=None, help="git revision to compare with (e.g. 7de4d1e)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write-readme", action="store_true")
    args = ap.parse_args(argv)
    command = "python benchmarks/bench_valid_input.py" + "".join(" " + a for a in (argv or sys.argv[1:]))
    load_before = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    tmp = Path(tempfile.mkdtemp(prefix="bench-valid-input-"))
    runs = []
    with prefect_test_harness(server_startup_timeout=180):
        tracking = f"sqlite:///{tmp / 'mlflow.db'}"
        os.environ["MLFLOW_TRACKING_URI"] = tracking
        from mlflow import MlflowClient

        for name in ("references", "reestimation"):
            MlflowClient(tracking).create_experiment(name, artifact_location=f"{(tmp / 'art').as_uri()}/{name}")
        from labelshift_mlflow import register_reference

        model = Model(args.seed)
        hx, hy = model.draw(np.random.default_rng(args.seed + 1), args.holdout, np.full(K, 1 / K))
        register_reference(model.scores(hx), [NAMES[v] for v in hy], name=MODEL, class_names=NAMES,
                           output_kind="logits", tracking_uri=tracking, id_column="id")
        env = dict(os.environ, PREFECT_API_URL=PREFECT_API_URL.value(), LABELSHIFT_HOME=str(tmp / "home"))
        codes = {"this": REPO}
        if args.baseline_ref:
            codes["base"] = tmp / "base-code"
            codes["base"].mkdir()
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline_ref], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(codes["base"])], input=archive, check=True)
        for i, (code, kind, rows, file_rows) in enumerate(plan(args)):
            target = tmp / f"target-{i}"
            write_target(target, model, rows, kind, args.items, file_rows, args.seed + 10 + rows % 1000 + i)
            r = run_cli(codes[code], env, target, tracking, tmp / f"run-{i}.log")
            r.update(code=args.baseline_ref if code == "base" else "this", kind=kind, rows=rows,
                     files=-(-rows // file_rows))
            runs.append(r)
            print(table(runs)[-1], file=sys.stderr, flush=True)
            subprocess.run(["rm", "-rf", str(target)], check=False)
    load_after = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    text = "\n".join([
        SECTION, "",
        f"`{command}` -- {cpu_model()}, nproc {os.cpu_count()} (shared), Python {platform.python_version()}, numpy "
        f"{np.__version__}; load average before {load_before}, after {load_after}.", "",
        f"A logistic regression on {K} Gaussian classes in {DIM} dimensions; its float32 log-probabilities on a "
        f"{args.holdout:,}-row labelled holdout registered as a reference (BCTS). *repeated*: every row one of "
        f"{args.items:,} scored items (as production logs repeat); *distinct*: every row scored afresh. Each line "
        "is one `python -m flows.cli estimate --json` as a subprocess against a running Prefect server (its boot "
        "not counted): exit code, verdict, wall time, peak RSS of its process tree.", "",
        *table(runs), "",
        "Before (7de4d1e), the MLLS weights solved on the pooled float32 calibrated rows were checked on the rows "
        "made again in float64 from the raw outputs against a fixed duality-gap tolerance max(1e-3 / m, 2e-10), and "
        "the run failed when it was exceeded (the issue: 3 x 600,000 rows of 31,000 items, gap 8.05e-10). This "
        "generator's gaps stay under that tolerance (with `--baseline-ref 7de4d1e`, 1.8M repeated rows pass on both "
        "codes), so the failure itself is not reproduced here; what the table shows is the new path at every size. "
        "Each optimality check's tolerance is now derived from the arithmetic "
        "(`labelshift.inference.mlls_inputs.gap_tolerance`, docs/solvers.md \"Reading a maximiser's gap\"; checked "
        "as a bound by tests/unit/inference/test_optimality_checks.py), a gap the rounding explains is re-solved, and "
        "the report solves MLLS on the interval's rows itself rather than fail.", ""])
    print(text)
    if args.write_readme:
        write_section(README, SECTION, text)
    return 0 if all(r["rc"] == 0 for r in runs if r["code"] == "this") else 1


if __name__ == "__main__":
    sys.exit(main())
