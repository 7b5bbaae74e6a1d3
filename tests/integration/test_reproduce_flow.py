"""The ``reproduce`` flow end to end through a real Prefect server (the test harness), with MLflow on SQLite and
the object store in a local folder; and its failure path.

The grid is tiny (two values per experiment, 4 seeds, a 2,000-point source set) so each run takes seconds; the
seeds are split two per task so the joining of seed chunks is exercised.
"""
from __future__ import annotations

import csv
import io

import numpy as np
import pytest
from mlflow import MlflowClient

from flows.reproduce import reproduce
from labelshift.errors import InputError
from labelshift.experiments import gaussian
from labelshift.storage import open_store

pytestmark = pytest.mark.integration

TINY = dict(shift_values=[0.1, 0.5], target_sizes=[100, 300], bins_values=[2, 4], n_seeds=4, seeds_per_task=2,
            n_source=2000)
METHODS = ["BBSE-hard", "BBSE-soft", "RLLS", "MLLS-CM", "MLLS"]


@pytest.fixture(scope="module")
def sweep_run(prefect_server, mlflow_sqlite, tmp_path_factory):
    """One successful run of the tiny sweep, shared by the assertions below."""
    root = tmp_path_factory.mktemp("reproduce")
    tracking = mlflow_sqlite(root)
    store = str(root / "store")
    state = reproduce(**TINY, store=store, tracking_uri=tracking, mlflow_experiment="test-reproduce",
                      return_state=True)
    return dict(state=state, tracking=tracking, store=store, root=root)


def test_flow_completes_and_returns_locations(sweep_run):
    state = sweep_run["state"]
    assert state.is_completed(), state.message
    result = state.result()
    assert result["mlflow"]["tracking_uri"] == sweep_run["tracking"]
    assert set(result["figures"]) == {"mse_vs_shift.png", "mse_vs_size.png", "mse_vs_bins.png"}
    # 5 methods x 2 settings (shift) + 5 x 2 (size) + 2 x 2 (bins)
    assert len(result["rows"]) == 24


def test_mlflow_parent_and_children(sweep_run):
    result = sweep_run["state"].result()
    client = MlflowClient(sweep_run["tracking"])
    parent = client.get_run(result["mlflow"]["run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.params["n_seeds"] == "4"
    assert parent.data.params["shift_values"] == "0.1,0.5"
    assert parent.data.tags["dataset"] == "gaussian"
    assert parent.data.tags["prefect.flow_run_id"] == str(sweep_run["state"].state_details.flow_run_id)

    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    by_method = {r.data.tags["method"]: r for r in children}
    assert set(by_method) == set(METHODS) | {"MLLS-binned"}
    assert all(r.info.status == "FINISHED" for r in children)

    # the child run's name starts with its method, so the run table's truncated names still show it
    assert all(r.info.run_name.startswith(r.data.tags["method"] + " ") for r in children)
    # the curves: one metric value per setting, step = the swept value (p_t(y=1) in thousandths, m itself), the
    # x value logged beside it
    mlls = by_method["MLLS"].info.run_id
    mse = client.get_metric_history(mlls, "shift/mse")
    assert sorted(m.step for m in mse) == [100, 500]
    x = {m.step: m.value for m in client.get_metric_history(mlls, "shift/p_t1")}
    assert x == {100: 0.1, 500: 0.5}
    assert {m.step: m.value for m in client.get_metric_history(mlls, "size/m")} == {100: 100.0, 300: 300.0}
    assert by_method["MLLS"].data.tags["labelshift.step.shift"] == "step = p_t1 (value x 1000)"
    # every point of a curve in the run's overview (latest values), not only the last step
    latest = by_method["MLLS"].data.metrics
    assert latest["shift/mse/p_t1 0.1"] == pytest.approx({m.step: m.value for m in mse}[100])
    assert {"shift/mse/p_t1 0.5", "size/mse/m 100", "size/mse/m 300"} <= set(latest)
    # the logged MSE is the mean over seeds of the per-seed rows in the summary
    rows = [r for r in result["rows"] if r["experiment"] == "shift" and r["method"] == "MLLS"]
    assert sorted(m.value for m in mse) == pytest.approx(sorted(r["mse_mean"] for r in rows))
    binned = by_method["MLLS-binned"].info.run_id
    eig = client.get_metric_history(binned, "bins/min_eigenvalue")
    assert sorted(m.step for m in eig) == [2, 4] and all(m.value > 0 for m in eig)
    # BBSE has no Hessian: no eigenvalue metric rather than NaNs
    assert client.get_metric_history(by_method["BBSE-hard"].info.run_id, "shift/min_eigenvalue") == []


def test_mlflow_artifacts_are_pngs_and_tables(sweep_run, tmp_path):
    run_id = sweep_run["state"].result()["mlflow"]["run_id"]
    client = MlflowClient(sweep_run["tracking"])
    figures = {f.path for f in client.list_artifacts(run_id, "figures")}
    assert figures == {"figures/mse_vs_shift.png", "figures/mse_vs_size.png", "figures/mse_vs_bins.png"}
    # each method's run has its own figures
    mlls = sweep_run["state"].result()["mlflow"]["child_run_ids"]["MLLS"]
    assert {f.path for f in client.list_artifacts(mlls, "figures")} == {"figures/MLLS_mse_vs_shift.png",
                                                                        "figures/MLLS_mse_vs_size.png"}
    binned = sweep_run["state"].result()["mlflow"]["child_run_ids"]["MLLS-binned"]
    assert {f.path for f in client.list_artifacts(binned, "figures")} == {"figures/MLLS-binned_mse_vs_bins.png"}
    # the experiment opens on its runs in MLflow 3 (model training, not the GenAI overview)
    exp = client.get_experiment(client.get_run(run_id).info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    local = client.download_artifacts(run_id, "figures/mse_vs_size.png", str(tmp_path))
    assert open(local, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    table = client.download_artifacts(run_id, "tables/per_seed_shift.csv", str(tmp_path))
    rows = list(csv.DictReader(open(table)))
    assert len(rows) == 40                                  # 2 settings x 4 seeds x 5 methods
    assert {"seed", "method", "mse", "w_0", "w_true_0", "min_eig"} <= set(rows[0])
    summary = list(csv.DictReader(open(client.download_artifacts(run_id, "tables/summary.csv", str(tmp_path)))))
    assert len(summary) == 24 and {"experiment", "mse_mean", "mse_se"} <= set(summary[0])


def test_store_has_result_tables_matching_an_unchunked_run(sweep_run):
    """The per-seed table in the store equals run_setting on all seeds at once (chunking changes nothing)."""
    run_id = sweep_run["state"].result()["mlflow"]["run_id"]
    store = open_store(sweep_run["store"])
    keys = set(store.list(f"results/{run_id}/"))
    assert {f"results/{run_id}/per_seed_{e}.csv" for e in ("shift", "size", "bins")} <= keys
    assert f"results/{run_id}/summary.json" in keys
    rows = list(csv.DictReader(io.StringIO(store.get_bytes(f"results/{run_id}/per_seed_shift.csv").decode())))
    assert len(rows) == 40
    setting = gaussian.settings_grid("shift", [0.5], m=1000)[0]
    direct = gaussian.run_setting(setting, range(4), METHODS, n_source=2000)
    from_flow = {(int(r["seed"]), r["method"]): float(r["mse"]) for r in rows if float(r["value"]) == 0.5}
    for i, seed in enumerate(direct.seeds):
        for j, method in enumerate(METHODS):
            assert from_flow[(int(seed), method)] == pytest.approx(direct.mse[i, j], rel=1e-12, abs=1e-15)
    summary = store.get_json(f"results/{run_id}/summary.json")
    assert summary["mlflow"]["run_id"] == run_id
    assert summary["parameters"]["n_seeds"] == 4
    assert all(len(f["sha256"]) == 64 for f in summary["files"].values())


def test_prefect_markdown_artifact_links_to_mlflow_run(sweep_run):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    state = sweep_run["state"]
    run_id = state.result()["mlflow"]["run_id"]
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    markdown = [a for a in artifacts if a.type == "markdown"]
    assert len(markdown) == 1
    assert run_id in markdown[0].data
    assert "| p_t(y=1) |" in markdown[0].data and "MLLS" in markdown[0].data


def test_failing_task_fails_flow_and_mlflow_runs(prefect_server, mlflow_sqlite, tmp_path, monkeypatch):
    """An error inside one estimation task: the flow run is Failed with the cause, no MLflow run is left RUNNING."""
    real = gaussian.run_setting

    def broken(setting, seeds, *args, **kwargs):
        if setting.kind == "size" and setting.value == 300:
            raise InputError("injected failure for m=300")
        return real(setting, seeds, *args, **kwargs)

    monkeypatch.setattr(gaussian, "run_setting", broken)
    tracking = mlflow_sqlite(tmp_path)
    state = reproduce(**TINY, store=str(tmp_path / "store"), tracking_uri=tracking,
                      mlflow_experiment="test-failure", return_state=True)
    assert state.is_failed()
    assert "injected failure for m=300" in state.message

    client = MlflowClient(tracking)
    exp = client.get_experiment_by_name("test-failure")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 7                                   # the parent and 6 method runs
    assert {r.info.status for r in runs} == {"FAILED"}
    assert all("injected failure" in r.data.tags["error"] for r in runs)


def test_parameters_are_validated_before_any_work(prefect_server, tmp_path):
    """A value the schema refuses never reaches a task: the flow run fails on its parameters, MLflow stays empty."""
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    state = reproduce(**{**TINY, "shift_values": [0.5, 1.5]}, tracking_uri=tracking,
                      store=str(tmp_path / "store"), mlflow_experiment="test-invalid", return_state=True)
    assert not state.is_completed()
    assert "shift_values" in state.message
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "store").exists()


def test_flow_parameters_documented_and_match_the_model():
    """Every flow parameter has a description in the deployment's schema (the UI form) and the model's default."""
    from prefect.utilities.callables import parameter_schema

    from flows.params import ReproduceParameters

    schema = parameter_schema(reproduce.fn).model_dump()["properties"]
    assert set(schema) == set(ReproduceParameters.model_fields)
    defaults = ReproduceParameters().model_dump()
    for name, prop in schema.items():
        assert prop.get("description"), f"parameter {name} has no description in the Prefect form"
        assert prop.get("default") == defaults[name]
    assert set(np.atleast_1d(gaussian.METHODS)) <= set(schema["methods"]["items"]["enum"])


def test_deployment_form_has_every_parameter(prefect_server):
    """What `labelshift serve` registers: the UI builds its form from this schema (titles, descriptions, defaults)."""
    from prefect.client.orchestration import get_client

    from flows.params import ReproduceParameters
    from flows.serve import DEPLOYMENT_DESCRIPTION

    deployment_id = reproduce.to_deployment(name="test-form", description=DEPLOYMENT_DESCRIPTION).apply()
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment(deployment_id)
    assert deployment.enforce_parameter_schema
    props = deployment.parameter_openapi_schema["properties"]
    assert list(props) == list(ReproduceParameters.model_fields)         # form fields in the model's order
    assert props["n_seeds"]["default"] == 100 and props["n_seeds"]["minimum"] == 2
    assert props["experiments"]["items"]["enum"] == ["shift", "size", "bins", "alpha"]
    assert "p_t(y=1)" in props["shift_values"]["description"]
