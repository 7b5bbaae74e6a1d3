"""Re-estimation for any deployed classifier: references for prediction logs, and models of any MLflow flavour.

Two ways in besides the PyTorch model of :mod:`tasks.reestimation`:

- **prediction-log mode**: the target's batches hold the model's outputs (:mod:`labelshift.monitoring.batches`); nothing
  is loaded or recomputed. What is registered is a *reference* (:func:`register_reference`): a pyfunc model version
  whose ``predict`` applies the calibrator, whose run holds ``reference/reference.json`` (class names, output kind, id
  column), the calibrator JSON and the labelled holdout's outputs (:data:`tasks.reestimation.REFERENCE_ARTIFACT`).
- **input mode, any flavour**: a scikit-learn model (``predict_proba``, or ``decision_function`` scores taken as
  logits), a pyfunc whose output is one score per class, or PyTorch as before; tabular batches as Parquet are
  checked against the signature's column names. :func:`register_sklearn_model` logs one with its reference.

:func:`load_for_reestimation` picks the mode from the model version (a reference, else its flavour);
:func:`score_for_reestimation` and :func:`write_for_reestimation` read and write batches of every format.
"""
from __future__ import annotations

import json
import logging
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import mlflow.pyfunc
import numpy as np
from mlflow import MlflowClient
from prefect import task
from prefect.cache_policies import NO_CACHE

from labelshift import calibration as calibration_mod
from labelshift import rows as rows_mod
from labelshift.monitoring.batches import (OUTPUT_KINDS, OutputSpec, batch_format, batch_rows,
                                                     check_one_format, check_reference, default_class_names,
                                                     iter_feature_chunks, iter_ids, iter_output_chunks, read_holdout)
from labelshift.monitoring.outputs import write_corrected_parquet, write_corrected_file
from labelshift.calibration import load_calibrator
from labelshift.estimation.diagnostics import correct_predictions
from labelshift.errors import FormatError, InputError, ObjectNotFoundError
from labelshift.monitoring.inputs import load_batch
from labelshift.monitoring.layout import ChangedBatchError, RejectedBatch, TargetBatch
from labelshift.storage import open_store
from tasks.reestimation import (REFERENCE_ARTIFACT, ModelBundle, ScoredBatches, _forward, resolve_version,
                                calibrator_artifact, load_bundle, log_reestimation_reference, write_outputs)

__all__ = ["REFERENCE_JSON", "ReferenceBundle", "reference_model_class", "register_reference", "register_reference_file",
           "register_sklearn_model", "load_reference", "load_for_reestimation", "score_for_reestimation",
           "write_for_reestimation", "class_names_of"]

REFERENCE_JSON = "reference/reference.json"
REFERENCE_FORMAT = "labelshift-reference"


def class_names_of(bundle) -> list[str]:
    """The bundle's class names ("0".."k-1" when it has none)."""
    names = getattr(bundle, "class_names", None)
    return list(names) if names else list(default_class_names(bundle.n_classes))


# -- the pyfunc form of a reference ------------------------------------------------------------------------------------
def reference_model_class():
    """The pyfunc form of a reference: ``predict`` takes model outputs (one column per class, or an (n, k) array)
    and returns the calibrated probabilities, one column per class name. (Made on demand: MLflow inspects a
    PythonModel subclass when it is defined, which needs to happen only where a reference is registered; its note
    on the untyped ``predict`` is recorded and dropped, since MLflow sets its own warning filter around it.)"""
    with warnings.catch_warnings(record=True):
        return _define_reference_model()


def _define_reference_model():
    class ReferenceModel(mlflow.pyfunc.PythonModel):
        """A reference as an MLflow pyfunc: ``predict`` takes model outputs (one column per class, or an (n, k) array)
        and returns the calibrated probabilities, one column per class name."""

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

    return ReferenceModel


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
    """Tag the version just registered, point ``alias`` at it; returns {"model_uri", "version", "run_id"}."""
    version = str(info.registered_model_version)
    client.set_model_version_tag(name, version, "labelshift.kind", "reference")
    if alias:
        client.set_registered_model_alias(name, alias, version)
    return {"model_uri": f"models:/{name}@{alias}" if alias else f"models:/{name}/{version}", "version": version,
            "run_id": run_id}


def register_reference(holdout_outputs, holdout_labels, *, name: str, class_names, output_kind: str,
                       tracking_uri: str | None = None, alias: str | None = "production", calibrator: str = "BCTS",
                       id_column: str | None = "id", experiment: str = "references") -> dict:
    """Register a reference for prediction-log mode: the calibrator fit on the labelled holdout's outputs, the
    holdout itself, the class names and the kind of output, as a pyfunc model version ``name`` (alias ``alias``).

    ``holdout_labels``: class names or indices 0..k-1. ``id_column``: the batch column carried into the corrected
    outputs when a batch has it. Returns {"model_uri", "version", "run_id"}; the reference is then addressed as
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
                    info = mlflow.pyfunc.log_model(name="reference", python_model=reference_model_class()(),
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

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    @property
    def source_prior(self) -> np.ndarray:
        prior = self.source_probs.mean(axis=0)
        return prior / prior.sum()

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


def _download_json(client: MlflowClient, run_id: str, path: str) -> dict | None:
    """The run's own JSON artifact ``path``, or None when the run has none.

    Looked up in the run's listing first and read from the run's artifact root: ``client.download_artifacts`` would
    also try MLflow 3's logged model of the same name (``reference``), where the file is missing, and an MLflow
    server proxying S3 answers a missing file with HTTP 500, which its clients retry for minutes."""
    import posixpath

    import mlflow.artifacts

    try:
        if path not in {f.path for f in client.list_artifacts(run_id, posixpath.dirname(path) or None)}:
            return None
        root = client.get_run(run_id).info.artifact_uri
        with tempfile.TemporaryDirectory() as tmp:
            local = mlflow.artifacts.download_artifacts(artifact_uri=f"{root}/{path}", dst_path=tmp,
                                                        tracking_uri=client.tracking_uri)
            return json.loads(Path(local).read_text())
    except Exception:
        return None


def _signature(version_uri: str) -> tuple[tuple[str, ...] | None, tuple[int, ...] | None, dict]:
    info = mlflow.models.get_model_info(version_uri)
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


def load_reference(model_uri: str, *, tracking_uri: str, calibrator: str = "BCTS") -> ReferenceBundle | ModelBundle:
    """Resolve ``model_uri`` and load what re-estimation needs, in the mode its version calls for: a reference
    (prediction logs), a scikit-learn or pyfunc model (inputs), or a PyTorch model (:func:`load_bundle`)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    name, alias, mv = resolve_version(client, model_uri, tracking_uri)
    key = (tracking_uri, name, str(mv.version), calibrator)
    with _LOCK:
        if key in _CACHE:
            return ReferenceBundle(**{**_CACHE[key].__dict__, "uri": model_uri, "alias": alias})
    t0 = time.perf_counter()
    if not mv.run_id:
        raise FormatError(f"{model_uri} (version {mv.version}) has no source run, so no calibrator or holdout beside "
                          "it; register it with tasks.references.register_reference or register_sklearn_model.")
    version_uri = f"models:/{name}/{mv.version}"
    doc = _download_json(client, mv.run_id, REFERENCE_JSON)
    columns, shape, flavors = _signature(version_uri)
    if doc is None and "pytorch" in flavors:
        return load_bundle(model_uri, tracking_uri=tracking_uri, calibrator=calibrator)
    if doc is not None and not doc.get("class_names"):
        raise FormatError(f"reference {model_uri} (version {mv.version}) has no class names in {REFERENCE_JSON}; "
                          "register it again with the class names (--class-names a,b,c).")
    cal_doc = _download_json(client, mv.run_id, calibrator_artifact(calibrator))
    if cal_doc is None:
        raise ObjectNotFoundError(f"{model_uri} (version {mv.version}, run {mv.run_id}) has no calibrator "
                                  f"{calibrator_artifact(calibrator)}; pick the one it was registered with "
                                  f"({(doc or {}).get('calibrator', 'BCTS')}: --calibrator) or register it again.")
    cal = load_calibrator(cal_doc["calibrator"] if "calibrator" in cal_doc else cal_doc)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            ref_path = client.download_artifacts(mv.run_id, REFERENCE_ARTIFACT, tmp)
        except Exception:
            raise ObjectNotFoundError(f"{model_uri} (version {mv.version}) has no {REFERENCE_ARTIFACT} (the labelled "
                                      "holdout); register it with tasks.references.register_reference.") from None
        with np.load(ref_path, allow_pickle=False) as ref:
            holdout, labels = ref["logits"].astype(np.float64), ref["labels"].astype(np.int64)
    kind = (doc or {}).get("output_kind") or ("probabilities" if cal.input_kind_ == "probs" else "logits")
    k = holdout.shape[1]
    if doc is not None and doc.get("mode", "outputs") == "outputs":
        mode, model = "outputs", None
    elif "sklearn" in flavors:
        import mlflow.sklearn

        mode, model = "sklearn", mlflow.sklearn.load_model(version_uri)
    else:
        mode, model = "pyfunc", mlflow.pyfunc.load_model(version_uri)
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
    bundle = ReferenceBundle(
        uri=model_uri, name=name, version=str(mv.version), alias=alias, run_id=mv.run_id, mode=mode,
        class_names=names, output_kind=kind, calibrator_name=calibrator, calibrator=cal,
        source_probs=cal.predict_proba(holdout), source_labels=labels, id_column=(doc or {}).get("id_column"),
        output_method=method, input_columns=columns, input_shape=shape, model=model,
        load_seconds=time.perf_counter() - t0, source_outputs=holdout)
    with _LOCK:
        _CACHE[key] = bundle
    return bundle


@task(name="load-model", task_run_name="load-{model_uri}", cache_policy=NO_CACHE, persist_result=False)
def load_for_reestimation(model_uri: str, *, tracking_uri: str, calibrator: str):
    """The registered reference or model, in the mode its version calls for (:func:`load_reference`)."""
    return load_reference(model_uri, tracking_uri=tracking_uri, calibrator=calibrator)


# -- scoring and writing -----------------------------------------------------------------------------------------------
def _check_formats(bundle, store, batches: list[TargetBatch]) -> str:
    fmt = check_one_format([b.key for b in batches], store.uri)
    if isinstance(bundle, ModelBundle) and fmt != "npy":
        raise InputError(f"{bundle.uri} is a PyTorch model, which takes .npy batches of its inputs, but the new batches "
                         f"under {store.uri} are {fmt} ({batches[0].key}); save them as NAME.npy, or register a "
                         "reference (labelshift reference register) if they are the model's logged outputs.")
    if isinstance(bundle, ReferenceBundle) and bundle.mode != "outputs":
        if fmt == "parquet" and not bundle.input_columns:
            raise InputError(f"{bundle.uri}'s signature has no column names, so Parquet batch {batches[0].key} cannot "
                             "be matched to its inputs; save the batches as .npy arrays, or log the model with a "
                             "DataFrame input example.")
        if fmt == "npy" and not bundle.input_shape:
            raise InputError(f"{bundle.uri} has no input signature to check .npy batches against; log it with an "
                             "input example.")
    return fmt


def _bytes(store, b: TargetBatch) -> bytes:
    import hashlib

    from labelshift.monitoring.layout import ChangedBatchError

    data = store.get_bytes(b.key)
    digest = hashlib.sha256(data).hexdigest()
    if digest != b.checksum:
        raise ChangedBatchError(f"batch {store.url(b.key)} changed after this run listed it (listed sha256 "
                                f"{b.checksum[:12]}..., read {digest[:12]}...); run again.", {b.key: (b.checksum, digest)})
    return data


def _model_scores(bundle: ReferenceBundle, x: np.ndarray) -> np.ndarray:
    if bundle.mode == "sklearn":
        if bundle.input_columns:
            import pandas as pd

            x = pd.DataFrame(x, columns=list(bundle.input_columns))
        out = getattr(bundle.model, bundle.output_method)(x)
    else:
        import pandas as pd

        out = bundle.model.predict(pd.DataFrame(x, columns=list(bundle.input_columns)) if bundle.input_columns
                                   else x)
    out = np.asarray(out, dtype=np.float64)
    if out.ndim != 2 or out.shape[1] != bundle.n_classes:
        raise InputError(f"{bundle.uri} returned outputs of shape {out.shape}, not one score per class "
                         f"({bundle.n_classes}); a pyfunc model must return an (n, k) array of scores.")
    return out


def _download(store, b: TargetBatch, folder: Path, name: str) -> Path:
    """The batch as the local file ``folder/name``, streamed from the store (verified against its recorded checksum on
    the way) and hashed again against the checksum this run listed."""
    from labelshift.monitoring.layout import ChangedBatchError
    from labelshift.storage.base import file_sha256

    path = folder / f"{name}{Path(b.key).suffix}"
    store.get_file(b.key, path)
    digest = file_sha256(path)
    if digest != b.checksum:
        raise ChangedBatchError(f"batch {store.url(b.key)} changed after this run listed it (listed sha256 "
                                f"{b.checksum[:12]}..., read {digest[:12]}...); run again.", {b.key: (b.checksum, digest)})
    return path


def _skip(out: ScoredBatches, b: TargetBatch, exc: Exception, logger) -> None:
    out.skipped.append({"key": b.key, "reason": str(exc)})
    logger.warning("skipped %s: %s", b.key, exc)


def _reject(out: ScoredBatches, b: TargetBatch, exc: Exception, logger) -> None:
    out.rejected.append(RejectedBatch(b, str(exc)))
    if logger is not None:              # in strict mode the flow reports every rejection at once, in its error
        logger.warning("rejected %s: %s", b.key, exc)


def _score_logs(bundle: ReferenceBundle, store, batches: list[TargetBatch], out: ScoredBatches, logger,
                reject_logger) -> None:
    """Prediction logs: every batch streamed to a temporary file, then read in row chunks, calibrated chunk by chunk
    into one pooled float32 (m, k) array; the good batches get consecutive views of it (so pooling them is free:
    :func:`labelshift.rows.joined`), and so do their raw outputs (float32, for the source-aware interval; the
    probabilities are computed from the kept values). A batch that fails its checks part-way gives its rows back to
    the next one."""
    with tempfile.TemporaryDirectory(prefix="labelshift-batches-") as tmp, rows_mod.one_blas_thread():
        files = []
        for i, b in enumerate(batches):
            uri, fmt = store.url(b.key), batch_format(b.key)
            try:
                path = _download(store, b, Path(tmp), f"batch-{i}")
                files.append((b, uri, fmt, path, batch_rows(path, fmt, uri)))
            except (ObjectNotFoundError, ChangedBatchError) as exc:
                _skip(out, b, exc, logger)
            except (FormatError, InputError) as exc:
                _reject(out, b, exc, reject_logger)
        total = sum(f[4] for f in files)
        pooled = np.empty((total, bundle.n_classes), dtype=np.float32)
        pooled_raw = np.empty((total, bundle.n_classes), dtype=np.float32)     # for the source-aware interval
        at = 0
        for b, uri, fmt, path, n in files:
            row = at
            try:
                for chunk in iter_output_chunks(path, fmt, bundle.spec, uri):
                    if row + len(chunk) > at + n:
                        raise FormatError(f"batch {uri} holds more rows than its metadata says ({n}); write it "
                                          "again.")
                    kept = pooled_raw[row:row + len(chunk)]
                    kept[:] = chunk
                    pooled[row:row + len(chunk)] = bundle.calibrator.predict_proba(kept.astype(np.float64))
                    row += len(chunk)
                if row != at + n:
                    raise FormatError(f"batch {uri} holds {row - at} rows but its metadata says {n}; write it again.")
            except (FormatError, InputError) as exc:
                _reject(out, b, exc, reject_logger)
                continue
            finally:
                path.unlink(missing_ok=True)
            out.batches.append(b)
            out.probs.append(pooled[at:row])
            out.outputs.append(pooled_raw[at:row])
            at = row


def _calibrated(bundle, scores, raw: list) -> np.ndarray:
    """The calibrated probabilities of raw model outputs, kept (float32) in ``raw`` for the source-aware interval;
    the probabilities are computed from the kept values, so that both describe the same rows exactly."""
    kept = np.asarray(scores).astype(np.float32)
    raw.append(kept)
    return bundle.calibrator.predict_proba(kept.astype(np.float64))


def _score_batch(bundle, store, b: TargetBatch, batch_size: int, raw: list | None = None) -> np.ndarray:
    """Calibrated probabilities of every row of one batch (its rows stream through in chunks; only the (n, k)
    probabilities stay, and the raw outputs as float32 in ``raw`` when given). Raises FormatError/InputError for a
    batch that fails its checks."""
    raw = [] if raw is None else raw
    if isinstance(bundle, ModelBundle):
        x = load_batch(store, b, input_shape=bundle.input_shape)
        return _calibrated(bundle, _forward(bundle.model, x, batch_size), raw)
    uri, fmt = store.url(b.key), batch_format(b.key)
    parts = []
    if fmt == "parquet":
        for chunk in iter_feature_chunks(_bytes(store, b), uri, bundle.input_columns,
                                         chunk_rows=max(batch_size, 1024)):
            parts.append(_calibrated(bundle, _model_scores(bundle, chunk), raw))
    else:
        x = load_batch(store, b, input_shape=bundle.input_shape)
        for i in range(0, len(x), max(batch_size, 1)):
            parts.append(_calibrated(bundle, _model_scores(bundle, x[i:i + batch_size]), raw))
    return np.concatenate(parts)


@task(name="score-batches", task_run_name="score-{target_uri}", cache_policy=NO_CACHE, persist_result=False)
def score_for_reestimation(bundle, target_uri: str, batches: list[TargetBatch], *, batch_size: int = 1024,
                           log_rejections: bool = True) -> ScoredBatches:
    """Calibrated probabilities (and the raw outputs they came from, float32) of every row of every batch, in any mode
    and format, in one pass that goes on past a bad batch: a batch whose content fails its checks (FormatError,
    InputError) is set aside as rejected with its
    message, one deleted or replaced since the listing as skipped. Nothing is written here. Different formats under
    one target, or trouble with the store itself (unreachable, credentials), still fail. Rows stream through in
    chunks; only the (n, k) probabilities stay: float32 views of one pooled array for prediction logs, float64 per
    batch for models scored here."""
    from prefect.logging import get_run_logger

    logger = get_run_logger()
    store = open_store(target_uri)
    _check_formats(bundle, store, batches)
    out, t0 = ScoredBatches([], []), time.perf_counter()
    reject_logger = logger if log_rejections else None
    if isinstance(bundle, ReferenceBundle) and bundle.mode == "outputs":
        _score_logs(bundle, store, batches, out, logger, reject_logger)
    else:
        for i, b in enumerate(batches):
            raw: list = []
            try:
                probs = _score_batch(bundle, store, b, batch_size, raw)
            except (ObjectNotFoundError, ChangedBatchError) as exc:
                _skip(out, b, exc, logger)
                continue
            except (FormatError, InputError) as exc:
                _reject(out, b, exc, reject_logger)
                continue
            out.probs.append(probs)
            out.outputs.append(np.concatenate(raw))
            out.batches.append(b)
            logger.info("scored %s (%d of %d): %d rows, %.1f s so far", b.key, i + 1, len(batches), len(probs),
                        time.perf_counter() - t0)
    logger.info("%d batch(es) scored, %d rejected, %d skipped in %.1f s", len(out.batches), len(out.rejected),
                len(out.skipped), time.perf_counter() - t0)
    return out


def _take(ids, pending: list, n: int):
    """The next ``n`` ids from the chunk iterator ``ids`` (whose chunks need not be n long); None without ids."""
    import pyarrow as pa

    have = sum(len(a) for a in pending)
    while have < n:
        chunk = next(ids, None)
        if chunk is None:
            if not pending:
                return None
            raise FormatError(f"the id column holds {have} rows fewer than the outputs; write the batch again.")
        pending.append(chunk)
        have += len(chunk)
    joined = pa.concat_arrays(pending) if len(pending) > 1 else pending[0]
    pending[:] = [joined.slice(n)] if len(joined) > n else []
    return joined.slice(0, n)


def _corrected_chunks(probs: np.ndarray, weights: np.ndarray, ids, chunk_rows: int):
    pending: list = []
    for sl in rows_mod.blocks(len(probs), chunk_rows):
        block = probs[sl]
        yield correct_predictions(block, weights).astype(np.float32), _take(ids, pending, len(block))


@task(name="write-outputs", cache_policy=NO_CACHE, persist_result=False)
def write_for_reestimation(bundle, target_uri: str, batches: list[TargetBatch], probs: list[np.ndarray],
                           weights: list[float], summary: dict) -> list[str]:
    """Corrected predictions beside each batch: ``.corrected.npy`` for .npy batches (as for PyTorch models),
    ``.corrected.parquet`` with one column per class name (and the batch's id column) for Parquet batches, written
    row group by row group to a temporary file (the batch's id column streamed from a downloaded copy), then
    uploaded."""
    if all(b.key.endswith(".npy") for b in batches):
        return write_outputs.fn(target_uri, batches, probs, weights, summary)
    store = open_store(target_uri)
    names = class_names_of(bundle)
    id_column = getattr(bundle, "id_column", None)
    w = np.asarray(weights, dtype=np.float64)
    chunk_rows = rows_mod.ROW_BLOCK
    urls = []
    with rows_mod.one_blas_thread():
        for b, p in zip(batches, probs):
            with tempfile.TemporaryDirectory(prefix="labelshift-corrected-") as tmp:
                folder = Path(tmp)
                if id_column:
                    source = _download(store, b, folder, "batch")
                    ids = iter_ids(source, store.url(b.key), id_column, chunk_rows=chunk_rows)
                else:
                    ids = iter_ids(None, store.url(b.key), None)
                out = folder / "corrected.parquet"
                write_corrected_parquet(out, _corrected_chunks(p, w, ids, chunk_rows), names, id_column)
                batch_summary = dict(summary, batch={"key": b.key, "checksum": b.checksum, "rows": int(len(p)),
                                                     "corrected": store.url(b.corrected_key)})
                write_corrected_file(store, b, out, b.corrected_key, batch_summary, rows=len(p), classes=len(names))
            urls.append(store.url(b.corrected_key))
    return urls
