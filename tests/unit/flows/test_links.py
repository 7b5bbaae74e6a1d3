"""Links a person follows between Prefect and MLflow, and the MLflow steps of a swept value."""
from __future__ import annotations

from flows.links import mlflow_links
from tasks.sweep.report import summary_markdown
from tasks.sweep.runs import metric_steps
from tasks.tracking import artifact_url, experiment_url, run_url


def test_swept_values_are_their_own_steps_or_thousandths():
    assert metric_steps([100, 200, 5000]) == ([100, 200, 5000], "value")
    assert metric_steps([0.01, 0.05, 0.5, 0.99]) == ([10, 50, 500, 990], "value x 1000")
    assert metric_steps([0.1, 3.0, 10.0]) == ([100, 3000, 10000], "value x 1000")
    # thousandths would merge or round these: the index of the setting instead
    assert metric_steps([0.0001, 0.0002]) == ([0, 1], "index of the setting")
    assert metric_steps([0.1234, 0.5]) == ([0, 1], "index of the setting")


def test_links_open_mlflow_in_its_model_training_view_and_only_for_a_server():
    server = "http://127.0.0.1:5000/"
    assert run_url(server, "3", "abc") == "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    assert experiment_url(server, "3").endswith("/#/experiments/3/runs?workflowType=machine_learning")
    assert artifact_url(server, "3", "abc", "figures/MLLS_mse_vs_size.png") == (
        "http://127.0.0.1:5000/#/experiments/3/runs/abc/artifactPath/figures/MLLS_mse_vs_size.png"
        "?workflowType=machine_learning")
    for local in ("sqlite:///x/mlflow.db", "file:///x/mlruns"):
        assert run_url(local, "3", "abc") is None and artifact_url(local, "3", "abc", "f.png") is None
        assert mlflow_links(local, "3", "abc", ["figures/mse_vs_shift.png"]) == {}
    links = mlflow_links(server, "3", "abc", ["figures/mse_vs_shift.png"])
    assert links["MLflow run"] == run_url(server, "3", "abc")
    assert links["figure mse_vs_shift.png"].startswith("http://127.0.0.1:5000/#/experiments/3/runs/abc/artifactPath/")
    assert all(v.startswith("http://") for v in links.values())


def test_the_artifact_puts_browser_links_first_and_as_markdown_links():
    markdown = summary_markdown("t", [], {"MLflow run": "http://h/#/experiments/1/runs/r?workflowType=machine_learning",
                                          "results in the object store": "s3://b/results/r"})
    first_lines = markdown.splitlines()[:3]
    assert "[MLflow run](http://h/#/experiments/1/runs/r?workflowType=machine_learning)" in first_lines[2]
    assert "s3://b/results/r" not in first_lines[2]
    assert "- **results in the object store**: s3://b/results/r" in markdown


def test_a_run_ends_saying_where_to_look():
    """The terminal summary's last lines: the MLflow run (its page on a server, or the `mlflow ui` command for a
    local store), the figure, the outputs and what they are, and the target's state folder."""
    from flows.summary import PLAIN_TEXT

    base = {"target": "/data/logs", "outputs": ["/data/logs/a.corrected.parquet"]}
    local = PLAIN_TEXT.links({**base, "mlflow": {"run_id": "r1", "experiment_id": "2",
                                                  "tracking_uri": "sqlite:////h/mlflow.db"}})
    text = "\n".join(local)
    assert "`mlflow ui --backend-store-uri sqlite:////h/mlflow.db`" in text
    assert "http://127.0.0.1:5000/#/experiments/2/runs/r1" in text and "figures/target_prior.png" in text
    assert "1 corrected file beside the batches under /data/logs" in text and "NAME.summary.json" in text
    assert "/data/logs/_labelshift/" in text
    served = "\n".join(PLAIN_TEXT.links({**base, "outputs": [], "outputs_withheld": "Not label shift",
                                         "mlflow": {"run_id": "r1", "ui": "http://m:5000/#/experiments/2/runs/r1"}}))
    assert "MLflow run: http://m:5000/#/experiments/2/runs/r1" in served and "mlflow ui" not in served
    assert "none written: Not label shift" in served
