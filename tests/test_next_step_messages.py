"""On a fresh stack, re-estimation fails with messages that say how to get what is missing there."""
from __future__ import annotations

import pytest

from labelshift.errors import InputError, ObjectNotFoundError
from labelshift.monitoring.listing import find_new_batches
from labelshift.storage import open_store


def test_no_batch_says_how_to_simulate_batches_at_that_target(tmp_path):
    target = open_store(f"file://{tmp_path}/target")
    with pytest.raises(InputError) as info:
        find_new_batches(target)
    assert f"`labelshift data simulate-target mnist-5k --to file://{tmp_path}/target`" in str(info.value)


def test_no_registered_model_says_how_to_register_one_on_that_tracking_server(mlflow_sqlite, tmp_path):
    from mlflow import MlflowClient

    from tasks.reestimation.model import _registry_error

    tracking = mlflow_sqlite(tmp_path)
    error = _registry_error(MlflowClient(tracking), "labelshift-mnist-5k", "latest-good", None,
                            RuntimeError("not found"))
    assert isinstance(error, ObjectNotFoundError)
    assert f"`labelshift reproduce --dataset mnist-5k --tracking-uri {tracking}`" in str(error)
    assert "registered: none" in str(error)
