"""A registered PyTorch model resolved to one version and loaded with what re-estimation needs from its run: the
calibrator and the labelled source holdout (:mod:`labelshift_mlflow.artifacts`), as a :class:`ModelBundle`.
Registered-model URIs (``models:/NAME@ALIAS``, ``models:/NAME/VERSION``) are parsed and resolved here for every kind
of model (:mod:`tasks.reestimation.references` loads the others). The version's files are downloaded once and
checked against its recorded digest (:func:`labelshift_mlflow.trusted.trusted_files`) before anything is loaded from them.
"""
from __future__ import annotations

import dataclasses
import functools

import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from mlflow import MlflowClient

from labelshift.inference.holdout import Holdout
from labelshift.calibration import load_calibrator
from labelshift.errors import FormatError, InputError, ObjectNotFoundError, ServiceUnavailableError
from labelshift.storage.digest import FileDigest
from labelshift_mlflow.artifacts import REFERENCE_ARTIFACT, calibrator_artifact
from labelshift_mlflow.trusted import DIGEST_TAG, VersionFiles, check_digest, trusted_files

__all__ = ["renamed_bundle", "ModelBundle", "parse_model_uri", "resolve_version", "registered_name", "cache_key",
           "cached_bundle",
           "load_bundle", "bundle_from_files"]

_MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))$")


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/NAME@ALIAS`` -> (NAME, ALIAS, None); ``models:/NAME/VERSION`` -> (NAME, None, VERSION)."""
    match = _MODEL_URI.match(uri.strip()) if isinstance(uri, str) else None
    if not match:
        raise InputError(f"model must be a registered-model URI 'models:/NAME@ALIAS' or 'models:/NAME/VERSION', got "
                         f"{uri!r} (e.g. models:/my-classifier@production, as `labelshift reference register --name "
                         "my-classifier` registers it).")
    return match["name"], match["alias"], match["version"]


@dataclass
class ModelBundle:
    """A registered model resolved to one version, with what re-estimation needs from its run."""

    uri: str
    name: str
    version: str
    alias: str | None
    run_id: str
    input_shape: tuple[int, ...]
    n_classes: int
    calibrator_name: str
    calibrator: object
    source_probs: np.ndarray       # calibrated outputs on the labelled source holdout
    source_labels: np.ndarray
    model: object = field(repr=False)
    load_seconds: float = 0.0
    source_outputs: np.ndarray | None = field(default=None, repr=False)   # raw holdout logits, float64
    digest: FileDigest | None = field(default=None, repr=False)   # of the files loaded (labelshift_mlflow.trusted)
    model_dir: str | None = None       # the checked model files it was loaded from (the corrected model copies them)

    @property
    def source_prior(self) -> np.ndarray:
        """p_s(y): the mean calibrated prediction on the source holdout, the prior the calibrated predictor is
        consistent with (so that W and the EM step of MLLS agree with f). It equals the holdout's label
        frequencies for BCTS and VS, not always for TS and NBVS; ``docs/reestimation.md``."""
        prior = self.source_probs.mean(axis=0)
        return prior / prior.sum()

    @functools.cached_property
    def holdout(self) -> Holdout:
        """The labelled source holdout every target of this model is assessed against, checked once: calibrated
        and raw outputs, labels, p_s (:attr:`source_prior`), the calibrator."""
        return Holdout(self.source_probs, self.source_labels, self.source_prior, outputs=self.source_outputs,
                       calibrator=self.calibrator, class_names=None)

    def describe(self) -> dict:
        return {"uri": self.uri, "name": self.name, "version": self.version, "alias": self.alias,
                "run_id": self.run_id, "input_shape": list(self.input_shape), "n_classes": self.n_classes,
                "calibrator": self.calibrator_name, "n_source": int(len(self.source_labels))}


def renamed_bundle(bundle, uri: str, alias: str | None):
    """The cached bundle as asked for by ``uri`` (another alias of the same version), its checked holdout kept (a
    ``functools.cached_property``, made once per loaded version)."""
    fresh = dataclasses.replace(bundle, uri=uri, alias=alias)
    if "holdout" in bundle.__dict__:
        fresh.__dict__["holdout"] = bundle.__dict__["holdout"]
    return fresh


_BUNDLES: dict[tuple, ModelBundle] = {}
_BUNDLES_LOCK = threading.Lock()


def _registry_error(client: MlflowClient, name: str, alias: str | None, version: str | None, exc) -> Exception:
    try:
        registered = client.get_registered_model(name)
    except Exception:
        try:
            names = sorted(m.name for m in client.search_registered_models(max_results=50))
        except Exception:
            names = []
        sweep = name.startswith("labelshift-")       # a name the sweeps register
        return ObjectNotFoundError(
            f"no registered model {name!r} in the MLflow registry ({client.tracking_uri}); registered: "
            f"{', '.join(names) or 'none'}. " + (
                f"Train it with `labelshift reproduce --dataset {name.removeprefix('labelshift-')} --tracking-uri "
                f"{client.tracking_uri}` (or run the reproduce-images deployment), or register"
                if sweep else "Check the name, or register") +
            f" your own model: its logged outputs on a labelled holdout with `labelshift reference register "
            f"--holdout FILE --label-column COL --outputs logits|probabilities --name NAME --tracking-uri "
            f"{client.tracking_uri}`, a scikit-learn classifier with "
            "tasks.reestimation.references.register_sklearn_model, a PyTorch one with "
            "mlflow.pytorch.log_model(..., registered_model_name=...) (docs/operations.md).")
    if alias is not None:
        aliases = sorted(getattr(registered, "aliases", {}) or {})
        return ObjectNotFoundError(
            f"registered model {name!r} has no alias {alias!r} (its aliases: {', '.join(aliases) or 'none'}). Use "
            f"one of them, models:/{name}/VERSION, or set it: MlflowClient().set_registered_model_alias({name!r}, "
            f"{alias!r}, VERSION).")
    return ObjectNotFoundError(f"registered model {name!r} has no version {version} ({exc}).")


def _input_shape(model_uri: str, model_dir: Path) -> tuple[int, ...]:
    """The input shape (without the batch axis) of the model's signature, read from its downloaded ``MLmodel``."""
    from mlflow.models import Model

    sig = Model.load(str(model_dir / "MLmodel")).signature
    if sig is None or sig.inputs is None or not sig.inputs.inputs:
        raise FormatError(f"{model_uri} has no input signature; log it with an input_example (mlflow.pytorch."
                          "log_model(model, name=..., input_example=x)) so batches can be checked against it.")
    spec = sig.inputs.inputs[0]
    shape = getattr(spec, "shape", None)
    if not shape or len(shape) < 2:
        raise FormatError(f"{model_uri}'s signature is not a tensor of shape (-1, ...): {sig.inputs}.")
    return tuple(int(d) for d in shape[1:])


def resolve_version(client: MlflowClient, model_uri: str, tracking_uri: str):
    """``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` -> (NAME, ALIAS, the model version). Raises
    ObjectNotFoundError naming what is registered, ServiceUnavailableError when MLflow does not answer."""
    name, alias, version = parse_model_uri(model_uri)
    try:
        mv = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, version)
    except Exception as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(exc) or "not found" in str(exc).lower() or "INVALID_PARAMETER" in str(exc):
            raise _registry_error(client, name, alias, version, exc) from None
        raise ServiceUnavailableError(f"could not read {model_uri} from MLflow at {tracking_uri}: "
                                      f"{type(exc).__name__}: {exc}") from None
    return name, alias, mv


def registered_name(model_uri: str, tracking_uri: str) -> str:
    """The registered model's name, once its version (alias or number) is found in the registry: a check of the URI
    that reads no artifact (ObjectNotFoundError naming what is registered; ServiceUnavailableError)."""
    name, _, _ = resolve_version(MlflowClient(tracking_uri=tracking_uri), model_uri, tracking_uri)
    return name


def cache_key(tracking_uri: str, name: str, mv, calibrator: str) -> tuple:
    """The key of a loaded version in this process's caches: the recorded digest is part of it, so a version
    trusted again (or anew) is loaded and checked again."""
    return (tracking_uri, name, str(mv.version), calibrator, dict(mv.tags or {}).get(DIGEST_TAG))


def cached_bundle(key: tuple, model_uri: str, name: str, alias: str | None, mv, logger=None):
    """The bundle loaded earlier under ``key``, as asked for by ``model_uri``, or None. It was checked when loaded;
    an untrusted one is warned about (or refused) again, as a fresh load would be."""
    with _BUNDLES_LOCK:
        bundle = _BUNDLES.get(key)
    if bundle is None:
        return None
    check_digest(model_uri, name, mv, bundle.digest, logger=logger)
    return renamed_bundle(bundle, model_uri, alias)


def load_bundle(model_uri: str, *, tracking_uri: str, calibrator: str = "BCTS", logger=None) -> ModelBundle:
    """Resolve ``model_uri`` in the registry, download the version once, check it against its recorded digest
    (:func:`labelshift_mlflow.trusted.trusted_files`) and load the model, its calibrator and the source holdout
    (:func:`bundle_from_files`).

    Bundles are cached in this process by (tracking URI, name, version, calibrator, recorded digest): a served
    deployment loads a model version once. Raises InputError (a version altered after it was trusted, an untrusted
    one under LABELSHIFT_REQUIRE_TRUSTED_MODELS=1, a calibrator or holdout for a different number of classes than
    the model's), ObjectNotFoundError (no such model / alias / artifact), ServiceUnavailableError (MLflow
    unreachable).
    """
    client = MlflowClient(tracking_uri=tracking_uri)
    name, alias, mv = resolve_version(client, model_uri, tracking_uri)
    key = cache_key(tracking_uri, name, mv, calibrator)
    cached = cached_bundle(key, model_uri, name, alias, mv, logger)
    if cached is not None:
        return cached
    _need_run(model_uri, mv)
    with trusted_files(client, model_uri, name, mv, logger=logger) as files:
        return bundle_from_files(model_uri, name, alias, mv, files, calibrator=calibrator, key=key)


def _need_run(model_uri: str, mv) -> None:
    if not mv.run_id:
        raise FormatError(f"{model_uri} (version {mv.version}) has no source run, so no calibrator beside it; "
                          "log the model from a run that also logs calibration/<NAME>.json and "
                          f"{REFERENCE_ARTIFACT} (labelshift_mlflow.artifacts.log_reestimation_reference).")


def _reference_files(model_uri: str, mv, files: VersionFiles, calibrator: str):
    """The calibrator and the source holdout's logits and labels, from the version's downloaded run files."""
    cal_path, ref_path = files.run_file(calibrator_artifact(calibrator)), files.run_file(REFERENCE_ARTIFACT)
    if cal_path is None:
        present = sorted(p.name for p in (files.run_dir / "calibration").glob("*")) \
            if (files.run_dir / "calibration").is_dir() else []
        raise ObjectNotFoundError(
            f"{model_uri} (version {mv.version}, run {mv.run_id}) has no calibrator "
            f"{calibrator_artifact(calibrator)}; found: {', '.join(present) or 'nothing under calibration/'}. "
            "Pick one that exists (--calibrator) or log it with labelshift_mlflow.artifacts.log_reestimation_reference.")
    if ref_path is None:
        raise ObjectNotFoundError(
            f"{model_uri} (version {mv.version}, run {mv.run_id}) has no {REFERENCE_ARTIFACT} (the labelled "
            "source holdout MLLS and BBSE are fit on). Models trained by this version of `labelshift "
            "reproduce` carry it: rerun `labelshift reproduce --dataset DATASET` (a cached model is not retrained; the "
            "holdout is added to its run); for other models log it with "
            "labelshift_mlflow.artifacts.log_reestimation_reference.")
    doc = json.loads(cal_path.read_text())
    with np.load(ref_path, allow_pickle=False) as ref:
        holdout_logits, holdout_labels = ref["logits"], ref["labels"]
    return load_calibrator(doc["calibrator"] if "calibrator" in doc else doc), holdout_logits, holdout_labels


def bundle_from_files(model_uri: str, name: str, alias: str | None, mv, files: VersionFiles, *,
                      calibrator: str, key: tuple) -> ModelBundle:
    """The PyTorch model of version ``mv``, its calibrator and source holdout, loaded from ``files`` (downloaded and
    checked by :func:`labelshift_mlflow.trusted.trusted_files`), cached under ``key``."""
    import mlflow.pytorch
    import torch

    t0 = time.perf_counter()
    cal, holdout_logits, holdout_labels = _reference_files(model_uri, mv, files, calibrator)
    input_shape = _input_shape(model_uri, files.model_dir)
    model = mlflow.pytorch.load_model(str(files.model_dir), map_location="cpu")
    files.keep = True           # the corrected model copies these checked files, not a second download
    with torch.no_grad():
        probe = model(torch.zeros((2, *input_shape), dtype=torch.float32))
    n_classes = int(probe.shape[-1])
    cal_k = getattr(cal, "n_classes_", None)
    if cal_k is not None and int(cal_k) != n_classes:
        raise InputError(f"calibrator {calibrator_artifact(calibrator)} of {model_uri} is for {cal_k} classes but the "
                         f"model outputs {n_classes}; log the calibrator fit on this model's outputs.")
    if holdout_logits.ndim != 2 or holdout_logits.shape[1] != n_classes or len(holdout_labels) != len(holdout_logits):
        raise InputError(f"{REFERENCE_ARTIFACT} of {model_uri} holds logits of shape {holdout_logits.shape} and "
                         f"{len(holdout_labels)} labels, but the model outputs {n_classes} classes; log the holdout "
                         "of this model.")
    source_probs = cal.predict_proba(holdout_logits.astype(np.float64))
    bundle = ModelBundle(uri=model_uri, name=name, version=str(mv.version), alias=alias, run_id=mv.run_id,
                         input_shape=input_shape, n_classes=n_classes, calibrator_name=calibrator, calibrator=cal,
                         source_probs=source_probs, source_labels=holdout_labels.astype(np.int64), model=model,
                         load_seconds=time.perf_counter() - t0, source_outputs=holdout_logits.astype(np.float64),
                         digest=files.digest, model_dir=str(files.model_dir))
    with _BUNDLES_LOCK:
        _BUNDLES[key] = bundle
    return bundle
