"""One settings object for every environment variable (runtime.environment), and the CLI package that reads it."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from runtime import environment as settings_mod
from flows.cli import main

ROOT = Path(__file__).resolve().parents[3]


def test_resolve_reads_every_variable_and_treats_blank_as_unset(tmp_path):
    env = {settings_mod.ENV_HOME: str(tmp_path), settings_mod.ENV_MODEL: " models:/m@a ",
           settings_mod.ENV_TARGET: "s3://b/t", settings_mod.ENV_DASK: "local",
           settings_mod.ENV_CRON: "0 6 * * *", settings_mod.ENV_TIMEZONE: "Europe/Paris",
           settings_mod.ENV_CACHE: str(tmp_path / "cache"), settings_mod.ENV_PORTS["mlflow"]: "5100",
           settings_mod.ENV_PREFECT_API_URL: "http://127.0.0.1:4200/api", settings_mod.ENV_EXPERIMENT: "e"}
    s = settings_mod.resolve(environ=env)
    assert (s.home, s.model, s.target, s.dask_address) == (tmp_path, "models:/m@a", "s3://b/t", "local")
    assert (s.reestimate_cron, s.reestimate_timezone, s.cache_dir) == ("0 6 * * *", "Europe/Paris",
                                                                        tmp_path / "cache")
    assert s.stack_ports == {"s3": None, "mlflow": "5100", "prefect": None}
    assert s.prefect_api_url == "http://127.0.0.1:4200/api" and s.experiment_name == "e"
    assert s.stack_dir == tmp_path / "stack"
    blank = settings_mod.resolve(tmp_path, environ={name: "  " for name in env})
    assert (blank.model, blank.target, blank.dask_address, blank.prefect_api_url, blank.cache_dir) == (None,) * 5
    assert blank.experiment_name == settings_mod.DEFAULT_EXPERIMENT


def test_the_documented_defaults_are_the_ones_in_use():
    from flows.params import DEFAULT_MODEL
    from stack.supervisor import DEFAULT_PORTS
    from labelshift.experiments.datasets.sources import default_cache_dir

    docs = {v.name: v.default for v in settings_mod.VARIABLES}
    for service, name in settings_mod.ENV_PORTS.items():
        assert docs[name] == f"`{DEFAULT_PORTS[service]}`"
    assert docs[settings_mod.ENV_MODEL] == f"`{DEFAULT_MODEL}`"
    assert docs[settings_mod.ENV_CACHE] == "`~/.cache/labelshift`"
    assert default_cache_dir() == Path.home() / ".cache" / "labelshift"
    assert len({v.name for v in settings_mod.VARIABLES}) == len(settings_mod.VARIABLES)


def test_labelshift_cache_reaches_data_push(tmp_path, monkeypatch):
    """The library takes the download folder as a parameter; the command passes the one the settings resolve."""
    import labelshift.experiments.datasets as datasets

    seen = {}

    def fake_push(name, store, prefix, **kwargs):
        seen.update(kwargs)
        return {"class_counts": {"train": [1]}}

    monkeypatch.setattr(datasets, "push_dataset", fake_push)
    monkeypatch.setenv(settings_mod.ENV_CACHE, str(tmp_path / "downloads"))
    assert main(["data", "push", "digits", "--home", str(tmp_path), "--to", str(tmp_path / "d")]) == 0
    assert seen["cache_dir"] == tmp_path / "downloads"
    monkeypatch.delenv(settings_mod.ENV_CACHE)
    assert main(["data", "push", "digits", "--home", str(tmp_path), "--to", str(tmp_path / "d")]) == 0
    assert seen["cache_dir"] is None


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_the_cli_package_has_no_import_cycle():
    package = ROOT / "flows" / "cli"
    modules = {p.stem: p for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")}
    graph = {name: {m for m in modules if f"flows.cli.{m}" in _imports(path)} for name, path in modules.items()}
    assert graph["_common"] == set(), "the shared module imports no subcommand"
    visiting, done = set(), set()

    def visit(name, trail):
        if name in done:
            return
        assert name not in visiting, f"import cycle: {' -> '.join([*trail, name])}"
        visiting.add(name)
        for dep in graph[name]:
            visit(dep, [*trail, name])
        visiting.discard(name)
        done.add(name)

    for name in graph:
        visit(name, [])


@pytest.mark.parametrize("path", ["labelshift", "tasks"])
def test_the_domain_and_tasks_do_not_read_the_projects_variables(path):
    """The library and the tasks read no LABELSHIFT_* variable: they get the values as parameters."""
    reads = re.compile(r"""(environ(\.get)?\s*[(\[]|getenv\()\s*['"]LABELSHIFT_""")
    for file in (ROOT / path).rglob("*.py"):
        assert not reads.search(file.read_text()), file


def test_the_console_is_quiet_by_default_about_mlflow_runs(tmp_path):
    """Found in the walk-through (docs/operations.md): against a tracking server MLflow printed "View run ... at:"
    and "View experiment at:" on every run's end, twice for some, between the CLI's own lines and links."""
    quiet, verbose = {}, {}
    settings_mod.apply(settings_mod.resolve(tmp_path, environ={}), environ=quiet)
    settings_mod.apply(settings_mod.resolve(tmp_path, environ={}), verbose=True, environ=verbose)
    assert quiet["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "true"
    assert "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT" not in verbose


def test_defining_the_pyfunc_models_prints_no_warning():
    """Found in the walk-through: `reference register` and a run with --register-corrected printed MLflow's
    "Add type hints to the `predict` method" although both classes are defined under catch_warnings: MLflow sets
    its own filter ("once") inside, which an "ignore" outside does not override."""
    import os
    import subprocess
    import sys

    code = "import labelshift_mlflow.pyfunc, tasks.reestimation.references, tasks.reestimation.serving"
    done = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "type hints" not in done.stderr and "Warning" not in done.stderr, done.stderr
