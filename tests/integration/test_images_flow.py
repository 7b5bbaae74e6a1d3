"""The image experiments end to end on CPU: ``labelshift data push`` to a folder and to SeaweedFS S3, training
through the ``reproduce`` flow (MLflow registry, cache), a short Dirichlet-shift sweep on ``digits`` and the
results page built from its MLflow runs.

Sizes: digits (1,797 8x8 images), 3 epochs on a 300-image subset, 2 alphas x 2 sizes x 4 seeds: seconds.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from flows.cli import main
from flows.reproduce import reproduce
from labelshift.experiments.datasets import load_dataset, read_manifest
from labelshift.experiments import images
from labelshift.storage import open_store

pytestmark = pytest.mark.integration

SWEEP = dict(dataset="digits", alpha_values=[0.1, 10.0], target_sizes=[100, 400], target_size=400, n_seeds=4,
             epochs=3, train_limit=300, good_accuracy=0.0)


def _same(a, b):
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(a.split(split).x, b.split(split).x)
        np.testing.assert_array_equal(a.split(split).y, b.split(split).y)


def test_data_push_local_reads_back_identical(tmp_path, capsys):
    dest = tmp_path / "data" / "digits"
    assert main(["data", "push", "digits", "--to", str(dest)]) == 0
    assert "pushed digits" in capsys.readouterr().out
    pushed = load_dataset(open_store(str(dest)), "", expected_name="digits")
    again = tmp_path / "again"
    assert main(["data", "push", "digits", "--to", str(again)]) == 0
    _same(pushed, load_dataset(open_store(str(again)), "", expected_name="digits"))
    assert pushed.manifest["sha256"] == load_dataset(open_store(str(again)), "").manifest["sha256"]


def test_data_push_errors_are_clear(tmp_path, capsys):
    assert main(["data", "push", "nope", "--to", str(tmp_path)]) == 2
    assert "unknown dataset 'nope'" in capsys.readouterr().err
    assert main(["data", "push", "mnist", "--to", str(tmp_path), "--from", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())      # nothing written


def test_data_push_to_s3_reads_back_identical(seaweed, s3_bucket, tmp_path, monkeypatch):
    for k, v in seaweed.env().items():
        monkeypatch.setenv(k, v)
    uri = f"s3://{s3_bucket}/data/digits"
    assert main(["data", "push", "digits", "--to", uri]) == 0
    local = tmp_path / "local"
    assert main(["data", "push", "digits", "--to", str(local)]) == 0
    _same(load_dataset(open_store(uri), "", expected_name="digits"),
          load_dataset(open_store(str(local)), "", expected_name="digits"))


def test_reproduce_on_mnist_without_push_says_what_to_do(prefect_server, mlflow_sqlite, tmp_path):
    state = reproduce(dataset="mnist", n_seeds=2, store=str(tmp_path / "store"),
                      tracking_uri=mlflow_sqlite(tmp_path), mlflow_experiment="t-missing", return_state=True)
    assert state.is_failed()
    assert "labelshift data push mnist" in state.message


@pytest.fixture(scope="module")
def image_runs(prefect_server, mlflow_sqlite, tmp_path_factory):
    """The digits sweep twice on the same store and tracking: the second must find the model in the store."""
    root = tmp_path_factory.mktemp("images")
    tracking, store = mlflow_sqlite(root), str(root / "store")
    kw = dict(SWEEP, store=store, tracking_uri=tracking, mlflow_experiment="test-images")
    first = reproduce(**kw, return_state=True)
    second = reproduce(**kw, return_state=True)
    return dict(first=first, second=second, tracking=tracking, store=store, root=root)


def test_image_sweep_completes_with_runs_and_figures(image_runs):
    state = image_runs["first"]
    assert state.is_completed(), state.message
    result = state.result()
    assert set(result["figures"]) == {"mse_vs_alpha.png", "mse_vs_size.png"}
    # 2 experiments x 2 settings x 5 methods
    assert len(result["rows"]) == 20
    assert {r["method"] for r in result["rows"]} == set(images.METHODS)
    client = MlflowClient(image_runs["tracking"])
    parent = client.get_run(result["mlflow"]["run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["dataset"] == "digits"
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "figures")}
    assert arts == {"figures/mse_vs_alpha.png", "figures/mse_vs_size.png"}
    mlls = client.get_run(result["mlflow"]["child_run_ids"]["MLLS"])
    # alpha in thousandths as the step (0.1 -> 100, 10 -> 10000), the target size m as itself
    assert sorted(m.step for m in client.get_metric_history(mlls.info.run_id, "alpha/mse")) == [100, 10000]
    assert sorted(m.step for m in client.get_metric_history(mlls.info.run_id, "size/mse")) == [100, 400]


def test_training_logged_registered_and_reloadable(image_runs):
    import mlflow.pytorch
    import torch

    meta = image_runs["first"].result()["models"][0]
    assert meta["cached"] is False and meta["dataset"] == "digits" and meta["train_size"] == 300
    client = MlflowClient(image_runs["tracking"])
    run = client.get_run(meta["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["labelshift.cache"] == "miss"
    # per-epoch curves with step = epoch
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train_loss")) == [1, 2, 3]
    assert "calibration/BCTS/valid_nll_after" in run.data.metrics
    # BCTS is fit by minimising the valid NLL over a family holding the identity map: it cannot be worse there
    assert run.data.metrics["calibration/BCTS/valid_nll_after"] <= \
        run.data.metrics["calibration/BCTS/valid_nll_before"] + 1e-9
    # the registry: alias -> the version logged by this run; the model loads back and gives the same logits
    version = client.get_model_version_by_alias("labelshift-digits", "latest-good")
    assert version.run_id == meta["run_id"]
    mlflow.set_tracking_uri(image_runs["tracking"])
    loaded = mlflow.pytorch.load_model("models:/labelshift-digits@latest-good")
    store = open_store(image_runs["store"])
    ds = load_dataset(store, "datasets/digits", splits=("valid",))
    x = ds.valid.x[:8].astype(np.float32)[:, None] / 255.0
    with torch.no_grad():
        got = loaded(torch.from_numpy(x)).numpy()
    stored = store.get_array(f"{meta['store_prefix']}/logits_valid.npy")[:8]
    np.testing.assert_allclose(got, stored, rtol=1e-4, atol=1e-4)
    # the checkpoint in the store loads with weights_only=True and gives the same logits
    from labelshift.experiments.training import load_checkpoint, predict_logits

    model, cmeta = load_checkpoint(store.get_bytes(f"{meta['store_prefix']}/checkpoint.pt"))
    assert cmeta["key"] == meta["key"]
    np.testing.assert_allclose(predict_logits(model, ds.valid.x[:8], device="cpu"), stored, rtol=1e-5, atol=1e-5)


def test_second_run_hits_the_cache(image_runs):
    state = image_runs["second"]
    assert state.is_completed(), state.message
    first, second = image_runs["first"].result(), state.result()
    meta = second["models"][0]
    assert meta["cached"] is True and meta["key"] == first["models"][0]["key"]
    client = MlflowClient(image_runs["tracking"])
    run = client.get_run(meta["run_id"])
    assert run.data.tags["labelshift.cache"] == "hit"
    assert client.get_metric_history(run.info.run_id, "train_loss") == []     # nothing was trained
    # no second version in the registry; same predictions, so the same MSE rows
    assert len(client.search_model_versions("name = 'labelshift-digits'")) == 1
    assert [r["mse_mean"] for r in second["rows"]] == [r["mse_mean"] for r in first["rows"]]


def test_report_page_from_mlflow(image_runs, tmp_path, capsys):
    out = tmp_path / "report"
    code = main(["report", "--out", str(out), "--tracking-uri", image_runs["tracking"],
                 "--experiment-name", "test-images", "--home", str(tmp_path / "home")])
    assert code == 0
    page = (out / "results.md").read_text()
    assert "## digits" in page and "### MSE vs alpha" in page and "### MSE vs m" in page
    assert "| alpha | BBSE-hard | RLLS | MLLS-CM | MLLS | MLLS-uncal |" in page
    assert "### Claims of Section 6" in page and page.count("**") >= 6
    assert (out / "figures" / "digits" / "mse_vs_alpha.png").read_bytes()[:4] == b"\x89PNG"


def test_registered_image_model_is_reestimated_and_old_runs_get_the_holdout(image_runs):
    """The digits model the sweep registered can be re-estimated as it is (its run carries the calibrator and the
    source holdout); a model registered before the holdout was logged gets it on the next (cached) sweep."""
    from urllib.parse import urlparse

    from flows.reestimate import reestimate
    from labelshift.experiments.datasets.simulate import simulate_target_batches

    client = MlflowClient(image_runs["tracking"])
    version = client.get_model_version_by_alias("labelshift-digits", "latest-good")
    holdout = "calibration/source_holdout.npz"
    assert holdout in {a.path for a in client.list_artifacts(version.run_id, "calibration")}

    # label-shifted digits batches from the test pool: classes 0 and 1 only
    store = open_store(image_runs["store"])
    ds = load_dataset(store, "datasets/digits", splits=("test",))
    prior = np.zeros(10)
    prior[:2] = 0.5
    xs, _, _ = simulate_target_batches(ds.test.x, ds.test.y, 10, rows=300, n_batches=2, target_prior=prior, seed=1)
    target = image_runs["root"] / "target"
    target.mkdir()
    for i, x in enumerate(xs):
        np.save(target / f"b{i}.npy", x)
    state = reestimate(model="models:/labelshift-digits@latest-good", target=str(target),
                       tracking_uri=image_runs["tracking"], return_state=True)
    assert state.is_completed(), state.message
    res = state.result()["result"]
    assert state.name in ("Shifted", "Untrustworthy") and res["shifted"]
    # a 300-image digits network is not perfect; still most of the mass must land on classes 0 and 1
    assert sum(res["target_prior"][:2]) > 0.8
    assert np.load(target / "b0.corrected.npy").shape == (300, 10)

    # simulate a model registered before the holdout was logged: remove it from the run's artifacts, then sweep
    # again (the model is found in the store) -- the registered run gets it back
    artifact_dir = urlparse(client.get_run(version.run_id).info.artifact_uri).path
    (Path(artifact_dir) / holdout).unlink()
    assert holdout not in {a.path for a in client.list_artifacts(version.run_id, "calibration")}
    kw = dict(SWEEP, store=image_runs["store"], tracking_uri=image_runs["tracking"], mlflow_experiment="test-images",
              experiments=["alpha"], alpha_values=[1.0], n_seeds=2)
    again = reproduce(**kw, return_state=True)
    assert again.is_completed() and again.result()["models"][0]["cached"] is True
    assert holdout in {a.path for a in client.list_artifacts(version.run_id, "calibration")}


def test_fashion_mnist_end_to_end_on_small_idx_files(prefect_server, mlflow_sqlite, tmp_path, monkeypatch):
    """fashion-mnist through the flow with its own defaults (every calibration x estimator), its source folder
    pointed at small idx.gz files written here in the package's format; then the report's calibration table."""
    from flows.params import ReproduceParameters
    from labelshift.experiments.datasets import sources
    from tests.unit.experiments.test_datasets import write_mnist_folder

    write_mnist_folder(tmp_path / "pkg", n_train=240, n_test=60, gz=True)
    monkeypatch.setattr(sources, "FASHION_MNIST_DIR", tmp_path / "pkg")
    tracking, store = mlflow_sqlite(tmp_path), str(tmp_path / "store")
    state = reproduce(dataset="fashion-mnist", alpha_values=[1.0], target_sizes=[100], target_size=100, n_seeds=2,
                      epochs=1, good_accuracy=0.0, store=store, tracking_uri=tracking,
                      mlflow_experiment="test-fashion", return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    methods = ReproduceParameters(dataset="fashion-mnist").methods
    assert len(result["rows"]) == 2 * len(methods) and {r["method"] for r in result["rows"]} == set(methods)
    manifest = read_manifest(open_store(store), "datasets/fashion-mnist", expected_name="fashion-mnist")
    assert manifest["source"]["kind"] == "debian-package" and manifest["classes"][0] == "T-shirt/top"
    client = MlflowClient(tracking)
    assert set(result["mlflow"]["child_run_ids"]) == set(methods)
    meta = result["models"][0]
    assert {a.path for a in client.list_artifacts(meta["run_id"], "calibration")} >= {
        f"calibration/{c}.json" for c in ("BCTS", "TS", "VS", "NBVS")}
    out = tmp_path / "report"
    assert main(["report", "--out", str(out), "--tracking-uri", tracking, "--experiment-name", "test-fashion",
                 "--home", str(tmp_path / "home")]) == 0
    page = (out / "results.md").read_text()
    assert "## fashion-mnist" in page and "### Claims of Section 6" in page
    assert "### MSE by calibration and estimator at m = 100" in page
    assert "| calibration | BBSE-hard | BBSE-soft | RLLS | MLLS | MLLS-CM |" in page


def test_the_network_setting_travels_to_training(prefect_server, mlflow_sqlite, tmp_path, monkeypatch):
    """``network="resnet18"`` (CLI --network) trains ResNet-18 instead of the dataset's LeNet: its meta, its MLflow
    config and the cache key say so."""
    from labelshift.experiments.datasets import sources
    from tasks.sweep.images import training_config
    from tests.unit.experiments.test_datasets import write_mnist_folder

    assert training_config("fashion-mnist")["model"] == "lenet"
    assert training_config("fashion-mnist", network="resnet18")["model"] == "resnet18"
    write_mnist_folder(tmp_path / "pkg", n_train=120, n_test=60, gz=True)
    monkeypatch.setattr(sources, "FASHION_MNIST_DIR", tmp_path / "pkg")
    tracking, store = mlflow_sqlite(tmp_path), str(tmp_path / "store")
    state = reproduce(dataset="fashion-mnist", network="resnet18", methods=["MLLS"], calibrators=["BCTS"],
                      alpha_values=[1.0], target_sizes=[50], target_size=50, n_seeds=2, epochs=1, good_accuracy=0.0,
                      store=store, tracking_uri=tracking, mlflow_experiment="test-resnet", return_state=True)
    assert state.is_completed(), state.message
    meta = state.result()["models"][0]
    assert meta["config"]["model"] == "resnet18"
