"""A Dask worker lost during a pass over the target's partitions (issue 41: "a worker lost mid-run: the run fails or
retries, nothing committed twice"). Lost once, the scheduler reloads its partitions from their sources on a worker
that lives and runs the pass's call again: the pass returns what it returns without the loss. Lost every time, the
pass fails with a PartitionError naming the cluster and the fix (``on_cluster.cluster_client``), which fails the run
before its commit.

Each test has a cluster of its own (a killed worker process is restarted by its nanny, which takes seconds).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from labelshift.errors import PartitionError

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")
cluster = pytest.importorskip("tasks.reestimation.cluster")

pytestmark = pytest.mark.integration


def _column_sums_or_die(B, marker: str) -> np.ndarray:
    """The partition's column sums; the first call of all (no marker yet) kills the worker process it runs in."""
    if not Path(marker).exists():
        Path(marker).write_text(str(os.getpid()))
        os._exit(1)
    return np.asarray(B, dtype=np.float64).sum(axis=0)


def _die(B) -> None:
    os._exit(1)


def _sources(tmp_path: Path, rng) -> tuple[list, list[np.ndarray]]:
    arrays = [rng.dirichlet(np.ones(4), size=n).astype(np.float32) for n in (300, 500, 200)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"part{i}.npy", a)
    return [cluster.npy_partition(tmp_path / f"part{i}.npy") for i in range(len(arrays))], arrays


def test_a_worker_killed_during_a_pass_has_its_partitions_reloaded_and_the_pass_completes(tmp_path):
    sources, arrays = _sources(tmp_path, np.random.default_rng(5))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  worker_dashboard_address=None) as lc, distributed.Client(lc) as client:
        R = cluster.cluster_rows(client, sources)
        sums = R.run(_column_sums_or_die, str(tmp_path / "died"))
    assert (tmp_path / "died").exists()                         # a worker did die during the pass
    expected = [a.astype(np.float64).sum(axis=0) for a in arrays]
    for got, want in zip(sums, expected):                       # the same rows summed again: float64 rounding only
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_worker_lost_for_good_fails_the_run_with_the_cluster_named(tmp_path, monkeypatch):
    from tasks.reestimation.on_cluster import cluster_client

    monkeypatch.setattr(os, "cpu_count", lambda: 2)             # "local": a worker a core, two on any machine
    sources, _ = _sources(tmp_path, np.random.default_rng(6))
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):     # the first loss is for good
        with pytest.raises(PartitionError, match=r"a worker of the Dask cluster at local died or was cut off during "
                                                 r"the run \(KilledWorker.*nothing was committed\. Fix:.*"
                                                 r"run without dask"):
            with cluster_client("local") as client:
                cluster.cluster_rows(client, sources).run(_die)


def test_the_workers_of_local_and_of_infra_dask_start_without_the_nannys_trim_threshold(monkeypatch):
    """``local_cluster`` and the configuration shipped for workers started by hand (``infra/dask``) both leave out
    MALLOC_TRIM_THRESHOLD_, which Dask's nanny sets by default (the cost of a pass: benchmarks/README.md)."""
    root = Path(__file__).resolve().parents[2]
    shipped = dask.config.collect(paths=[str(root / "infra" / "dask")], env={})
    assert shipped["distributed"]["nanny"]["pre-spawn-environ"] == {"MALLOC_TRIM_THRESHOLD_": None}  # None: unset
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")     # as a default LocalCluster's nanny leaves it here
    with cluster.local_cluster(1) as lc, distributed.Client(lc) as client:
        environ = client.run(lambda: dict(os.environ))
    assert all("MALLOC_TRIM_THRESHOLD_" not in env for env in environ.values())
    assert os.environ["MALLOC_TRIM_THRESHOLD_"] == "65536"                  # this process's own left as it was
