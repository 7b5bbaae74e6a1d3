"""The pyfunc models of labelshift (``mlflow.pyfunc.PythonModel``): :class:`ReferenceModel`, a registered reference
whose ``predict`` applies the calibrator, and :class:`ShiftCorrectedModel`, a deployed model corrected to its
target's label distribution (``docs/serving.md``). MLflow pickles each instance by reference to this module, so a
model registered by labelshift loads wherever labelshift is installed; loading one never imports Prefect.

:class:`ShiftCorrectedModel`'s ``predict`` computes what the ``reestimate`` flow writes beside each batch: the same
scoring (:func:`labelshift_mlflow.scores.forward`, :func:`labelshift_mlflow.scores.model_scores`), the same float32
rounding of the raw outputs before the calibrator, and :func:`labelshift.estimation.diagnostics.correct_predictions`
(Saerens et al. 2002; Garg et al., NeurIPS 2020, Section 2) -- so the two agree to float precision -- and adds the
corrected class (the arg max).
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import mlflow
import mlflow.pyfunc
import numpy as np

from labelshift.calibration import load_calibrator
from labelshift.errors import InputError
from labelshift.estimation.diagnostics import correct_predictions
from labelshift.monitoring.batches import OutputSpec, read_outputs
from labelshift_mlflow.scores import forward, model_scores

__all__ = ["ReferenceModel", "ShiftCorrectedModel", "CLASS_COLUMN", "load_state", "corrected_frame", "calibrated"]

#: the output column of the corrected class (the class names are the other columns)
CLASS_COLUMN = "corrected_class"
#: rows per forward pass of a PyTorch model (the flow's default batch size)
BATCH_SIZE = 1024


# -- the pyfunc form of a reference ------------------------------------------------------------------------------------
# MLflow inspects a PythonModel subclass when it is defined; its note on the untyped ``predict`` is recorded and
# dropped, since MLflow sets its own warning filter around it
with warnings.catch_warnings(record=True):

    class ReferenceModel(mlflow.pyfunc.PythonModel):
        """The pyfunc form of a reference: ``predict`` takes model outputs (one column per class, or an (n, k) array)
        and returns the calibrated probabilities, one column per class name. MLflow pickles the instance by
        reference to this module, so the model loads where labelshift is installed."""

        def load_context(self, context):
            doc = json.loads(Path(context.artifacts["reference"]).read_text())
            self.class_names = doc["class_names"]
            self.calibrator = load_calibrator(json.loads(Path(context.artifacts["calibrator"]).read_text())["calibrator"])

        def predict(self, context, model_input, params=None):
            import pandas as pd

            if isinstance(model_input, pd.DataFrame):
                cols = [c for c in self.class_names if c in model_input.columns]
                x = model_input[cols].to_numpy() if len(cols) == len(self.class_names) else model_input.to_numpy()
            else:
                x = np.asarray(model_input)
            return pd.DataFrame(self.calibrator.predict_proba(np.asarray(x, dtype=np.float64)), columns=self.class_names)


# -- the corrected model -------------------------------------------------------------------------------------------------------
# MLflow inspects a PythonModel subclass when it is defined and warns about its untyped ``predict``: recorded and
# dropped (MLflow sets its own filter, "once", inside, which an "ignore" outside would not override)
with warnings.catch_warnings(record=True):

    class ShiftCorrectedModel(mlflow.pyfunc.PythonModel):
        """The pyfunc of a corrected model: the deployed model corrected to its target's label distribution.

        Its ``predict`` takes what the deployed model takes (input mode: an array of shape (n, *input shape), or a
        DataFrame with the signature's columns) or, in prediction-log mode, the deployed model's outputs (a DataFrame
        with one column per class name or one list column, or an (n, k) array), and returns a DataFrame with one
        column per class name -- p_t(y|x) proportional to w_y f_y(x), f the calibrated source posterior -- and
        :data:`CLASS_COLUMN`, the name of the most probable class (:func:`corrected_frame`). Its artifacts:
        ``correction`` (the JSON of :func:`correction_doc`) and, in input mode, ``deployed`` (a copy of the deployed
        model version). MLflow pickles the instance by reference to this module, so the model loads where labelshift
        is installed."""

        def load_context(self, context):
            self.state = load_state(context.artifacts)

        def predict(self, context, model_input, params=None):
            return corrected_frame(self.state, model_input)


def load_state(artifacts: dict) -> SimpleNamespace:
    """What ``predict`` needs, from the model's artifacts (local paths): the correction JSON, its calibrator and
    weights, and the deployed model (input mode)."""
    doc = json.loads(Path(artifacts["correction"]).read_text())
    model = _load_deployed(artifacts["deployed"], doc["mode"]) if doc["mode"] != "outputs" else None
    return SimpleNamespace(doc=doc, class_names=list(doc["class_names"]), calibrator=load_calibrator(doc["calibrator"]),
                           weights=np.asarray(doc["weights"], dtype=np.float64), model=model)


def corrected_frame(state: SimpleNamespace, model_input):
    """p_t(y|x) of each row (:func:`labelshift.estimation.diagnostics.correct_predictions` of :func:`calibrated`),
    one column per class, and the corrected class in :data:`CLASS_COLUMN`."""
    import pandas as pd

    corrected = correct_predictions(calibrated(state, model_input), state.weights)
    out = pd.DataFrame(corrected, columns=state.class_names)
    out[CLASS_COLUMN] = np.asarray(state.class_names, dtype=object)[corrected.argmax(axis=1)]
    return out


def calibrated(state: SimpleNamespace, model_input) -> np.ndarray:
    """f(x), the calibrated source posterior of each row, computed as the flow computes it: the deployed model's
    scores (as :mod:`tasks.reestimation.scoring` scores a batch) rounded to float32, then the calibrator; prediction
    logs' probabilities kept in float32, as the flow keeps them."""
    doc = state.doc
    if doc["mode"] == "outputs":
        raw = _outputs(model_input, OutputSpec(tuple(state.class_names), doc["output_kind"]))
        return state.calibrator.predict_proba(raw.astype(np.float64)).astype(np.float32)
    x = _inputs(model_input, doc)
    if doc["mode"] == "pytorch":
        scores = forward(state.model, x, BATCH_SIZE)
    else:
        scorer = SimpleNamespace(mode=doc["mode"], model=state.model, output_method=doc.get("output_method"),
                                 input_columns=doc.get("input_columns"), uri=doc["source_model"]["uri"],
                                 n_classes=len(state.class_names))
        scores = model_scores(scorer, x)
    return state.calibrator.predict_proba(np.asarray(scores).astype(np.float32).astype(np.float64))


def _load_deployed(path: str, mode: str):
    if mode == "pytorch":
        import mlflow.pytorch

        return mlflow.pytorch.load_model(path, map_location="cpu")
    if mode == "sklearn":
        import mlflow.sklearn

        return mlflow.sklearn.load_model(path)
    return mlflow.pyfunc.load_model(path)


def _inputs(model_input, doc: dict) -> np.ndarray:
    """The model inputs of a request as the flow reads a batch: float32, checked against the input columns or
    shape."""
    import pandas as pd

    columns, shape = doc.get("input_columns"), doc.get("input_shape")
    if isinstance(model_input, pd.DataFrame) and columns:
        missing = [c for c in columns if c not in model_input.columns]
        if missing:
            raise InputError(f"the input lacks the model's column(s) {missing[:10]}; send the columns of its "
                             f"signature ({', '.join(columns[:8])}{' ...' if len(columns) > 8 else ''}).")
        model_input = model_input[columns]
    x = np.asarray(model_input.to_numpy() if isinstance(model_input, pd.DataFrame) else model_input, dtype=np.float32)
    if shape and x.ndim >= 1 and x.shape[1:] != tuple(shape):
        if x.ndim == 2 and x.shape[1] == int(np.prod(shape)):
            x = x.reshape((len(x), *shape))
        else:
            raise InputError(f"the input has shape {x.shape}, the model takes (n, {', '.join(map(str, shape))}); "
                             "send one row per example.")
    if not np.isfinite(x).all():
        raise InputError("the input holds NaN or infinite values; drop or impute those rows.")
    return np.ascontiguousarray(x)


def _outputs(model_input, spec: OutputSpec) -> np.ndarray:
    """The deployed model's outputs of a request, (n, k) float32, read and checked as a prediction-log batch
    (:func:`labelshift.monitoring.batches.read_outputs`): class columns or one list column, or an (n, k) array."""
    import io

    import pandas as pd

    buf = io.BytesIO()
    if isinstance(model_input, pd.DataFrame):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pandas(model_input, preserve_index=False), buf)
        return read_outputs(buf.getvalue(), "parquet", spec, "the request")
    np.save(buf, np.asarray(model_input), allow_pickle=False)
    return read_outputs(buf.getvalue(), "npy", spec, "the request")
