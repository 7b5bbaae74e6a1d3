"""A corrected model to serve: on a trusted "Shifted" verdict, a new version of an MLflow pyfunc that returns
p_t(y|x) proportional to w_y f_y(x), registered beside the deployed model (docs/serving.md).

The pyfunc (:class:`ShiftCorrectedModel`) holds a copy of the deployed model version (none in prediction-log mode,
where it takes the model's outputs), its calibrator and the weights w; its ``predict`` computes what the
``reestimate`` flow writes beside each batch, with the same scoring and rounding and
:func:`labelshift.estimation.diagnostics.correct_predictions` (Saerens et al. 2002; Garg et al., NeurIPS 2020,
Section 2), so the two agree to float precision. :func:`check_corrected_name` runs before a re-estimation does any
work; :func:`register_if_shifted` after the outputs are written and before the watermark moves.
"""
from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
import warnings

import mlflow
import mlflow.pyfunc
from mlflow import MlflowClient
from prefect import task
from prefect.cache_policies import NO_CACHE

from labelshift.errors import InputError
from labelshift.inference.report import ShiftReport
from labelshift_mlflow.pyfunc import CLASS_COLUMN, ShiftCorrectedModel, calibrated, corrected_frame, load_state
from labelshift_mlflow.registry import parse_model_uri
from tasks.tracking import one_line, registry_refused
from labelshift_mlflow.trusted import record_digest

__all__ = ["KIND", "KIND_TAG", "ALIAS", "CLASS_COLUMN", "ShiftCorrectedModel", "load_state", "corrected_frame",
           "calibrated", "corrected_name", "check_corrected_name", "register_if_shifted", "register_corrected_model"]

#: value of the tag :data:`KIND_TAG` on a registered model (and its versions) made here; a registered model without
#: it is another kind of model, and is never written to
KIND = "shift-corrected"
KIND_TAG = "labelshift.kind"
#: registered-model tag naming the deployed model whose corrections it holds
SOURCE_TAG = "labelshift.source_model"
#: version tag: the digest of the deployed model version's files, as checked when the flow loaded them ("none":
#: the deployed version had no recorded digest); the corrected version's own is labelshift_mlflow.trusted.DIGEST_TAG
SOURCE_DIGEST_TAG = "labelshift.source_digest"
#: the alias that moves to each new version
ALIAS = "shift-corrected"
#: suffix of the default registry name, ``<deployed model's name>-shift-corrected``
NAME_SUFFIX = "-shift-corrected"
#: the artifact path of the model in its logged-model record, and the JSON the pyfunc loads
ARTIFACT = "shift-corrected"
CORRECTION_FORMAT = "labelshift-shift-corrected"


def corrected_name(model_name: str, name: str | None = None) -> str:
    """The registry name of the corrected model: ``name`` when given, else ``<model_name>-shift-corrected``."""
    return name or f"{model_name}{NAME_SUFFIX}"


def check_corrected_name(tracking_uri: str, model_uri: str, name: str | None = None) -> str:
    """The registry name the corrections of ``model_uri`` go to, checked before anything is computed: absent, or a
    shift-corrected model of the same deployed model; InputError naming the fix otherwise."""
    model_name = parse_model_uri(model_uri)[0]
    name = corrected_name(model_name, name)
    if name == model_name:
        raise InputError(f"corrected_model_name {name!r} is the deployed model's own name; the corrected model needs "
                         f"a registered model of its own. {_fix(model_name)}")
    _check_registered(_registered_model(MlflowClient(tracking_uri=tracking_uri), name), name, model_name)
    return name


def _fix(model_name: str) -> str:
    return (f"Choose another registry name (CLI --corrected-model-name NAME; flow parameter corrected_model_name), or "
            f"leave it out for the default '{model_name}{NAME_SUFFIX}'. Nothing was registered and the watermark did "
            "not move.")


def _check_registered(registered, name: str, model_name: str) -> None:
    """Raise InputError unless ``registered`` (the registered model ``name``, or None) is absent or a corrected model
    of ``model_name``."""
    if registered is None:
        return
    tags = registered.tags or {}
    if tags.get(KIND_TAG) != KIND:
        found = f"tag {KIND_TAG} = {tags[KIND_TAG]!r}" if KIND_TAG in tags else f"no tag {KIND_TAG}"
        raise InputError(f"registered model {name!r} exists and is not a labelshift shift-corrected model ({found}, "
                         f"expected {KIND!r}); its versions would be mixed with corrected ones. {_fix(model_name)}")
    if tags.get(SOURCE_TAG) not in (None, model_name):
        raise InputError(f"registered model {name!r} holds the corrections of {tags[SOURCE_TAG]!r}, not of "
                         f"{model_name!r}. {_fix(model_name)}")


def _registered_model(client: MlflowClient, name: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


# -- registration ------------------------------------------------------------------------------------------------------
def _mode(bundle) -> str:
    return getattr(bundle, "mode", None) or "pytorch"


def correction_doc(bundle, report: ShiftReport, *, run_id: str, target: str, sequence: int) -> dict:
    """What the pyfunc loads and what the version records."""

    ci = report.interval.to_dict()
    return {"format": CORRECTION_FORMAT, "version": 1, "mode": _mode(bundle), "class_names": bundle.holdout.names,
            "output_kind": getattr(bundle, "output_kind", "logits"),
            "output_method": getattr(bundle, "output_method", None),
            "input_columns": list(bundle.input_columns) if getattr(bundle, "input_columns", None) else None,
            "input_shape": list(bundle.input_shape) if getattr(bundle, "input_shape", None) else None,
            "calibrator_name": bundle.calibrator_name, "calibrator": bundle.calibrator.to_dict(),
            "weights": [float(v) for v in report.weights], "weights_lower": ci["weights_lower"],
            "weights_upper": ci["weights_upper"], "target_prior": ci["target_prior"], "prior_lower": ci["lower"],
            "prior_upper": ci["upper"], "source_prior": [float(v) for v in report.source_prior],
            "interval": ci["method"], "level": ci["level"],
            "estimator": report.method, "verdict": report.verdict,
            "source_model": {"uri": f"models:/{bundle.name}/{bundle.version}", "name": bundle.name,
                             "version": str(bundle.version), "run_id": bundle.run_id},
            "estimation_run_id": run_id, "target": target, "sequence": sequence}


@task(name="register-corrected-model", cache_policy=NO_CACHE, persist_result=False)
def register_if_shifted(bundle, report: ShiftReport, *, tracking_uri: str, name: str, run_id: str, target: str,
                        sequence: int) -> dict | None:
    """Register the corrected model (:func:`register_corrected_model`) under "Shifted"; else None."""
    if report.verdict != "Shifted":
        return None
    try:
        return register_corrected_model(bundle, report, tracking_uri=tracking_uri, name=name, run_id=run_id,
                                        target=target, sequence=sequence)
    except mlflow.exceptions.MlflowException as exc:
        if not registry_refused(exc):
            raise
        raise InputError(f"register_corrected: the tracking server refuses this MLflow user the registration of "
                         f"{name!r} ({one_line(exc)}). In the container stack only the operator "
                         "registers models (infra/README.md, 'Who may do what'): run this re-estimation with "
                         "register_corrected from the operator's machine (labelshift estimate --register-corrected), "
                         "or without it on the workers. Nothing was committed.") from None


def register_corrected_model(bundle, report: ShiftReport, *, tracking_uri: str, name: str, run_id: str,
                             target: str, sequence: int, alias: str = ALIAS) -> dict:
    """A new version of ``name``: the corrected pyfunc of ``bundle`` with ``report``'s weights, logged as a model of
    the run ``run_id``, tagged (its own digest, and :data:`SOURCE_DIGEST_TAG`) and described, ``alias`` moved to it.
    Returns {"name", "version", "alias", "model_uri", "version_uri"}."""
    client = MlflowClient(tracking_uri=tracking_uri)
    doc = correction_doc(bundle, report, run_id=run_id, target=target, sequence=sequence)
    _ensure_registered_model(client, name, bundle.name)
    mlflow.set_tracking_uri(tracking_uri)           # the fluent logging below resolves models:/ URIs through it
    experiment_id = client.get_run(run_id).info.experiment_id
    logged = mlflow.initialize_logged_model(name=ARTIFACT, source_run_id=run_id, experiment_id=experiment_id,
                                            tags={KIND_TAG: KIND})
    with tempfile.TemporaryDirectory(prefix="labelshift-corrected-") as tmp:
        path = Path(tmp) / "correction.json"
        path.write_text(json.dumps(doc, indent=1))
        artifacts = {"correction": str(path)}
        if doc["mode"] != "outputs":        # copied into the new model: the files checked at load when there
            artifacts["deployed"] = getattr(bundle, "model_dir", None) or doc["source_model"]["uri"]
        _log_quietly(logged.model_id, ShiftCorrectedModel(), artifacts, _signature(bundle),
                     _requirements(doc["mode"]))
    source_digest = getattr(getattr(bundle, "digest", None), "value", None) or "none"
    mv = client.create_model_version(name, source=f"models:/{logged.model_id}", run_id=run_id,
                                     tags={**version_tags(doc), SOURCE_DIGEST_TAG: source_digest},
                                     description=version_description(doc), model_id=logged.model_id,
                                     await_creation_for=120)
    record_digest(client, name, str(mv.version))
    client.set_registered_model_alias(name, alias, mv.version)
    client.set_tag(run_id, "labelshift.corrected_model", f"models:/{name}/{mv.version}")
    return {"name": name, "version": str(mv.version), "alias": alias, "model_uri": f"models:/{name}@{alias}",
            "version_uri": f"models:/{name}/{mv.version}"}


def _log_quietly(model_id: str, python_model, artifacts: dict, signature, requirements: list[str]) -> None:
    """``mlflow.pyfunc.log_model`` into the logged model ``model_id``, without its notes on pickled models and on
    the missing input example (the signature is the deployed model's)."""
    quiet = logging.getLogger("mlflow.pyfunc")
    level, quiet.level = quiet.level, logging.ERROR
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            mlflow.pyfunc.log_model(name=ARTIFACT, python_model=python_model, artifacts=artifacts, signature=signature,
                                    pip_requirements=requirements, model_id=model_id)
    finally:
        quiet.level = level


def _ensure_registered_model(client: MlflowClient, name: str, source_name: str) -> None:
    """Create the registered model ``name`` with its tags, unless it exists (then checked again)."""
    existing = _registered_model(client, name)
    if existing is not None:
        _check_registered(existing, name, source_name)
        return
    try:
        client.create_registered_model(name, tags={KIND_TAG: KIND, SOURCE_TAG: source_name}, description=(
            f"{source_name} corrected to the label distribution of its target: each version reweights the "
            f"calibrated outputs by the importance weights of one re-estimation (alias '{ALIAS}': the latest). "
            "Made by the labelshift reestimate flow; docs/serving.md."))
    except Exception:
        if _registered_model(client, name) is None:     # else: created meanwhile by another run
            raise


def _signature(bundle):
    """The deployed model's input schema in input mode; none in prediction-log mode."""
    from mlflow.models import ModelSignature

    if _mode(bundle) == "outputs":
        return None
    info = mlflow.models.get_model_info(f"models:/{bundle.name}/{bundle.version}")
    if info.signature is None or info.signature.inputs is None:
        return None
    return ModelSignature(inputs=info.signature.inputs)


def _requirements(mode: str) -> list[str]:
    """What the model needs besides labelshift itself (not on PyPI: ``--env-manager local``, docs/serving.md)."""
    extra = {"pytorch": ["torch"], "sklearn": ["scikit-learn"]}.get(mode, [])
    return ["mlflow", "numpy", "pandas", "pyarrow", *extra]


def _numbers(values) -> str:
    return json.dumps([None if v is None else round(float(v), 6) for v in values])


def version_tags(doc: dict) -> dict[str, str]:
    """The tags of a corrected version (docs/serving.md)."""
    src = doc["source_model"]
    return {KIND_TAG: KIND, "labelshift.source_model": src["uri"], "labelshift.source_model_name": src["name"],
            "labelshift.source_model_version": src["version"], "labelshift.source_run_id": src["run_id"] or "",
            "labelshift.estimation_run_id": doc["estimation_run_id"], "labelshift.mode": doc["mode"],
            "labelshift.calibrator": doc["calibrator_name"], "labelshift.classes": json.dumps(doc["class_names"]),
            **{f"labelshift.{k}": _numbers(doc[k]) for k in ("weights", "weights_lower", "weights_upper",
                                                               "target_prior")},
            "labelshift.interval": f"{doc['level']:.0%} {doc['interval']}", "labelshift.estimator": doc["estimator"],
            "labelshift.target": doc["target"], "labelshift.sequence": str(doc["sequence"]),
            "labelshift.verdict": doc["verdict"]}


def version_description(doc: dict) -> str:
    """The version's description: what it computes, from what, and a table of the weights (markdown)."""
    src = doc["source_model"]
    takes = "the deployed model's outputs (prediction-log mode)" if doc["mode"] == "outputs" else \
        "the deployed model's inputs"
    lines = [f"{src['uri']} corrected to the label distribution of {doc['target']}: p_t(y|x) proportional to "
             f"w_y f_y(x), f the {doc['calibrator_name']}-calibrated output. Takes {takes}; returns one column per "
             f"class and '{CLASS_COLUMN}'. Weights estimated by {doc['estimator']} in MLflow run "
             f"{doc['estimation_run_id']} (re-estimation {doc['sequence']}), {doc['level']:.0%} {doc['interval']} "
             "intervals.", "", "| class | w | interval on w | target p_t |", "|---|---|---|---|"]
    for c, n in enumerate(doc["class_names"]):
        lo, hi = doc["weights_lower"][c], doc["weights_upper"][c]
        span = "" if lo is None or hi is None else f"[{lo:.3f}, {hi:.3f}]"
        lines.append(f"| {n} | {doc['weights'][c]:.3f} | {span} | {doc['target_prior'][c]:.4f} |")
    return "\n".join(lines)
