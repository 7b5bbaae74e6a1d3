"""The two UIs as a person uses them, in headless Chromium: a sweep launched from the Prefect UI's Custom run form,
followed into MLflow; a re-estimation run from the UI. A screenshot of each step goes to .labelshift/ui-screens/.

Runs against a local stack on free loopback ports with `labelshift serve` (tests_ui/conftest.py); the browser
reaches loopback addresses only.
"""
from __future__ import annotations

import re
import time
import warnings

import httpx
import pytest
from playwright.sync_api import expect

from tests_ui import support

pytestmark = pytest.mark.ui

#: the sweep launched from the form: the defaults of the Gaussian form except this many seeds per setting
SEEDS = "5"


class Steps:
    """Numbered screenshots of one test: ``shot("name")`` writes ``<screens>/<prefix>-NN-name.png``."""

    def __init__(self, page, screens, prefix: str):
        self.page, self.screens, self.prefix, self.n = page, screens, prefix, 0

    def shot(self, name: str, *, full_page: bool = False) -> None:
        self.n += 1
        self.page.screenshot(path=str(self.screens / f"{self.prefix}-{self.n:02d}-{name}.png"), full_page=full_page)


def _prefect_ui(stack) -> str:
    return stack["env"]["PREFECT_API_URL"].removesuffix("/api")


def _wait_for_final_state(page, steps: Steps, timeout_s: float = 150.0) -> str:
    """Reload the flow-run page until its state badge shows a final state; returns it (fails on a failure)."""
    deadline = time.monotonic() + timeout_s
    badge = page.locator(".state-badge").first
    while time.monotonic() < deadline:
        kind = (badge.get_attribute("class") or "") if badge.count() else ""
        if re.search(r"state--(failed|crashed|cancelled)", kind):
            steps.shot("failed", full_page=True)
            pytest.fail(f"the flow run ended {badge.inner_text()}:\n{page.inner_text('body')[:3000]}")
        if "state--completed" in kind:       # the type; the name may be the flow's own (a verdict)
            page.wait_for_timeout(1000)          # the logs of the last moments arrive
            page.reload()
            expect(badge).to_be_visible()
            return badge.inner_text().strip()
        page.wait_for_timeout(1500)
        page.reload()
        badge.wait_for(timeout=15_000)
    steps.shot("timeout", full_page=True)
    pytest.fail(f"the flow run was not Completed within {timeout_s:.0f} s")


def _open_new_run_from_toast(page) -> str:
    """After Submit the Prefect UI goes back to the deployment page (it does not open the new run; that is
    Prefect's UI code) and shows a toast with 'View run': follow it to the new flow run. Returns its id."""
    page.wait_for_url(re.compile(r".*/deployments/deployment/[0-9a-f-]{36}(\?.*)?$"))
    view = page.get_by_role("button", name="View run").last
    expect(view).to_be_attached()
    page.wait_for_timeout(800)          # the toast slides in
    view.dispatch_event("click")
    page.wait_for_url(re.compile(r".*/runs/flow-run/[0-9a-f-]{36}.*"))
    return re.search(r"/runs/flow-run/([0-9a-f-]{36})", page.url).group(1)


def _quick_run(page, stack, tries: int = 2) -> None:
    """Run > Quick run on the deployment page, as a person would: when the Prefect server answers the
    create-flow-run request with a server error (its SQLite database can be busy on a loaded machine: Prefect
    issues #18934, #19771), wait and click again, at most ``tries`` times; the answer and the server's log tail
    are kept as a warning so that a retry is seen in the test output, and the test fails if every try fails."""
    answers = []
    for _ in range(tries):
        page.get_by_role("button", name="Run", exact=True).click()
        with page.expect_response(lambda r: r.url.endswith("/create_flow_run")) as created:
            page.get_by_text("Quick run", exact=True).click()
        answer = created.value
        if answer.ok:
            if answers:
                warnings.warn(f"Quick run needed {len(answers) + 1} tries: {answers}", stacklevel=2)
            return
        answers.append(f"HTTP {answer.status}: {answer.text()[:500]}")
        page.wait_for_timeout(3000)
        page.reload()
    pytest.fail(f"the Prefect server refused every Quick run: {answers}\n"
                f"its log ends:\n{support.prefect_log_tail(stack)}")


def _form_field(page, title: str):
    """The Custom run form's field whose label starts with ``title``."""
    label = page.locator(".schema-form-property__label", has_text=title)
    return page.locator(".schema-form-property", has=label).last


def _artifact_markdown(stack, flow_run_id: str) -> str:
    api = stack["env"]["PREFECT_API_URL"]
    r = httpx.post(f"{api}/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [flow_run_id]},
                                                                  "type": {"any_": ["markdown"]}}}, timeout=10)
    r.raise_for_status()
    found = r.json()
    assert found, f"flow run {flow_run_id} has no markdown artifact"
    return found[0]["data"]


def test_sweep_from_the_custom_run_form_to_mlflow_figures(stack, page, screens):
    steps = Steps(page, screens, "1-reproduce")
    ui = _prefect_ui(stack)
    mlflow = stack["env"]["MLFLOW_TRACKING_URI"]

    # the deployment, then Run > Custom run
    page.goto(f"{ui}/deployments/deployment/{stack['ids']['reproduce/reproduce']}")
    page.get_by_role("button", name="Run", exact=True).click()
    steps.shot("run-menu")
    page.get_by_text("Custom run", exact=True).click()
    seeds = _form_field(page, "Seeds per setting").locator("input").first
    expect(seeds).to_be_visible()
    steps.shot("custom-run-form", full_page=True)

    # the form: grouped and titled fields of the Gaussian family only, full descriptions, no "None" panels
    form = page.inner_text("body")
    assert "Property is type" not in form
    for title in ("Experiments", "Estimators", "Shift grid", "Size grid", "Bins grid", "Seeds per Prefect task"):
        assert title in form
    for image_only in ("Alpha grid", "Training epochs", "Calibrators", "Networks trained"):
        assert image_only not in form
    assert "'alpha' (MSE vs Dirichlet alpha" in form
    assert "else &lt;home&gt;/store" not in form and "else <home>/store" in form
    assert form.index("Seeds per setting") < form.index("Shift grid") < form.index("Seeds per Prefect task")

    seeds.fill(SEEDS)
    page.get_by_role("button", name="Submit").click()
    flow_run_id = _open_new_run_from_toast(page)
    steps.shot("flow-run-started")
    assert _wait_for_final_state(page, steps) == "Completed"
    # the flow-run log links the MLflow run
    log_link = page.locator("a[href^='http://127.0.0.1:'][href*='/#/experiments/'][href*='/runs/']")
    expect(log_link.first).to_be_visible()
    steps.shot("flow-run-completed-log-links-mlflow")

    # the artifact: http links into MLflow (run, artifacts, figures), nothing a browser cannot open first
    markdown = _artifact_markdown(stack, flow_run_id)
    run_link = re.search(r"\[MLflow run\]\((http://[^)]+/#/experiments/\d+/runs/([0-9a-f]{32})"
                         r"\?workflowType=machine_learning)\)", markdown)
    assert run_link, markdown[:2000]
    figure_link = re.search(r"\[figure mse_vs_size\.png\]\((http://[^)]+/artifactPath/figures/mse_vs_size\.png"
                            r"[^)]*)\)", markdown)
    assert figure_link, markdown[:2000]
    assert log_link.first.inner_text().strip() == run_link.group(1)
    page.get_by_text("Artifacts", exact=True).click()
    steps.shot("artifacts-tab", full_page=True)
    page.get_by_text("MSE per method and setting").first.click()
    page.wait_for_url(re.compile(r".*/artifacts/artifact/.*"))
    link = page.get_by_role("link", name="MLflow run").first
    expect(link).to_be_visible()
    steps.shot("artifact", full_page=True)
    assert link.get_attribute("href") == run_link.group(1)

    # into MLflow by that link: the parent run, in the model-training view
    link.click() if link.get_attribute("target") != "_blank" else page.goto(run_link.group(1))
    page.wait_for_url(re.compile(r".*#/experiments/\d+/runs/.*"))
    expect(page.get_by_text("Prefect flow run").first).to_be_visible(timeout=60_000)
    steps.shot("mlflow-parent-run", full_page=True)
    run_id = run_link.group(2)
    experiment_id = re.search(r"#/experiments/(\d+)/", run_link.group(1)).group(1)
    runs = httpx.post(f"{mlflow}/api/2.0/mlflow/runs/search", json={
        "experiment_ids": [experiment_id], "filter": f"tags.mlflow.parentRunId = '{run_id}'"}, timeout=10).json()
    child = next(r for r in runs["runs"] if r["data"]["tags"] and
                 {t["key"]: t["value"] for t in r["data"]["tags"]}.get("method") == "MLLS")
    assert child["info"]["run_name"].startswith("MLLS ")
    tags = {t["key"]: t["value"] for t in child["data"]["tags"]}
    assert tags["prefect.flow_run_url"].endswith(f"/runs/flow-run/{flow_run_id}")

    # the experiment opens on its runs (no GenAI overview to get past); a sweep's row unfolds into one run per
    # method, named method first
    parent_name = httpx.get(f"{mlflow}/api/2.0/mlflow/runs/get", params={"run_id": run_id},
                            timeout=10).json()["run"]["info"]["run_name"]
    page.goto(re.search(r"\[MLflow experiment[^\]]*\]\((http://[^)]+)\)", markdown).group(1))
    row = page.locator("[role=row]", has_text=parent_name).first
    expect(row).to_be_visible(timeout=60_000)
    assert "Detect Issues" not in page.inner_text("body")           # the GenAI overview's popover
    row.locator("button").first.click()
    expect(page.get_by_text(f"MLLS · {parent_name}").first).to_be_visible()
    steps.shot("mlflow-experiment-runs")

    # a method's run: the MSE curve as a chart, its overview listing every point
    page.goto(f"{mlflow}/#/experiments/{experiment_id}/runs/{child['info']['run_id']}/model-metrics?workflowType=machine_learning")
    expect(page.get_by_text("size/mse", exact=True).first).to_be_visible(timeout=60_000)
    page.wait_for_timeout(1500)
    steps.shot("mlflow-mlls-metric-charts", full_page=True)
    page.goto(f"{mlflow}/#/experiments/{experiment_id}/runs/{child['info']['run_id']}?workflowType=machine_learning")
    expect(page.get_by_text("size/mse/m 100").first).to_be_visible(timeout=60_000)
    steps.shot("mlflow-mlls-overview", full_page=True)

    # a figure, as the artifact links it: previewed in MLflow (the server proxies it from S3)
    with page.expect_response(lambda r: "get-artifact" in r.url and "mse_vs_size.png" in r.url) as got:
        page.goto(figure_link.group(1))
    assert got.value.ok and got.value.headers["content-type"].startswith("image/png")
    page.wait_for_function("() => Array.from(document.images).some(i => i.complete && i.naturalWidth > 300)",
                           timeout=30_000)
    steps.shot("mlflow-figure-mse-vs-size")
    assert not page.blocked or all(not support.is_loopback(u) for u in page.blocked)


def test_reestimate_from_the_ui_shows_its_verdict_and_artifact(stack, page, screens):
    steps = Steps(page, screens, "2-reestimate")
    stack["ready"].wait()
    support.put_batches(stack["env"])
    ui = _prefect_ui(stack)
    page.goto(f"{ui}/deployments/deployment/{stack['ids']['reestimate/reestimate']}")
    _quick_run(page, stack)
    _open_new_run_from_toast(page)
    steps.shot("flow-run-started")
    verdict = _wait_for_final_state(page, steps, timeout_s=180)
    steps.shot("flow-run-verdict", full_page=True)
    assert verdict == "Shifted", verdict           # the batches are drawn from a prior far from the source's
    page.get_by_text("Artifacts", exact=True).click()
    page.get_by_text("re-estimation verdict").first.click()
    page.wait_for_url(re.compile(r".*/artifacts/artifact/.*"))
    steps.shot("artifact", full_page=True)
    expect(page.get_by_text(re.compile(r"target prior|shift", re.I)).first).to_be_visible()
    mlflow_link = page.locator("a[href^='http://127.0.0.1:'][href*='/#/experiments/']").first
    expect(mlflow_link).to_be_visible()
    assert "workflowType=machine_learning" in mlflow_link.get_attribute("href")
