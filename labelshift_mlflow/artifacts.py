"""What re-estimation reads beside a registered model, in the model's MLflow run: the calibrator JSON
(``calibration/<CALIBRATOR>.json``) and the labelled source holdout (:data:`REFERENCE_ARTIFACT`: ``logits`` and
``labels``). The sweep's calibration task (:func:`tasks.sweep.images.calibrate`) writes them for the models it trains,
:mod:`tasks.reestimation.references` for the references and models it registers; :mod:`labelshift_mlflow.registry`
and :mod:`tasks.reestimation.references` read them (``docs/reestimation.md``).
"""
from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path

import numpy as np
from mlflow import MlflowClient

__all__ = ["REFERENCE_ARTIFACT", "calibrator_artifact", "log_source_holdout", "log_reestimation_reference"]

REFERENCE_ARTIFACT = "calibration/source_holdout.npz"


def calibrator_artifact(name: str) -> str:
    return f"calibration/{name}.json"



def log_source_holdout(client: MlflowClient, run_id: str, holdout_logits, holdout_labels) -> None:
    """Log the labelled source holdout (``logits``, ``labels``) as :data:`REFERENCE_ARTIFACT` of a model's run."""
    buf = io.BytesIO()
    np.savez_compressed(buf, logits=np.asarray(holdout_logits, np.float32),
                        labels=np.asarray(holdout_labels, np.int64))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(REFERENCE_ARTIFACT).name
        path.write_bytes(buf.getvalue())
        client.log_artifact(run_id, str(path), str(Path(REFERENCE_ARTIFACT).parent))


def log_reestimation_reference(client: MlflowClient, run_id: str, calibrator, holdout_logits, holdout_labels, *,
                               name: str = "BCTS", metrics: dict | None = None, model_key: str | None = None) \
        -> None:
    """Log what re-estimation needs beside a model into its run: the calibrator JSON (fit on the holdout's
    logits) and the source holdout itself."""
    doc = {"calibrator": calibrator.to_dict(), "metrics": metrics or {}, "model_key": model_key}
    client.log_text(run_id, json.dumps(doc, indent=1, allow_nan=False), calibrator_artifact(name))
    log_source_holdout(client, run_id, holdout_logits, holdout_labels)
