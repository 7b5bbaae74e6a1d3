"""The user's model API: registering a deployed classifier (or its logged outputs) for re-estimation, loading what
was registered, and the pyfunc models labelshift registers. It needs MLflow and :mod:`labelshift`, never Prefect:
``mlflow.pyfunc.load_model`` of a corrected model and registering a scikit-learn model from a script load neither
the orchestration nor its server.

    from labelshift_mlflow import register_sklearn_model, register_reference
    register_sklearn_model(clf, holdout_x, holdout_y, name="my-clf")          # input mode: the model itself
    register_reference(holdout_outputs, holdout_labels, name="my-clf-logs",   # prediction-log mode: its outputs
                       class_names=["a", "b", "c"], output_kind="probabilities")

Modules: :mod:`.references` (registering and loading references and models of any flavour), :mod:`.registry`
(model URIs, versions, the PyTorch model bundle), :mod:`.trusted` (the digests that make a version trusted),
:mod:`.artifacts` (what a registration logs beside a model), :mod:`.pyfunc` (the pyfunc classes), :mod:`.scores` (a
model's raw scores on its inputs). ``docs/operations.md`` ("Any deployed classifier") walks through it.
"""
from __future__ import annotations

from .pyfunc import ReferenceModel, ShiftCorrectedModel
from .references import ReferenceBundle, load_reference, register_reference, register_reference_file, \
    register_sklearn_model
from .registry import parse_model_uri

__all__ = ["register_sklearn_model", "register_reference", "register_reference_file", "load_reference",
           "ReferenceBundle", "ReferenceModel", "ShiftCorrectedModel", "parse_model_uri"]
