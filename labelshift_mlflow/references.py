"""Re-estimation for any deployed classifier: references for prediction logs, and models of any MLflow flavour.

Two ways in besides the PyTorch model of :mod:`labelshift_mlflow.registry`:

- **prediction-log mode**: the target's batches hold the model's outputs (:mod:`labelshift.monitoring.batches`); nothing
  is loaded or recomputed. What is registered is a *reference* (:func:`register_reference`): a pyfunc model version
  whose ``predict`` applies the calibrator, whose run holds ``reference/reference.json`` (class names, output kind, id
  column), the calibrator JSON and the labelled holdout's outputs
  (:data:`labelshift_mlflow.artifacts.REFERENCE_ARTIFACT`).
- **input mode, any flavour**: a scikit-learn model (``predict_proba``, or ``decision_function`` scores taken as
  logits), a pyfunc whose output is one score per class, or PyTorch as before; tabular batches as Parquet are
  checked against the signature's column names. :func:`register_sklearn_model` logs one with its reference.

:func:`load_reference` picks the mode from the model version (a reference, else its flavour; the ``load-model`` task
of :mod:`tasks.reestimation.references` calls it); :func:`tasks.reestimation.scoring.score_for_reestimation` and
:func:`tasks.reestimation.outputs.write_for_reestimation` read and write batches of every format. This module, like
the whole of :mod:`labelshift_mlflow`, never imports Prefect.
"""
from __future__ import annotations

import functools

import json
import logging
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import mlflow.pyfunc
import numpy as np
from mlflow import MlflowClient

from labelshift.inference.holdout import Holdout
from labelshift import calibration as calibration_mod
from labelshift.monitoring.batches import (OUTPUT_KINDS, OutputSpec, check_reference, default_class_names,
                                           read_holdout)
from labelshift.calibration import load_calibrator
from labelshift.errors import FormatError, InputError, ObjectNotFoundError
from labelshift_mlflow.pyfunc import ReferenceModel
from labelshift_mlflow.artifacts import REFERENCE_ARTIFACT, calibrator_artifact, log_reestimation_reference
from labelshift_mlflow.registry import (ModelBundle, bundle_from_files, cache_key, cached_bundle, renamed_bundle,
                                     resolve_version)
from labelshift_mlflow.trusted import VersionFiles, check_digest, record_digest, trusted_files

__all__ = ["REFERENCE_JSON", "ReferenceBundle", "ReferenceModel", "register_reference", "register_reference_file",
           "register_sklearn_model", "load_reference"]

REFERENCE_JSON = "reference/reference.json"
REFERENCE_FORMAT = "labelshift-reference"


def _calibrator(name: str, output_kind: str):
    cls = getattr(calibration_mod, name, None)
    if cls is None or not isinstance(cls, type):
        raise InputError(f"unknown calibrator {name!r}; use one of BCTS, TS, VS, NBVS.")
    return cls(input_kind="logits" if output_kind == "logits" else "probs")


def _experiment(client: MlflowClient, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    return client.create_experiment(name)


def _log_reference_files(client: MlflowClient, run_id: str, holdout, *, calibrator: str, id_column: str | None,
                         mode: str, output_method: str | None = None) -> tuple[object, dict]:
    cal = _calibrator(calibrator, holdout.output_kind).fit(holdout.outputs, holdout.labels)
    log_reestimation_reference(client, run_id, cal, holdout.outputs, holdout.labels, name=calibrator)
    doc = {"format": REFERENCE_FORMAT, "version": 1, "mode": mode, "class_names": list(holdout.class_names),
           "output_kind": holdout.output_kind, "id_column": id_column, "calibrator": calibrator,
           "output_method": output_method, "n_holdout": int(len(holdout.labels))}
    client.log_text(run_id, json.dumps(doc, indent=1), REFERENCE_JSON)
    return cal, doc


@contextmanager
def _registration_run(client: MlflowClient, experiment: str, run_name: str, tags: dict):
    """The MLflow run a registration logs into: its id, ended FINISHED, or FAILED when anything in the block
    raises (interrupts included)."""
    run_id = client.create_run(_experiment(client, experiment), run_name=run_name, tags=tags).info.run_id
    try:
        yield run_id
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id)


def _registered(client: MlflowClient, name: str, info, alias: str | None, run_id: str) -> dict:
    """Tag the version just registered (its kind, its digest: :func:`labelshift_mlflow.trusted.record_digest`), then
    point ``alias`` at it; returns {"model_uri", "version", "run_id", "digest"}."""
    version = str(info.registered_model_version)
    client.set_model_version_tag(name, version, "labelshift.kind", "reference")
    digest = record_digest(client, name, version)
    if alias:
        client.set_registered_model_alias(name, alias, version)
    return {"model_uri": f"models:/{name}@{alias}" if alias else f"models:/{name}/{version}", "version": version,
            "run_id": run_id, "digest": digest}


def register_reference(holdout_outputs, holdout_labels, *, name: str, class_names, output_kind: str,
                       tracking_uri: str | None = None, alias: str | None = "production", calibrator: str = "BCTS",
                       id_column: str | None = "id", experiment: str = "references") -> dict:
    """Register a reference for prediction-log mode: the calibrator fit on the labelled holdout's outputs, the
    holdout itself, the class names and the kind of output, as a pyfunc model version ``name`` (alias ``alias``).

    ``holdout_labels``: class names or indices 0..k-1. ``id_column``: the batch column carried into the corrected
    outputs when a batch has it. Returns {"model_uri", "version", "run_id", "digest"}; the reference is then addressed as
    ``models:/NAME@ALIAS``.
    """
    if output_kind not in OUTPUT_KINDS:
        raise InputError(f"output_kind must be one of {OUTPUT_KINDS}, got {output_kind!r}: what the model logs "
                         "(scores before softmax are logits).")
    holdout = check_reference(holdout_outputs, holdout_labels, class_names, output_kind)
    client = MlflowClient(tracking_uri=tracking_uri)
    with _registration_run(client, experiment, f"reference-{name}", {"labelshift.kind": "reference"}) as run_id:
        _, doc = _log_reference_files(client, run_id, holdout, calibrator=calibrator, id_column=id_column,
                                      mode="outputs")
        with tempfile.TemporaryDirectory() as tmp:
            ref_path = Path(tmp) / "reference.json"
            ref_path.write_text(json.dumps(doc))
            cal_path = Path(client.download_artifacts(run_id, calibrator_artifact(calibrator), tmp))
            if tracking_uri:
                mlflow.set_tracking_uri(tracking_uri)
            quiet = logging.getLogger("mlflow.pyfunc")
            level, quiet.level = quiet.level, logging.ERROR     # its note on pickled python_model objects
            try:
                with mlflow.start_run(run_id=run_id):
                    info = mlflow.pyfunc.log_model(name="reference", python_model=ReferenceModel(),
                                                   artifacts={"reference": str(ref_path),
                                                              "calibrator": str(cal_path)},
                                                   pip_requirements=["mlflow", "numpy", "pandas"],
                                                   registered_model_name=name, await_registration_for=120)
            finally:
                quiet.level = level
        return _registered(client, name, info, alias, run_id)


def register_reference_file(holdout: str | Path, *, label_column: str, output_kind: str, name: str,
                            class_names=None, output_column: str | None = None, **kw) -> dict:
    """:func:`register_reference` from a Parquet file of the labelled holdout's outputs
    (:func:`labelshift.monitoring.batches.read_holdout`)."""
    h = read_holdout(holdout, label_column=label_column, output_kind=output_kind, class_names=class_names,
                     output_column=output_column)
    return register_reference(h.outputs, h.labels, name=name, class_names=h.class_names, output_kind=output_kind,
                              **kw)


def register_sklearn_model(model, holdout_x, holdout_y, *, name: str, tracking_uri: str | None = None,
                           alias: str | None = "production", calibrator: str = "BCTS",
                           output_method: str = "predict_proba", class_names=None, experiment: str = "models") \
        -> dict:
    """Register a fitted scikit-learn classifier for input mode: the model (``mlflow.sklearn``, with a signature
    from ``holdout_x``: a DataFrame gives named columns for Parquet batches), the calibrator fit on its
    ``output_method`` outputs on the labelled holdout, the holdout and the class names (default: ``classes_``)."""
    import mlflow.sklearn
    from mlflow.models import infer_signature

    if output_method not in ("predict_proba", "decision_function"):
        raise InputError(f"output_method must be 'predict_proba' or 'decision_function', got {output_method!r}.")
    outputs = np.asarray(getattr(model, output_method)(holdout_x), dtype=np.float64)
    classes = list(getattr(model, "classes_", []))
    names = class_names or [str(c) for c in classes] or None
    y = np.asarray(holdout_y)
    if classes and y.dtype.kind not in "OUS":
        y = np.searchsorted(np.asarray(classes), y)
    kind = "probabilities" if output_method == "predict_proba" else "logits"
    holdout = check_reference(outputs, y.astype(str) if y.dtype.kind in "OUS" else y, names, kind)
    client = MlflowClient(tracking_uri=tracking_uri)
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    with _registration_run(client, experiment, f"train-{name}", {}) as run_id:
        with mlflow.start_run(run_id=run_id):
            signature = infer_signature(holdout_x[:5], outputs[:5])
            info = mlflow.sklearn.log_model(model, name="model", signature=signature,
                                            pip_requirements=["scikit-learn", "mlflow"],
                                            registered_model_name=name, await_registration_for=120)
        _log_reference_files(client, run_id, holdout, calibrator=calibrator, id_column="id", mode="inputs",
                             output_method=output_method)
        return _registered(client, name, info, alias, run_id)


# -- loading -----------------------------------------------------------------------------------------------------------
@dataclass
class ReferenceBundle:
    """A registered reference or non-PyTorch model resolved to one version, with what re-estimation needs.

    ``mode``: ``"outputs"`` (prediction logs; no model), ``"sklearn"`` or ``"pyfunc"`` (inputs scored here).
    """

    uri: str
    name: str
    version: str
    alias: str | None
    run_id: str
    mode: str
    class_names: tuple[str, ...]
    output_kind: str
    calibrator_name: str
    calibrator: object
    source_probs: np.ndarray
    source_labels: np.ndarray
    id_column: str | None = None
    output_method: str | None = None
    input_columns: tuple[str, ...] | None = None
    input_shape: tuple[int, ...] | None = None
    model: object = field(default=None, repr=False)
    load_seconds: float = 0.0
    source_outputs: np.ndarray | None = field(default=None, repr=False)   # raw holdout outputs, float64
    digest: object = field(default=None, repr=False)   # FileDigest of the files loaded (labelshift_mlflow.trusted)
    model_dir: str | None = None       # the checked model files it was loaded from (the corrected model copies them)

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def source_prior(self) -> np.ndarray:
        prior = self.source_probs.mean(axis=0)
        return prior / prior.sum()

    @functools.cached_property
    def holdout(self) -> Holdout:
        """The labelled source holdout every target of this model is assessed against, checked once: calibrated
        and raw outputs, labels, p_s (:attr:`source_prior`), the calibrator and the class names."""
        return Holdout(self.source_probs, self.source_labels, self.source_prior, outputs=self.source_outputs,
                       calibrator=self.calibrator, class_names=self.class_names)

    @property
    def spec(self) -> OutputSpec:
        return OutputSpec(self.class_names, self.output_kind, self.id_column)

    def describe(self) -> dict:
        return {"uri": self.uri, "name": self.name, "version": self.version, "alias": self.alias,
                "run_id": self.run_id, "mode": self.mode, "classes": list(self.class_names),
                "output_kind": self.output_kind, "n_classes": self.n_classes, "calibrator": self.calibrator_name,
                "input_columns": list(self.input_columns) if self.input_columns else None,
                "input_shape": list(self.input_shape) if self.input_shape else None,
                "n_source": int(len(self.source_labels))}


_CACHE: dict[tuple, ReferenceBundle] = {}
_LOCK = threading.Lock()


def _run_json(files: VersionFiles, path: str) -> dict | None:
    """The run's JSON artifact ``path`` from the version's downloaded files, or None when the run has none."""
    local = files.run_file(path)
    return json.loads(local.read_text()) if local is not None else None


def _signature(model_dir: Path) -> tuple[tuple[str, ...] | None, tuple[int, ...] | None, dict]:
    """Input columns, input shape and flavours, from the version's downloaded ``MLmodel``."""
    from mlflow.models import Model

    info = Model.load(str(model_dir / "MLmodel"))
    sig = info.signature
    columns, shape = None, None
    if sig is not None and sig.inputs is not None and sig.inputs.inputs:
        if sig.inputs.is_tensor_spec():
            dims = getattr(sig.inputs.inputs[0], "shape", None)
            if dims and len(dims) >= 2:
                shape = tuple(int(d) for d in dims[1:])
        elif sig.inputs.has_input_names():
            columns = tuple(sig.inputs.input_names())
            shape = (len(columns),)
    return columns, shape, info.flavors


def load_reference(model_uri: str, *, tracking_uri: str, calibrator: str = "BCTS",
                   logger=None) -> ReferenceBundle | ModelBundle:
    """Resolve ``model_uri``, download its version once, check it against its recorded digest
    (:func:`labelshift_mlflow.trusted.trusted_files`: an altered version, or an untrusted one under
    ``LABELSHIFT_REQUIRE_TRUSTED_MODELS=1``, raises InputError; an untrusted one is otherwise loaded with a warning
    to ``logger``) and load what re-estimation needs from those files, in the mode its version calls for: a
    reference (prediction logs), a scikit-learn or pyfunc model (inputs), or a PyTorch model
    (:func:`labelshift_mlflow.registry.bundle_from_files`)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    name, alias, mv = resolve_version(client, model_uri, tracking_uri)
    key = cache_key(tracking_uri, name, mv, calibrator)
    with _LOCK:
        bundle = _CACHE.get(key)
    if bundle is not None:
        check_digest(model_uri, name, mv, bundle.digest, logger=logger)
        return renamed_bundle(bundle, model_uri, alias)
    cached = cached_bundle(key, model_uri, name, alias, mv, logger)
    if cached is not None:
        return cached
    if not mv.run_id:
        raise FormatError(f"{model_uri} (version {mv.version}) has no source run, so no calibrator or holdout beside "
                          "it; register it with labelshift_mlflow.register_reference or "
                          "register_sklearn_model.")
    with trusted_files(client, model_uri, name, mv, logger=logger) as files:
        doc = _run_json(files, REFERENCE_JSON)
        columns, shape, flavors = _signature(files.model_dir)
        if doc is None and "pytorch" in flavors:
            return bundle_from_files(model_uri, name, alias, mv, files, calibrator=calibrator, key=key)
        bundle = _reference_bundle(model_uri, name, alias, mv, files, doc, calibrator, columns, shape, flavors)
    with _LOCK:
        _CACHE[key] = bundle
    return bundle


def _load_model(files: VersionFiles, doc: dict | None, flavors: dict):
    """(mode, model) of a reference (no model) or a scikit-learn or pyfunc model, loaded from the checked files.
    A model's folder is kept, as MLflow keeps its own download folder: a pyfunc may read its files later, and the
    corrected model copies these checked files rather than downloading the version again."""
    if doc is not None and doc.get("mode", "outputs") == "outputs":
        return "outputs", None
    files.keep = True
    if "sklearn" in flavors:
        import mlflow.sklearn

        return "sklearn", mlflow.sklearn.load_model(str(files.model_dir))
    return "pyfunc", mlflow.pyfunc.load_model(str(files.model_dir))


def _without_reference(model_uri: str, mv, flavors: dict) -> str:
    """The error for a model version logged with MLflow alone: no calibrator, no labelled holdout beside it."""
    kind = "scikit-learn" if "sklearn" in flavors else "pyfunc"
    how = ("register it with labelshift_mlflow.register_sklearn_model(model, holdout_x, holdout_y, name=...)"
           if kind == "scikit-learn" else
           "log them into its run with labelshift_mlflow.artifacts.log_reestimation_reference(client, run_id, "
           "calibrator, holdout_outputs, holdout_labels)")
    return (f"{model_uri} (version {mv.version}) is a {kind} model logged without what re-estimation needs beside it "
            f"(a calibrator and the labelled holdout's outputs, {REFERENCE_ARTIFACT}): {how}; or, to re-estimate from "
            "the model's prediction logs instead, register its holdout's outputs with `labelshift reference register "
            "--holdout FILE --label-column COL --outputs logits|probabilities --name NAME`.")


def _reference_bundle(model_uri: str, name: str, alias: str | None, mv, files: VersionFiles, doc: dict | None,
                      calibrator: str, columns, shape, flavors: dict) -> ReferenceBundle:
    """A reference or a non-PyTorch model of version ``mv``, read from its downloaded and checked ``files``."""
    t0 = time.perf_counter()
    if doc is not None and not doc.get("class_names"):
        raise FormatError(f"reference {model_uri} (version {mv.version}) has no class names in {REFERENCE_JSON}; "
                          "register it again with the class names (--class-names a,b,c).")
    cal_doc = _run_json(files, calibrator_artifact(calibrator))
    if cal_doc is None and doc is None and files.run_file(REFERENCE_ARTIFACT) is None:
        raise ObjectNotFoundError(_without_reference(model_uri, mv, flavors))
    if cal_doc is None:
        raise ObjectNotFoundError(f"{model_uri} (version {mv.version}, run {mv.run_id}) has no calibrator "
                                  f"{calibrator_artifact(calibrator)}; pick the one it was registered with "
                                  f"({(doc or {}).get('calibrator', 'BCTS')}: --calibrator) or register it again.")
    cal = load_calibrator(cal_doc["calibrator"] if "calibrator" in cal_doc else cal_doc)
    ref_path = files.run_file(REFERENCE_ARTIFACT)
    if ref_path is None:
        raise ObjectNotFoundError(f"{model_uri} (version {mv.version}) has no {REFERENCE_ARTIFACT} (the labelled "
                                  "holdout); register it with labelshift_mlflow.register_reference.")
    with np.load(ref_path, allow_pickle=False) as ref:
        holdout, labels = ref["logits"].astype(np.float64), ref["labels"].astype(np.int64)
    kind = (doc or {}).get("output_kind") or ("probabilities" if cal.input_kind_ == "probs" else "logits")
    k = holdout.shape[1]
    mode, model = _load_model(files, doc, flavors)
    names = tuple((doc or {}).get("class_names") or ())
    if not names and mode == "sklearn" and hasattr(model, "classes_"):
        names = tuple(str(c) for c in model.classes_)
    names = names or default_class_names(k)
    if len(names) != k or int(getattr(cal, "n_classes_", k)) != k:
        raise InputError(f"{model_uri}: the reference names {len(names)} classes, its calibrator is for "
                         f"{getattr(cal, 'n_classes_', k)} and its holdout has {k}; register it again from one "
                         "holdout.")
    method = (doc or {}).get("output_method")
    if mode == "sklearn" and method is None:
        method = "predict_proba" if kind == "probabilities" or not hasattr(model, "decision_function") \
            else "decision_function"
    return ReferenceBundle(
        uri=model_uri, name=name, version=str(mv.version), alias=alias, run_id=mv.run_id, mode=mode,
        class_names=names, output_kind=kind, calibrator_name=calibrator, calibrator=cal,
        source_probs=cal.predict_proba(holdout), source_labels=labels, id_column=(doc or {}).get("id_column"),
        output_method=method, input_columns=columns, input_shape=shape, model=model,
        load_seconds=time.perf_counter() - t0, source_outputs=holdout, digest=files.digest,
        model_dir=str(files.model_dir) if model is not None else None)
