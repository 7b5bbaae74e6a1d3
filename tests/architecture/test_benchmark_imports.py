"""The benchmark scripts stay runnable as the code moves: every name they import from the project's packages exists
(a renamed module or function fails here, not in the middle of an hour's benchmark)."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("labelshift", "labelshift_mlflow", "tasks", "flows", "runtime", "stack")


def _missing(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                and node.module.split(".")[0] in PROJECT):
            continue
        try:
            module = importlib.import_module(node.module)
        except ImportError as exc:
            out.append(f"{node.module} ({exc})")
            continue
        for alias in node.names:
            if not hasattr(module, alias.name):
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    out.append(f"{node.module}.{alias.name}")
    return out


def test_every_project_name_a_benchmark_imports_exists():
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert len(scripts) > 10
    missing = {p.name: m for p in scripts if (m := _missing(p))}
    assert not missing, f"benchmarks import names that do not exist: {missing}"


def test_the_check_sees_a_name_that_is_gone(tmp_path):
    script = tmp_path / "bench_x.py"
    script.write_text("from labelshift.inference.no_shift import no_such_test\nfrom labelshift.no_such_module import x\n")
    assert _missing(script)[0] == "labelshift.inference.no_shift.no_such_test"
    assert _missing(script)[1].startswith("labelshift.no_such_module")
