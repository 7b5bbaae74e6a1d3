"""Prefect tasks of scheduled re-estimation: load the registered model with its calibrator and labelled source
holdout, score the target batches, assess the shift (:func:`labelshift.inference.report.assess_shift`), log to MLflow
and write the outputs.

A registered model can be re-estimated when its source run holds ``calibration/<CALIBRATOR>.json`` and
:data:`REFERENCE_ARTIFACT` (``logits`` and ``labels`` of the labelled source holdout), as
:func:`log_reestimation_reference` writes them. MLflow: one monitor run per (model, target) whose series is the
prior over time, and under it one child run per re-estimation (:func:`prior_metrics`, the figure, the summary
JSON). Both layouts are described in ``docs/reestimation.md``.
"""
from __future__ import annotations

import io
import logging
import json
import math
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus
from prefect import task
from prefect.cache_policies import NO_CACHE

from labelshift.monitoring.batches import metric_names
from labelshift.calibration import load_calibrator
from labelshift.estimation.diagnostics import correct_predictions
from labelshift.errors import FormatError, InputError, ObjectNotFoundError, ServiceUnavailableError
from labelshift.monitoring.layout import RejectedBatch, TargetBatch
from labelshift.monitoring.outputs import write_batch_outputs
from labelshift.figures import figure_png, plot_prior_estimate
from labelshift.inference.report import ShiftReport, Verdict, assess_shift, finite
from labelshift.inference.settings import DEFAULTS
from labelshift.rows import joined
from labelshift.storage import open_store
from tasks import tracking

__all__ = ["REFERENCE_ARTIFACT", "ModelBundle", "parse_model_uri", "log_reestimation_reference", "load_bundle",
           "holdout_arguments",
           "ScoredBatches", "log_rejections", "log_source_holdout", "estimate_shift", "write_outputs",
           "start_reestimation_run", "log_reestimation", "sync_monitor", "end_run", "prior_metrics", "history_record",
           "render_figure"]

REFERENCE_ARTIFACT = "calibration/source_holdout.npz"
MONITOR_KIND = "monitor"
_MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))$")


def calibrator_artifact(name: str) -> str:
    return f"calibration/{name}.json"


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/NAME@ALIAS`` -> (NAME, ALIAS, None); ``models:/NAME/VERSION`` -> (NAME, None, VERSION)."""
    match = _MODEL_URI.match(uri.strip()) if isinstance(uri, str) else None
    if not match:
        raise InputError(f"model must be a registered-model URI 'models:/NAME@ALIAS' or 'models:/NAME/VERSION', got "
                         f"{uri!r} (e.g. models:/labelshift-mnist-5k@latest-good).")
    return match["name"], match["alias"], match["version"]


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

    @property
    def source_prior(self) -> np.ndarray:
        """p_s(y): the mean calibrated prediction on the source holdout, the prior the calibrated predictor is
        consistent with (so that W and the EM step of MLLS agree with f). It equals the holdout's label
        frequencies for BCTS and VS, not always for TS and NBVS; ``docs/reestimation.md``."""
        prior = self.source_probs.mean(axis=0)
        return prior / prior.sum()

    def describe(self) -> dict:
        return {"uri": self.uri, "name": self.name, "version": self.version, "alias": self.alias,
                "run_id": self.run_id, "input_shape": list(self.input_shape), "n_classes": self.n_classes,
                "calibrator": self.calibrator_name, "n_source": int(len(self.source_labels))}


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
        return ObjectNotFoundError(
            f"no registered model {name!r} in the MLflow registry ({client.tracking_uri}); registered: "
            f"{', '.join(names) or 'none'}. Train one with `labelshift reproduce --dataset mnist-5k --tracking-uri "
            f"{client.tracking_uri}` (registers labelshift-mnist-5k; or run the reproduce-images deployment) or "
            "register yours with mlflow.pytorch.log_model(..., registered_model_name=...).")
    if alias is not None:
        aliases = sorted(getattr(registered, "aliases", {}) or {})
        return ObjectNotFoundError(
            f"registered model {name!r} has no alias {alias!r} (its aliases: {', '.join(aliases) or 'none'}). Use "
            f"one of them, models:/{name}/VERSION, or set it: MlflowClient().set_registered_model_alias({name!r}, "
            f"{alias!r}, VERSION).")
    return ObjectNotFoundError(f"registered model {name!r} has no version {version} ({exc}).")


def _input_shape(model_uri: str) -> tuple[int, ...]:
    import mlflow

    info = mlflow.models.get_model_info(model_uri)
    sig = info.signature
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


def load_bundle(model_uri: str, *, tracking_uri: str, calibrator: str = "BCTS") -> ModelBundle:
    """Resolve ``model_uri`` in the registry and load the model, its calibrator and the source holdout.

    Bundles are cached in this process by (tracking URI, name, version, calibrator): a served deployment loads a
    model version once. Raises ObjectNotFoundError (no such model / alias / artifact), InputError (a calibrator or
    holdout for a different number of classes than the model's), ServiceUnavailableError (MLflow unreachable).
    """
    import mlflow

    client = MlflowClient(tracking_uri=tracking_uri)
    name, alias, mv = resolve_version(client, model_uri, tracking_uri)
    key = (tracking_uri, name, str(mv.version), calibrator)
    with _BUNDLES_LOCK:
        if key in _BUNDLES:
            bundle = _BUNDLES[key]
            return ModelBundle(**{**bundle.__dict__, "uri": model_uri, "alias": alias})
    t0 = time.perf_counter()
    if not mv.run_id:
        raise FormatError(f"{model_uri} (version {mv.version}) has no source run, so no calibrator beside it; "
                          "log the model from a run that also logs calibration/<NAME>.json and "
                          f"{REFERENCE_ARTIFACT} (tasks.reestimation.log_reestimation_reference).")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            cal_path = client.download_artifacts(mv.run_id, calibrator_artifact(calibrator), tmp)
        except Exception:
            try:
                present = [a.path for a in client.list_artifacts(mv.run_id, "calibration")]
            except Exception:
                present = []
            raise ObjectNotFoundError(
                f"{model_uri} (version {mv.version}, run {mv.run_id}) has no calibrator "
                f"{calibrator_artifact(calibrator)}; found: {', '.join(present) or 'nothing under calibration/'}. "
                "Pick one that exists (--calibrator) or log it with tasks.reestimation.log_reestimation_reference."
            ) from None
        try:
            ref_path = client.download_artifacts(mv.run_id, REFERENCE_ARTIFACT, tmp)
        except Exception:
            raise ObjectNotFoundError(
                f"{model_uri} (version {mv.version}, run {mv.run_id}) has no {REFERENCE_ARTIFACT} (the labelled "
                "source holdout MLLS and BBSE are fit on). Models trained by this version of `labelshift "
                "reproduce` carry it: rerun `labelshift reproduce --dataset DATASET` (a cached model is not retrained; the "
                "holdout is added to its run); for other models log it with "
                "tasks.reestimation.log_reestimation_reference.") \
                from None
        doc = json.loads(Path(cal_path).read_text())
        with np.load(ref_path, allow_pickle=False) as ref:
            holdout_logits, holdout_labels = ref["logits"], ref["labels"]
    cal = load_calibrator(doc["calibrator"] if "calibrator" in doc else doc)
    version_uri = f"models:/{name}/{mv.version}"
    input_shape = _input_shape(version_uri)
    model = mlflow.pytorch.load_model(version_uri, map_location="cpu")
    import torch

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
                         load_seconds=time.perf_counter() - t0, source_outputs=holdout_logits.astype(np.float64))
    with _BUNDLES_LOCK:
        _BUNDLES[key] = bundle
    return bundle


def _forward(model, x: np.ndarray, batch_size: int) -> np.ndarray:
    import torch

    out = []
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            out.append(model(torch.from_numpy(np.ascontiguousarray(x[i:i + batch_size]))).float().numpy())
    return np.concatenate(out).astype(np.float64)


@dataclass
class ScoredBatches:
    """What scoring made of the new batches: the good ones with their probabilities (and the raw outputs those came
    from, float32, batch by batch like ``probs``), those that failed their checks (rejected, with the reason) and
    those gone or replaced since the listing (skipped: the next run lists them afresh)."""

    batches: list[TargetBatch]
    probs: list[np.ndarray]
    rejected: list[RejectedBatch] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    outputs: list[np.ndarray] = field(default_factory=list)


@task(name="estimate-shift", cache_policy=NO_CACHE, persist_result=False)
def estimate_shift(bundle: ModelBundle, probs: list[np.ndarray], *, estimator: str = DEFAULTS.estimator,
                   cross_check: list[str] = DEFAULTS.cross_check, interval: str = DEFAULTS.interval,
                   level: float = DEFAULTS.level, significance: float = DEFAULTS.significance,
                   n_bootstrap: int = DEFAULTS.n_bootstrap, seed: int = DEFAULTS.seed,
                   max_interval_width: float | None = DEFAULTS.max_interval_width,
                   outputs: list[np.ndarray] | None = None, class_names=None,
                   label_shift_significance: float | None = DEFAULTS.label_shift_significance,
                   prepared_holdout=None) -> ShiftReport:
    """:func:`labelshift.inference.report.assess_shift` on the pooled batches, with the bundle's source holdout and
    prior (and, for the source-aware interval, the raw holdout outputs, the calibrator and the raw target
    ``outputs``); the batches are pooled without a copy when they are views of one array
    (:func:`labelshift.rows.joined`). The defaults are :data:`labelshift.inference.settings.DEFAULTS`;
    ``prepared_holdout``: the label-shift test's work on the holdout, made once for many calls (the segments)."""
    return assess_shift(target_probs=joined(probs), **holdout_arguments(bundle),
                        estimator=estimator, cross_check=cross_check, interval=interval, level=level,
                        significance=significance, n_bootstrap=n_bootstrap, seed=seed,
                        max_interval_width=max_interval_width,
                        target_outputs=None if outputs is None else joined(outputs),
                        class_names=class_names, label_shift_significance=label_shift_significance,
                        prepared_holdout=prepared_holdout)


def holdout_arguments(bundle: ModelBundle) -> dict:
    """The keyword arguments of :func:`~labelshift.inference.report.assess_shift` that the bundle gives: its source
    holdout (calibrated and raw outputs, labels), prior and calibrator."""
    return {"source_probs": bundle.source_probs, "source_labels": bundle.source_labels,
            "source_prior": bundle.source_prior, "source_outputs": bundle.source_outputs,
            "calibrator": bundle.calibrator}


@task(name="write-outputs", cache_policy=NO_CACHE, persist_result=False)
def write_outputs(target_uri: str, batches: list[TargetBatch], probs: list[np.ndarray], weights: list[float],
                  summary: dict) -> list[str]:
    """Corrected predictions p_t(y|x) proportional to w_y f_y(x) (Saerens et al. 2002) beside each batch, then its
    summary JSON; each write atomic. Returns the URIs of the corrected arrays."""
    store = open_store(target_uri)
    urls = []
    for b, p in zip(batches, probs):
        corrected = correct_predictions(p, np.asarray(weights)).astype(np.float32)
        batch_summary = dict(summary, batch={"key": b.key, "checksum": b.checksum, "rows": int(len(p)),
                                             "corrected": store.url(b.corrected_key)})
        write_batch_outputs(store, b, corrected, batch_summary)
        urls.append(store.url(b.corrected_key))
    return urls


# -- MLflow ----------------------------------------------------------------------------------------------------------
def _monitor_run(client: MlflowClient, experiment_id: str, model_name: str, target_url: str) -> str:
    """The monitor run of (model, target): found by its tags, else created (and ended at once: it only collects
    the series; logging to an ended run is allowed)."""
    target_tag = target_url.replace("'", "")
    found = client.search_runs([experiment_id], filter_string=(
        f"tags.`labelshift.kind` = '{MONITOR_KIND}' and tags.`labelshift.model` = '{model_name}' and "
        f"tags.`labelshift.target` = '{target_tag}'"), max_results=1, order_by=["attributes.start_time ASC"])
    if found:
        return found[0].info.run_id
    run = client.create_run(experiment_id, run_name=f"monitor-{model_name}", tags={
        "labelshift.kind": MONITOR_KIND, "labelshift.model": model_name, "labelshift.target": target_tag,
        "mlflow.note.content": f"Target prior of {model_name} on {target_url} over time: one point per successful "
                               "re-estimation (step = run sequence). Each re-estimation is a child run."})
    client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.FINISHED))
    return run.info.run_id


#: tag of a re-estimation child run naming the process that runs it: ``host/pid/start time``
OWNER_TAG = "labelshift.owner"


def _owner(pid: int | None = None) -> str:
    import os
    import socket

    import psutil

    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}/{pid}/{psutil.Process(pid).create_time():.2f}"


def _owner_gone(owner: str) -> bool:
    """True when ``owner`` (see :func:`_owner`) names a process of this host that no longer runs."""
    import socket

    import psutil

    try:
        host, pid, started = owner.rsplit("/", 2)
        pid_i, started_f = int(pid), float(started)
    except ValueError:
        return False
    if host != socket.gethostname():
        return False                    # another machine's process: cannot tell, leave it
    try:
        return abs(psutil.Process(pid_i).create_time() - started_f) > 1.0     # the pid now names another process
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def end_orphaned_runs(client: MlflowClient, experiment_id: str, monitor_run_id: str,
                      committed: frozenset | set = frozenset()) -> list[str]:
    """End the child runs of ``monitor_run_id`` still RUNNING whose process, on this host, is gone (a command
    killed outright cannot end its own run); returns their ids. Such a run is ended FINISHED when its id is in
    ``committed`` (the runs the watermark's history counts: it was killed after its commit, so its batches are
    counted and its outputs written), else KILLED. Runs of live processes and of other hosts are left alone, and a
    failure here never fails the caller."""
    ended = []
    try:
        runs = client.search_runs([experiment_id], filter_string=f"tags.mlflow.parentRunId = '{monitor_run_id}' "
                                                                 "and attributes.status = 'RUNNING'", max_results=200)
        for run in runs:
            owner = run.data.tags.get(OWNER_TAG)
            if owner and _owner_gone(owner):
                done = run.info.run_id in committed
                client.set_tag(run.info.run_id, "labelshift.ended_by",
                               "the next re-estimation: the process that ran it was killed "
                               + ("after its commit, before it could end it" if done else "before it could end it"))
                client.set_terminated(run.info.run_id, status="FINISHED" if done else "KILLED")
                ended.append(run.info.run_id)
    except Exception as exc:                                    # bookkeeping only
        logging.getLogger(__name__).warning("could not check for orphaned MLflow runs: %s", exc)
    return ended


def catch_up_monitor(tracking_uri: str, experiment: str, model_name: str, target_url: str, history: list[dict]) \
        -> None:
    """Bookkeeping a run with no new data still owes: the monitor points of committed runs whose own logging was
    cut short (a command killed, or MLflow down, after its commit) and their child runs ended FINISHED
    (:func:`sync_monitor`); child runs of killed commands that never committed ended KILLED
    (:func:`end_orphaned_runs`). Creates nothing when the experiment or the monitor run does not exist yet."""
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return
    target_tag = target_url.replace("'", "")
    found = client.search_runs([exp.experiment_id], filter_string=(
        f"tags.`labelshift.kind` = '{MONITOR_KIND}' and tags.`labelshift.model` = '{model_name}' and "
        f"tags.`labelshift.target` = '{target_tag}'"), max_results=1, order_by=["attributes.start_time ASC"])
    if not found:
        return
    monitor = found[0].info.run_id
    sync_monitor(tracking_uri, monitor, history, model_name)
    end_orphaned_runs(client, exp.experiment_id, monitor, _committed(history))


def _committed(history: list[dict]) -> set:
    """The child-run ids the watermark's history counts."""
    return {e["mlflow_run_id"] for e in history if e.get("mlflow_run_id")}


def start_reestimation_run(tracking_uri: str, experiment: str, artifact_root: str | None, *, model_name: str,
                           target_url: str, run_name: str, params: dict, tags: dict,
                           history: list[dict] | None = None) -> dict:
    """Create the child run of this re-estimation (under the monitor run of model and target); child runs of killed
    commands are ended first (:func:`end_orphaned_runs`, FINISHED for those ``history`` counts)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id = tracking.experiment_id(client, experiment, artifact_location=artifact_root, if_deleted="raise")
    monitor = _monitor_run(client, experiment_id, model_name, target_url)
    end_orphaned_runs(client, experiment_id, monitor, _committed(history or []))
    run = client.create_run(experiment_id, run_name=run_name, tags={
        **tags, "mlflow.parentRunId": monitor, "labelshift.kind": "reestimation", "labelshift.model": model_name,
        "labelshift.target": target_url, OWNER_TAG: _owner()})
    client.log_batch(run.info.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
    return {"experiment_id": experiment_id, "run_id": run.info.run_id, "monitor_run_id": monitor}


def _class_keys(k: int, class_names=None) -> list[str]:
    return metric_names(class_names) if class_names else [str(c) for c in range(k)]


def prior_metrics(report: ShiftReport, class_names=None) -> dict[str, float]:
    """The metrics of one re-estimation, by name (per class: ``prior/<c>``, ``prior_lower/<c>``,
    ``prior_upper/<c>``, ``weight/<c>``, ``source_prior/<c>``; the cross-checks' priors; then the test, the
    identifiability numbers, the size; the label-shift test's ``label_shift_statistic``, ``label_shift_p_value``,
    ``label_shift_dof``, ``label_shift_ok`` and its parts ``label_shift_p_value_regions``,
    ``label_shift_p_value_log_odds``, ``label_shift_log_odds_statistic`` when it ran). ``<c>`` is the class name made
    metric-safe (:func:`labelshift.monitoring.batches.metric_names`), the index for unnamed classes. Numbers that are
    not finite are left out."""
    out = {}
    ci = report.interval
    keys = _class_keys(report.n_classes, class_names)
    for c, v in zip(keys, report.target_prior.tolist()):
        out[f"prior/{c}"] = v
        i = keys.index(c)
        out[f"prior_lower/{c}"] = ci.lower[i]
        out[f"prior_upper/{c}"] = ci.upper[i]
        out[f"weight/{c}"] = report.weights[i]
        out[f"source_prior/{c}"] = report.source_prior[i]
    for method, check in report.cross_check.items():
        if check.ok:
            for c, v in zip(keys, check.target_prior.tolist()):
                out[f"cross_check/{method}/prior/{c}"] = v
    test, ident = report.no_shift_test, report.identifiability
    out.update({"no_shift_p_value": test.p_value, "no_shift_statistic": test.statistic,
                "total_variation": report.total_variation, "shifted": float(report.shifted),
                "trustworthy": float(report.trustworthy), "n_target": report.n_target,
                "min_hessian_eigenvalue": ident.min_hessian_eigenvalue,
                "min_free_eigenvalue": ident.min_free_eigenvalue})
    acc = report.accuracy
    if acc is not None:
        out.update({"accuracy_expected": acc.expected, "accuracy_lower": acc.lower, "accuracy_upper": acc.upper,
                    "accuracy_source": acc.source, "accuracy_change": acc.change,
                    "accuracy_corrected": acc.corrected, "accuracy_corrected_lower": acc.corrected_lower,
                    "accuracy_corrected_upper": acc.corrected_upper})
    if report.repeats is not None and report.repeats.repeated_rows:     # rows that repeat: how many, what they weigh
        out.update({"target_distinct_rows": report.repeats.n_distinct,
                    "target_effective_rows": report.repeats.effective_rows})
    if finite(ident.confusion_condition):       # a singular matrix (condition inf) logs neither number
        out["confusion_condition"] = ident.confusion_condition
        out["confusion_sigma_min"] = ident.confusion_sigma_min
    if report.label_shift is not None:
        lst = report.label_shift
        out.update({"label_shift_statistic": lst.statistic, "label_shift_p_value": lst.p_value,
                    "label_shift_dof": lst.dof, "label_shift_ok": float(bool(report.label_shift_ok))})
        for part in ("p_value_regions", "p_value_log_odds", "log_odds_statistic"):
            if part in lst.extra:
                out[f"label_shift_{part}"] = lst.extra[part]
    return {k: float(v) for k, v in out.items() if finite(v)}


def log_reestimation(tracking_uri: str, runs: dict, report: ShiftReport, summary: dict, figure: bytes,
                     step: int, class_names=None) -> None:
    """The child run's metrics (:func:`prior_metrics`, at ``step``), the verdict as the tag ``labelshift.verdict``,
    the figure, the summary JSON and the label-shift test's result (``reestimation/label_shift_test.json``)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, step) for k, v in prior_metrics(report, class_names).items()]
    for i in range(0, len(metrics), 1000):
        client.log_batch(runs["run_id"], metrics=metrics[i:i + 1000])
    client.set_tag(runs["run_id"], "labelshift.verdict", report.verdict)
    client.log_text(runs["run_id"], json.dumps(summary, indent=1, default=str), "reestimation/summary.json")
    if report.label_shift_tested:
        doc = {"ok": report.label_shift_ok, "significance": report.label_shift_level,
               "summary": report.label_shift_summary,
               **(report.label_shift.to_dict() if report.label_shift is not None
                  else {"error": report.label_shift_error})}
        client.log_text(runs["run_id"], json.dumps(doc, indent=1, default=str), "reestimation/label_shift_test.json")
    _log_bytes(client, runs["run_id"], figure, "figures", "target_prior.png")


def log_rejections(tracking_uri: str, run_id: str, rejected: list[dict], summary: dict | None = None) -> None:
    """The batches a run rejected: metric ``n_rejected``, tag ``labelshift.rejected`` (their keys) and, when given,
    the summary JSON (which lists them with their reasons)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    client.log_metric(run_id, "n_rejected", float(len(rejected)))
    if rejected:
        client.set_tag(run_id, "labelshift.rejected", ", ".join(r["key"] for r in rejected)[:5000])
    if summary is not None:
        client.log_text(run_id, json.dumps(summary, indent=1, default=str), "reestimation/summary.json")


def _log_bytes(client: MlflowClient, run_id: str, data: bytes, folder: str, name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        client.log_artifact(run_id, str(path), folder)


#: tag set on a re-estimation's child run once its point is in the monitor run's series
SYNCED_TAG = "labelshift.monitor_synced"
#: how many of the most recent history entries a run checks for points the monitor run is missing
SYNC_LOOKBACK = 30


def sync_monitor(tracking_uri: str, monitor_run_id: str, history: list[dict], model_name: str) -> list[int]:
    """Give the monitor run of (``model_name``, target) one point per successful re-estimation of that model
    (``step`` = the run sequence, the time of the run as timestamp): the prior with its interval, the tests'
    p-values (``no_shift_p_value``, ``label_shift_p_value``); under "Not label shift" only the latter, the size and
    ``label_shift_ok`` = 0.

    The watermark's history is per target, so entries of other models are skipped. An entry's point is logged when
    its child run (``mlflow_run_id``) does not carry :data:`SYNCED_TAG` yet -- the run that just committed, and any
    of the last :data:`SYNC_LOOKBACK` whose own logging failed after their commit -- and the tag is set after it
    (and such a child run still RUNNING, because MLflow was down when it ended, is ended FINISHED).
    (A watermark deleted to start over restarts the sequence at 1; its points then repeat earlier steps, at later
    timestamps.) Returns the sequences added.
    """
    from datetime import datetime

    from mlflow.entities import ViewType

    client = MlflowClient(tracking_uri=tracking_uri)
    entries = [e for e in history[-SYNC_LOOKBACK:] if e.get("sequence") is not None and e.get("mlflow_run_id")
               and e.get("model") == model_name and ("target_prior" in e or "label_shift_p_value" in e)]
    if not entries:
        return []
    # which of their child runs already gave their point: one search (deleted child runs included)
    ids = ", ".join(f"'{e['mlflow_run_id']}'" for e in entries)
    experiment_id = client.get_run(monitor_run_id).info.experiment_id
    synced = {r.info.run_id for r in client.search_runs(
        [experiment_id], filter_string=f"attributes.run_id IN ({ids}) and tags.`{SYNCED_TAG}` = 'true'",
        run_view_type=ViewType.ALL, max_results=len(entries))}
    added = []
    for entry in entries:
        seq, child = entry["sequence"], entry["mlflow_run_id"]
        if child in synced:
            continue
        try:
            stamp = int(datetime.fromisoformat(str(entry.get("time")).replace("Z", "+00:00")).timestamp() * 1000)
        except ValueError:
            stamp = int(time.time() * 1000)
        values = {}
        if "target_prior" in entry:     # none under "Not label shift": that estimate means nothing
            keys = _class_keys(len(entry["target_prior"]), entry.get("classes"))
            for c, key in enumerate(keys):
                values[f"prior/{key}"] = entry["target_prior"][c]
                if "lower" in entry and "upper" in entry:
                    values[f"prior_lower/{key}"] = entry["lower"][c]
                    values[f"prior_upper/{key}"] = entry["upper"][c]
        for key, name in (("p_value", "no_shift_p_value"), ("total_variation", "total_variation"),
                          ("n_target", "n_target"), ("label_shift_p_value", "label_shift_p_value")):
            if entry.get(key) is not None:
                values[name] = entry[key]
        if entry.get("label_shift_ok") is not None:
            values["label_shift_ok"] = float(bool(entry["label_shift_ok"]))
        if entry.get("accuracy"):         # expected, lower, upper, on the source
            values.update(zip(("accuracy_expected", "accuracy_lower", "accuracy_upper", "accuracy_source"),
                              entry["accuracy"]))
        for key in ("shifted", "trustworthy"):
            if key in entry:
                values[key] = float(bool(entry[key]))
        metrics = [Metric(k, float(v), stamp, int(seq)) for k, v in values.items()
                   if v is not None and math.isfinite(float(v))]
        for i in range(0, len(metrics), 1000):
            client.log_batch(monitor_run_id, metrics=metrics[i:i + 1000])
        try:
            client.set_tag(child, SYNCED_TAG, "true")
            # its batches are counted, so it succeeded: a run whose end MLflow missed (the server was down) ends now
            if client.get_run(child).info.status == "RUNNING":
                client.set_terminated(child, "FINISHED")
        except Exception:
            pass
        added.append(int(seq))
    return added


def end_run(tracking_uri: str, run_id: str, status: str = "FINISHED", cause: str | None = None) -> None:
    """End the re-estimation's child run (FINISHED, or FAILED / KILLED with the cause as a tag)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    if cause:
        client.set_tag(run_id, "error", cause[:5000])
    client.set_terminated(run_id, status)


#: how the figure's legend names each interval
INTERVAL_LABELS = {"source-aware": "source-aware (target + holdout error)", "fisher": "Fisher (target only)",
                   "bootstrap": "bootstrap (target only)"}


def render_figure(report: ShiftReport, history: list[dict], level: float, title: str, class_names=None) -> bytes:
    """The estimated prior with its interval against the source prior, the watermark's history beside it (PNG).
    The legend names the interval; under "Not label shift" the title says that the estimate is not meaningful."""
    ci = report.interval
    past = [{"sequence": h["sequence"], "target_prior": h["target_prior"],
             **({"lower": h["lower"], "upper": h["upper"]} if "lower" in h and "upper" in h else {})}
            for h in history if "target_prior" in h]
    if report.verdict == Verdict.NOT_LABEL_SHIFT:
        title = f"{title}\nNot label shift: this estimate is not meaningful"
    return figure_png(plot_prior_estimate(report.source_prior.tolist(), report.target_prior.tolist(),
                                          ci.lower.tolist(), ci.upper.tolist(), level=level, title=title,
                                          class_names=class_names, history=past or None,
                                          interval_label=INTERVAL_LABELS.get(ci.method, ci.method)))


def history_record(report: ShiftReport, run_id: str | None, model_name: str | None = None,
                   class_names=None) -> dict:
    """The watermark's record of one successful re-estimation (small: one is kept per run). The watermark adds
    ``sequence``, ``time``, ``run_id`` and ``batches`` itself
    (:func:`labelshift.monitoring.watermark.commit_watermark`). Under "Not label shift" the record holds no estimate (no
    prior, interval, no-shift p-value: they mean nothing), only the verdict, the size and the label-shift test's
    p-value."""
    lst = report.label_shift
    tested = {"label_shift_p_value": None if lst is None or not finite(lst.p_value) else float(lst.p_value),
              "label_shift_ok": report.label_shift_ok} if report.label_shift_tested else {}
    base = {"model": model_name, "verdict": report.verdict, "n_target": report.n_target, **tested,
            "mlflow_run_id": run_id, **({"classes": list(class_names)} if class_names else {})}
    if report.verdict == Verdict.NOT_LABEL_SHIFT:
        return base
    ci = report.interval
    return {**base, "target_prior": [round(v, 6) for v in report.target_prior.tolist()],
            "lower": [round(v, 6) for v in ci.lower.tolist()], "upper": [round(v, 6) for v in ci.upper.tolist()],
            "interval": ci.method, "p_value": report.no_shift_test.to_dict()["p_value"], "shifted": report.shifted,
            "total_variation": round(report.total_variation, 6), "trustworthy": report.trustworthy,
            **({"accuracy": [round(float(v), 6) for v in (report.accuracy.expected, report.accuracy.lower,
                                                           report.accuracy.upper, report.accuracy.source)]}
               if report.accuracy is not None else {})}
