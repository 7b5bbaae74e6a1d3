"""The results page (``labelshift report``): a markdown summary of the latest sweep of each dataset, from MLflow.

For every dataset the latest FINISHED parent run of the experiment (a run with a ``dataset`` tag and no parent)
is read back: its ``tables/summary.csv`` artifact (mean MSE and standard error per experiment, setting and
method) and its figures. The page holds one table per dataset and experiment and a verdict on each claim of the
paper's Section 6, *computed from those numbers*:

1. "MLLS has lower MSE than BBSE and RLLS everywhere": the share of settings (every experiment but bins) where
   MLLS's mean MSE is below both BBSE-hard's and RLLS's.
2. "MLLS-CM performs close to BBSE": per setting, MLLS-CM's and BBSE-hard's means differ by at most 25% of
   BBSE-hard's or by at most two combined standard errors.
3. "The gap is larger under severe shift": the ratio MSE(BBSE-hard) / MSE(MLLS) at the most severe shift of the
   shift/alpha experiment (smallest alpha; p_t(y=1) farthest from the balanced 0.5) exceeds the ratio at the
   mildest.

A sweep that ran estimators on several calibrations (``<estimator>@<calibration>`` methods, e.g. fashion-mnist's
default grid) also gets one table with a row per calibration and a column per estimator at the largest target
size of its size experiment (the plain names counted where they belong:
:func:`labelshift.experiments.images.method_calibration`).

Plain MLflow client calls; no Prefect.
"""
from __future__ import annotations

import csv
import math
import os
import tempfile
from pathlib import Path

from mlflow import MlflowClient

__all__ = ["latest_sweeps", "claims", "calibration_table", "render_page", "write_report"]

X_LABEL = {"shift": "p_t(y=1)", "size": "m", "bins": "bins", "alpha": "alpha"}
#: relative difference (and standard errors) within which two methods count as "close" (claim 2)
CLOSE_REL, CLOSE_SE = 0.25, 2.0


def latest_sweeps(client: MlflowClient, experiment_id: str) -> dict[str, object]:
    """dataset -> its latest finished parent run."""
    runs = client.search_runs([experiment_id], filter_string="attributes.status = 'FINISHED'",
                              order_by=["attributes.start_time DESC"], max_results=1000)
    out = {}
    for run in runs:
        tags = run.data.tags
        if "mlflow.parentRunId" in tags or "dataset" not in tags:
            continue
        out.setdefault(tags["dataset"], run)
    return out


def _float(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _rows(client: MlflowClient, run_id: str, tmp: Path) -> list[dict]:
    path = client.download_artifacts(run_id, "tables/summary.csv", str(tmp))
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("value", "mse_mean", "mse_se"):
            r[k] = _float(r.get(k))
    return rows


def _fmt(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.3g}"


def _cell(row: dict | None) -> str:
    """A table cell: mean MSE ± its standard error, "-" without a row."""
    return "-" if row is None else f"{_fmt(row['mse_mean'])} ± {_fmt(row['mse_se'])}"


def _table(rows: list[dict], experiment: str) -> list[str]:
    sel = [r for r in rows if r.get("experiment") == experiment]
    methods = list(dict.fromkeys(r["method"] for r in sel))
    values = sorted({r["value"] for r in sel})
    cell = {(r["value"], r["method"]): r for r in sel}
    lines = ["| " + " | ".join([X_LABEL.get(experiment, "value"), *methods]) + " |",
             "|" + "---|" * (len(methods) + 1)]
    for v in values:
        lines.append("| " + " | ".join([f"{v:g}", *(_cell(cell.get((v, m))) for m in methods)]) + " |")
    return lines


def calibration_table(rows: list[dict], first_calibrator: str = "BCTS", experiment: str = "size") -> list[str]:
    """Markdown lines: mean MSE ± standard error at the largest value of ``experiment``, a row per calibration and
    a column per estimator; no lines when the sweep ran no ``<estimator>@<calibration>`` method there."""
    from labelshift.experiments.images import CALIBRATIONS, method_calibration

    sel = [r for r in rows if r.get("experiment") == experiment and not math.isnan(r["value"])]
    if not any("@" in r["method"] for r in sel):
        return []
    largest = max(r["value"] for r in sel)
    cells = {method_calibration(r["method"], first_calibrator): r for r in sel if r["value"] == largest}
    estimators = list(dict.fromkeys(e for e, _ in cells))
    calibrations = [c for c in CALIBRATIONS if any((e, c) in cells for e in estimators)]
    lines = [f"### MSE by calibration and estimator at {X_LABEL.get(experiment, experiment)} = {largest:g}", "",
             "| calibration | " + " | ".join(estimators) + " |", "|" + "---|" * (len(estimators) + 1)]
    for c in calibrations:
        lines.append(f"| {c} | " + " | ".join(_cell(cells.get((e, c))) for e in estimators) + " |")
    return lines + [""]


def _by_setting(rows: list[dict]) -> dict:
    """(experiment, value) -> {method: row}, bins experiment left out."""
    out: dict = {}
    for r in rows:
        if r.get("experiment") == "bins":
            continue
        out.setdefault((r["experiment"], r["value"]), {})[r["method"]] = r
    return out


def claims(rows: list[dict]) -> list[dict]:
    """The three Section 6 claims on one dataset's summary rows: dicts with ``claim``, ``verdict`` ("holds",
    "fails", "partly" or "n/a") and ``evidence`` (the numbers)."""
    settings = _by_setting(rows)
    out = []

    # 1. MLLS below BBSE-hard and RLLS everywhere
    comp = [(k, s) for k, s in settings.items() if {"MLLS", "BBSE-hard", "RLLS"} <= set(s)]
    wins = [k for k, s in comp if s["MLLS"]["mse_mean"] < min(s["BBSE-hard"]["mse_mean"], s["RLLS"]["mse_mean"])]
    if comp:
        verdict = "holds" if len(wins) == len(comp) else ("fails" if not wins else "partly")
        ratios = [s["MLLS"]["mse_mean"] / s["BBSE-hard"]["mse_mean"] for _, s in comp]
        finite = [r for r in ratios if not math.isnan(r)]
        ev = (f"MLLS below both in {len(wins)}/{len(comp)} settings; MSE(MLLS)/MSE(BBSE-hard) from "
              f"{min(finite):.3g} to {max(finite):.3g}" if finite else "no finite MSE")
        lost = [f"{e}={v:g}" for (e, v), _ in comp if (e, v) not in wins]
        if lost:
            ev += f"; not below at {', '.join(lost)}"
    else:
        verdict, ev = "n/a", "MLLS, BBSE-hard and RLLS were not all run"
    out.append(dict(claim="MLLS has lower MSE than BBSE and RLLS everywhere", verdict=verdict, evidence=ev))

    # 2. MLLS-CM close to BBSE
    comp = [(k, s) for k, s in settings.items() if {"MLLS-CM", "BBSE-hard"} <= set(s)]
    n_all = len(comp)
    comp = [(k, s) for k, s in comp if not (math.isnan(s["MLLS-CM"]["mse_mean"]) or
                                            math.isnan(s["BBSE-hard"]["mse_mean"]))]
    missing = n_all - len(comp)
    if comp:
        close, rel = 0, []
        for _, s in comp:
            a, b = s["MLLS-CM"], s["BBSE-hard"]
            diff = abs(a["mse_mean"] - b["mse_mean"])
            se = math.hypot(_nz(a["mse_se"]), _nz(b["mse_se"]))
            rel.append(diff / b["mse_mean"] if b["mse_mean"] else math.nan)
            close += diff <= CLOSE_REL * b["mse_mean"] or diff <= CLOSE_SE * se
        finite = [r for r in rel if not math.isnan(r)]
        verdict = "holds" if close == len(comp) else ("fails" if close == 0 else "partly")
        ev = (f"close (within {CLOSE_REL:.0%} or {CLOSE_SE:g} standard errors) in {close}/{len(comp)} settings; "
              f"largest relative difference {max(finite):.1%}" if finite else "no finite MSE")
        if missing:
            ev += f"; {missing} setting(s) left out: no finite MSE (an estimator failed there)"
    elif n_all:
        verdict, ev = "n/a", f"no finite MSE of MLLS-CM or BBSE-hard in any of {n_all} settings"
    else:
        verdict, ev = "n/a", "MLLS-CM and BBSE-hard were not both run"
    out.append(dict(claim="MLLS-CM performs close to BBSE (the gain of MLLS comes from calibration)",
                    verdict=verdict, evidence=ev))

    # 3. the gap grows with the severity of the shift
    shift_exp = [e for e in ("alpha", "shift") if any(k[0] == e for k in settings)]
    verdict, ev = "n/a", "no shift or alpha experiment with BBSE-hard and MLLS"
    if shift_exp:
        e = shift_exp[0]
        pts = {v: s for (ex, v), s in settings.items() if ex == e and {"MLLS", "BBSE-hard"} <= set(s)}
        if len(pts) >= 2:
            sev = (lambda v: v) if e == "alpha" else (lambda v: -abs(v - 0.5))   # smaller = more severe
            severe, mild = min(pts, key=sev), max(pts, key=sev)
            ratio = {v: pts[v]["BBSE-hard"]["mse_mean"] / pts[v]["MLLS"]["mse_mean"] for v in (severe, mild)}
            verdict = "holds" if ratio[severe] > ratio[mild] else "fails"
            ev = (f"MSE(BBSE-hard)/MSE(MLLS) = {ratio[severe]:.3g} at {X_LABEL[e]}={severe:g} (most severe) vs "
                  f"{ratio[mild]:.3g} at {X_LABEL[e]}={mild:g} (mildest)")
    out.append(dict(claim="The advantage of MLLS is larger under severe shift", verdict=verdict, evidence=ev))
    return out


def _nz(x: float) -> float:
    return 0.0 if x is None or math.isnan(x) else x


def render_page(sections: list[dict]) -> str:
    """Markdown from ``[{dataset, run_id, params, metrics, rows, figures: [relative paths]}]``."""
    lines = ["# Label shift estimation: results", "",
             "Latest finished `reproduce` sweep of each dataset, read from MLflow. MSE of the estimated importance "
             "weights, mean ± standard error over seeds. Claims of Section 6 of Garg et al. (2020) are checked "
             "against these numbers.", ""]
    for sec in sections:
        p, m = sec["params"], sec["metrics"]
        lines += [f"## {sec['dataset']}", "", f"MLflow run `{sec['run_id']}`; {p.get('n_seeds', '?')} seeds per "
                  f"setting; methods {p.get('methods', '?')}."]
        if "model/test_accuracy_mean" in m:
            lines += [f"Network test accuracy: {m['model/test_accuracy_mean']:.4f} (mean over "
                      f"{p.get('model_seeds', '1')} model(s)); calibrators {p.get('calibrators', '')}."]
        lines.append("")
        for e in dict.fromkeys(r["experiment"] for r in sec["rows"]):
            lines += [f"### MSE vs {X_LABEL.get(e, e)}", ""] + _table(sec["rows"], e) + [""]
        lines += calibration_table(sec["rows"], (p.get("calibrators") or "BCTS").split(",")[0])
        lines += ["### Claims of Section 6", "", "| claim | verdict | evidence |", "|---|---|---|"]
        lines += [f"| {c['claim']} | **{c['verdict']}** | {c['evidence']} |" for c in claims(sec["rows"])]
        lines.append("")
        for fig in sec["figures"]:
            lines += [f"![{Path(fig).stem}]({fig})", ""]
    if not sections:
        lines += ["No finished sweep found. Run `labelshift reproduce` first.", ""]
    return "\n".join(lines)


def write_report(tracking_uri: str, experiment_name: str, out_dir) -> Path:
    """Write ``results.md`` and ``figures/<dataset>/*.png`` under ``out_dir``, each file atomically; returns the
    page's path."""
    from labelshift.errors import ObjectNotFoundError

    # MLflow's own variable, which it reads at each download: no progress bars on the console
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment_name)
    if exp is None:
        raise ObjectNotFoundError(f"no MLflow experiment {experiment_name!r} at {tracking_uri}; run "
                                  "`labelshift reproduce` first or pass --experiment-name / --tracking-uri.")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    with tempfile.TemporaryDirectory(prefix="labelshift-report-") as tmp:
        for dataset, run in sorted(latest_sweeps(client, exp.experiment_id).items()):
            rid = run.info.run_id
            work = Path(tmp, rid)
            work.mkdir()
            rows = _rows(client, rid, work)
            figs = []
            fig_dir = out / "figures" / dataset
            for art in client.list_artifacts(rid, "figures"):
                if art.path.endswith(".png"):
                    local = client.download_artifacts(rid, art.path, str(work))
                    fig_dir.mkdir(parents=True, exist_ok=True)
                    _write_whole(fig_dir / Path(art.path).name, Path(local).read_bytes())
                    figs.append(f"figures/{dataset}/{Path(art.path).name}")
            sections.append(dict(dataset=dataset, run_id=rid, params=run.data.params, metrics=run.data.metrics,
                                 rows=rows, figures=figs))
    page = out / "results.md"
    _write_whole(page, render_page(sections).encode("utf-8"))
    return page


def _write_whole(path: Path, data: bytes) -> None:
    """Write ``path`` all or nothing (a hidden ``.NAME.tmp`` beside it, then a rename): a report killed mid-way
    leaves each file whole, old or new, and at most that temporary file, which the next run overwrites."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
