"""The layering of the house, checked: imports point one way, flows -> tasks -> labelshift.

* ``labelshift`` (the domain) never imports prefect, mlflow, ``tasks`` or ``flows``;
* ``tasks`` never imports ``flows``;
* ``stack`` (the local stack's settings and process supervision) never imports prefect, mlflow, ``tasks`` or
  ``flows``: the flows and the CLI use it.

Every import statement counts, also one inside a function (a late import is still a dependency). A second test
imports every domain module in a fresh interpreter and checks that neither Prefect nor MLflow was loaded on the way
(an indirect import through a third package would slip past the source check).
"""
from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: package -> top-level names its modules must not import
FORBIDDEN = {
    "labelshift": {"prefect", "prefect_dask", "mlflow", "tasks", "flows"},
    "tasks": {"flows"},
    "stack": {"prefect", "prefect_dask", "mlflow", "tasks", "flows"},
}


def imported_roots(source: str, module: str) -> set[str]:
    """Top-level package names imported anywhere in ``source`` (relative imports resolve inside ``module``)."""
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:                              # relative: stays inside the module's own package
                roots.add(module.split(".")[0])
            elif node.module:
                roots.add(node.module.split(".")[0])
    return roots


def violations(package: str) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        bad = imported_roots(path.read_text(encoding="utf-8"), module) & FORBIDDEN[package]
        found += [f"{path.relative_to(ROOT)} imports {name}" for name in sorted(bad)]
    return found


def test_the_checker_sees_imports_anywhere_in_a_module():
    source = textwrap.dedent("""
        import numpy as np
        from . import estimators
        def late():
            import mlflow.pytorch
            from prefect import task
    """)
    assert imported_roots(source, "labelshift.x") == {"numpy", "labelshift", "mlflow", "prefect"}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package):
    assert violations(package) == [], (
        f"{package} must not import {sorted(FORBIDDEN[package])}: move the code to the layer that owns it "
        "(flows -> tasks -> labelshift)")


def test_the_domain_loads_without_prefect_or_mlflow():
    modules = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                     for p in (ROOT / "labelshift").rglob("*.py"))
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "print(sorted(m for m in ('prefect', 'mlflow') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"importing labelshift loaded {out.stdout.strip()}"
