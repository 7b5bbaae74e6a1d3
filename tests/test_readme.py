"""The README's library example runs as documented, and its claims about batches hold."""
import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"


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
    for folder in ("labelshift", "tasks", "flows"):
        for path in (root / folder).rglob("*.py"):
            named |= set(re.findall(r"``(docs/[\w.-]+\.md)``", path.read_text()))
    for doc in (root / "docs").glob("*.md"):
        named |= {f"docs/{m}" for m in re.findall(r"\]\(([\w.-]+\.md)\)", doc.read_text())}
    assert {"docs/uncertainty.md", "docs/reestimation.md", "docs/solvers.md"} <= named
    missing = sorted(n for n in named if not (root / n).is_file())
    assert not missing, f"named but missing: {missing}"
