"""Rows on a cluster: MLLS, the no-shift test and the label-shift test on a large target, in one process and on a
Dask ``LocalCluster`` whose workers hold the partitions (issue 41 item 1; ``labelshift/partitions.py``,
``tasks/reestimation/cluster.py``).

What it does, in a temporary folder:

1. writes ``--rows`` target rows of a k-class Gaussian model's softmax outputs (float32; class y: logits
   N(sep e_y, I), target prior Dirichlet(1)) as ``--partitions`` .npy files, and a labelled source sample of 20,000
   rows at the uniform prior (not timed);
2. *one process* (a child process, so that its peak memory is its own): reads every file into one array and runs
   MLLS (``mlls_newton_rows``), the no-shift test (two-sample form) and the label-shift test (likelihood-ratio, its
   bootstrap included); time of each and the process's peak RSS;
3. *cluster* (another child process): a ``LocalCluster`` of ``--workers`` worker processes, 1 thread each; each
   worker reads its own files (``npy_partition``), then the same three computations with every pass over the rows
   a map over the partitions and a reduce; time of each (loading apart), the driver's and each worker's peak RSS;
4. prints the weights' largest difference between the two and a markdown table.

    python benchmarks/bench_partitions.py                         # 10M rows x 10 classes, 8 partitions, 2 workers
    python benchmarks/bench_partitions.py --rows 100000000 --partitions 16
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SOURCE_ROWS = 20_000


def _softmax_rows(rng, m: int, prior: np.ndarray, sep: float) -> tuple[np.ndarray, np.ndarray]:
    k = len(prior)
    y = rng.choice(k, size=m, p=prior)
    z = rng.standard_normal((m, k), dtype=np.float32)
    z[np.arange(m), y] += sep
    z -= z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z, y


def write_data(folder: Path, rows: int, k: int, partitions: int, sep: float, seed: int) -> None:
    """The partitions' files, the source sample and the target prior (``meta.json``)."""
    rng = np.random.default_rng(seed)
    prior = rng.dirichlet(np.ones(k))
    cuts = np.linspace(0, rows, partitions + 1).astype(int)
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        P, _ = _softmax_rows(np.random.default_rng([seed, i]), int(b - a), prior, sep)
        np.save(folder / f"part-{i:03d}.npy", P)
    S, y = _softmax_rows(rng, SOURCE_ROWS, np.full(k, 1 / k), sep)
    np.save(folder / "source.npy", S)
    np.save(folder / "source-labels.npy", y)
    (folder / "meta.json").write_text(json.dumps({"prior": prior.tolist(), "partitions": partitions}))


def _computations(P, S, y) -> dict:
    """MLLS, the no-shift test and the label-shift test on the target P (an array or partitioned rows): the time
    of each and the weights."""
    from labelshift.estimation.solvers import mlls_newton_rows
    from labelshift.inference.label_shift_test import label_shift_test
    from labelshift.inference.no_shift import no_shift_test

    k = S.shape[1]
    ps = np.bincount(y, minlength=k) / y.size
    out = {}
    t = time.perf_counter()
    w = mlls_newton_rows(P, ps).weights
    out["mlls_s"] = time.perf_counter() - t
    t = time.perf_counter()
    no_shift_test(P, None, ps, source_probs=S)
    out["no_shift_s"] = time.perf_counter() - t
    t = time.perf_counter()
    label_shift_test(S, y, P, seed=0)
    out["label_shift_s"] = time.perf_counter() - t
    out["weights"] = w.tolist()
    out["pass_ms"] = _pass_ms(P, w)
    return out


def _pass_ms(P, w, passes: int = 10) -> float:
    """Milliseconds of one MLLS pass with its Hessian (a map of the partitions' sums and their reduce on a cluster)."""
    from labelshift import rows

    t = time.perf_counter()
    for _ in range(passes):
        rows.mlls_pass(P, w, hessian=True)
    return 1e3 * (time.perf_counter() - t) / passes


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def one_process(folder: Path) -> dict:
    meta = json.loads((folder / "meta.json").read_text())
    t = time.perf_counter()
    P = np.concatenate([np.load(folder / f"part-{i:03d}.npy") for i in range(meta["partitions"])])
    load_s = time.perf_counter() - t
    out = _computations(P, np.load(folder / "source.npy"), np.load(folder / "source-labels.npy"))
    return dict(out, load_s=load_s, peak_gib=_peak_gib())


def _worker_peak_gib() -> float:
    import resource as r
    return r.getrusage(r.RUSAGE_SELF).ru_maxrss / 2**20


def on_cluster(folder: Path, workers: int, fast: bool = True) -> dict:
    """The cluster's figures: workers started by ``local_cluster`` (``fast``), or with Dask's own nanny environment
    (its MALLOC_TRIM_THRESHOLD_=65536: the baseline of cluster.FAST_PASSES)."""
    import dask
    import distributed

    from tasks.reestimation.cluster import FAST_PASSES, cluster_rows, local_cluster, npy_partition

    meta = json.loads((folder / "meta.json").read_text())
    with dask.config.set({} if fast else {k: 65536 for k in FAST_PASSES}):
        lc = local_cluster(workers) if fast else distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
            worker_dashboard_address=None)
    with lc, distributed.Client(lc) as client:
        t = time.perf_counter()
        R = cluster_rows(client, [npy_partition(folder / f"part-{i:03d}.npy") for i in range(meta["partitions"])])
        load_s = time.perf_counter() - t
        out = _computations(R, np.load(folder / "source.npy"), np.load(folder / "source-labels.npy"))
        t = time.perf_counter()
        for _ in range(10):
            R.run(len)
        empty_ms = 1e3 * (time.perf_counter() - t) / 10
        peaks = sorted(client.run(_worker_peak_gib).values())
    return dict(out, load_s=load_s, peak_gib=_peak_gib(), worker_peak_gib=peaks, empty_pass_ms=empty_ms)


def assessment_on_cluster(folder: Path, workers: int) -> dict:
    """The whole assessment (``assess_shift``, default settings) of the target's raw outputs on the cluster (the
    log of each stored row: logits up to a constant, a BCTS fit on the source's), with the calibrated rows derived
    again in every pass (``Target.from_partitioned_outputs``) and kept on the workers once (``kept_rows``, the
    flow's path): the time of each and the number of passes."""
    import distributed

    from labelshift.calibration import BCTS
    from labelshift.inference.holdout import Holdout, Target, calibrated_probs
    from labelshift.inference.report import assess_shift
    from tasks.reestimation.cluster import cluster_rows, kept_rows, local_cluster

    meta = json.loads((folder / "meta.json").read_text())
    S, y = np.log(np.load(folder / "source.npy")).astype(np.float64), np.load(folder / "source-labels.npy")
    cal = BCTS().fit(S, y)
    probs = cal.predict_proba(S)
    holdout = Holdout(probs, y, probs.mean(axis=0), outputs=S, calibrator=cal)
    out = {}
    with local_cluster(workers) as lc, distributed.Client(lc) as client:
        R = cluster_rows(client, [_log_partition(folder / f"part-{i:03d}.npy")
                                  for i in range(meta["partitions"])])
        for name, make in (("derived", lambda: Target.from_partitioned_outputs(R, cal)),
                           ("kept", lambda: Target(kept_rows(R, calibrated_probs, cal, dtype=np.float32), R))):
            t = time.perf_counter()
            report = assess_shift(holdout, make())
            out[f"{name}_s"] = time.perf_counter() - t
            out[f"{name}_verdict"] = str(report.verdict)
    return out


def load_log_npy(path: str) -> np.ndarray:
    """A partition's stored probabilities as raw outputs: their logs (float32), read by the worker."""
    return np.log(np.load(path)).astype(np.float32)


def _log_partition(path: Path):
    from tasks.reestimation.cluster import PartitionSource

    return PartitionSource(load_log_npy, (str(path),), str(path))


def _child(mode: str, folder: Path, workers: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    done = subprocess.run([sys.executable, __file__, "--child", mode, "--folder", str(folder), "--workers",
                           str(workers)], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: int, k: int, partitions: int, workers: int, one: dict, cl: dict, trimmed: dict) -> str:
    diff = float(np.max(np.abs(np.asarray(one["weights"]) - np.asarray(cl["weights"]))))
    lines = [f"{rows:,} rows x {k} classes (float32) in {partitions} partitions; largest weight difference "
             f"{diff:.1e}", "",
             "| run | load s | MLLS s | no-shift s | label-shift s | one MLLS pass ms | peak RSS GiB |",
             "|---|---|---|---|---|---|---|",
             f"| one process (1 BLAS thread) | {one['load_s']:.1f} | {one['mlls_s']:.1f} | {one['no_shift_s']:.1f} | "
             f"{one['label_shift_s']:.1f} | {one['pass_ms']:.0f} | {one['peak_gib']:.2f} |",
             f"| LocalCluster, {workers} workers x 1 thread | {cl['load_s']:.1f} | {cl['mlls_s']:.1f} | "
             f"{cl['no_shift_s']:.1f} | {cl['label_shift_s']:.1f} | {cl['pass_ms']:.0f} (an empty pass "
             f"{cl['empty_pass_ms']:.0f}) | driver {cl['peak_gib']:.2f}, workers "
             + ", ".join(f"{g:.2f}" for g in cl["worker_peak_gib"]) + " |",
             f"| the same, Dask's nanny environment (MALLOC_TRIM_THRESHOLD_=65536) | {trimmed['load_s']:.1f} | "
             f"{trimmed['mlls_s']:.1f} | {trimmed['no_shift_s']:.1f} | {trimmed['label_shift_s']:.1f} | "
             f"{trimmed['pass_ms']:.0f} | driver {trimmed['peak_gib']:.2f}, workers "
             + ", ".join(f"{g:.2f}" for g in trimmed["worker_peak_gib"]) + " |",
             "", f"ratio cluster / one process: MLLS {cl['mlls_s'] / one['mlls_s']:.2f}x, no-shift "
             f"{cl['no_shift_s'] / one['no_shift_s']:.2f}x, label-shift "
             f"{cl['label_shift_s'] / one['label_shift_s']:.2f}x; one pass with the nanny's environment / without "
             f"it: {trimmed['pass_ms'] / cl['pass_ms']:.2f}x"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sep", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--assessment", action="store_true",
                    help="only the whole assessment of raw outputs on the cluster: calibrated rows derived in every "
                         "pass against kept on the workers")
    ap.add_argument("--child", choices=["one", "cluster", "cluster-trimmed", "assessment"], help=argparse.SUPPRESS)
    ap.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        result = one_process(args.folder) if args.child == "one" else \
            assessment_on_cluster(args.folder, args.workers) if args.child == "assessment" else \
            on_cluster(args.folder, args.workers, fast=args.child == "cluster")
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
        folder = Path(tmp)
        t = time.perf_counter()
        write_data(folder, args.rows, args.classes, args.partitions, args.sep, args.seed)
        print(f"data written in {time.perf_counter() - t:.0f} s", file=sys.stderr)
        if args.assessment:
            got = _child("assessment", folder, args.workers)
            print(f"{args.rows:,} raw rows x {args.classes} classes in {args.partitions} partitions, assess_shift on "
                  f"{args.workers} workers: calibrated rows derived in every pass {got['derived_s']:.1f} s, kept "
                  f"once {got['kept_s']:.1f} s ({got['derived_s'] / got['kept_s']:.2f}x); verdicts "
                  f"{got['derived_verdict']} / {got['kept_verdict']}")
            return
        one = _child("one", folder, args.workers)
        cl = _child("cluster", folder, args.workers)
        trimmed = _child("cluster-trimmed", folder, args.workers)
    print(table(args.rows, args.classes, args.partitions, args.workers, one, cl, trimmed))


if __name__ == "__main__":
    main()
