"""The layering of the house, checked: imports point one way, flows -> tasks -> labelshift.

* ``labelshift`` (the domain) never imports prefect, mlflow, ``tasks``, ``flows``, ``runtime`` or ``stack``;
* ``labelshift_mlflow`` (the user's model API: registering, loading, the pyfunc models) never imports prefect,
  ``tasks``, ``flows`` or ``stack``;
* ``tasks`` never imports ``flows`` or ``stack`` (a task runs wherever a worker runs it, whoever started the
  servers);
* ``runtime`` (what every command needs: the environment it resolves, the processes it starts, how it stops)
  never imports prefect, mlflow, ``tasks``, ``flows`` or ``stack``: the flows, the CLI and the stacks use it;
* ``stack`` (the stacks of servers that run apart from a command: the local stack's supervisor, the container
  stack's roles) never imports prefect, mlflow, ``tasks`` or ``flows``; it may import ``runtime``;
* no package of the code imports ``infra`` (the container stack's tooling, run from a checkout), and ``infra``
  drives the stack from outside, as an operator would: it never imports ``tasks`` or ``flows``;
* the store side (``labelshift.monitoring``, ``labelshift.storage``) never imports the statistics
  (``labelshift.inference``, ``labelshift.estimation``): it keeps the books of a target and knows nothing about
  estimators.

Every import statement counts, also one inside a function (a late import is still a dependency), and no module
reaches itself again through the modules it imports (no import cycles). A second test imports every domain module
in a fresh interpreter and checks that neither Prefect nor MLflow was loaded on the way (an indirect import through
a third package would slip past the source check).
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: package -> top-level names its modules must not import
FORBIDDEN = {
    "labelshift": {"prefect", "prefect_dask", "mlflow", "tasks", "flows", "runtime", "stack", "infra"},
    "labelshift_mlflow": {"prefect", "prefect_dask", "tasks", "flows", "stack", "infra"},
    "tasks": {"flows", "stack", "infra"},
    "flows": {"infra"},
    "runtime": {"prefect", "prefect_dask", "mlflow", "tasks", "flows", "stack", "infra"},
    "stack": {"prefect", "prefect_dask", "mlflow", "tasks", "flows", "infra"},
    "infra": {"tasks", "flows"},
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
        "(flows -> tasks -> labelshift; flows -> stack -> runtime)")


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


#: the packages whose modules' imports must form no cycle
CYCLE_FREE = ("labelshift", "labelshift_mlflow", "tasks", "flows", "runtime", "stack", "infra")


def import_graph(packages=CYCLE_FREE) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports, anywhere in its source. ``from pkg import mod`` is an edge
    to ``pkg.mod`` alone when that is a module (not to ``pkg``'s ``__init__`` too), as the interpreter would load it
    at that point only through ``pkg`` if ``pkg`` were not loaded yet -- which it is, by then, in every chain that
    starts at ``pkg``."""
    modules = {}
    for top in packages:
        for path in sorted((ROOT / top).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = (path, name)
    graph = {}
    for name, (path, dotted) in modules.items():
        imported = imported_modules(path.read_text(encoding="utf-8"), dotted)
        found = {m for m in imported if m in modules and m != name}
        graph[name] = {m for m in found if not any(o.startswith(m + ".") for o in found)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next((w for w in edges if w not in index or w in on_stack), None)
            if nxt is not None and nxt not in index:
                index[nxt] = low[nxt] = counter[0]
                counter[0] += 1
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt is not None:
                low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_late_import():
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}
    assert cycles(graph) == [["a.x", "a.y", "a.z"]]
    assert cycles({"a.x": {"a.y"}, "a.y": set()}) == []


def test_no_import_cycles():
    found = cycles(import_graph())
    assert found == [], (f"import cycles (imports inside functions included): {found}; move what both sides need "
                         "down into a module of its own, or pass it as an argument")


def private_imports(root: Path = ROOT) -> list[str]:
    """``file: name`` for every private name (``_x``, not a dunder) imported from another module by the code of the
    house (the domain, the model API, tasks, flows, runtime, stack), imports inside functions included."""
    found = []
    for top in ("labelshift", "labelshift_mlflow", "tasks", "flows", "runtime", "stack"):
        for path in sorted((root / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom):
                    found += [f"{path.relative_to(root)}: {a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_private_names_stay_in_their_module():
    """A name shared between modules is public within its package (no ``from .x import _y``)."""
    found = private_imports()
    assert found == [], f"private names imported from another module (make them public in their package): {found}"


def test_the_users_model_api_loads_and_registers_without_prefect(tmp_path):
    """Registering a scikit-learn model and loading a corrected model with mlflow.pyfunc.load_model, in a fresh
    interpreter, never import Prefect."""
    code = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        import mlflow, mlflow.pyfunc
        from sklearn.linear_model import LogisticRegression
        from labelshift.calibration import BCTS
        from labelshift_mlflow import ShiftCorrectedModel, register_sklearn_model

        tracking = "sqlite:///{tmp_path / 'mlflow.db'}"
        mlflow.set_tracking_uri(tracking)
        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((300, 3)), rng.integers(0, 3, 300)
        clf = LogisticRegression().fit(x, y)
        info = register_sklearn_model(clf, x, y, name="no-prefect", tracking_uri=tracking)
        cal = BCTS(input_kind="probs").fit(clf.predict_proba(x), y)
        doc = {{"mode": "outputs", "class_names": ["a", "b", "c"], "output_kind": "probabilities",
               "calibrator": cal.to_dict(), "weights": [0.5, 1.0, 1.5]}}
        path = "{tmp_path / 'correction.json'}"
        open(path, "w").write(json.dumps(doc))
        mlflow.pyfunc.save_model("{tmp_path / 'corrected'}", python_model=ShiftCorrectedModel(),
                                 artifacts={{"correction": path}})
        model = mlflow.pyfunc.load_model("{tmp_path / 'corrected'}")
        out = model.predict(clf.predict_proba(x[:5]).astype(np.float32))
        print(info["version"], list(out.columns), sorted(m for m in sys.modules if m.split(".")[0] == "prefect")[:3])
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "1 ['a', 'b', 'c', 'corrected_class'] []", done.stdout


# -- the environment, read in one module -------------------------------------------------------------------------------
#: where the environment check looks: the code of the house and the container stack's tooling
ENVIRONMENT_SCANNED = ("labelshift", "labelshift_mlflow", "tasks", "flows", "runtime", "stack", "infra")
#: the modules that touch ``os.environ`` (or ``os.getenv``, ``os.putenv``, ...) themselves, each with its reason;
#: every other module reads a setting, exports one or builds a child's environment through runtime/environment.py
ENVIRONMENT_TOUCHED_BY = {
    "runtime/environment.py": "the one module that reads the project's settings, exports them, and builds the "
                              "environment of a child process",
    "labelshift/storage/s3.py": "boto3's own endpoint variables, read only to name the endpoint in use in an error "
                                "message (the domain imports nothing of runtime)",
    "tasks/sweep/results_page.py": "MLflow's own progress-bar variable, set before MLflow downloads artifacts",
    "tasks/reestimation/cluster.py": "glibc's MALLOC_TRIM_THRESHOLD_, which a Dask nanny leaves in its process: left "
                                     "out while local_cluster starts its workers",
    "infra/image.py": "a build tool run from a checkout: the image names it builds and pip's own PIP_* variables, "
                      "carried into docker build (none is a setting of the commands)",
    "infra/stack_e2e.py": "the end-to-end check: the client environment of the compose project it starts, set in "
                          "its own process before Prefect and MLflow are imported",
}
#: the names of the ``os`` module that read or write the process's environment
_ENVIRONMENT_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def environment_touches(source: str) -> list[int]:
    """Line numbers where ``source`` touches the process's environment through the ``os`` module: ``os.environ``
    and the other names of :data:`_ENVIRONMENT_NAMES` (``os`` under any alias), or one of them imported from
    ``os``."""
    tree = ast.parse(source)
    aliases = {"os"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update(a.asname for a in node.names if a.name == "os" and a.asname)
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr in _ENVIRONMENT_NAMES
                and isinstance(node.value, ast.Name) and node.value.id in aliases):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and not node.level:
            if any(a.name in _ENVIRONMENT_NAMES for a in node.names):
                lines.append(node.lineno)
    return sorted(lines)


def environment_touchers(root: Path = ROOT) -> dict[str, list[int]]:
    """path -> lines, for every module of :data:`ENVIRONMENT_SCANNED` that touches the environment itself."""
    found = {}
    for top in ENVIRONMENT_SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            lines = environment_touches(path.read_text(encoding="utf-8"))
            if lines:
                found[path.relative_to(root).as_posix()] = lines
    return found


def test_the_environment_checker_sees_every_way_in():
    source = textwrap.dedent("""
        import os
        import os as system
        from os import getenv
        value = os.environ.get("A")
        def late():
            system.environ["B"] = "1"
            return os.getenv("C"), os.path.join("a", "b"), environ
    """)
    assert environment_touches(source) == [4, 5, 7, 8]
    assert environment_touches("import os\nos.getpid()\nenv = {}\nenv.get('X')\n") == []


def test_the_environment_is_read_in_one_module():
    """Only runtime/environment.py and the listed modules touch ``os.environ``; the rest go through it."""
    found = environment_touchers()
    outside = {path: lines for path, lines in found.items() if path not in ENVIRONMENT_TOUCHED_BY}
    assert not outside, (f"these modules touch the environment themselves: {outside}; read a setting with "
                         "runtime.environment.read (or resolve, values), export one with export, start a child with "
                         "child_environment -- or, for a variable a library or a child process owns, list the module "
                         "in ENVIRONMENT_TOUCHED_BY with its reason")
    stale = sorted(set(ENVIRONMENT_TOUCHED_BY) - set(found))
    assert not stale, f"listed in ENVIRONMENT_TOUCHED_BY but touching the environment no more: {stale}"


# -- the module map of docs/architecture.md ---------------------------------------------------------------------------
ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: the folders whose every package and module the map names
MAPPED = ("labelshift", "labelshift_mlflow", "tasks", "flows", "runtime", "stack")
#: a path under those folders in inline code: a module (``flows/reestimate.py``) or a package (``labelshift/inference/``)
_PATH = re.compile(r"`((?:%s)/[\w./]*)`" % "|".join(MAPPED))


def named_paths(markdown: str) -> list[str]:
    """The module and package paths under :data:`MAPPED` that ``markdown`` names in inline code, in order."""
    return [m for m in _PATH.findall(markdown) if m.endswith((".py", "/"))]


def module_map(markdown: str) -> str:
    """The section "## Module map" of the page, up to the next second-level heading."""
    found = re.search(r"^## Module map\n(.*?)(?=^## |\Z)", markdown, re.M | re.S)
    assert found, f"{ARCHITECTURE.relative_to(ROOT)} has no section '## Module map'"
    return found.group(1)


def mapped_paths() -> set[str]:
    """What the map must name: every module file under :data:`MAPPED` but ``__init__.py`` (a package is named by
    its folder, ``labelshift/inference/``), and every package."""
    expected = set()
    for top in MAPPED:
        for path in (ROOT / top).rglob("*.py"):
            relative = path.relative_to(ROOT).as_posix()
            if path.name == "__init__.py":
                expected.add(relative.removesuffix("__init__.py"))
            else:
                expected.add(relative)
    return expected


def test_the_map_reader_sees_modules_and_packages_in_inline_code():
    markdown = textwrap.dedent("""
        ## Module map
        - `labelshift/inference/`: a package; `labelshift/inference/report.py`: a module
        - `flows/reestimate.py` runs `labelshift.inference.report.assess_shift`; `labelshift estimate` is a command
        ## One run
        `tasks/reestimation/runs.py`
    """)
    assert named_paths(module_map(markdown)) == ["labelshift/inference/", "labelshift/inference/report.py",
                                                 "flows/reestimate.py"]
    assert named_paths(markdown)[-1] == "tasks/reestimation/runs.py"


def test_the_architecture_page_maps_every_module_and_names_none_that_is_gone():
    """A new, moved or deleted module fails here until docs/architecture.md's module map says so."""
    page, name = ARCHITECTURE.read_text(encoding="utf-8"), ARCHITECTURE.relative_to(ROOT)
    in_map = named_paths(module_map(page))
    problems = []
    missing = sorted(mapped_paths() - set(in_map))
    if missing:
        problems.append(f"its module map names no line for {', '.join(missing)}: add one line each (what it "
                        "computes or does, from its module docstring)")
    gone = sorted({p for p in named_paths(page) if not (ROOT / p).exists()})
    if gone:
        problems.append(f"it names {', '.join(gone)}, which do not exist: remove them, or rename them to where the "
                        "code moved")
    twice = sorted({p for p in in_map if in_map.count(p) > 1})
    if twice:
        problems.append(f"its module map has more than one line for {', '.join(twice)}")
    assert not problems, f"{name}: " + "; ".join(problems)
