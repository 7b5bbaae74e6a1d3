"""Prefect tasks that write a sweep's results to the object store (an S3 bucket or a local folder).

Keys, under the store's root (``<run>`` is the MLflow parent run id, so the store and MLflow name a sweep alike):

* ``results/<run>/per_seed_<experiment>.csv`` -- one row per (setting, seed, method): the estimated and true
  weights, the MSE, the minimum Hessian eigenvalue, solver flags;
* ``results/<run>/figures/mse_vs_<experiment>.png`` -- the paper's figure of the experiment;
* ``results/<run>/summary.json`` -- per (experiment, setting, method) mean MSE and standard error, plus the flow
  parameters and the checksums of every file above.

Every write is atomic and records a SHA-256 (see :mod:`labelshift.storage`).
"""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from labelshift.storage import open_store

__all__ = ["results_prefix", "results_url", "check_store_uri", "save_experiment", "save_summary"]


def results_prefix(run_id: str) -> str:
    """Folder of one sweep's results in the store."""
    return f"results/{run_id}"


def check_store_uri(store_uri: str) -> str:
    """Parse the store URI (no network): a malformed one fails the run before any work. Returns the root URI."""
    return open_store(store_uri).uri


def results_url(store_uri: str, run_id: str) -> str:
    """Full URI of one sweep's results folder (``s3://bucket/prefix/results/<run>`` or ``file:///...``)."""
    return open_store(store_uri).url(results_prefix(run_id))


@task(name="save-experiment", task_run_name="save-{kind}", cache_policy=NO_CACHE, persist_result=False)
def save_experiment(store_uri: str, run_id: str, kind: str, outputs: dict[str, bytes]) -> dict[str, dict[str, str]]:
    """Write one experiment's per-seed table and figure (from :func:`tasks.sweep.outputs.render_outputs`); returns
    ``{key: {"url", "sha256"}}``."""
    store = open_store(store_uri)
    prefix = results_prefix(run_id)
    files = {
        f"{prefix}/per_seed_{kind}.csv": outputs["per_seed_csv"],
        f"{prefix}/figures/mse_vs_{kind}.png": outputs["figure"],
    }
    out = {}
    for key, data in files.items():
        digest = store.put_bytes(key, data, content_type="image/png" if key.endswith(".png") else "text/csv")
        out[key] = {"url": store.url(key), "sha256": digest}
    return out


@task(name="save-summary", cache_policy=NO_CACHE, persist_result=False)
def save_summary(store_uri: str, run_id: str, summary: dict) -> dict[str, str]:
    """Write ``summary.json`` (parameters, per-setting MSE table, files written); returns its url and sha256."""
    store = open_store(store_uri)
    key = f"{results_prefix(run_id)}/summary.json"
    digest = store.put_json(key, summary)
    return {"url": store.url(key), "sha256": digest}
