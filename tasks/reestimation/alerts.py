"""The verdict of a re-estimation as a Prefect event, for automations to act on (docs/alerts.md).

Each re-estimation that reaches a verdict emits one event named for it (:data:`EVENT_NAMES`); its resource is the
target with the model as labels. :func:`verdict_event` builds it (pure); :func:`emit_verdict` sends it, never
fails the run, and says when no alert can come of it (:func:`delivery_warning`).

Prefect's triggers match an event's name and its resource's labels (exact values, lists, globs), not numbers in
the payload. So the two numbers an operator sets a threshold on are also labels, in whole percents rounded down:
``labelshift.total-variation.percent`` (total variation between source and target prior) and
``labelshift.accuracy-drop.percent`` (the deployed model's accuracy on the source minus its expected accuracy on
the target). "At least T percent" is then the list of the values T..100, which :mod:`flows.alerts` writes into the
automation's trigger; floor(100 x) >= T exactly when x >= T / 100 for a whole T.
"""
from __future__ import annotations

import logging
import math
import uuid

from prefect import task
from prefect.cache_policies import NO_CACHE

from labelshift.inference.report import NOT_LABEL_SHIFT, ShiftReport

__all__ = ["EVENT_PREFIX", "EVENT_NAMES", "RESOURCE_PREFIX", "LABEL_MODEL", "LABEL_TV_PERCENT",
           "LABEL_ACCURACY_DROP_PERCENT", "AUTOMATION_TAG", "ALERTED", "event_name", "percent_label", "verdict_event",
           "emit_verdict", "delivery_warning"]

EVENT_PREFIX = "labelshift.verdict"
#: the event of each verdict a re-estimation ends in ("No new data" emits none: nothing was estimated)
EVENT_NAMES = {verdict: f"{EVENT_PREFIX}.{slug}" for verdict, slug in (
    ("Shifted", "shifted"), (NOT_LABEL_SHIFT, "not-label-shift"), ("Untrustworthy", "untrustworthy"),
    ("No shift", "no-shift"), ("No valid data", "no-valid-data"))}
RESOURCE_PREFIX = "labelshift.target."
LABEL_MODEL = "labelshift.model"
LABEL_TV_PERCENT = "labelshift.total-variation.percent"
LABEL_ACCURACY_DROP_PERCENT = "labelshift.accuracy-drop.percent"
#: the tag of every automation ``labelshift alerts`` manages (flows.alerts.TAG)
AUTOMATION_TAG = "labelshift-alerts"
#: the verdicts the automations of ``labelshift alerts`` notify of ("No shift" is never sent)
ALERTED = ("Shifted", NOT_LABEL_SHIFT, "Untrustworthy", "No valid data")

_log = logging.getLogger(__name__)


def event_name(verdict: str) -> str:
    """``labelshift.verdict.<slug>`` of a verdict; raises ValueError for a verdict that has no event."""
    try:
        return EVENT_NAMES[verdict]
    except KeyError:
        raise ValueError(f"verdict {verdict!r} has no event; known: {', '.join(EVENT_NAMES)}") from None


def percent_label(fraction: float) -> str:
    """A fraction as whole percents rounded down, as a label value: 0.374 -> "37", -0.02 -> "-2". The 1e-9 keeps
    0.29 (28.999... in binary) at "29"."""
    return str(math.floor(100 * fraction + 1e-9))


def _num(x):
    """A float for JSON (None for nan and infinities, which Prefect's event store cannot hold)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _estimate_payload(summary: dict) -> tuple[dict, dict]:
    """(payload items, resource labels) of a summary that holds an estimate (``summary["result"]``)."""
    res = ShiftReport.from_dict(summary["result"])
    names = summary.get("classes") or [str(c) for c in range(res.n_classes)]
    ci = res.interval
    prior = {"classes": list(names), "source": [_num(v) for v in res.source_prior],
             "target": [_num(v) for v in res.target_prior], "lower": [_num(v) for v in ci.lower],
             "upper": [_num(v) for v in ci.upper], "level": _num(ci.level), "interval": ci.method,
             "estimator": res.method}
    text = "; ".join(f"{n} {s:.3f} -> {t:.3f} [{lo:.3f}, {hi:.3f}]" for n, s, t, lo, hi in
                     zip(names, res.source_prior, res.target_prior, ci.lower, ci.upper))
    ls = res.label_shift
    items = {"prior": prior, "prior_text": text, "total_variation": _num(res.total_variation),
             "p_values": {"no_shift": _num(res.no_shift_test.p_value),
                          "label_shift": _num(ls.p_value) if ls is not None else None},
             "significance": {"no_shift": _num(res.significance),
                              "label_shift": _num(res.label_shift_level) if res.label_shift_tested else None},
             "trustworthy": bool(res.trustworthy), "reasons": list(res.reasons), "n_rows": int(res.n_target),
             "accuracy": None}
    labels = {LABEL_TV_PERCENT: percent_label(res.total_variation)}
    acc = res.accuracy
    if acc is not None and res.verdict != NOT_LABEL_SHIFT:
        drop = acc.source - acc.expected
        items["accuracy"] = {"source": _num(acc.source), "expected": _num(acc.expected), "lower": _num(acc.lower),
                             "upper": _num(acc.upper), "level": _num(acc.level), "drop": _num(drop)}
        if math.isfinite(drop):
            labels[LABEL_ACCURACY_DROP_PERCENT] = percent_label(drop)
    return items, labels


def verdict_event(summary: dict, *, model: dict | None = None, prefect_run_url: str | None = None) -> dict:
    """The Prefect event of a re-estimation's verdict (``summary``: the flow's summary; ``model``: default
    ``summary["model"]``), as the keyword arguments of ``prefect.events.emit_event``: the target as the resource,
    labelled; the model and the MLflow run as related resources; the payload (docs/alerts.md); an id derived from
    the MLflow run, so that one re-estimation is one event even if sent twice. ValueError for "No new data"."""
    name = event_name(summary["verdict"])
    model = model or summary.get("model") or {}
    mlflow = summary.get("mlflow") or {}
    links = summary.get("links") or {}
    mlflow_url = next((u for u in (links.get("MLflow run"), mlflow.get("ui")) if str(u or "").startswith("http")),
                      None)                  # "No valid data" has no links yet: the MLflow entry's address then
    target = str(summary["target"])
    resource = {"prefect.resource.id": RESOURCE_PREFIX + target, "prefect.resource.name": target,
                LABEL_MODEL: str(model.get("name") or ""), "labelshift.model.version": str(model.get("version") or ""),
                "labelshift.verdict": summary["verdict"]}
    payload = {"verdict": summary["verdict"], "headline": summary.get("headline", ""),
               "model": {k: model.get(k) for k in ("name", "version", "uri")}, "target": target,
               "sequence": summary.get("sequence"), "batches": len(summary.get("batches") or []),
               "rejected": [r["key"] for r in summary.get("rejected") or []],
               "links": {"prefect_run": prefect_run_url, "mlflow_run": mlflow_url},
               "prefect_flow_run_id": summary.get("prefect_flow_run_id"), "mlflow_run_id": mlflow.get("run_id")}
    if "result" in summary:
        items, labels = _estimate_payload(summary)
        payload.update(items)
        resource.update(labels)
    related = [{"prefect.resource.id": f"labelshift.model.{model.get('name')}", "prefect.resource.role": "model",
                "prefect.resource.name": f"{model.get('name')} v{model.get('version')}"}] if model.get("name") else []
    if mlflow.get("run_id"):
        related.append({"prefect.resource.id": f"mlflow.run.{mlflow['run_id']}", "prefect.resource.role": "mlflow-run"})
    seed = mlflow.get("run_id") or summary.get("prefect_flow_run_id") or uuid.uuid4().hex
    return {"event": name, "resource": resource, "related": related, "payload": payload,
            "id": uuid.uuid5(uuid.NAMESPACE_URL, f"labelshift:{name}:{seed}")}


@task(name="emit-verdict-event", cache_policy=NO_CACHE, persist_result=False)
def emit_verdict(summary: dict, *, model: dict | None = None, prefect_run_url: str | None = None,
                 alerts_missed: str | None = None) -> str | None:
    """Emit the verdict's event (:func:`verdict_event`); never raises (a failure is logged as a warning). Returns
    :func:`delivery_warning`'s sentence, also logged, when the alerts live on the server ``alerts_missed`` names and
    the verdict is alerted on; None otherwise."""
    try:
        from prefect.events import emit_event

        if summary.get("verdict") not in EVENT_NAMES:
            return None
        if not summary.get("prefect_flow_run_id"):       # the summary of "No valid data" does not hold it
            from prefect.runtime import flow_run

            summary = {**summary, "prefect_flow_run_id": flow_run.id}
        event = verdict_event(summary, model=model, prefect_run_url=prefect_run_url)
        emit_event(**event)
    except Exception as exc:
        _warn(f"the verdict's Prefect event was not emitted ({type(exc).__name__}: {exc}); automations on it will "
              "not fire for this run")
        return None
    warning = delivery_warning(event["event"], alerts_missed) \
        if alerts_missed and summary["verdict"] in ALERTED else None
    if warning:
        _warn(warning)
    return warning


def delivery_warning(event: str, alerts_at: str) -> str:
    """The sentence that no alert can be delivered for ``event``, sent to a command's temporary Prefect server while
    the alerts live on ``alerts_at``, naming the fix."""
    return (f"no alert can be delivered for this run: its event {event} went to the temporary Prefect server this "
            f"command started (PREFECT_API_URL is not set), while the alerts set up from this home live on "
            f"{alerts_at}. Point PREFECT_API_URL at it (for the local stack: `source .labelshift/stack/env.sh`); the "
            "verdict is in the run's summary and MLflow either way")


def _warn(message: str) -> None:
    try:
        from prefect import get_run_logger

        get_run_logger().warning(message)
    except Exception:
        _log.warning(message)
