"""Prefect task that renders an experiment's output files once, for both MLflow and the object store."""
from __future__ import annotations

import csv
import dataclasses
import io

import numpy as np

from prefect import task
from prefect.cache_policies import NO_CACHE

from labelshift.experiments.plots import plot_sweep
from labelshift.figures import figure_png

__all__ = ["records_csv", "render_outputs"]


def records_csv(records: list[dict]) -> bytes:
    """Flat dicts as CSV bytes (header = union of the keys, in first-seen order; None as an empty cell)."""
    columns: list[str] = []
    seen = set()
    for r in records:
        for c in r:
            if c not in seen:
                seen.add(c)
                columns.append(c)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return buf.getvalue().encode("utf-8")


@task(name="render", task_run_name="render-{sweep.kind}", cache_policy=NO_CACHE, persist_result=False)
def render_outputs(sweep, dataset: str | None = None) -> dict[str, bytes]:
    """The experiment's figure in the paper's style (PNG), the same figure per method (``method_figures``:
    method -> PNG, for that method's MLflow run) and its per-seed table (CSV: one row per setting, seed and method
    with the estimated and true weights, MSE, minimum Hessian eigenvalue and solver flags)."""
    return {"figure": figure_png(plot_sweep(sweep, dataset)),
            "method_figures": _method_figures(sweep, dataset),
            "per_seed_csv": records_csv([row for res in sweep.results for row in res.to_records()])}


def _method_figures(sweep, dataset: str | None) -> dict[str, bytes]:
    """One figure per method with at least one finite MSE (a curve of NaNs has nothing to draw: on a log axis
    matplotlib cannot even place its ticks)."""
    out = {}
    for j, method in enumerate(sweep.methods):
        if np.isfinite(np.asarray(sweep.mse_mean, dtype=float)[:, j]).any():
            out[method] = figure_png(plot_sweep(_one_method(sweep, method), dataset))
    return out


def _one_method(sweep, method: str):
    """The sweep restricted to one method's column (its per-seed results are left whole)."""
    j = list(sweep.methods).index(method)
    return dataclasses.replace(sweep, methods=[method], mse_mean=sweep.mse_mean[:, [j]],
                               mse_se=sweep.mse_se[:, [j]], min_eigenvalue_mean=sweep.min_eigenvalue_mean[:, [j]])
