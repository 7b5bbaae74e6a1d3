"""A corrected model to serve: the ``reestimate`` flow with ``register_corrected`` against a real
MLflow server (artifacts in a local folder) and the Prefect test server, on local-folder targets.

The classifier is the Bayes-optimal linear model of :mod:`tests.reestimation_support` (input mode, PyTorch) and a
reference registered from its logits (prediction-log mode). On a "Shifted" run a version of
``<model>-shift-corrected`` is registered; loaded with ``mlflow.pyfunc.load_model("models:/...@shift-corrected")``
it gives the corrected outputs the flow wrote beside the batch, and ``mlflow models serve --env-manager local``
serves it. Under any other verdict, or for a registry name that belongs to another kind of model, nothing is
registered.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from mlflow import MlflowClient

from tests.reestimation_support import K, SHIFTED_PRIOR, SOURCE_PRIOR, bayes_logits, draw, register_model

pytestmark = pytest.mark.integration

MODEL = "serve-e2e"
CORRECTED = f"{MODEL}-shift-corrected"


@pytest.fixture(scope="module")
def deployed(mlflow_server):
    return dict(register_model(mlflow_server.url, MODEL), tracking_uri=mlflow_server.url)


def _run(model_uri: str, tracking_uri: str, target: Path, **kw):
    from flows.reestimate import reestimate

    return reestimate(model=model_uri, target=str(target), tracking_uri=tracking_uri, return_state=True, **kw)


def _versions(tracking_uri: str, name: str) -> list:
    return MlflowClient(tracking_uri).search_model_versions(f"name = '{name}'")


def _load(tracking_uri: str, uri: str):
    import mlflow.pyfunc

    mlflow.set_tracking_uri(tracking_uri)
    return mlflow.pyfunc.load_model(uri)


def test_a_shifted_run_registers_a_corrected_model_that_predicts_what_the_flow_wrote(prefect_server, deployed,
                                                                                   tmp_path):
    rng = np.random.default_rng(5)
    target = tmp_path / "target"
    target.mkdir()
    x, y = draw(SHIFTED_PRIOR, 3000, rng)
    np.save(target / "day-1.npy", x)
    state = _run(deployed["model_uri"], deployed["tracking_uri"], target, register_corrected=True)
    assert state.is_completed() and state.name == "Shifted", state.message
    summary = state.result()
    info = summary["corrected_model"]
    assert info == {"name": CORRECTED, "version": "1", "alias": "shift-corrected",
                    "model_uri": f"models:/{CORRECTED}@shift-corrected", "version_uri": f"models:/{CORRECTED}/1"}

    # the served model gives what the flow wrote beside the batch (float32 there: agreement to ~1e-7)
    model = _load(deployed["tracking_uri"], f"models:/{CORRECTED}@shift-corrected")
    out = model.predict(x)
    written = np.load(target / "day-1.corrected.npy")
    names = [str(c) for c in range(K)]
    assert list(out.columns) == [*names, "corrected_class"]
    np.testing.assert_allclose(out[names].to_numpy(), written, rtol=0, atol=1e-6)
    assert (out["corrected_class"].to_numpy() == np.asarray(names)[written.argmax(1)]).all()
    # and p_t(y|x) ~ w_y f_y(x) with the reported weights, f the calibrated Bayes posterior
    from labelshift.estimation.diagnostics import correct_predictions

    w = np.array(summary["result"]["weights"])
    client = MlflowClient(deployed["tracking_uri"])
    mv = client.get_model_version_by_alias(CORRECTED, "shift-corrected")
    # what is recorded on the version: the source model version, the weights with their interval, the run
    tags = mv.tags
    assert mv.run_id == summary["mlflow"]["run_id"] == tags["labelshift.estimation_run_id"]
    assert tags["labelshift.kind"] == "shift-corrected" and tags["labelshift.verdict"] == "Shifted"
    assert tags["labelshift.source_model"] == f"models:/{MODEL}/{deployed['version']}"
    assert tags["labelshift.source_run_id"] == deployed["run_id"]
    assert json.loads(tags["labelshift.weights"]) == pytest.approx(w, abs=1e-6)
    ci = summary["result"]["interval"]
    assert json.loads(tags["labelshift.weights_lower"]) == pytest.approx(ci["weights_lower"], abs=1e-6)
    assert json.loads(tags["labelshift.weights_upper"]) == pytest.approx(ci["weights_upper"], abs=1e-6)
    assert tags["labelshift.interval"] == "95% source-aware" and tags["labelshift.target"] == summary["target"]
    assert summary["mlflow"]["run_id"] in mv.description and "| class | w | interval on w |" in mv.description
    assert client.get_registered_model(CORRECTED).tags["labelshift.kind"] == "shift-corrected"
    assert client.get_run(mv.run_id).data.tags["labelshift.corrected_model"] == f"models:/{CORRECTED}/1"
    from labelshift.calibration import load_calibrator

    cal_doc = json.loads(Path(client.download_artifacts(deployed["run_id"], "calibration/BCTS.json",
                                                        str(tmp_path))).read_text())
    expected = correct_predictions(load_calibrator(cal_doc["calibrator"]).predict_proba(bayes_logits(x)), w)
    np.testing.assert_allclose(out[names].to_numpy(), expected, atol=1e-4)       # float32 forward pass

    # not shifted, then not label shift: nothing registered, the alias stays
    np.save(target / "day-2.npy", draw(SOURCE_PRIOR, 3000, rng)[0])
    state = _run(deployed["model_uri"], deployed["tracking_uri"], target, register_corrected=True)
    assert state.is_completed() and state.name == "No shift", state.message
    assert "corrected_model" not in state.result() or state.result()["corrected_model"] is None
    x3, _ = draw(SOURCE_PRIOR, 2400, rng)
    np.save(target / "day-3.npy", np.concatenate([x3, 0.3 * rng.standard_normal((600, 2)).astype(np.float32)]))
    state = _run(deployed["model_uri"], deployed["tracking_uri"], target, register_corrected=True)
    assert state.is_completed() and state.name == "Not label shift", state.message
    assert [v.version for v in _versions(deployed["tracking_uri"], CORRECTED)] == ["1"]
    assert client.get_model_version_by_alias(CORRECTED, "shift-corrected").version == "1"

    # a second shifted run: version 2, the alias moves
    np.save(target / "day-4.npy", draw(SHIFTED_PRIOR, 3000, rng)[0])
    state = _run(deployed["model_uri"], deployed["tracking_uri"], target, register_corrected=True)
    assert state.is_completed() and state.name == "Shifted", state.message
    assert client.get_model_version_by_alias(CORRECTED, "shift-corrected").version == "2"
    # what `mlflow models serve` answers is what the loaded model gives
    latest = _load(deployed["tracking_uri"], f"models:/{CORRECTED}@shift-corrected").predict(x[:5])
    _served_over_http(deployed["tracking_uri"], f"models:/{CORRECTED}@shift-corrected", x[:5],
                      latest[names].to_numpy(), tmp_path)


def _served_over_http(tracking_uri: str, model_uri: str, x: np.ndarray, reference: np.ndarray, folder: Path):
    """``mlflow models serve -m MODEL_URI --env-manager local`` on a free port: POST /invocations with the rows ``x``
    answers one record per row, the class columns and ``corrected_class``."""
    import requests

    from runtime.processes import ServiceProcess, free_ports, http_ok

    (port,) = free_ports(1)
    # the environment of these tests (--env-manager local), its scripts (uvicorn) first on the PATH
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local",
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    server = ServiceProcess(command, log=folder / "serve.log", env=env, name="mlflow models serve").start()
    try:
        t0 = time.monotonic()
        server.wait_ready(lambda: http_ok(f"http://127.0.0.1:{port}/ping"), 180, what=f"on port {port}", step=0.5)
        print(f"mlflow models serve ready in {time.monotonic() - t0:.1f} s")
        answer = requests.post(f"http://127.0.0.1:{port}/invocations", json={"inputs": x.tolist()}, timeout=60)
        assert answer.status_code == 200, answer.text
        rows = answer.json()["predictions"]
        probs = np.array([[r[str(c)] for c in range(K)] for r in rows])
        assert probs.shape == reference.shape and np.allclose(probs.sum(1), 1)
        assert all(r["corrected_class"] == str(int(np.argmax(p))) for r, p in zip(rows, probs))
        np.testing.assert_allclose(probs, reference, atol=1e-6)
    finally:
        server.stop()


def test_a_registry_name_of_another_kind_of_model_fails_before_anything_is_written(prefect_server, deployed,
                                                                                  tmp_path):
    client = MlflowClient(deployed["tracking_uri"])
    client.create_registered_model("someone-elses-model", tags={"team": "fraud"})
    target = tmp_path / "target"
    target.mkdir()
    np.save(target / "day-1.npy", draw(SHIFTED_PRIOR, 2000, np.random.default_rng(1))[0])
    for name, message in (("someone-elses-model", "is not a labelshift shift-corrected model"),
                          (MODEL, "is the deployed model's own name")):
        state = _run(deployed["model_uri"], deployed["tracking_uri"], target, register_corrected=True,
                     corrected_model_name=name)
        assert state.is_failed() and message in state.message, state.message
        assert "--corrected-model-name" in state.message and "watermark did not move" in state.message
        assert sorted(p.name for p in target.iterdir()) == ["day-1.npy"]      # no outputs, no watermark
    assert _versions(deployed["tracking_uri"], "someone-elses-model") == []
    assert [v.version for v in _versions(deployed["tracking_uri"], MODEL)] == [deployed["version"]]


def test_prediction_log_mode_takes_the_deployed_models_outputs(prefect_server, mlflow_server, tmp_path):
    import pandas as pd

    from labelshift_mlflow import register_reference

    rng = np.random.default_rng(7)
    hx, hy = draw(SOURCE_PRIOR, 4000, rng)
    names = ["north", "east", "west"]
    ref = register_reference(bayes_logits(hx), [names[v] for v in hy], name="serve-logs", class_names=names,
                             output_kind="logits", tracking_uri=mlflow_server.url)
    target = tmp_path / "logs"
    target.mkdir()
    logits = bayes_logits(draw(SHIFTED_PRIOR, 3000, rng)[0]).astype(np.float32)
    np.save(target / "part-0.npy", logits)
    state = _run(ref["model_uri"], mlflow_server.url, target, register_corrected=True,
                 corrected_model_name="serve-logs-corrected")
    assert state.is_completed() and state.name == "Shifted", state.message
    model = _load(mlflow_server.url, "models:/serve-logs-corrected@shift-corrected")
    written = np.load(target / "part-0.corrected.npy")
    from_array = model.predict(logits)
    from_frame = model.predict(pd.DataFrame(logits, columns=names))
    for out in (from_array, from_frame):
        assert list(out.columns) == [*names, "corrected_class"]
        np.testing.assert_allclose(out[names].to_numpy(), written, rtol=0, atol=1e-6)
        assert (out["corrected_class"].to_numpy() == np.asarray(names)[written.argmax(1)]).all()
    mv = MlflowClient(mlflow_server.url).get_model_version_by_alias("serve-logs-corrected", "shift-corrected")
    assert mv.tags["labelshift.mode"] == "outputs" and json.loads(mv.tags["labelshift.classes"]) == names
    with pytest.raises(Exception, match="no column for class"):
        model.predict(pd.DataFrame(logits, columns=["a", "b", "c"]))


def test_a_scikit_learn_model_on_parquet_batches(prefect_server, mlflow_server, tmp_path):
    """Input mode with a scikit-learn model whose signature names its columns: the corrected model takes a DataFrame
    of those columns (others ignored) and gives the class columns of NAME.corrected.parquet."""
    import pandas as pd
    from sklearn.linear_model import LogisticRegression

    from labelshift_mlflow import register_sklearn_model

    rng = np.random.default_rng(3)
    tx, ty = draw(SOURCE_PRIOR, 2000, rng)
    hx, hy = draw(SOURCE_PRIOR, 3000, rng)
    frame = lambda a: pd.DataFrame(a, columns=["x1", "x2"])    # noqa: E731
    clf = LogisticRegression().fit(frame(tx), ty)
    info = register_sklearn_model(clf, frame(hx), hy, name="serve-sklearn", tracking_uri=mlflow_server.url)
    target = tmp_path / "tabular"
    target.mkdir()
    x, _ = draw(SHIFTED_PRIOR, 3000, rng)
    batch = frame(x).assign(id=[f"r{i}" for i in range(len(x))])
    batch.to_parquet(target / "day-1.parquet")
    state = _run(info["model_uri"], mlflow_server.url, target, register_corrected=True)
    assert state.is_completed() and state.name == "Shifted", state.message
    written = pd.read_parquet(target / "day-1.corrected.parquet")
    names = [str(c) for c in range(K)]
    out = _load(mlflow_server.url, "models:/serve-sklearn-shift-corrected@shift-corrected").predict(batch)
    np.testing.assert_allclose(out[names].to_numpy(), written[names].to_numpy(), rtol=0, atol=1e-6)
    assert (out["corrected_class"].to_numpy() == np.asarray(names)[written[names].to_numpy().argmax(1)]).all()


@pytest.mark.parametrize("verdict", ["Not label shift", "Untrustworthy", "No shift"])
def test_nothing_is_registered_under_any_other_verdict(verdict):
    from tasks.reestimation.serving import register_if_shifted

    assert register_if_shifted.fn(None, SimpleNamespace(verdict=verdict), tracking_uri="http://127.0.0.1:9",
                                  name="x", run_id="r", target="t", sequence=1) is None


def test_the_registry_name_is_validated_with_the_other_parameters():
    from pydantic import ValidationError

    from flows.params import ReestimateParameters

    assert ReestimateParameters().register_corrected is False
    assert ReestimateParameters(corrected_model_name="fraud-corrected").corrected_model_name == "fraud-corrected"
    for bad in ("", "a/b", "a@b"):
        with pytest.raises(ValidationError, match="corrected_model_name"):
            ReestimateParameters(corrected_model_name=bad)


def test_the_registry_name_check_names_the_fix(mlflow_sqlite, tmp_path):
    from labelshift.errors import InputError
    from tasks.reestimation.serving import KIND, KIND_TAG, SOURCE_TAG, check_corrected_name

    uri = mlflow_sqlite(tmp_path)
    client = MlflowClient(uri)
    assert check_corrected_name(uri, "models:/fraud@production") == "fraud-shift-corrected"     # not there yet
    client.create_registered_model("fraud-shift-corrected", tags={KIND_TAG: KIND, SOURCE_TAG: "fraud"})
    assert check_corrected_name(uri, "models:/fraud/3") == "fraud-shift-corrected"
    with pytest.raises(InputError, match="holds the corrections of 'fraud', not of 'churn'.*--corrected-model-name"):
        check_corrected_name(uri, "models:/churn@production", "fraud-shift-corrected")
    client.create_registered_model("fraud-logs", tags={KIND_TAG: "reference"})
    with pytest.raises(InputError, match="tag labelshift.kind = 'reference', expected 'shift-corrected'"):
        check_corrected_name(uri, "models:/fraud@production", "fraud-logs")
