"""The ``reestimate`` flow's parameters: one model (:class:`flows.params.ReestimateParameters`) that the flow's
signature, its form in the Prefect UI and ``labelshift estimate``'s options are, whose statistical and segment fields
take their defaults and bounds from the domain's settings, and which builds those settings whole."""
from __future__ import annotations

import argparse
import inspect

import pytest

from flows.cli._common import UsageError, option_name
from flows.cli.estimate import OPTIONS, parameters_from_args, register
from flows.params import ReestimateParameters
from flows.reestimate import reestimate
from labelshift.errors import InputError
from labelshift.inference.segments import SEGMENT_BOUNDS, SegmentSettings
from labelshift.inference.settings import BOUNDS, DEFAULTS, AssessmentSettings

FIELDS = list(ReestimateParameters.model_fields)
_JSON_BOUND = {"gt": "exclusiveMinimum", "ge": "minimum", "lt": "exclusiveMaximum", "le": "maximum"}


def _bounds(prop: dict) -> dict:
    number = next(v for v in prop.get("anyOf", [prop]) if v.get("type") in ("number", "integer"))
    return {k: number[k] for k in _JSON_BOUND.values() if k in number}


def test_the_flow_signature_and_its_form_are_the_parameter_model():
    from prefect.utilities.callables import parameter_schema

    assert list(inspect.signature(reestimate.fn).parameters) == FIELDS
    defaults = {n: p.default for n, p in inspect.signature(reestimate.fn).parameters.items()}
    assert defaults == ReestimateParameters().model_dump()
    form = parameter_schema(reestimate).model_dump()["properties"]
    model = ReestimateParameters.model_json_schema()["properties"]
    drop = ("title", "description", "position")
    assert {n: {k: v for k, v in form[n].items() if k not in drop} for n in FIELDS} == \
        {n: {k: v for k, v in model[n].items() if k not in drop} for n in FIELDS}


def test_the_settings_are_built_whole_from_the_parameters_with_the_domains_defaults_and_bounds():
    p = ReestimateParameters()
    assert p.assessment() == DEFAULTS and p.segments() is None
    given = ReestimateParameters(interval="fisher", level=0.9, cross_check=["BBSE-hard"], segment_column="region",
                                 min_segment_size=50)
    assert given.assessment() == AssessmentSettings(interval="fisher", level=0.9, cross_check=("BBSE-hard",))
    assert given.segments() == SegmentSettings("region", min_size=50)
    model = ReestimateParameters.model_json_schema()["properties"]
    for name, bound in BOUNDS.items():
        assert _bounds(model[name]) == {_JSON_BOUND[k]: v for k, v in bound.constraints().items()}, name
    for name, bound in SEGMENT_BOUNDS.items():
        field = {"min_size": "min_segment_size", "processes": "segment_processes"}[name]
        assert _bounds(model[field]) == {_JSON_BOUND[k]: v for k, v in bound.constraints().items()}, name


@pytest.mark.parametrize("bad", [dict(level=1.0), dict(significance=0.5), dict(n_bootstrap=19), dict(seed=-1),
                                 dict(max_interval_width=0.0), dict(label_shift_significance=1.0),
                                 dict(estimator="BBSE-soft"), dict(cross_check=["PCC"])])
def test_the_domain_refuses_what_the_form_refuses_naming_the_setting(bad):
    name = next(iter(bad))
    with pytest.raises(InputError, match=name if name != "estimator" else "interval"):
        AssessmentSettings(**bad)


def test_the_cli_options_are_the_parameter_model():
    """One option per field, whose absence gives the model's default and whose out-of-range values the model's
    bounds refuse, naming the option."""
    parser = argparse.ArgumentParser(prog="labelshift")
    register(parser.add_subparsers(dest="command"))
    actions = {a.dest: a for a in parser._subparsers._group_actions[0].choices["estimate"]._actions}
    for name in FIELDS:
        assert option_name(name, OPTIONS) in actions[name].option_strings
    assert parameters_from_args(parser.parse_args(["estimate"])) == ReestimateParameters()
    for name, bound in BOUNDS.items():
        for key, value in bound.constraints().items():
            outside = value + {"gt": 0, "ge": -1, "lt": 0, "le": 1}[key]
            args = parser.parse_args(["estimate", option_name(name, OPTIONS), str(outside)])
            with pytest.raises(UsageError, match=option_name(name, OPTIONS)):
                parameters_from_args(args)


def test_every_setting_is_logged_to_mlflow_unless_declared_not_to_be():
    """A field is an MLflow param of the run (with its value) unless its declaration marks it otherwise: adding a
    setting is its declaration, and the run logs it."""
    from flows.params import Logged

    marks = {n: next((m.when for m in f.metadata if isinstance(m, Logged)), "always")
             for n, f in ReestimateParameters.model_fields.items()}
    everything = ReestimateParameters(label_shift_significance=0.01, segment_column="region", cross_check=["BBSE-hard"],
                                      max_interval_width=0.5)
    logged = everything.as_mlflow_params()
    always = {"model", "calibrator", "estimator", "cross_check", "interval", "level", "significance", "n_bootstrap",
              "seed", "max_interval_width", "on_invalid", "label_shift_holdout_inflation"}
    assert set(logged) == always | {"label_shift_significance", "segment_column", "min_segment_size",
                                    "segment_correction"}                  # as the runs before the marks logged
    assert set(logged) | {"dask"} == {n for n, when in marks.items() if when != "never"}   # dask: not with segments
    assert ReestimateParameters(dask="host:8786").as_mlflow_params()["dask"] == "tcp://host:8786"
    assert logged["cross_check"] == "BBSE-hard" and logged["max_interval_width"] == 0.5
    assert logged["segment_column"] == "region" and logged["label_shift_significance"] == 0.01
    plain = ReestimateParameters().as_mlflow_params()
    assert set(plain) == always == {n for n, when in marks.items() if when == "always"}
    assert {"tracking_uri", "target", "batch_size"} <= {n for n, when in marks.items() if when == "never"}


def test_the_dask_address_is_checked_and_settings_the_cluster_cannot_do_are_refused_naming_the_fix():
    assert ReestimateParameters().dask is None
    assert ReestimateParameters(dask="local").dask == "local"
    with pytest.raises(ValueError, match="not a Dask scheduler address"):
        ReestimateParameters(dask="no-port")
    with pytest.raises(ValueError, match="segment_column .* not supported on a Dask cluster yet.*without --dask"):
        ReestimateParameters(dask="tcp://h:8786", segment_column="region")
