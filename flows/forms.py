"""The parameter forms of the served ``reproduce`` deployments, one per dataset family.

The Prefect UI draws a deployment's *Custom run* form from its parameter schema (fields ordered by ``position``,
labelled by ``title``) and checks the values against it before *Submit*. The flow's own schema has the parameters
of both dataset families in one list, so :func:`family_schema` cuts it per family:

- ``gaussian`` (deployment ``reproduce/<name>``): the paper's two-Gaussian sweeps -- dataset fixed to
  'gaussian', experiments shift/size/bins, the methods that apply;
- ``images`` (deployment ``reproduce/<name>-images``): mnist-5k, digits, fashion-mnist, mnist, cifar10 --
  experiments alpha/size, the image methods (also ``<estimator>@<calibration>``), the training and calibration
  settings, target size 5000 (fashion-mnist: its own grid, filled in by the flow's parameters).

A combination the schema of a family cannot hold (gaussian with 'alpha', 'MLLS-uncal' on Gaussians) is therefore
not offered at all; the remaining cross-field rule (``seeds_per_task`` at most ``n_seeds``) is not expressible in
the schema the UI checks, so the flow checks it first thing and fails the run before any work.

Each form is grouped by what a person decides first: what to run (dataset, experiments, methods, seeds), then the
grids, then the fixed settings of the experiments, then where results go and how the work is split. Optional
fields are shown as plain fields ("empty = the default") instead of Prefect's choice between a value and None.
"""
from __future__ import annotations

import copy
import typing

from flows.params import (EXPERIMENTS, IMAGE_DATASETS, IMAGE_EXPERIMENTS, IMAGE_METHODS, IMAGE_TARGET_SIZE,
                          Method, ReproduceParameters)

__all__ = ["FAMILIES", "family_schema", "IMAGES_SUFFIX"]

#: suffix of the image deployment's name
IMAGES_SUFFIX = "-images"

_COMMON_TAIL = ["base_seed", "seeds_per_task", "store", "tracking_uri", "mlflow_experiment"]

#: per family: the parameters of its form, in order
FAMILIES: dict[str, list[str]] = {
    "gaussian": ["dataset", "experiments", "methods", "n_seeds",
                 "shift_values", "target_sizes", "bins_values",
                 "target_size", "size_shift", "mu", "n_source", *_COMMON_TAIL],
    "images": ["dataset", "experiments", "methods", "n_seeds",
               "alpha_values", "target_sizes",
               "target_size", "size_alpha",
               "model_seeds", "network", "epochs", "train_limit", "calibrators", "good_accuracy", *_COMMON_TAIL],
}

#: labels of the form fields (the parameter name stays the key)
TITLES = {
    "dataset": "Dataset", "experiments": "Experiments", "methods": "Estimators", "n_seeds": "Seeds per setting",
    "shift_values": "Shift grid: p_t(y=1) values (experiment 'shift')",
    "target_sizes": "Size grid: target sizes m (experiment 'size')",
    "bins_values": "Bins grid: numbers of bins (experiment 'bins')",
    "alpha_values": "Alpha grid: Dirichlet alphas (experiment 'alpha')",
    "target_size": "Target size m of the other experiments",
    "size_shift": "p_t(y=1) of the size and bins experiments",
    "size_alpha": "Dirichlet alpha of the size experiment",
    "mu": "Class mean distance mu", "n_source": "Labelled source examples",
    "model_seeds": "Networks trained", "network": "Network", "epochs": "Training epochs",
    "train_limit": "Training subset size", "calibrators": "Calibrators",
    "good_accuracy": "Accuracy for the 'latest-good' alias",
    "base_seed": "Base seed", "seeds_per_task": "Seeds per Prefect task",
    "store": "Object store", "tracking_uri": "MLflow tracking URI", "mlflow_experiment": "MLflow experiment",
}

#: what differs in the image family: choices and defaults
_IMAGE_CHOICES = {"dataset": list(IMAGE_DATASETS), "experiments": list(IMAGE_EXPERIMENTS),
                  "methods": [*IMAGE_METHODS, *(m for m in typing.get_args(Method) if m not in IMAGE_METHODS)]}
_IMAGE_DEFAULTS = {"dataset": "mnist-5k", "experiments": list(IMAGE_EXPERIMENTS), "methods": list(IMAGE_METHODS),
                   "target_size": IMAGE_TARGET_SIZE}

def _gaussian_methods(schema_methods: list[str]) -> list[str]:
    return [m for m in schema_methods if m not in ("MLLS-uncal",) and "@" not in m]


def _drop_null(prop: dict) -> dict:
    """``anyOf: [X, null]`` (an Optional parameter) as X without a default: an empty field is left out of the
    run's parameters, so the flow's default (None) applies. Prefect's form would otherwise offer a switch between
    X and a "None" panel."""
    variants = prop.get("anyOf")
    if not variants:
        return prop
    kept = [v for v in variants if v.get("type") != "null"]
    if len(kept) != 1 or len(kept) == len(variants):
        return prop
    out = {k: v for k, v in prop.items() if k != "anyOf"}
    out.update(kept[0])
    if out.get("default", 0) is None:
        del out["default"]
    return out


def family_schema(flow_schema: dict, family: str) -> dict:
    """The parameter schema of one dataset family's form, cut from the ``reproduce`` flow's schema.

    Args:
        flow_schema: ``parameter_schema(reproduce).model_dump()`` (Prefect's schema of the flow signature).
        family: ``"gaussian"`` or ``"images"`` (see :data:`FAMILIES`).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown dataset family {family!r}; choose from {', '.join(FAMILIES)}")
    schema = copy.deepcopy(flow_schema)
    source = schema.get("properties", {})
    missing = [name for name in FAMILIES[family] if name not in source]
    if missing:
        raise ValueError(f"the flow has no parameters {missing}; update flows.forms.FAMILIES")
    props = {}
    for position, name in enumerate(FAMILIES[family]):
        prop = _drop_null(source[name])
        field = ReproduceParameters.model_fields[name]
        if field.description:        # the richer text of flows.params, whatever the flow's docstring says
            # the form renders descriptions as markdown: '<home>' would vanish as an unknown HTML tag
            prop["description"] = field.description.replace("<", "&lt;").replace(">", "&gt;")
        prop["title"] = TITLES.get(name, name)
        prop["position"] = position
        props[name] = prop
    other = "reproduce deployment named like this one with the suffix " + IMAGES_SUFFIX
    if family == "gaussian":
        props["dataset"]["enum"] = ["gaussian"]
        props["dataset"]["description"] = (
            "This form runs the two-Gaussian sweeps ('gaussian': the paper's mixture of two unit-variance "
            "Gaussians, Example 1, with the true p_s(y|x) as the predictor). The image datasets (mnist-5k, "
            f"digits, fashion-mnist, mnist, cifar10) have a form of their own: the {other}.")
        props["experiments"]["items"]["enum"] = list(EXPERIMENTS)
        props["methods"]["items"]["enum"] = _gaussian_methods(props["methods"]["items"]["enum"])
    else:
        for name, choices in _IMAGE_CHOICES.items():
            target = props[name]["items"] if "items" in props[name] else props[name]
            target["enum"] = list(choices)
        for name, value in _IMAGE_DEFAULTS.items():
            props[name]["default"] = value
    schema["properties"] = props
    schema["required"] = [r for r in schema.get("required", []) if r in props]
    return schema


IMAGES_DESCRIPTION = (
    "Reproduce the label-shift experiments of Garg et al. (NeurIPS 2020) on an image dataset (mnist-5k, "
    "digits and fashion-mnist ship offline; mnist and cifar10 after `labelshift data push`): train the network "
    "(cached in the store), "
    "calibrate it (BCTS), then weight MSE of each estimator against the Dirichlet shift alpha and the target size m. "
    "The model is registered in MLflow as labelshift-<dataset> (what the reestimate deployment loads). The "
    "two-Gaussian sweeps are the other reproduce deployment.")


def reproduce_deployments(flow, *, name: str, description: str, tags: list[str], **kwargs) -> list:
    """The two served ``reproduce`` deployments: ``name`` with the Gaussian form and ``name-images`` with the
    image form (see the module docstring); ``kwargs`` go to ``flow.to_deployment``."""
    from prefect.utilities.callables import ParameterSchema, parameter_schema

    flow_schema = parameter_schema(flow).model_dump()
    out = []
    for family, suffix, text, parameters in (
            ("gaussian", "", description, {}),
            ("images", IMAGES_SUFFIX, IMAGES_DESCRIPTION, {"dataset": _IMAGE_DEFAULTS["dataset"]})):
        deployment = flow.to_deployment(name=f"{name}{suffix}", description=text, tags=[*tags, family],
                                        parameters=parameters, **kwargs)
        deployment._parameter_openapi_schema = ParameterSchema(**family_schema(flow_schema, family))
        out.append(deployment)
    return out
