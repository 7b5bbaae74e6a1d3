"""What an empty target's error tells each kind of model to write there (tasks.reestimation.scoring.expected_batches):
the batches that model takes, and nothing that belongs to another kind."""
from __future__ import annotations

import numpy as np

from labelshift_mlflow.references import ReferenceBundle
from labelshift_mlflow.registry import ModelBundle
from tasks.reestimation.scoring import expected_batches

TARGET = "s3://bucket/incoming"


def _pytorch(name: str) -> ModelBundle:
    return ModelBundle(uri=f"models:/{name}@a", name=name, version="1", alias="a", run_id="r", input_shape=(1, 28, 28),
                       n_classes=10, calibrator_name="BCTS", calibrator=None, source_probs=np.full((4, 10), 0.1),
                       source_labels=np.arange(4), model=None)


def _reference(mode: str, **kw) -> ReferenceBundle:
    return ReferenceBundle(uri="models:/m@a", name="m", version="1", alias="a", run_id="r", mode=mode,
                           class_names=("cat", "dog", "eel"), output_kind="logits", calibrator_name="BCTS",
                           calibrator=None, source_probs=np.full((3, 3), 1 / 3), source_labels=np.arange(3), **kw)


def test_a_pytorch_model_is_told_its_input_shape_and_the_demo_models_how_to_simulate_batches():
    said = expected_batches(_pytorch("labelshift-mnist-5k"), TARGET)
    assert said.startswith("NAME.npy, a float32 array of shape (n, 1, 28, 28) of this PyTorch model's inputs")
    assert f"`labelshift data simulate-target mnist-5k --to {TARGET}`" in said
    assert "simulate-target" not in expected_batches(_pytorch("my-net"), TARGET)
    assert "parquet" not in expected_batches(_pytorch("my-net"), TARGET)


def test_prediction_logs_are_told_their_class_columns_and_id_column():
    said = expected_batches(_reference("outputs", id_column="request_id"), TARGET)
    assert "the model's logged outputs (logits): one float column per class named 'cat', 'dog', 'eel'" in said
    assert "or one list column of 3 floats per row, and the id column 'request_id'" in said
    assert "input" not in said and ".npy" not in said


def test_scikit_learn_and_pyfunc_models_are_told_their_input_columns_or_shape():
    columns = tuple(f"px{i}" for i in range(64))
    said = expected_batches(_reference("sklearn", input_columns=columns), TARGET)
    assert said == ("NAME.parquet with this scikit-learn model's input columns 'px0', 'px1', 'px2', 'px3', 'px4', "
                    "'px5', ... (64 in all)")
    said = expected_batches(_reference("pyfunc", input_shape=(8, 8)), TARGET)
    assert said == "NAME.npy, a float array of shape (n, 8, 8) of its inputs saved with numpy.save"
