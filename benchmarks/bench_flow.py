"""Flow overhead: the two-Gaussian sweep as a plain in-process loop versus through the Prefect ``reproduce`` flow.

Same grid, same machine, same process, one after the other:

* **plain loop** -- ``run_setting`` on every setting with all seeds, then ``aggregate``: the numerical work only;
* **flow** -- ``reproduce(...)`` against a running Prefect server (started before timing, its startup reported
  on its own line): the same estimation fanned out over Prefect tasks, plus everything the flow adds (MLflow
  parent and child runs with metrics, figures, per-seed tables, the object store, the Prefect artifact).

The ratio flow / plain loop is the cost of orchestration and logging; the goal is at most 1.5.

    python benchmarks/bench_flow.py                 # the default sweep of `make run` (ReproduceParameters())
    python benchmarks/bench_flow.py --quick         # a small grid, for a smoke test
    python benchmarks/bench_flow.py --repeat 3      # best of 3 for each side

Prints a markdown table (paste it into benchmarks/README.md, section "Flow overhead").
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from report_utils import quiet_services  # noqa: E402

quiet_services()

from flows.params import ReproduceParameters  # noqa: E402

QUICK = dict(shift_values=[0.05, 0.2, 0.5], target_sizes=[100, 1000], bins_values=[2, 8], n_seeds=20)


def plain_loop(p: ReproduceParameters) -> dict:
    """The sweep with the library alone: every setting, all seeds in one call, then aggregate."""
    from flows.plan import experiment_settings
    from labelshift.experiments import gaussian

    sweeps = {}
    for experiment in p.experiments:
        settings = experiment_settings(p, experiment)
        results = [gaussian.run_setting(s, range(p.n_seeds), list(p.methods_for(experiment)), mu=p.mu,
                                        n_source=p.n_source, base_seed=p.base_seed) for s in settings]
        sweeps[experiment] = gaussian.aggregate(results)
    return sweeps


def through_flow(p: ReproduceParameters, root: Path, heartbeats: bool = False) -> dict:
    """The sweep through the flow, logging to a SQLite MLflow store and a local object store under ``root``,
    run as ``labelshift reproduce`` runs it on the temporary server (``heartbeats=False``) or as on a lasting
    server (``heartbeats=True``)."""
    from flows.reproduce import run_in_process

    p = p.model_copy(update={"store": str(root / "store"), "tracking_uri": f"sqlite:///{root / 'mlflow.db'}",
                             "mlflow_experiment": "bench"})
    state = run_in_process(p, temporary_server=not heartbeats)
    if not state.is_completed():
        raise SystemExit(f"the flow failed: {state.message}")
    return state.result()


def _best(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small grid instead of the default sweep")
    ap.add_argument("--seeds", type=int, help="seeds per setting (default: the flow's default)")
    ap.add_argument("--seeds-per-task", type=int, help="chunk size of the flow's estimation tasks")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each side; the best time is reported")
    args = ap.parse_args(argv)
    values = dict(QUICK) if args.quick else {}
    if args.seeds:
        values["n_seeds"] = args.seeds
    if args.seeds_per_task:
        values["seeds_per_task"] = args.seeds_per_task
    p = ReproduceParameters(**values)

    from prefect.testing.utilities import prefect_test_harness

    with tempfile.TemporaryDirectory(prefix="labelshift-bench-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        with prefect_test_harness(server_startup_timeout=180):
            startup = time.perf_counter() - t0
            # warm-up outside the timing, as after the first `make run`: imports (MLflow, matplotlib), the MLflow
            # database schema, the first clients
            through_flow(ReproduceParameters(**{**QUICK, "n_seeds": 2, "experiments": ["shift"],
                                                "shift_values": [0.5]}), root)
            t_plain, _ = _best(lambda: plain_loop(p), args.repeat)
            t_flow, result = _best(lambda: through_flow(p, root), args.repeat)
            t_flow_hb, _ = _best(lambda: through_flow(p, root, heartbeats=True), args.repeat)

    from flows.plan import plan

    n_settings = sum(len(p.grid_values(e)) for e in p.experiments)
    n_tasks = sum(len(t) for t in plan(p).values())
    ratio = t_flow / t_plain
    print(f"\nmachine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"grid: {', '.join(f'{e} {len(p.grid_values(e))}' for e in p.experiments)} settings "
          f"({n_settings} in all) x {p.n_seeds} seeds; {n_tasks} estimation tasks; best of {args.repeat}\n")
    print("| run | seconds |")
    print("|---|---|")
    print(f"| plain loop (run_setting + aggregate) | {t_plain:.1f} |")
    print(f"| Prefect flow (tasks + MLflow + figures + store + artifact), as `labelshift reproduce` | {t_flow:.1f} |")
    print(f"| **ratio flow / plain** | **{ratio:.2f}** |")
    print(f"| same flow with flow-run heartbeats on (as on a lasting server) | {t_flow_hb:.1f} "
          f"(ratio {t_flow_hb / t_plain:.2f}) |")
    print(f"| Prefect server startup (once per command, not in the ratio) | {startup:.1f} |")
    print(f"\ngoal <= 1.5: {'met' if ratio <= 1.5 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
