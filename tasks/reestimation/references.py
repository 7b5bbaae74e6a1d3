"""The ``load-model`` task of a re-estimation: the registered reference or model of any flavour, loaded by
:func:`labelshift_mlflow.load_reference` (the user's model API, which never imports Prefect). The names of
:mod:`labelshift_mlflow.references` are also importable from here, as they were before they moved (models registered
then pickled :class:`ReferenceModel` by reference to this module)."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from labelshift_mlflow.references import (REFERENCE_JSON, ReferenceBundle, ReferenceModel, load_reference,
                                          register_reference, register_reference_file, register_sklearn_model)

__all__ = ["load_for_reestimation", "REFERENCE_JSON", "ReferenceBundle", "ReferenceModel", "load_reference",
           "register_reference", "register_reference_file", "register_sklearn_model"]


@task(name="load-model", task_run_name="load-{model_uri}", cache_policy=NO_CACHE, persist_result=False)
def load_for_reestimation(model_uri: str, *, tracking_uri: str, calibrator: str):
    """The registered reference or model, in the mode its version calls for, checked against its recorded digest
    (:func:`labelshift_mlflow.load_reference`; its warning on an untrusted version goes to the run's log)."""
    from prefect.logging import get_run_logger

    return load_reference(model_uri, tracking_uri=tracking_uri, calibrator=calibrator, logger=get_run_logger())
