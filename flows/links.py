"""Links between the two UIs a person looks at: the Prefect flow run and the MLflow runs it logged.

Prefect's side: the address of the running flow run (``PREFECT_UI_URL``, which Prefect derives from
``PREFECT_API_URL``), tagged on the MLflow runs. MLflow's side: http addresses of a run and of its artifacts (the
tracking server proxies artifacts, so the MLflow UI shows a figure that lives in S3), for the flow-run log and the
Prefect artifact. Addresses are only given when they can open in a browser: an ``sqlite:`` tracking store or a
temporary Prefect server that ends with the command has none.
"""
from __future__ import annotations

__all__ = ["flow_run_info", "prefect_flow_run_url", "mlflow_links"]


def flow_run_info() -> tuple[str | None, str | None]:
    """``(id, name)`` of the Prefect flow run this code runs in; ``(None, None)`` outside one (e.g. a flow's
    ``.fn`` called directly)."""
    try:
        from prefect.context import get_run_context

        run = get_run_context().flow_run
        return str(run.id), str(run.name)
    except Exception:
        return None, None


def prefect_flow_run_url(flow_run_id: str) -> str | None:
    """The Prefect UI address of a flow run, or None without a lasting server (or outside a flow run)."""
    if not flow_run_id:
        return None
    try:
        from prefect.settings import PREFECT_API_URL
        from prefect.utilities.urls import url_for

        if not PREFECT_API_URL.value():          # a temporary server: gone when the command ends
            return None
        url = url_for("flow-run", obj_id=flow_run_id)
    except Exception:
        return None
    return url if url and url.startswith(("http://", "https://")) else None


def mlflow_links(tracking_uri: str, experiment_id: str, run_id: str, figures: list[str]) -> dict[str, str]:
    """``{label: http address}`` of an MLflow run, its artifacts tab and each figure (artifact paths); empty when
    the tracking URI is not a server."""
    from tasks.tracking import MODEL_TRAINING_VIEW, artifact_url, experiment_url, run_url

    run = run_url(tracking_uri, experiment_id, run_id)
    if run is None:
        return {}
    base = run.removesuffix(f"?{MODEL_TRAINING_VIEW}")
    links = {"MLflow run": run, "MLflow artifacts (figures, tables)": f"{base}/artifacts?{MODEL_TRAINING_VIEW}",
             "MLflow experiment (one run per method)": experiment_url(tracking_uri, experiment_id)}
    for path in figures:
        links[f"figure {path.rsplit('/', 1)[-1]}"] = artifact_url(tracking_uri, experiment_id, run_id, path)
    return links
