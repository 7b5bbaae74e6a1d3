"""The README's library example runs as documented, its claims about batches hold, the pages it and the docstrings
name exist (anchors included), and the operations manual's table of settings is the settings' catalogue."""
import argparse
import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
#: the operator's manual: the commands, the table of environment variables, the verdicts, the faults
OPERATIONS = README.parent / "docs" / "operations.md"


def test_readme_python_example_runs_and_batches_match():
    block = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]
    ns: dict = {}
    exec(compile(block, str(README), "exec"), ns)
    res, many, est, cal = ns["res"], ns["many"], ns["est"], ns["cal"]
    # the prior estimate is a distribution and close to the simulated target prior (0.7, 0.2, 0.1): with m = 2000
    # target rows the MLE's standard error per class is about sqrt(p(1-p)/m) / (accuracy factor) < 0.02, so 0.05
    # is a loose bound that a broken estimator would still fail.
    assert np.isclose(res.target_prior.sum(), 1.0)
    np.testing.assert_allclose(res.target_prior, [0.7, 0.2, 0.1], atol=0.05)
    assert len(many) == 2 and many.weights.shape == (2, 3)
    np.testing.assert_allclose(many[1].weights, res.weights, rtol=0, atol=1e-10)
    one = est.estimate(cal.predict_proba(ns["target_logits"][:500]))
    np.testing.assert_allclose(many[0].weights, one.weights, rtol=0, atol=1e-10)


def test_the_docs_that_the_readme_and_the_docstrings_name_exist():
    root = README.parent
    named = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", README.read_text()))
    for folder in ("labelshift", "tasks", "flows", "runtime", "stack"):
        for path in (root / folder).rglob("*.py"):
            named |= set(re.findall(r"``(docs/[\w.-]+\.md)``", path.read_text()))
    for doc in (root / "docs").glob("*.md"):
        named |= {f"docs/{m}" for m in re.findall(r"\]\(([\w.-]+\.md)\)", doc.read_text())}
    assert {"docs/uncertainty.md", "docs/reestimation.md", "docs/solvers.md", "docs/operations.md"} <= named
    missing = sorted(n for n in named if not (root / n).is_file())
    assert not missing, f"named but missing: {missing}"


def _slug(heading: str) -> str:
    """The anchor GitHub gives a markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_links_to_sections_that_exist():
    """The README is short because it links into docs/ (the verdicts, the faults, models of any kind): every
    ``docs/PAGE.md#anchor`` it names must be a heading of that page, so a renamed section fails here."""
    root = README.parent
    links = re.findall(r"\]\((docs/[\w.-]+\.md)#([\w-]+)\)", README.read_text())
    assert links
    for page, anchor in links:
        headings = re.findall(r"^#+ (.+)$", (root / page).read_text(), re.M)
        assert anchor in {_slug(h) for h in headings}, f"{page}#{anchor} names no heading of {page}"


def test_the_verdicts_are_defined_once():
    """The order of the verdicts is explained in docs/operations.md alone; the README names them and links there."""
    verdicts = ["Not label shift", "Untrustworthy", "Shifted", "No shift"]
    section = OPERATIONS.read_text().split("## What each verdict means", 1)[1].split("\n## ", 1)[0]
    positions = [section.index(f"**{v}**") for v in verdicts]
    assert positions == sorted(positions)
    assert "docs/operations.md#what-each-verdict-means" in README.read_text()


def _table_lines(header: str) -> list[str]:
    """The rows of the table under ``header`` in docs/operations.md, as lines."""
    text = OPERATIONS.read_text()
    start = text.index(header)
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def _variables_table() -> list[list[str]]:
    """The rows of the table of environment variables in docs/operations.md, as cells."""
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")]
            for line in _table_lines("| variable | what it sets | default | flag that wins over it |")]


def test_the_operations_manual_lists_every_environment_variable_as_the_settings_name_them():
    """The table is the settings' catalogue: the same variables in the same order, with the same defaults and flags."""
    from runtime.environment import VARIABLES

    rows = _variables_table()
    assert [r[0] for r in rows] == [f"`{v.name}`" for v in VARIABLES]
    for row, variable in zip(rows, VARIABLES):
        assert row == [f"`{variable.name}`", variable.sets, variable.default, variable.flag or "-"]


def test_every_flag_in_the_variables_table_exists():
    from flows.cli import build_parser

    parser = build_parser()
    options = set()
    pending = [parser]
    while pending:
        p = pending.pop()
        for action in p._actions:
            options.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())
    flags = {f for row in _variables_table() for f in re.findall(r"`(--[a-z0-9-]+)`", row[3])}
    assert flags and flags <= options, flags - options


def test_the_operations_manual_lists_every_time_limit_as_runtime_sets_it():
    """The table of time limits is runtime.timeouts.limits(): the same variables, values and words, in order."""
    from runtime.timeouts import limits

    rows = _table_lines("| variable | value | what it bounds |")
    assert rows == [f"| {f'`{limit.variable}`' if limit.variable else '-'} | `{limit.value}` | {limit.bounds} |"
                    for limit in limits()]


@pytest.mark.integration
def test_the_own_model_block_runs_as_written(prefect_server, tmp_path):
    """The README's "Your own model, in three commands", run as written in a fresh folder (its own ./.labelshift)
    with `labelshift` on the PATH: a scikit-learn model's logged probabilities as holdout.parquet and logs/; the
    first two commands complete, the third serves until it is stopped (SIGTERM) and then exits 0. The test's
    Prefect server stands in for the temporary one each command would start (PREFECT_API_URL, as "your servers")."""
    import os
    import shlex
    import signal
    import subprocess
    import sys
    import time

    import pandas as pd
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    section = re.search(r"^## Your own model, in three commands\n(.*?)(?=^## )", README.read_text(), re.M | re.S)
    block = re.search(r"```bash\n(.*?)```", section.group(1), re.S).group(1).strip().splitlines()
    assert [line.split()[1] for line in block] == ["reference", "estimate", "serve"]
    x, y = make_classification(n_samples=6000, n_features=8, n_informative=6, n_classes=3, random_state=0)
    clf = LogisticRegression(max_iter=500).fit(x[:2000], y[:2000])
    names = ["cat", "dog", "fox"]
    holdout = pd.DataFrame(clf.predict_proba(x[2000:4000]), columns=names)
    holdout["label"] = [names[v] for v in y[2000:4000]]
    holdout.to_parquet(tmp_path / "holdout.parquet")
    (tmp_path / "logs").mkdir()
    new = np.arange(4000, 6000)[(y[4000:] != 0) | (np.arange(2000) % 3 == 0)]      # fewer cats than before
    pd.DataFrame(clf.predict_proba(x[new]), columns=names).to_parquet(tmp_path / "logs" / "day-1.parquet")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "LABELSHIFT_", "AWS_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PREFECT_API_URL"] = prefect_server
    for line in block[:2]:
        done = subprocess.run(shlex.split(line), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert "Where to look:" in done.stdout and (tmp_path / "logs" / "day-1.corrected.parquet").exists()
    serve = subprocess.Popen(shlex.split(block[2]), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        seen, deadline = [], time.monotonic() + 240
        while time.monotonic() < deadline and not any("Stop with Ctrl-C" in s for s in seen):
            line = serve.stdout.readline()
            if not line and serve.poll() is not None:
                break
            seen.append(line)
        assert any("'0 6 * * *'" in s for s in seen), "".join(seen)[-3000:]
        assert any("models:/my-clf@production" in s and "./logs" in s for s in seen), "".join(seen)[-3000:]
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
