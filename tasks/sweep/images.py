"""Prefect tasks of the image experiments: dataset in the store, training, predictions, calibration, estimation.

Store layout, under ``models/<key>/`` (:func:`model_key`): ``checkpoint.pt``, ``logits_valid.npy`` and
``logits_test.npy``, ``calibration/<NAME>.json``, and ``meta.json`` written *last*: its presence marks a complete
cache entry. The key is a SHA-256 of the dataset fingerprint, the architecture, the training settings, the model
seed and the training subset, so a rerun with the same inputs (against any Prefect server) skips the training.

MLflow: each (dataset, model seed) gets a training run nested under the sweep's parent run (per-epoch metrics,
test accuracy, calibration metrics and calibrators, ``labelshift.cache = hit|miss``); a newly trained model is
registered as ``labelshift-<dataset>`` with the alias ``newest`` and, from the accuracy threshold, ``latest-good``.
With CUDA the flow tags :func:`train_model` ``gpu`` under a tag concurrency limit (:func:`ensure_gpu_limit`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import time

import numpy as np
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from labelshift.calibration import BCTS, NBVS, TS, VS, expected_calibration_error, nll, softmax
from labelshift.experiments.datasets import DATASETS, dataset_fingerprint, push_dataset, read_manifest
from labelshift.errors import InputError, ObjectNotFoundError
from labelshift.experiments import images
from labelshift.storage import open_store

from ..tracking import one_line, registry_refused
from .estimation import settings_run_name

__all__ = ["CALIBRATORS", "CACHE_VERSION", "dataset_prefix", "model_key", "training_config", "ensure_dataset",
           "ensure_gpu_limit", "train_model", "predict_pools", "calibrate", "estimate_image_settings",
           "registered_model_name", "report_progress"]

#: calibrators that can be asked for (the sweep's MLLS uses the first one asked for)
CALIBRATORS = {"BCTS": BCTS, "TS": TS, "VS": VS, "NBVS": NBVS}
#: bump to invalidate every cached model (e.g. when the training code changes what it produces)
CACHE_VERSION = 1
#: alias set on every newly registered model; ``GOOD_ALIAS`` only when the test accuracy reaches the threshold
LATEST_ALIAS = "newest"   # "latest" is reserved by MLflow
GOOD_ALIAS = "latest-good"
#: images in the example batch the registered model is traced on
EXAMPLE_BATCH = 8
#: progress lines of the long steps (each training epoch, each estimation task); the CLI prints this logger
progress = logging.getLogger("labelshift.progress")


def report_progress(message: str) -> None:
    """A progress line: to the CLI's logger and to the Prefect run's log (when in a run)."""
    progress.info(message)
    try:
        get_run_logger().info(message)
    except Exception:                       # outside a run context
        pass


def dataset_prefix(name: str) -> str:
    """Where the flow reads dataset ``name`` in the store."""
    return f"datasets/{name}"


def registered_model_name(dataset: str) -> str:
    return f"labelshift-{dataset}"


def training_config(dataset: str, epochs: int | None = None, network: str | None = None) -> dict:
    """Architecture and training settings of ``dataset`` (from :data:`labelshift.experiments.training.TRAINING_DEFAULTS`),
    with optional epochs and network (``lenet``, ``resnet18``) overrides."""
    from labelshift.experiments.training import training_defaults

    cfg = training_defaults(dataset)
    if epochs is not None:
        cfg["epochs"] = int(epochs)
    spec = DATASETS.get(dataset)
    return {"model": network or (spec.model if spec else "lenet"), "train": cfg}


def model_key(fingerprint: str, config: dict, model_seed: int, train_limit: int | None) -> str:
    """The cache key of a trained model: a SHA-256 (first 24 hex digits) of everything that determines it."""
    ident = {"v": CACHE_VERSION, "dataset": fingerprint, "config": config, "seed": int(model_seed),
             "train_limit": None if train_limit is None else int(train_limit)}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]


@task(name="ensure-dataset", task_run_name="dataset-{name}", cache_policy=NO_CACHE, persist_result=False)
def ensure_dataset(store_uri: str, name: str, prefix: str | None = None) -> dict:
    """The manifest of dataset ``name`` at ``prefix`` in the store; pushes the offline datasets (mnist-5k, digits)
    when they are missing. MNIST and CIFAR-10 must be pushed first (``labelshift data push``)."""
    store = open_store(store_uri)
    prefix = dataset_prefix(name) if prefix is None else prefix
    try:
        return read_manifest(store, prefix, expected_name=name)
    except ObjectNotFoundError:
        spec = DATASETS.get(name)
        if spec is None or not spec.offline:
            raise ObjectNotFoundError(
                f"dataset {name!r} is not in the store at {store.url(prefix)}; push it first: "
                f"`labelshift data push {name} --to {store.url(prefix)} --from DIR` (a folder with the standard "
                f"files) or `... --download` where there is internet.") from None
        return push_dataset(name, store, prefix)


def ensure_gpu_limit(slots: int) -> None:
    """Create the Prefect tag concurrency limit ``gpu`` with ``slots`` slots unless one exists (best effort)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        try:
            client.read_concurrency_limit_by_tag("gpu")
            return
        except Exception:
            pass
        client.create_concurrency_limit(tag="gpu", concurrency_limit=int(slots))


def _subset(y: np.ndarray, limit: int | None, seed: int) -> np.ndarray:
    """Indices of a class-stratified random subset of ``limit`` examples (all indices when None)."""
    if limit is None or limit >= len(y):
        return np.arange(len(y))
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5B5]))
    order = rng.permutation(len(y))
    # round-robin over classes in random order, so every class is represented
    by_class = [order[y[order] == c] for c in np.unique(y)]
    picked = [ix[i] for i in range(max(map(len, by_class))) for ix in by_class if i < len(ix)]
    return np.sort(np.asarray(picked[:limit]))


def _log_metrics(client: MlflowClient, run_id: str, values: dict, step: int = 0) -> None:
    now = int(time.time() * 1000)
    metrics = [Metric(k, float(v), now, step) for k, v in values.items()
               if v is not None and np.isfinite(float(v))]
    if metrics:
        client.log_batch(run_id, metrics=metrics)


def _train_and_store(client: MlflowClient, run_id: str, store, ds, dataset: str, config: dict, key: str,
                     mprefix: str, manifest: dict, model_seed: int, train_limit: int | None):
    """Train the network, logging the epochs to ``run_id``; store its checkpoint and logits under ``mprefix``.
    Returns (the model on the CPU, its meta)."""
    from labelshift.experiments.models import build_model_for
    from labelshift.experiments.training import accuracy, checkpoint_bytes, predict_logits, resolve_device, train

    rows = _subset(ds.train.y, train_limit, model_seed)
    device = resolve_device(None)
    params = {"model": config["model"], "model_seed": model_seed, "train_size": len(rows),
              "device": device.type, "dataset_fingerprint": dataset_fingerprint(manifest)[:16],
              **{f"train.{k}": v for k, v in config["train"].items()}}
    client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])
    model = build_model_for(ds, config["model"], seed=model_seed)

    def on_epoch(epoch: int, m: dict) -> None:
        _log_metrics(client, run_id, {k: m[k] for k in ("train_loss", "train_accuracy", "valid_loss",
                                                         "valid_accuracy", "lr", "seconds") if k in m},
                     step=epoch)
        report_progress(f"train {dataset} seed {model_seed}: epoch {epoch}/{config['train']['epochs']}, train loss "
                  f"{m['train_loss']:.4f}, valid accuracy {m.get('valid_accuracy', float('nan')):.4f} "
                  f"({m['seconds']:.0f} s)")

    t0 = time.perf_counter()
    result = train(model, ds.train.x[rows], ds.train.y[rows], seed=model_seed, device=device,
                   valid=(ds.valid.x, ds.valid.y), on_epoch=on_epoch, **config["train"])
    train_seconds = time.perf_counter() - t0
    model = result.model.to("cpu")
    logits_valid = predict_logits(model, ds.valid.x, device="cpu")
    logits_test = predict_logits(model, ds.test.x, device="cpu")
    meta = {"key": key, "store_prefix": mprefix, "dataset": dataset, "model_seed": int(model_seed),
            "config": config, "train_limit": train_limit, "train_size": int(len(rows)),
            "test_accuracy": accuracy(logits_test, ds.test.y),
            "valid_accuracy": accuracy(logits_valid, ds.valid.y), "device": device.type,
            "train_seconds": train_seconds, "epochs_run": len(result.history)}
    _log_metrics(client, run_id, {"test_accuracy": meta["test_accuracy"], "train_seconds": train_seconds})
    store.put_bytes(f"{mprefix}/checkpoint.pt", checkpoint_bytes(model, meta))
    store.put_array(f"{mprefix}/logits_valid.npy", logits_valid)
    store.put_array(f"{mprefix}/logits_test.npy", logits_test)
    return model, meta


def _register(client: MlflowClient, run_id: str, tracking_uri: str, model, ds, dataset: str, meta: dict,
              good_accuracy: float) -> bool:
    """Log the model to its training run and register it (name, version and URI into ``meta``); where the server
    refuses this user registrations, the model stays logged, the run tagged ``labelshift.registration``. Returns
    whether it was registered."""
    import mlflow.exceptions

    name = registered_model_name(dataset)
    try:
        _log_and_register(client, run_id, tracking_uri, model, ds, name, meta, good_accuracy)
        return True
    except mlflow.exceptions.MlflowException as exc:
        if not registry_refused(exc):
            raise
        # the workers' role of the container stack: the model stays logged in its run, the sweep goes on; the
        # store keeps no cache entry, so that the operator's own run of the sweep trains and registers it
        why = one_line(exc)
        client.set_tag(run_id, "labelshift.registration", f"refused: {why}")
        report_progress(f"{name}: not registered (this MLflow user may not register models: {why}); the model stays "
                  f"logged in run {run_id} and is not cached: the operator's run of this sweep trains and "
                  "registers it (infra/README.md, 'Who may do what')")
        return False


def _log_and_register(client: MlflowClient, run_id: str, tracking_uri: str, model, ds, name: str, meta: dict,
                      good_accuracy: float) -> None:
    import mlflow
    import torch

    mlflow.set_tracking_uri(tracking_uri)
    # MLflow 3 stores PyTorch models as torch.export programs ("pt2"), traced on an example batch: the
    # first EXAMPLE_BATCH valid images scaled to [0, 1], the input the network expects
    example = ds.valid.x[:EXAMPLE_BATCH].astype(np.float32) / 255.0
    example = example[:, None] if example.ndim == 3 else example
    with mlflow.start_run(run_id=run_id):
        info = mlflow.pytorch.log_model(model, name="model", registered_model_name=name,
                                        input_example=example, serialization_format="pt2",
                                        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
                                        await_registration_for=60)
    version = str(info.registered_model_version)
    client.set_registered_model_alias(name, LATEST_ALIAS, version)
    if meta["test_accuracy"] >= good_accuracy:
        client.set_registered_model_alias(name, GOOD_ALIAS, version)
    meta.update(registered_model=name, version=version, model_uri=info.model_uri)


@task(name="train-model", task_run_name="train-{dataset}-seed{model_seed}", cache_policy=NO_CACHE,
      persist_result=False)
def train_model(store_uri: str, dataset: str, model_seed: int, *, tracking_uri: str, experiment_id: str,
                parent_run_id: str | None = None, epochs: int | None = None, train_limit: int | None = None,
                good_accuracy: float = 0.9, register: bool = True, network: str | None = None) -> dict:
    """Train (or find in the store) the network of ``dataset`` (or ``network``) with ``model_seed``; returns its meta
    (as stored, with ``cached`` and ``run_id``, this call's MLflow training run)."""
    from labelshift.experiments.datasets import load_dataset

    store = open_store(store_uri)
    prefix = dataset_prefix(dataset)
    manifest = read_manifest(store, prefix, expected_name=dataset)
    config = training_config(dataset, epochs, network)
    key = model_key(dataset_fingerprint(manifest), config, model_seed, train_limit)
    mprefix = f"models/{key}"
    client = MlflowClient(tracking_uri=tracking_uri)
    tags = {"labelshift.kind": "training", "dataset": dataset, "model_seed": str(model_seed),
            "labelshift.model_key": key, "labelshift.model_store": store.url(mprefix)}
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    run_id = client.create_run(experiment_id, run_name=f"train-{dataset}-seed{model_seed}", tags=tags).info.run_id
    try:
        if store.exists(f"{mprefix}/meta.json"):
            meta = store.get_json(f"{mprefix}/meta.json")
            client.set_tag(run_id, "labelshift.cache", "hit")
            _log_metrics(client, run_id, {"test_accuracy": meta["test_accuracy"],
                                          "valid_accuracy": meta["valid_accuracy"]})
            client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
            return dict(meta, cached=True, run_id=run_id)

        client.set_tag(run_id, "labelshift.cache", "miss")
        ds = load_dataset(store, prefix, expected_name=dataset)
        model, meta = _train_and_store(client, run_id, store, ds, dataset, config, key, mprefix, manifest,
                                       model_seed, train_limit)
        if not register or _register(client, run_id, tracking_uri, model, ds, dataset, meta, good_accuracy):
            store.put_json(f"{mprefix}/meta.json", meta)   # last: marks the cache entry complete
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
        return dict(meta, cached=False, run_id=run_id)
    except BaseException as exc:
        try:
            client.set_tag(run_id, "error", f"{type(exc).__name__}: {exc}"[:5000])
            client.set_terminated(run_id, "FAILED")
        except Exception:
            pass
        raise


@task(name="predict", task_run_name="predict-{meta[dataset]}-seed{meta[model_seed]}", cache_policy=NO_CACHE,
      persist_result=False)
def predict_pools(store_uri: str, meta: dict) -> dict:
    """Logits and labels of the valid and test pools for a trained model: read from the store where the training
    stored them, else computed once from the checkpoint and stored."""
    from labelshift.experiments.datasets import load_dataset

    store = open_store(store_uri)
    mprefix = meta["store_prefix"]
    ds = load_dataset(store, dataset_prefix(meta["dataset"]), expected_name=meta["dataset"],
                      splits=("valid", "test"))
    out = {"valid_y": ds.valid.y, "test_y": ds.test.y}
    for pool in ("valid", "test"):
        key = f"{mprefix}/logits_{pool}.npy"
        if store.exists(key):
            out[f"logits_{pool}"] = store.get_array(key)
            continue
        from labelshift.experiments.training import load_checkpoint, predict_logits

        model, _ = load_checkpoint(store.get_bytes(f"{mprefix}/checkpoint.pt"))
        out[f"logits_{pool}"] = predict_logits(model, ds.split(pool).x)
        store.put_array(key, out[f"logits_{pool}"])
    return out


def _registered_run(client: MlflowClient, meta: dict) -> str | None:
    """The source run of the model version a cached model was registered as (None when not registered)."""
    if not meta.get("registered_model") or not meta.get("version"):
        return None
    try:
        return client.get_model_version(meta["registered_model"], str(meta["version"])).run_id
    except Exception:           # the version was deleted from the registry meanwhile: nothing to complete
        return None


def _has_artifact(client: MlflowClient, run_id: str, path: str) -> bool:
    folder = path.rsplit("/", 1)[0]
    try:
        return any(a.path == path for a in client.list_artifacts(run_id, folder))
    except Exception:
        return False


@task(name="calibrate", task_run_name="calibrate-{meta[dataset]}-seed{meta[model_seed]}", cache_policy=NO_CACHE,
      persist_result=False)
def calibrate(store_uri: str, meta: dict, outputs: dict, calibrators: list[str], *, tracking_uri: str) \
        -> images.Pools:
    """Fit each calibrator on the valid logits; save it as JSON (store and MLflow) with NLL and ECE before and
    after; the sweep's :class:`~labelshift.experiments.images.Pools` (the first calibrator's, every one's in
    ``Pools.calibrated``)."""
    if not calibrators:
        raise InputError("calibrators is empty; ask for at least one of " + ", ".join(CALIBRATORS))
    unknown = [c for c in calibrators if c not in CALIBRATORS]
    if unknown:
        raise InputError(f"unknown calibrator(s) {unknown}; choose from {', '.join(CALIBRATORS)}.")
    store = open_store(store_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    run_id = meta["run_id"]
    lv, lt = outputs["logits_valid"].astype(np.float64), outputs["logits_test"].astype(np.float64)
    yv, yt = outputs["valid_y"], outputs["test_y"]
    raw_v, raw_t = softmax(lv), softmax(lt)
    # a model found in the cache was registered by an earlier run: what re-estimation needs also goes to that run,
    # the source run of the registered version, when it lacks it (models registered before it was logged there)
    runs = [run_id]
    registered_run = _registered_run(client, meta)
    if registered_run and registered_run != run_id and not _has_artifact(client, registered_run,
                                                                         "calibration/source_holdout.npz"):
        runs.append(registered_run)
    first, calibrated = None, {}
    for name in calibrators:
        cal = CALIBRATORS[name](input_kind="logits").fit(lv, yv)
        pv, pt = cal.predict_proba(lv), cal.predict_proba(lt)
        scores = {f"{pool}_{metric}_{when}": fn(probs, y)
                  for pool, raw, cal_p, y in (("valid", raw_v, pv, yv), ("test", raw_t, pt, yt))
                  for metric, fn in (("nll", nll), ("ece", expected_calibration_error))
                  for when, probs in (("before", raw), ("after", cal_p))}
        doc = {"calibrator": cal.to_dict(), "metrics": scores, "model_key": meta["key"]}
        text = json.dumps(doc, indent=1, allow_nan=False)
        store.put_bytes(f"{meta['store_prefix']}/calibration/{name}.json", text.encode(),
                        content_type="application/json")
        for target_run in runs:
            client.log_text(target_run, text, f"calibration/{name}.json")
        _log_metrics(client, run_id, {f"calibration/{name}/{k}": v for k, v in scores.items()})
        calibrated[name] = (pv, pt)
        if first is None:
            first = (name, pv, pt)
    # the labelled source holdout the calibrators were fit on, for re-estimation with the registered model
    from labelshift_mlflow.artifacts import log_source_holdout

    for target_run in runs:
        log_source_holdout(client, target_run, outputs["logits_valid"], yv)
    if registered_run in runs:          # what belongs to the version is complete: record its digest
        from labelshift_mlflow.trusted import record_digest

        record_digest(client, meta["registered_model"], str(meta["version"]))
    name, pv, pt = first
    return images.Pools(valid_raw=raw_v, valid_cal=pv, valid_y=yv, test_raw=raw_t, test_cal=pt, test_y=yt,
                        fingerprint=f"{meta['key']}/{name}", calibrated=calibrated)


@task(name="estimate-images", task_run_name=settings_run_name, cache_policy=NO_CACHE, persist_result=False)
def estimate_image_settings(settings: list, seeds: list[int], methods: list[str], pools: list, *,
                            base_seed: int) -> list:
    """For each setting: draw the seeds' Dirichlet-shifted target sets from the test pool, estimate w with every
    method, score the MSE (:func:`labelshift.experiments.images.run_setting`); a progress line when done."""
    t0 = time.perf_counter()
    out = [images.run_setting(s, seeds, pools, methods, base_seed=base_seed) for s in settings]
    values = ", ".join(f"{s.value:g}" for s in settings)
    report_progress(f"estimated {settings[0].kind} = {values}: {len(seeds)} seeds x {len(methods)} methods "
              f"({time.perf_counter() - t0:.1f} s)")
    return out
