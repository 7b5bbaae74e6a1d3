"""The MLflow bookkeeping of scheduled re-estimation: one monitor run per (model, target) whose series is the prior
over time, and under it one child run per re-estimation (:func:`start_reestimation_run`; its metrics
:func:`prior_metrics`, the figure :func:`render_figure`, the summary JSON: :func:`log_reestimation`); the monitor's
points caught up from the watermark's history (:func:`sync_monitor`, :func:`history_record`), the child runs of
killed commands ended (:func:`end_orphaned_runs`). Both layouts are described in ``docs/reestimation.md``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
import logging
import math
import time

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus

from labelshift.monitoring.batches import metric_names
from labelshift.figures import figure_png, plot_prior_estimate
from labelshift.inference.report import ShiftReport, Verdict, finite
from tasks import tracking

__all__ = ["MONITOR_KIND", "OWNER_TAG", "SYNCED_TAG", "ReestimationRun", "start_reestimation_run", "end_orphaned_runs",
           "catch_up_monitor", "prior_metrics", "log_reestimation", "log_rejections", "sync_monitor", "end_run",
           "render_figure", "history_record"]

MONITOR_KIND = "monitor"


def _find_monitor(client: MlflowClient, experiment_id: str, model_name: str, target_url: str) -> str | None:
    """The id of the monitor run of (model, target), found by its tags; None when there is none yet."""
    target_tag = target_url.replace("'", "")
    found = client.search_runs([experiment_id], filter_string=(
        f"tags.`labelshift.kind` = '{MONITOR_KIND}' and tags.`labelshift.model` = '{model_name}' and "
        f"tags.`labelshift.target` = '{target_tag}'"), max_results=1, order_by=["attributes.start_time ASC"])
    return found[0].info.run_id if found else None


def _monitor_run(client: MlflowClient, experiment_id: str, model_name: str, target_url: str) -> str:
    """The monitor run of (model, target), else created (and ended at once: logging to an ended run is allowed)."""
    found = _find_monitor(client, experiment_id, model_name, target_url)
    if found:
        return found
    run = client.create_run(experiment_id, run_name=f"monitor-{model_name}", tags={
        "labelshift.kind": MONITOR_KIND, "labelshift.model": model_name,
        "labelshift.target": target_url.replace("'", ""),
        "mlflow.note.content": f"Target prior of {model_name} on {target_url} over time: one point per successful "
                               "re-estimation (step = run sequence). Each re-estimation is a child run."})
    client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.FINISHED))
    return run.info.run_id


#: tag of a re-estimation child run naming the process that runs it: ``host/pid/start time``
OWNER_TAG = "labelshift.owner"


def _owner(pid: int | None = None) -> str:
    import os
    import socket

    import psutil

    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}/{pid}/{psutil.Process(pid).create_time():.2f}"


def _owner_gone(owner: str) -> bool:
    """True when ``owner`` (see :func:`_owner`) names a process of this host that no longer runs."""
    import socket

    import psutil

    try:
        host, pid, started = owner.rsplit("/", 2)
        pid_i, started_f = int(pid), float(started)
    except ValueError:
        return False
    if host != socket.gethostname():
        return False                    # another machine's process: cannot tell, leave it
    try:
        return abs(psutil.Process(pid_i).create_time() - started_f) > 1.0     # the pid now names another process
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def end_orphaned_runs(client: MlflowClient, experiment_id: str, monitor_run_id: str,
                      committed: frozenset | set = frozenset()) -> list[str]:
    """End the child runs of ``monitor_run_id`` still RUNNING whose process, on this host, is gone; returns their
    ids. FINISHED when in ``committed`` (killed after its commit), else KILLED. Never fails the caller."""
    ended = []
    try:
        runs = client.search_runs([experiment_id], filter_string=f"tags.mlflow.parentRunId = '{monitor_run_id}' "
                                                                 "and attributes.status = 'RUNNING'", max_results=200)
        for run in runs:
            owner = run.data.tags.get(OWNER_TAG)
            if owner and _owner_gone(owner):
                done = run.info.run_id in committed
                client.set_tag(run.info.run_id, "labelshift.ended_by",
                               "the next re-estimation: the process that ran it was killed "
                               + ("after its commit, before it could end it" if done else "before it could end it"))
                client.set_terminated(run.info.run_id, status="FINISHED" if done else "KILLED")
                ended.append(run.info.run_id)
    except Exception as exc:                                    # bookkeeping only
        logging.getLogger(__name__).warning("could not check for orphaned MLflow runs: %s", exc)
    return ended


def catch_up_monitor(tracking_uri: str, experiment: str, model_name: str, target_url: str, history: list[dict]) \
        -> None:
    """Bookkeeping a run with no new data still owes (:func:`sync_monitor`, :func:`end_orphaned_runs`); creates
    nothing when the experiment or the monitor run does not exist yet."""
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    monitor = exp and _find_monitor(client, exp.experiment_id, model_name, target_url)
    if not monitor:
        return
    sync_monitor(tracking_uri, monitor, history, model_name)
    end_orphaned_runs(client, exp.experiment_id, monitor, _committed(history))


def _committed(history: list[dict]) -> set:
    """The child-run ids the watermark's history counts."""
    return {e["mlflow_run_id"] for e in history if e.get("mlflow_run_id")}


@dataclass(frozen=True)
class ReestimationRun:
    """The MLflow side of one re-estimation: its experiment, its child run, the monitor run of (model, target);
    and the run's ``sequence`` (the watermark's next) and Prefect ``flow_run_id`` (None outside a flow run)."""

    experiment_id: str
    run_id: str
    monitor_run_id: str
    sequence: int = 0
    flow_run_id: str | None = None

    def summary(self, tracking_uri: str) -> dict:
        """The run's ``mlflow`` entry in the flow's summary (``ui``: None without a server)."""
        return {"tracking_uri": tracking_uri, "experiment_id": self.experiment_id, "run_id": self.run_id,
                "monitor_run_id": self.monitor_run_id,
                "ui": tracking.run_url(tracking_uri, self.experiment_id, self.run_id)}


def start_reestimation_run(tracking_uri: str, experiment: str, artifact_root: str | None, *, model_name: str,
                           target_url: str, run_name: str, params: dict, tags: dict,
                           history: list[dict] | None = None, sequence: int = 0,
                           flow_run_id: str | None = None) -> ReestimationRun:
    """Create the child run of this re-estimation (under the monitor run of model and target); child runs of killed
    commands are ended first (:func:`end_orphaned_runs`, FINISHED for those ``history`` counts)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id = tracking.experiment_id(client, experiment, artifact_location=artifact_root, if_deleted="raise")
    monitor = _monitor_run(client, experiment_id, model_name, target_url)
    end_orphaned_runs(client, experiment_id, monitor, _committed(history or []))
    run = client.create_run(experiment_id, run_name=run_name, tags={
        **tags, "mlflow.parentRunId": monitor, "labelshift.kind": "reestimation", "labelshift.model": model_name,
        "labelshift.target": target_url, OWNER_TAG: _owner()})
    try:
        client.log_batch(run.info.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
    except BaseException as exc:          # stopped (SIGTERM) or failed between creating the run and returning it
        _end_quietly(client, tracking_uri, run.info.run_id, exc)
        raise
    return ReestimationRun(experiment_id, run.info.run_id, monitor, sequence, flow_run_id)


def _end_quietly(client: MlflowClient, tracking_uri: str, run_id: str, exc: BaseException) -> None:
    """End a run its caller never received (KILLED when stopped, else FAILED); a lost server leaves it RUNNING for
    the next run's :func:`end_orphaned_runs`, and a failing end never hides ``exc``."""
    if tracking.tracking_server_lost(exc, tracking_uri) is not None:
        return
    status = tracking.ended_status(exc)
    try:
        client.set_terminated(run_id, status)
    except Exception as close_exc:
        logging.getLogger(__name__).warning("could not mark MLflow run %s %s: %s", run_id, status, close_exc)


def _class_keys(k: int, class_names=None) -> list[str]:
    return metric_names(class_names) if class_names else [str(c) for c in range(k)]


def prior_metrics(report: ShiftReport, class_names=None) -> dict[str, float]:
    """The metrics of one re-estimation, by name (per class ``<c>``, the metric-safe name or the index:
    ``prior/<c>``, ``prior_lower/<c>``, ``prior_upper/<c>``, ``weight/<c>``, ``source_prior/<c>``); numbers that
    are not finite are left out."""
    out = {}
    ci = report.interval
    keys = _class_keys(report.n_classes, class_names)
    for c, v in zip(keys, report.target_prior.tolist()):
        out[f"prior/{c}"] = v
        i = keys.index(c)
        out[f"prior_lower/{c}"] = ci.lower[i]
        out[f"prior_upper/{c}"] = ci.upper[i]
        out[f"weight/{c}"] = report.weights[i]
        out[f"source_prior/{c}"] = report.source_prior[i]
    for method, check in report.cross_check.items():
        if check.ok:
            for c, v in zip(keys, check.target_prior.tolist()):
                out[f"cross_check/{method}/prior/{c}"] = v
    test, ident = report.no_shift_test, report.identifiability
    out.update({"no_shift_p_value": test.p_value, "no_shift_statistic": test.statistic,
                "total_variation": report.total_variation, "shifted": float(report.shifted),
                "trustworthy": float(report.trustworthy), "n_target": report.n_target,
                "min_hessian_eigenvalue": ident.min_hessian_eigenvalue,
                "min_free_eigenvalue": ident.min_free_eigenvalue})
    acc = report.accuracy
    if acc is not None:
        out.update({"accuracy_expected": acc.expected, "accuracy_lower": acc.lower, "accuracy_upper": acc.upper,
                    "accuracy_source": acc.source, "accuracy_change": acc.change,
                    "accuracy_corrected": acc.corrected, "accuracy_corrected_lower": acc.corrected_lower,
                    "accuracy_corrected_upper": acc.corrected_upper})
    if report.repeats is not None and report.repeats.repeated_rows:     # rows that repeat: how many, what they weigh
        out.update({"target_distinct_rows": report.repeats.n_distinct,
                    "target_effective_rows": report.repeats.effective_rows})
    if finite(ident.confusion_condition):       # a singular matrix (condition inf) logs neither number
        out["confusion_condition"] = ident.confusion_condition
        out["confusion_sigma_min"] = ident.confusion_sigma_min
    if report.label_shift is not None:
        lst = report.label_shift
        out.update({"label_shift_statistic": lst.statistic, "label_shift_p_value": lst.p_value,
                    "label_shift_dof": lst.dof, "label_shift_ok": float(bool(report.label_shift_ok))})
        for part in ("p_value_regions", "p_value_log_odds", "log_odds_statistic"):
            if part in lst.extra:
                out[f"label_shift_{part}"] = lst.extra[part]
    return {k: float(v) for k, v in out.items() if finite(v)}


def log_reestimation(tracking_uri: str, run: ReestimationRun, report: ShiftReport, summary: dict, figure: bytes,
                     class_names=None) -> None:
    """The child run's metrics (at step = the run's sequence), verdict tag, figure, summary and label-shift test."""
    client = MlflowClient(tracking_uri=tracking_uri)
    now = int(time.time() * 1000)
    run_id = run.run_id
    _log_batches(client, run_id, [Metric(k, v, now, run.sequence)
                                  for k, v in prior_metrics(report, class_names).items()])
    client.set_tag(run_id, "labelshift.verdict", report.verdict)
    client.log_text(run_id, json.dumps(summary, indent=1, default=str), "reestimation/summary.json")
    if report.label_shift_tested:
        doc = {"ok": report.label_shift_ok, "significance": report.label_shift_level,
               "summary": report.label_shift_summary,
               **(report.label_shift.to_dict() if report.label_shift is not None
                  else {"error": report.label_shift_error})}
        client.log_text(run_id, json.dumps(doc, indent=1, default=str), "reestimation/label_shift_test.json")
    tracking.log_bytes(client, run_id, figure, "figures/target_prior.png")


def log_rejections(tracking_uri: str, run_id: str, rejected: list[dict], summary: dict | None = None) -> None:
    """The batches a run rejected: metric ``n_rejected``, tag ``labelshift.rejected`` (their keys) and, when given,
    the summary JSON (which lists them with their reasons)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    client.log_metric(run_id, "n_rejected", float(len(rejected)))
    if rejected:
        client.set_tag(run_id, "labelshift.rejected", ", ".join(r["key"] for r in rejected)[:5000])
    if summary is not None:
        client.log_text(run_id, json.dumps(summary, indent=1, default=str), "reestimation/summary.json")



#: tag set on a re-estimation's child run once its point is in the monitor run's series
SYNCED_TAG = "labelshift.monitor_synced"
#: how many of the most recent history entries a run checks for points the monitor run is missing
SYNC_LOOKBACK = 30


def sync_monitor(tracking_uri: str, monitor_run_id: str, history: list[dict], model_name: str) -> list[int]:
    """Give the monitor run of (``model_name``, target) one point (``step`` = the run sequence) per entry of the last
    :data:`SYNC_LOOKBACK` of that model in the watermark's history whose child run does not carry :data:`SYNCED_TAG`
    yet; the tag is set after it, and such a child run still RUNNING is ended FINISHED. Returns the sequences added.
    """
    from datetime import datetime

    from mlflow.entities import ViewType

    client = MlflowClient(tracking_uri=tracking_uri)
    entries = [e for e in history[-SYNC_LOOKBACK:] if e.get("sequence") is not None and e.get("mlflow_run_id")
               and e.get("model") == model_name and ("target_prior" in e or "label_shift_p_value" in e)]
    if not entries:
        return []
    # which of their child runs already gave their point: one search (deleted child runs included)
    ids = ", ".join(f"'{e['mlflow_run_id']}'" for e in entries)
    experiment_id = client.get_run(monitor_run_id).info.experiment_id
    synced = {r.info.run_id for r in client.search_runs(
        [experiment_id], filter_string=f"attributes.run_id IN ({ids}) and tags.`{SYNCED_TAG}` = 'true'",
        run_view_type=ViewType.ALL, max_results=len(entries))}
    added = []
    for entry in entries:
        seq, child = entry["sequence"], entry["mlflow_run_id"]
        if child in synced:
            continue
        try:
            stamp = int(datetime.fromisoformat(str(entry.get("time")).replace("Z", "+00:00")).timestamp() * 1000)
        except ValueError:
            stamp = int(time.time() * 1000)
        values = {}
        if "target_prior" in entry:     # none under "Not label shift": that estimate means nothing
            keys = _class_keys(len(entry["target_prior"]), entry.get("classes"))
            for c, key in enumerate(keys):
                values[f"prior/{key}"] = entry["target_prior"][c]
                if "lower" in entry and "upper" in entry:
                    values[f"prior_lower/{key}"] = entry["lower"][c]
                    values[f"prior_upper/{key}"] = entry["upper"][c]
        for key, name in (("p_value", "no_shift_p_value"), ("total_variation", "total_variation"),
                          ("n_target", "n_target"), ("label_shift_p_value", "label_shift_p_value")):
            if entry.get(key) is not None:
                values[name] = entry[key]
        if entry.get("label_shift_ok") is not None:
            values["label_shift_ok"] = float(bool(entry["label_shift_ok"]))
        if entry.get("accuracy"):         # expected, lower, upper, on the source
            values.update(zip(("accuracy_expected", "accuracy_lower", "accuracy_upper", "accuracy_source"),
                              entry["accuracy"]))
        for key in ("shifted", "trustworthy"):
            if key in entry:
                values[key] = float(bool(entry[key]))
        _log_batches(client, monitor_run_id, [Metric(k, float(v), stamp, int(seq)) for k, v in values.items()
                                              if v is not None and math.isfinite(float(v))])
        try:
            client.set_tag(child, SYNCED_TAG, "true")
            # its batches are counted, so it succeeded: a run whose end MLflow missed (the server was down) ends now
            if client.get_run(child).info.status == "RUNNING":
                client.set_terminated(child, "FINISHED")
        except Exception as exc:
            if tracking.tracking_server_lost(exc, tracking_uri) is not None:
                raise       # a server that stopped answering is not asked again (each ask costs its retries)
        added.append(int(seq))
    return added


def _log_batches(client: MlflowClient, run_id: str, metrics: list) -> None:
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i:i + 1000])


def end_run(tracking_uri: str, run_id: str, status: str = "FINISHED", cause: str | None = None) -> None:
    """End the re-estimation's child run (FINISHED, or FAILED / KILLED with the cause as a tag)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    if cause:
        client.set_tag(run_id, "error", cause[:5000])
    client.set_terminated(run_id, status)


#: how the figure's legend names each interval
INTERVAL_LABELS = {"source-aware": "source-aware (target + holdout error)", "fisher": "Fisher (target only)",
                   "bootstrap": "bootstrap (target only)"}


def render_figure(report: ShiftReport, history: list[dict], level: float, title: str, class_names=None) -> bytes:
    """The estimated prior with its interval against the source prior, the watermark's history beside it (PNG).
    The legend names the interval; under "Not label shift" the title says that the estimate is not meaningful."""
    ci = report.interval
    past = [{"sequence": h["sequence"], "target_prior": h["target_prior"],
             **({"lower": h["lower"], "upper": h["upper"]} if "lower" in h and "upper" in h else {})}
            for h in history if "target_prior" in h]
    if report.verdict == Verdict.NOT_LABEL_SHIFT:
        title = f"{title}\nNot label shift: this estimate is not meaningful"
    return figure_png(plot_prior_estimate(report.source_prior.tolist(), report.target_prior.tolist(),
                                          ci.lower.tolist(), ci.upper.tolist(), level=level, title=title,
                                          class_names=class_names, history=past or None,
                                          interval_label=INTERVAL_LABELS.get(ci.method, ci.method)))


def history_record(report: ShiftReport, run_id: str | None, model_name: str | None = None,
                   class_names=None) -> dict:
    """The watermark's record of one successful re-estimation (the watermark adds ``sequence``, ``time``, ``run_id``
    and ``batches``); under "Not label shift" no estimate, only the verdict, the size and the label-shift test."""
    lst = report.label_shift
    tested = {"label_shift_p_value": None if lst is None or not finite(lst.p_value) else float(lst.p_value),
              "label_shift_ok": report.label_shift_ok} if report.label_shift_tested else {}
    base = {"model": model_name, "verdict": report.verdict, "n_target": report.n_target, **tested,
            "mlflow_run_id": run_id, **({"classes": list(class_names)} if class_names else {})}
    if report.verdict == Verdict.NOT_LABEL_SHIFT:
        return base
    ci = report.interval
    return {**base, "target_prior": [round(v, 6) for v in report.target_prior.tolist()],
            "lower": [round(v, 6) for v in ci.lower.tolist()], "upper": [round(v, 6) for v in ci.upper.tolist()],
            "interval": ci.method, "p_value": report.no_shift_test.to_dict()["p_value"], "shifted": report.shifted,
            "total_variation": round(report.total_variation, 6), "trustworthy": report.trustworthy,
            **({"accuracy": [round(float(v), 6) for v in (report.accuracy.expected, report.accuracy.lower,
                                                           report.accuracy.upper, report.accuracy.source)]}
               if report.accuracy is not None else {})}
