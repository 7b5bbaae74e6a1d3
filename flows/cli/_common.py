"""What every subcommand shares: the usage error, list parsing, --home/--verbose, setting up the environment, and
command-line options built from a flow's parameter model (:func:`add_field`, :func:`given`, :func:`validated`).
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ValidationError

from runtime import environment as settings_mod

PROG = "labelshift"


class UsageError(Exception):
    """A mistake in the command line, reported as ``labelshift <cmd>: error: ...`` with exit status 2."""


def csv(kind, *, allow_empty: bool = False):
    """argparse type for comma-separated lists (spaces allowed): ``0.1,0.2`` -> [0.1, 0.2]; ``''`` -> [] when
    ``allow_empty``."""
    def parse(text: str) -> list:
        items = [t.strip() for t in text.replace(" ", ",").split(",") if t.strip()]
        if not items:
            if allow_empty:
                return []
            raise argparse.ArgumentTypeError("expected a comma-separated list, got an empty value")
        try:
            return [kind(t) for t in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values, got {text!r}") \
                from None
    parse.__name__ = f"list of {kind.__name__}"
    return parse


def add_common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """--home and --verbose, accepted before or after the subcommand."""
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--home", metavar="DIR", default=default,
                        help="state folder for the embedded defaults: Prefect's temporary server, the MLflow "
                             f"SQLite store and artifacts, the object store (default: ${settings_mod.ENV_HOME} "
                             f"or ./{settings_mod.DEFAULT_HOME})")
    parser.add_argument("-v", "--verbose", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="show Prefect's and MLflow's logs on the console (quiet by default)")


def local_path(uri: str) -> str:
    """``file:///x`` as ``/x`` (local paths print better); other URIs unchanged."""
    return uri[len("file://"):] if uri.startswith("file://") else uri


_temporary_server = None


def setup(args, *, prefect_server: bool = False, check=None, **overrides) -> settings_mod.Settings:
    """Resolve the settings (flags in ``overrides`` win; ``check(settings)`` first, before any server starts),
    export them, and route the flows' progress lines to stdout. Every process started from here on ends with this
    one. With ``prefect_server`` and no PREFECT_API_URL, the temporary Prefect server starts booting now
    (:func:`prefect_api` waits for it)."""
    global _temporary_server
    from runtime.lifetime import TemporaryPrefectServer, watch_descendants

    env = settings_mod.resolve(getattr(args, "home", None), **overrides)
    if check is not None:
        check(env)
    _temporary_server = None
    watch_descendants()
    settings_mod.apply(env, verbose=args.verbose)
    if prefect_server and env.prefect_api_url is None and not _prefect_api_in_settings():
        timeout = float(settings_mod.read("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS")
                        or settings_mod.PREFECT_STARTUP_TIMEOUT_S)
        _temporary_server = TemporaryPrefectServer(env.prefect_home, timeout_s=timeout).start()
        settings_mod.export(settings_mod.ENV_PREFECT_API_URL, _temporary_server.api_url)
    # one line per finished experiment on stdout (with --verbose, Prefect's run logger prints them already)
    progress = logging.getLogger("labelshift.progress")
    for old in list(progress.handlers):
        progress.removeHandler(old)
    if not args.verbose:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("  %(message)s"))
        progress.addHandler(handler)
    progress.setLevel(logging.INFO)
    progress.propagate = False
    return env


def _prefect_api_in_settings() -> bool:
    """True when Prefect, already imported by the caller (a test harness, a served run), has an API URL."""
    if "prefect.settings" not in sys.modules:
        return False
    from prefect.settings import PREFECT_API_URL

    return bool(PREFECT_API_URL.value())


@contextmanager
def prefect_api(env: settings_mod.Settings):
    """Where flows run: the configured Prefect API, or the temporary server of :func:`setup`, waited for and set as
    Prefect's API with flow-run heartbeats off (it cannot outlive the process to act on them). Yields the API URL
    (None when Prefect was configured in-process)."""
    if env.prefect_api_url is not None or _temporary_server is None:
        yield env.prefect_api_url
        return
    api_url = _temporary_server.wait_ready()
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield api_url


# -- options from a parameter model ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Opt:
    """How one field of a parameter model appears on the command line, where it differs from the defaults
    (``--<name-with-dashes>``, the field's type, its description and default as help): ``extra`` is appended to
    the description, ``default`` is the default as the help shows it (``""``: none), ``const`` makes a flag that
    sets the field to this value, and ``help`` replaces the description."""

    option: str | None = None
    metavar: str | None = None
    extra: str = ""
    default: str | None = None
    parse: Callable | None = None
    const: object = None
    help: str | None = None


def option_name(field: str, how: Mapping[str, Opt] | None = None) -> str:
    opt = (how or {}).get(field)
    return opt.option if opt and opt.option else "--" + field.replace("_", "-")


def _strip(annotation):
    """The annotation without Annotated[...] and without None in a union."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _strip(args[0])
    return annotation


def _scalar(annotation) -> tuple[Callable, tuple | None]:
    """argparse type and choices of a scalar annotation."""
    annotation = _strip(annotation)
    if typing.get_origin(annotation) is Literal:
        choices = typing.get_args(annotation)
        return type(choices[0]), choices
    if annotation in (int, float, str):
        return annotation, None
    return str, None


def show_default(value) -> str | None:
    if value is None:
        return None
    return ",".join(str(v) for v in value) if isinstance(value, list) else str(value)


def in_flags(text: str, model: type[BaseModel], how: Mapping[str, Opt] | None = None) -> str:
    """A field description in the command line's words: ```name='value'``` and ```name``` (the form's words for
    another setting) become ``--flag value`` and ``--flag``."""
    for name in model.model_fields:
        flag = option_name(name, how)
        text = re.sub(rf"`{name}='([^']*)'`", rf"{flag} \1", text).replace(f"`{name}`", flag)
    return text


def field_help(model: type[BaseModel], field: str, opt: Opt | None = None,
               how: Mapping[str, Opt] | None = None) -> str:
    """The field's description (plus ``opt.extra``, other settings named by their flags) and its default, as
    argparse help."""
    opt = opt or Opt()
    info = model.model_fields[field]
    default = opt.default if opt.default is not None else show_default(info.default)
    shown = f" (default: {default})" if default else ""
    return in_flags(f"{opt.help or info.description}{opt.extra}{shown}", model, how).replace("%", "%%")


def add_field(group, model: type[BaseModel], field: str, opt: Opt | None = None,
              how: Mapping[str, Opt] | None = None) -> argparse.Action:
    """Add the option of one model field to an argparse parser or group (its value defaults to None: not given);
    ``how``: the options of the other fields, which its help names by their flags."""
    opt = opt or Opt()
    info = model.model_fields[field]
    name = option_name(field, {field: opt})
    kwargs: dict = dict(dest=field, default=None, help=field_help(model, field, opt, how))
    if opt.const is not None:
        return group.add_argument(name, action="store_const", const=opt.const, **kwargs)
    annotation = _strip(info.annotation)
    if typing.get_origin(annotation) is list:
        kind, _ = _scalar(typing.get_args(annotation)[0])
        kwargs.update(type=opt.parse or csv(kind), metavar=opt.metavar or "LIST")
    else:
        kind, choices = _scalar(annotation)
        kwargs.update(type=opt.parse or kind)
        if choices is not None:
            kwargs["choices"] = list(choices)
        if opt.metavar:
            kwargs["metavar"] = opt.metavar
    return group.add_argument(name, **kwargs)


def given(args: argparse.Namespace, model: type[BaseModel]) -> dict:
    """The model's fields that were given on the command line."""
    return {name: v for name in model.model_fields if (v := getattr(args, name, None)) is not None}


def validated(model: type[BaseModel], values: dict, explain: Callable[[ValidationError], str]):
    """``model(**values)``; a validation error becomes a UsageError with the message of ``explain``."""
    try:
        return model(**values)
    except ValidationError as exc:
        raise UsageError(explain(exc)) from None


def problems(errors: Iterable[dict], model: type[BaseModel], how: Mapping[str, Opt] | None = None) -> list[str]:
    """One line per problem (pydantic's ``ValidationError.errors()``), naming the command-line option:
    ``--seeds: Input should be ...; got 1``."""
    lines = []
    for err in errors:
        loc = err.get("loc", ())
        field = str(loc[0]) if loc else ""
        where = option_name(field, how) if field in model.model_fields else "options"
        if len(loc) > 1 and isinstance(loc[1], int):
            where += f" (item {loc[1] + 1})"
        msg = err.get("msg", "invalid value").removeprefix("Value error, ")
        got = err.get("input")
        if field and not isinstance(got, dict):
            msg += f"; got {got!r}"
        lines.append(f"{where}: {msg}")
    return lines


def bounds(model: type[BaseModel], field: str) -> str | None:
    """The numeric range of a field in words: ``must be in (0.5, 1)``, ``must be positive``; None without bounds."""
    lo = hi = None
    for item in model.model_fields[field].metadata:
        for attr, side in (("gt", "("), ("ge", "[")):
            if getattr(item, attr, None) is not None:
                lo = (getattr(item, attr), side)
        for attr, side in (("lt", ")"), ("le", "]")):
            if getattr(item, attr, None) is not None:
                hi = (getattr(item, attr), side)
    if lo and hi:
        return f"must be in {lo[1]}{_number(lo[0])}, {_number(hi[0])}{hi[1]}"
    if lo:
        if lo == (0, "("):
            return "must be positive"
        return f"must be {'greater than' if lo[1] == '(' else 'at least'} {_number(lo[0])}"
    if hi:
        return f"must be {'less than' if hi[1] == ')' else 'at most'} {_number(hi[0])}"
    return None


def _number(value) -> str:
    """1.0 as 1, 1e6 as 1000000, 0.05 as 0.05."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
