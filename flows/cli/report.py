"""``labelshift report``: a markdown results page from the MLflow runs."""
from __future__ import annotations

from flows.cli._common import add_common, setup

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser(
        "report", help="write a markdown results page from the MLflow runs",
        description="Query the MLflow experiment for the latest finished sweep of each dataset and write "
                    "results.md (one table per dataset and experiment: MSE per method and setting with standard "
                    "errors; how the claims of the paper's Section 6 fare, computed from the numbers) with the "
                    "figures beside it.")
    add_common(p, top=False)
    p.add_argument("--out", metavar="DIR", default=None, help="output folder (default: <home>/report)")
    p.add_argument("--tracking-uri", metavar="URI", help="MLflow tracking URI (default: as for reproduce)")
    p.add_argument("--experiment-name", metavar="NAME", help="MLflow experiment (default: as for reproduce)")
    p.set_defaults(handler=run)


def run(args) -> int:
    env = setup(args, tracking_uri=args.tracking_uri, experiment_name=args.experiment_name)
    from tasks.sweep.results_page import write_report

    out = args.out or str(env.home / "report")
    page = write_report(env.tracking_uri, env.experiment_name, out)
    print(f"report: {page}")
    return 0
