"""Each re-estimation setting is defined once (issue 21): the names, types, bounds and defaults of the ``reestimate``
flow's signature, of :class:`flows.params.ReestimateParameters`, of the deployment's form in the Prefect UI (the
flow's parameter schema), of the ``labelshift estimate`` options, of the ``estimate-shift`` task and of
:func:`labelshift.assess_shift` agree, and the statistical defaults are the domain's
(:data:`labelshift.inference.settings.DEFAULTS`). The domain declares no bounds of its own (it checks what it must
at run time); the bounds are those of :mod:`flows.params`, which the flow, the form and the CLI share.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

from flows.cli._common import UsageError, option_name
from flows.cli.estimate import OPTIONS, parameters_from_args, register
from flows.params import ReestimateParameters
from flows.reestimate import DEFAULTS as FLOW_DEFAULTS
from flows.reestimate import reestimate
from labelshift import assess_shift
from labelshift.inference.settings import DEFAULTS, AssessmentSettings
from tasks.reestimation.assessment import estimate_shift

SETTINGS = [f.name for f in dataclasses.fields(AssessmentSettings)]
FIELDS = list(ReestimateParameters.model_fields)
#: what the places may differ in: how a field is labelled, its help text and its place in the form
_PRESENTATION = {"title", "description", "position"}


def _same(value):
    """Lists and tuples compare as lists (the domain's defaults are immutable, the flow's JSON-like)."""
    return list(value) if isinstance(value, (list, tuple)) else value


def _defaults(fn) -> dict:
    return {name: p.default for name, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="labelshift")
    register(parser.add_subparsers(dest="command"))
    return parser


def _schema(props: dict, name: str) -> dict:
    return {k: v for k, v in props[name].items() if k not in _PRESENTATION}


def test_reestimation_settings_are_defined_once():
    """The statistical defaults: the domain's, in every place that declares the setting."""
    places = {"assess_shift": _defaults(assess_shift), "estimate_shift task": _defaults(estimate_shift.fn),
              "ReestimateParameters": {n: f.default for n, f in ReestimateParameters.model_fields.items()},
              "reestimate flow": _defaults(reestimate.fn)}
    for place, defaults in places.items():
        for name in SETTINGS:
            assert name in defaults, f"{place} has no setting {name!r}"
            assert _same(defaults[name]) == _same(getattr(DEFAULTS, name)), \
                f"{place}: {name} defaults to {defaults[name]!r}, the domain's default is {getattr(DEFAULTS, name)!r}"
    assert DEFAULTS.interval == "source-aware" and list(DEFAULTS.cross_check) == ["BBSE-soft"]


def test_the_flow_signature_and_its_form_are_the_parameter_model():
    """Every flow parameter (not only the statistical ones): same names, in the same order, same type, bounds and
    default in the flow's parameter schema (the deployment's form) as in the model's JSON schema."""
    from prefect.utilities.callables import parameter_schema

    assert list(inspect.signature(reestimate.fn).parameters) == FIELDS
    assert {n: _same(v) for n, v in _defaults(reestimate.fn).items()} == \
        {n: _same(getattr(FLOW_DEFAULTS, n)) for n in FIELDS}
    form = parameter_schema(reestimate).model_dump()["properties"]
    model = ReestimateParameters.model_json_schema()["properties"]
    assert list(form) == list(model) == FIELDS
    for name in FIELDS:
        assert _schema(form, name) == _schema(model, name), name


def test_the_cli_options_are_the_parameter_model():
    """One option per field, whose choices are the model's, whose absence gives the model's default and whose
    out-of-range values the model's bounds refuse, naming the option."""
    parser = _parser()
    actions = {a.dest: a for a in parser._subparsers._group_actions[0].choices["estimate"]._actions}
    model = ReestimateParameters.model_json_schema()["properties"]
    for name in FIELDS:
        assert name in actions, f"labelshift estimate has no option for {name!r}"
        assert option_name(name, OPTIONS) in actions[name].option_strings
        enum = model[name].get("enum") or model[name].get("items", {}).get("enum")
        if actions[name].choices is not None:
            assert list(actions[name].choices) == enum, name
    given = parameters_from_args(parser.parse_args(["estimate"]))
    assert given == ReestimateParameters() == FLOW_DEFAULTS
    for name, prop in model.items():
        bounds = next((v for v in prop.get("anyOf", [prop]) if v.get("type") in ("number", "integer")), None)
        if bounds is None:
            continue
        for key, step in (("exclusiveMinimum", 0), ("minimum", -1), ("exclusiveMaximum", 0), ("maximum", 1)):
            if key not in bounds:
                continue
            value = bounds[key] + step              # just outside the range
            args = parser.parse_args(["estimate", option_name(name, OPTIONS), str(value)])
            with pytest.raises(UsageError, match=option_name(name, OPTIONS)):
                parameters_from_args(args)
