"""Prefect task that publishes a sweep's summary as a markdown artifact linking to its MLflow run."""
from __future__ import annotations

import math

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

__all__ = ["summary_markdown", "publish_summary"]


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.3g}"


def summary_markdown(title: str, sweeps: list, links: dict[str, str]) -> str:
    """Markdown: one table per experiment (rows: x values; columns: mean MSE +- standard error per method),
    then the links (MLflow run, store folder, figures)."""
    lines = [f"# {title}", ""]
    web = {name: target for name, target in links.items() if _is_web(target)}
    if web:     # what opens in a browser first, so it is seen without scrolling
        lines += [" · ".join(f"[{name}]({target})" for name, target in web.items()), ""]
    for sweep in sweeps:
        methods = list(sweep.methods)
        x = {"shift": "p_t(y=1)", "size": "m", "bins": "bins", "alpha": "alpha"}.get(sweep.kind, "value")
        n = int(min(len(r.seeds) for r in sweep.results))
        lines += [f"## MSE vs {x} ({n} seeds per setting)", "",
                  "| " + " | ".join([x, *methods]) + " |", "|" + "---|" * (len(methods) + 1)]
        for i, value in enumerate(sweep.values):
            cells = [f"{_fmt(float(sweep.mse_mean[i, j]))} ± {_fmt(float(sweep.mse_se[i, j]))}"
                     for j in range(len(methods))]
            lines.append("| " + " | ".join([f"{value:g}", *cells]) + " |")
        lines.append("")
    lines += ["## Where to look", ""]
    lines += [f"- **{name}**: [{target}]({target})" if _is_web(target) else f"- **{name}**: {target}"
              for name, target in links.items()]
    return "\n".join(lines) + "\n"


def _is_web(target: str) -> bool:
    return str(target).startswith(("http://", "https://"))


@task(name="publish-summary", cache_policy=NO_CACHE, persist_result=False)
def publish_summary(markdown: str, key: str | None = None) -> str:
    """Create the Prefect markdown artifact; returns its id."""
    return str(create_markdown_artifact(markdown=markdown, key=key,
                                        description="MSE per method and setting; links to the MLflow run"))
