"""The layering of the house, checked: imports point one way, flows -> tasks -> labelshift.

* ``labelshift`` (the domain) never imports prefect, mlflow, ``tasks`` or ``flows``;
* ``tasks`` never imports ``flows``;
* ``runtime`` (the environment every command resolves, and the processes of the local stack) never imports
  prefect, mlflow, ``tasks`` or ``flows``: the flows and the CLI use it;
* the store side (``labelshift.monitoring``, ``labelshift.storage``) never imports the statistics
  (``labelshift.inference``, ``labelshift.estimation``): it keeps the books of a target and knows nothing about
  estimators.

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

ROOT = Path(__file__).resolve().parents[2]

#: package -> top-level names its modules must not import
FORBIDDEN = {
    "labelshift": {"prefect", "prefect_dask", "mlflow", "tasks", "flows"},
    "tasks": {"flows"},
    "runtime": {"prefect", "prefect_dask", "mlflow", "tasks", "flows"},
}

#: subpackage -> subpackages (dotted) its modules must not import
FORBIDDEN_SUBPACKAGES = {
    "labelshift.monitoring": {"labelshift.inference", "labelshift.estimation"},
    "labelshift.storage": {"labelshift.inference", "labelshift.estimation"},
}


def imported_modules(source: str, module: str) -> set[str]:
    """Dotted names of the modules imported anywhere in ``source``, relative imports resolved inside ``module``
    (``from .x import y`` in ``a.b.c`` gives ``a.b.x`` and ``a.b.x.y``; ``from .. import x`` gives ``a`` and ``a.x``):
    a name imported from a package counts as a module of it, since it may be one."""
    found = set()
    package = module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[:len(package) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            if node.module:
                found.add(base)
            # each name imported may be a module of that package (from labelshift import estimation)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def imported_roots(source: str, module: str) -> set[str]:
    """Top-level package names imported anywhere in ``source`` (relative imports resolve inside ``module``)."""
    return {name.split(".")[0] for name in imported_modules(source, module)}


def _modules(folder: Path):
    for path in sorted(folder.rglob("*.py")):
        yield path, ".".join(path.relative_to(ROOT).with_suffix("").parts)


def violations(package: str) -> list[str]:
    found = []
    for path, module in _modules(ROOT / package):
        bad = imported_roots(path.read_text(encoding="utf-8"), module) & FORBIDDEN[package]
        found += [f"{path.relative_to(ROOT)} imports {name}" for name in sorted(bad)]
    return found


def reaches_into(imported: set[str], forbidden: set[str]) -> set[str]:
    """The forbidden subpackages that one of ``imported`` (dotted names) is, or lies inside."""
    return {f for f in forbidden for name in imported if name == f or name.startswith(f + ".")}


def subpackage_violations(subpackage: str) -> list[str]:
    found = []
    for path, module in _modules(ROOT / subpackage.replace(".", "/")):
        imported = imported_modules(path.read_text(encoding="utf-8"), module)
        found += [f"{path.relative_to(ROOT)} imports {name}"
                  for name in sorted(reaches_into(imported, FORBIDDEN_SUBPACKAGES[subpackage]))]
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


def test_the_checker_sees_a_subpackage_reaching_into_another():
    source = textwrap.dedent("""
        from ..errors import InputError
        from . import layout
        def late():
            from ..inference.segments import split_segments
            from labelshift import estimation
            import labelshift.estimation.solvers
    """)
    imported = imported_modules(source, "labelshift.monitoring.batches")
    assert imported >= {"labelshift.errors", "labelshift.monitoring.layout", "labelshift.inference.segments",
                        "labelshift.estimation", "labelshift.estimation.solvers"}
    forbidden = FORBIDDEN_SUBPACKAGES["labelshift.monitoring"]
    assert reaches_into(imported, forbidden) == {"labelshift.inference", "labelshift.estimation"}
    assert reaches_into({"labelshift.inference_notes", "labelshift.storage"}, forbidden) == set()


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package):
    assert violations(package) == [], (
        f"{package} must not import {sorted(FORBIDDEN[package])}: move the code to the layer that owns it "
        "(flows -> tasks -> labelshift)")


@pytest.mark.parametrize("subpackage", sorted(FORBIDDEN_SUBPACKAGES))
def test_the_store_side_does_not_reach_into_the_statistics(subpackage):
    assert subpackage_violations(subpackage) == [], (
        f"{subpackage} must not import {sorted(FORBIDDEN_SUBPACKAGES[subpackage])}: the store side keeps the books "
        "and knows nothing about estimators; move the code it needs down to the store side")


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
