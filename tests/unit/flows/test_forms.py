"""The Custom run forms of the served ``reproduce`` deployments: one per dataset family, grouped, with the
descriptions of flows.params, no "None" panels, and the schema check the Prefect UI runs before *Submit*
refusing what the flow would refuse."""
from __future__ import annotations

import pytest
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools.validation import is_valid

from flows.forms import FAMILIES, family_schema
from flows.params import ReproduceParameters
from flows.reproduce import reproduce


@pytest.fixture(scope="module")
def flow_schema():
    return parameter_schema(reproduce.fn).model_dump()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_form_fields_are_ordered_titled_described_and_never_a_none_panel(flow_schema, family):
    schema = family_schema(flow_schema, family)
    props = schema["properties"]
    assert [p["position"] for p in props.values()] == list(range(len(props)))
    assert list(props)[:4] == ["dataset", "experiments", "methods", "n_seeds"]
    for name, prop in props.items():
        assert "anyOf" not in prop, f"{name} would show Prefect's 'Property is type None' panel"
        assert prop["title"] != name or name == "mu"
        expected = ReproduceParameters.model_fields[name].description.replace("<", "&lt;").replace(">", "&gt;")
        assert prop["description"] == expected or name == "dataset"
    assert "alpha" in props["experiments"]["description"]          # the full text, not the docstring's
    assert "default" not in props["seeds_per_task"] and props["seeds_per_task"]["type"] == "integer"


def test_each_family_offers_only_its_own_parameters_and_choices(flow_schema):
    gaussian = family_schema(flow_schema, "gaussian")["properties"]
    images = family_schema(flow_schema, "images")["properties"]
    assert not {"alpha_values", "epochs", "calibrators", "model_seeds"} & set(gaussian)
    assert not {"shift_values", "bins_values", "mu", "size_shift"} & set(images)
    assert gaussian["dataset"]["enum"] == ["gaussian"]
    assert gaussian["experiments"]["items"]["enum"] == ["shift", "size", "bins"]
    assert "MLLS-uncal" not in gaussian["methods"]["items"]["enum"]
    assert "gaussian" not in images["dataset"]["enum"] and images["dataset"]["default"] == "mnist-5k"
    assert images["experiments"]["default"] == ["alpha", "size"] and images["target_size"]["default"] == 5000
    # every default a form shows is one the flow accepts
    for props in (gaussian, images):
        ReproduceParameters(**{k: p["default"] for k, p in props.items() if "default" in p})


def test_the_check_before_submit_refuses_what_the_flow_refuses(flow_schema):
    """What the UI validates against the deployment schema (Prefect's validator): gaussian + alpha, MLLS-uncal on
    Gaussians and image experiments on Gaussians are refused in the form; an empty optional field passes."""
    gaussian = family_schema(flow_schema, "gaussian")
    images = family_schema(flow_schema, "images")
    assert is_valid({"dataset": "gaussian", "experiments": ["shift"]}, gaussian)
    assert is_valid({"dataset": "gaussian", "experiments": ["shift"], "seeds_per_task": 2}, gaussian)
    assert not is_valid({"dataset": "gaussian", "experiments": ["alpha"]}, gaussian)
    assert not is_valid({"dataset": "mnist-5k"}, gaussian)
    assert not is_valid({"methods": ["MLLS-uncal"]}, gaussian)
    assert is_valid({"dataset": "digits", "experiments": ["alpha"], "epochs": 2}, images)
    assert not is_valid({"dataset": "digits", "experiments": ["shift"]}, images)
    assert not is_valid({"dataset": "gaussian"}, images)


def test_serve_builds_one_reproduce_deployment_per_family():
    from flows.serve import build_deployments

    reproduce_gaussian, reproduce_images, reestimate = build_deployments(name="r")
    assert (reproduce_gaussian.name, reproduce_images.name, reestimate.name) == ("r", "r-images", "reestimate")
    assert "shift_values" in reproduce_gaussian._parameter_openapi_schema.properties
    assert "alpha_values" in reproduce_images._parameter_openapi_schema.properties
    assert reproduce_images.parameters == {"dataset": "mnist-5k"}
