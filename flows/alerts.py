"""The shipped automations on the verdict events of re-estimation, and their idempotent creation (docs/alerts.md).

:func:`check_alerts` turns the operator's choices into an :class:`AlertPlan` (or an :class:`InputError` naming the
fix) before anything is created; :func:`apply_alerts` then saves the scope's notification blocks
(:func:`block_name`), creates or updates one automation per alert (:func:`automation_specs`, found again by name;
running it twice updates them), deletes those of the scope the plan no longer asks for, and keeps the all-models
automations off the models with a scope of their own (:func:`exclusions`), so one run notifies once.
:func:`delivery_failures` lists the notifications that did not arrive.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from labelshift.errors import InputError, ServiceUnavailableError
from tasks.reestimation.alerts import (AUTOMATION_TAG, EVENT_NAMES, LABEL_ACCURACY_DROP_PERCENT, LABEL_MODEL,
                                      LABEL_TV_PERCENT, RESOURCE_PREFIX)

__all__ = ["TAG", "BLOCK_PREFIX", "block_name", "exclusions", "DeliveryFailure", "delivery_failures", "AlertPlan", "AutomationSpec", "check_alerts", "check_url", "parse_threshold",
           "automation_specs", "apply_alerts", "MESSAGE_SUBJECT", "MESSAGE_BODY"]

TAG = AUTOMATION_TAG
BLOCK_PREFIX = "labelshift-alerts"
_EMAIL = re.compile(r"^[^@\s,]+@[^@\s,]+\.[^@\s,]+$")

#: what each notification says (Jinja, rendered by Prefect's actions service from the triggering event)
MESSAGE_SUBJECT = "labelshift: {{ event.payload.verdict }} -- {{ event.payload.model.name }} on {{ event.payload.target }}"
MESSAGE_BODY = """{% macro num(x, spec, missing='n/a') %}{% if x is number %}{{ spec|format(x) }}{% else %}\
{{ missing }}{% endif %}{% endmacro %}{% set p = event.payload %}\
{{ p.verdict }}: model {{ p.model.name }} v{{ p.model.version }} on {{ p.target }}
{{ p.headline }}
{% if p.prior_text %}prior (source -> target [{{ p.prior.level }} interval]): {{ p.prior_text }}
total variation {{ num(p.total_variation, '%.3f') }}; p-values: no shift {{ num(p.p_values.no_shift, '%.3g') }}, \
label shift {{ num(p.p_values.label_shift, '%.3g', 'not run') }}
{% endif %}{% if p.accuracy %}accuracy: {{ num(p.accuracy.source, '%.3f') }} on the source, expected \
{{ num(p.accuracy.expected, '%.3f') }} [{{ num(p.accuracy.lower, '%.3f') }}, {{ num(p.accuracy.upper, '%.3f') }}] \
on the target (drop {{ num(p.accuracy.drop, '%.3f') }})
{% endif %}{% if p.rejected %}rejected batches: {{ p.rejected|join(', ') }}
{% endif %}Prefect run: {{ p.links.prefect_run or p.prefect_flow_run_id }}
MLflow run: {{ p.links.mlflow_run or p.mlflow_run_id }}"""


@dataclass(frozen=True)
class AlertPlan:
    """What ``labelshift alerts`` sets up, checked: the targets (a webhook URL, a Slack URL, SendGrid e-mail,
    existing blocks as ``<type slug>/<name>``), the Shifted thresholds in whole percents (None: no such alert), the
    model the alerts are restricted to (None: every model), and whether to remove this scope's automations."""

    webhook_url: str | None = None
    slack_url: str | None = None
    email_to: tuple[str, ...] = ()
    email_from: str | None = None
    sendgrid_api_key: str | None = field(default=None, repr=False)
    blocks: tuple[str, ...] = ()
    tv_percent: int | None = 10
    accuracy_drop_percent: int | None = None
    model: str | None = None
    remove: bool = False

    @property
    def scope(self) -> str:
        """The automations' scope in their names: the model, or ``all models``."""
        return self.model or "all models"


def block_name(model: str | None) -> str:
    """The name of a scope's blocks: ``labelshift-alerts-all-models``, or ``labelshift-alerts-model-<slug>-<hash>``
    (the hash of the exact name, so that two models whose slugs agree never share a block)."""
    if model is None:
        return f"{BLOCK_PREFIX}-all-models"
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")[:40].strip("-") or "model"
    return f"{BLOCK_PREFIX}-model-{slug}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class AutomationSpec:
    """One automation: its name, what it says, the event it expects and the labels its resource must carry."""

    name: str
    description: str
    event: str
    match: dict
    match_related: list = field(default_factory=list)


def check_url(url: str, option: str) -> str:
    """``url`` when it is an absolute http(s) URL with a host; else InputError naming ``option`` and the fix."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in url.strip():
        raise InputError(f"{option} {url!r} is not an http(s) URL; pass one such as https://hooks.example.com/labelshift "
                         "(scheme, host and path)")
    return url.strip()


def parse_threshold(value: str | float | None, option: str) -> int | None:
    """A threshold given as a fraction in [0, 1] with at most two decimals (``0.1``, ``0.05``), in whole percents;
    ``off`` or None: no alert. InputError otherwise, naming ``option``."""
    if value is None or str(value).strip().lower() in ("off", "none", ""):
        return None
    try:
        fraction = float(value)
    except ValueError:
        raise InputError(f"{option} {value!r} is not a number; pass a fraction such as 0.1, or 'off'") from None
    if not 0.0 <= fraction <= 1.0:
        raise InputError(f"{option} must be in [0, 1], got {fraction}; pass a fraction such as 0.1 (10%), or 'off'")
    percent = round(fraction * 100)
    if abs(fraction * 100 - percent) > 1e-6:
        raise InputError(f"{option} {fraction} is not a whole percent (the events carry whole percents); pass "
                         f"{percent / 100:.2f} or another multiple of 0.01")
    return percent


def check_alerts(*, webhook_url=None, slack_url=None, email_to=(), email_from=None, sendgrid_api_key=None,
                 blocks=(), tv=None, accuracy_drop=None, model=None, remove=False,
                 tv_option="--shifted-tv", drop_option="--shifted-accuracy-drop") -> AlertPlan:
    """The plan, checked (the referenced blocks' existence aside); InputError naming the option and the fix."""
    refs = tuple(b.strip() for b in blocks if b.strip())
    for ref in refs:
        if ref.count("/") != 1 or not all(ref.split("/")):
            raise InputError(f"--block {ref!r} must be <block type slug>/<block name>, e.g. sendgrid-email/ops "
                             "(`prefect block ls` lists them)")
    email_to = tuple(a.strip() for a in email_to if a.strip())
    for address in (*email_to, *([email_from] if email_from else [])):
        if not _EMAIL.match(address):
            raise InputError(f"{address!r} is not an e-mail address; pass one such as ops@example.com")
    if email_to and not (email_from and sendgrid_api_key):
        raise InputError("--email-to needs --email-from and a SendGrid API key in $LABELSHIFT_ALERT_SENDGRID_API_KEY "
                         "(or send e-mail through a block of your own with --block TYPE/NAME)")
    plan = AlertPlan(webhook_url=check_url(webhook_url, "--webhook-url") if webhook_url else None,
                     slack_url=check_url(slack_url, "--slack-webhook-url") if slack_url else None,
                     email_to=email_to, email_from=email_from if email_to else None,
                     sendgrid_api_key=sendgrid_api_key if email_to else None, blocks=refs,
                     tv_percent=parse_threshold(tv, tv_option),
                     accuracy_drop_percent=parse_threshold(accuracy_drop, drop_option),
                     model=(model or "").strip() or None, remove=remove)
    if plan.model and (plan.model.startswith("!") or "*" in plan.model):
        raise InputError(f"--model {plan.model!r}: a registered model's name, without '*' or a leading '!' (Prefect "
                         "reads those as patterns); pass the name as MLflow shows it")
    if not remove and not (plan.webhook_url or plan.slack_url or plan.email_to or plan.blocks):
        raise InputError("no notification target: pass --webhook-url URL, --slack-webhook-url URL, --email-to "
                         "ADDRESS or --block TYPE/NAME (or their environment variables, see --help)")
    return plan


def _at_least(percent: int) -> list[str]:
    """The label values of ``floor(100 x) >= percent``: "percent" .. "100"."""
    return [str(p) for p in range(percent, 101)]


def exclusions(models) -> list[dict]:
    """The ``match_related`` of an all-models automation that skips ``models``: one specification per model, since
    Prefect requires every one of the list to be met (negated values in one would be met by any model)."""
    return [{"prefect.resource.role": "model", "prefect.resource.id": f"!labelshift.model.{m}"}
            for m in sorted(models)]


def automation_specs(plan: AlertPlan, scoped: tuple[str, ...] = ()) -> list[AutomationSpec]:
    """The automations of ``plan``: Not label shift, Untrustworthy and No valid data always, Shifted per threshold
    set; the all-models ones skip the models in ``scoped``."""
    base = {"prefect.resource.id": RESOURCE_PREFIX + "*"}
    if plan.model:
        base[LABEL_MODEL] = plan.model
    scope = f" ({plan.scope})"
    related = [] if plan.model else exclusions(scoped)
    specs = [AutomationSpec(f"labelshift: Not label shift{scope}",
                            "The new data are not label-shifted source data: no corrected outputs were written.",
                            EVENT_NAMES["Not label shift"], dict(base)),
             AutomationSpec(f"labelshift: Untrustworthy{scope}", "The re-estimate cannot be trusted.",
                            EVENT_NAMES["Untrustworthy"], dict(base)),
             AutomationSpec(f"labelshift: No valid data{scope}",
                            "No new batch could be used: each was rejected by its checks (or replaced while read); "
                            "nothing was estimated.", EVENT_NAMES["No valid data"], dict(base))]
    if plan.tv_percent is not None:
        specs.append(AutomationSpec(
            f"labelshift: Shifted, total variation >= {plan.tv_percent}%{scope}",
            f"The label distribution shifted by a total variation of {plan.tv_percent}% or more.",
            EVENT_NAMES["Shifted"], {**base, LABEL_TV_PERCENT: _at_least(plan.tv_percent)}))
    if plan.accuracy_drop_percent is not None:
        specs.append(AutomationSpec(
            f"labelshift: Shifted, accuracy drop >= {plan.accuracy_drop_percent}%{scope}",
            f"The label distribution shifted and the deployed model's expected accuracy dropped by "
            f"{plan.accuracy_drop_percent} points or more.",
            EVENT_NAMES["Shifted"], {**base, LABEL_ACCURACY_DROP_PERCENT: _at_least(plan.accuracy_drop_percent)}))
    return [AutomationSpec(s.name, s.description, s.event, s.match, related) for s in specs]


def _automation(spec: AutomationSpec, block_ids: list):
    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    trigger = EventTrigger(expect={spec.event}, match=spec.match, match_related=spec.match_related or {},
                           posture=Posture.Reactive, threshold=1, within=0)
    actions = [SendNotification(block_document_id=b, subject=MESSAGE_SUBJECT, body=MESSAGE_BODY) for b in block_ids]
    return AutomationCore(name=spec.name, description=spec.description + " (managed by `labelshift alerts`)",
                          enabled=True, tags=[TAG], trigger=trigger, actions=actions)


def _existing_blocks(refs) -> list:
    """The document ids of the notification blocks ``refs``; InputError for one missing or that cannot notify."""
    from prefect.blocks.core import Block

    ids = []
    for ref in refs:
        try:
            block = Block.load(ref)
        except Exception as exc:
            raise InputError(f"--block {ref}: no such block on the Prefect server ({type(exc).__name__}: {exc}); "
                             f"create it first (Prefect UI > Blocks, or `prefect block create`), or pick one of: "
                             f"{', '.join(_notification_blocks()) or 'none yet'}") from None
        if "notify" not in block.get_block_capabilities():
            raise InputError(f"--block {ref} is not a notification block; pick one of: "
                             f"{', '.join(_notification_blocks()) or 'none yet'}")
        ids.append(block._block_document_id)
    return ids


def _notification_blocks() -> list[str]:
    try:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            return sorted(f"{d.block_type.slug}/{d.name}" for d in client.read_block_documents(include_secrets=False)
                          if d.name and d.block_type and "notify" in (d.block_schema.capabilities
                                                                      if d.block_schema else []))
    except Exception:
        return []


def _save_blocks(plan: AlertPlan) -> list:
    """Save the plan's blocks under its scope's :func:`block_name`, overwriting; their document ids."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock, SendgridEmail, SlackWebhook

    name, ids = block_name(plan.model), []
    if plan.webhook_url:
        ids.append(CustomWebhookNotificationBlock(
            name=name, url=plan.webhook_url,
            json_data={"subject": "{{subject}}", "body": "{{body}}", "text": "{{subject}}\n{{body}}"},
        ).save(name, overwrite=True))
    if plan.slack_url:
        ids.append(SlackWebhook(url=plan.slack_url).save(name, overwrite=True))
    if plan.email_to:
        ids.append(SendgridEmail(api_key=plan.sendgrid_api_key, sender_email=plan.email_from,
                                 to_emails=list(plan.email_to)).save(name, overwrite=True))
    return ids


def _check_server() -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    with get_client(sync_client=True) as client:
        problem = client.api_healthcheck()
    if problem is not None:
        raise ServiceUnavailableError(f"the Prefect API at {PREFECT_API_URL.value()} did not answer ({problem}); "
                                      "start it (`labelshift stack up`, or `prefect server start`) or fix "
                                      "PREFECT_API_URL")


def _tagged(client, page: int = 100) -> list:
    """Every automation tagged :data:`TAG`, page by page (the API answers at most its default limit at once)."""
    from prefect.events.filters import AutomationFilter, AutomationFilterTags

    only_ours = AutomationFilter(tags=AutomationFilterTags(all_=[TAG]))
    found: list = []
    while True:
        batch = client.read_automations(automations=only_ours, limit=page, offset=len(found))
        found += batch
        if len(batch) < page:
            return found


def apply_alerts(plan: AlertPlan) -> dict:
    """Set up (or with ``plan.remove``, delete with the scope's blocks) the plan's automations, after checking the
    server (ServiceUnavailableError) and the referenced blocks (InputError). Returns ``{"created", "updated",
    "deleted": [names], "blocks": [ids], "deleted_blocks": [<type slug>/<name>]}``."""
    from prefect.client.orchestration import get_client

    _check_server()
    block_ids = [] if plan.remove else _existing_blocks(plan.blocks)     # checked before anything is written
    if not plan.remove:
        block_ids = _save_blocks(plan) + block_ids
    done: dict = {"created": [], "updated": [], "deleted": [], "blocks": [str(b) for b in block_ids],
                  "deleted_blocks": []}
    with get_client(sync_client=True) as client:
        scoped = _scoped_models(_tagged(client)) - {plan.model}
        if plan.model and not plan.remove:
            scoped.add(plan.model)
        wanted = [] if plan.remove else automation_specs(plan, tuple(sorted(scoped)))
        _write_scope(client, plan, wanted, block_ids, done)
        if plan.model:
            done["updated"] += _exclude_from_all_models(client, scoped)
        if plan.remove:
            done["deleted_blocks"] = _delete_scope_blocks(client, plan.model)
    return done


def _scoped_models(automations) -> set[str]:
    """The models that have automations of their own among ``automations`` (their trigger's model label)."""
    models = set()
    for automation in automations:
        match = getattr(automation.trigger, "match", None)
        value = match.root.get(LABEL_MODEL) if match is not None else None
        if isinstance(value, str):
            models.add(value)
    return models


def _exclude_from_all_models(client, scoped: set[str]) -> list[str]:
    """Set the all-models automations to skip the ``scoped`` models; the names of those that changed."""
    from prefect.events.schemas.automations import AutomationCore

    related, changed = exclusions(scoped), []
    for automation in _tagged(client):
        if not automation.name.endswith(f" ({AlertPlan().scope})"):
            continue
        trigger = automation.trigger.model_dump(mode="json")
        current = trigger.get("match_related") or []
        if (current if isinstance(current, list) else [current] if current else []) == related:
            continue
        kept = {k: v for k, v in automation.model_dump(mode="json").items() if v is not None}   # none is unset
        core = AutomationCore.model_validate({**kept, "trigger": {**trigger, "match_related": related or {}}})
        client.update_automation(automation.id, core)
        changed.append(automation.name)
    return changed


def _write_scope(client, plan: AlertPlan, wanted: list[AutomationSpec], block_ids: list, done: dict) -> None:
    """Create or update the scope's automations ``wanted`` and delete its others; the names go to ``done``."""
    ours = [a for a in _tagged(client) if a.name.endswith(f" ({plan.scope})")]
    by_name: dict = {}
    for automation in ours:
        by_name.setdefault(automation.name, []).append(automation)
    for spec in wanted:
        found = by_name.pop(spec.name, [])
        automation = _automation(spec, block_ids)
        if found:
            client.update_automation(found[0].id, automation)
            done["updated"].append(spec.name)
            found = found[1:]
        else:
            client.create_automation(automation)
            done["created"].append(spec.name)
        for extra in found:                   # duplicates made by hand or by an interrupted earlier run
            client.delete_automation(extra.id)
    for name, stale in by_name.items():
        for automation in stale:
            client.delete_automation(automation.id)
        done["deleted"].append(name)


#: the block types :func:`_save_blocks` writes
_SAVED_KINDS = ("custom-webhook", "slack-webhook", "sendgrid-email")


def _delete_scope_blocks(client, model: str | None) -> list[str]:
    """Delete the blocks :func:`_save_blocks` saved for the scope of ``model``; their ``<type slug>/<name>``."""
    from prefect.exceptions import ObjectNotFound

    name, gone = block_name(model), []
    for slug in _SAVED_KINDS:
        try:
            document = client.read_block_document_by_name(name, slug, include_secrets=False)
        except ObjectNotFound:
            continue
        client.delete_block_document(document.id)
        gone.append(f"{slug}/{name}")
    return gone


#: what Prefect's triggers and actions services record of an automation's firing and of each of its actions
#: (prefect/server/events/schemas/automations.py, prefect/server/events/actions.py)
FIRED, EXECUTED, FAILED = ("prefect.automation.triggered", "prefect.automation.action.executed",
                           "prefect.automation.action.failed")
#: why an action that left neither an executed nor a failed event did not arrive
LOST = ("no delivery recorded: the notification raised an error that Prefect does not report as a failed action (a "
        "webhook receiver down, refusing, or answering an error status); Prefect's actions service retried it and "
        "dropped it, and the error is in the Prefect server's log")


@dataclass(frozen=True)
class DeliveryFailure:
    """A notification that did not arrive: when its automation fired (ISO 8601), the automation's name, the reason
    (Prefect's, or :data:`LOST`) and the firing verdict event's ``{verdict, model, target, prefect_flow_run_id}``."""

    occurred: str
    automation: str
    reason: str
    verdict: dict


def _events(client, event_filter: dict) -> list[dict]:
    """Every stored event that ``event_filter`` (Prefect's EventFilter, as JSON) selects, page after page."""
    page = client.request("POST", "/events/filter", json={"filter": event_filter, "limit": 50})
    page.raise_for_status()
    body = page.json()
    found = list(body["events"])
    while body.get("next_page"):
        token = body["next_page"].split("page-token=", 1)[1]
        page = client.request("GET", "/events/filter/next", params={"page-token": token})
        page.raise_for_status()
        body = page.json()
        found += body["events"]
    return found


def _related(event: dict, role: str) -> str | None:
    """The id of the event that ``event`` names in ``role`` (``prefect.event.<id>`` -> ``<id>``), or None."""
    for resource in event.get("related") or []:
        if resource.get("prefect.resource.role") == role:
            return resource["prefect.resource.id"].removeprefix("prefect.event.")
    return None


def delivery_failures(hours: float = 24.0, settle_s: float = 10.0) -> list[DeliveryFailure]:
    """The notifications of the :data:`TAG` automations fired in the last ``hours`` that did not arrive, oldest
    first: each :data:`FAILED` action, and as :data:`LOST` each action that left neither it nor :data:`EXECUTED`
    ``settle_s`` after the firing. ServiceUnavailableError when the Prefect API does not answer."""
    from datetime import datetime, timedelta, timezone

    from prefect.client.orchestration import get_client

    _check_server()
    now = datetime.now(timezone.utc)
    with get_client(sync_client=True) as client:
        ours = {f"prefect.automation.{a.id}": a for a in _tagged(client)}
        if not ours:
            return []
        events = _events(client, {"event": {"name": [FIRED, EXECUTED, FAILED]}, "resource": {"id": sorted(ours)},
                                  "occurred": {"since": (now - timedelta(hours=hours)).isoformat()}})
        handled: dict = {}
        for event in events:
            if event["event"] != FIRED:
                handled.setdefault(_related(event, "automation-triggered-event"), []).append(event)
        failures = []
        for fired in sorted((e for e in events if e["event"] == FIRED), key=lambda e: e["occurred"]):
            done = handled.get(fired["id"], [])
            reasons = [_reason(e) for e in done if e["event"] == FAILED]
            age = (now - datetime.fromisoformat(fired["occurred"])).total_seconds()
            missing = len(ours[fired["resource"]["prefect.resource.id"]].actions) - len(done)
            if missing > 0 and age >= settle_s:
                reasons += [LOST] * missing
            failures += [(fired, reason) for reason in reasons]
        verdicts = _verdicts(client, {_related(f, "triggering-event") for f, _ in failures} - {None})
    return [DeliveryFailure(fired["occurred"], fired["resource"].get("prefect.resource.name", ""), reason,
                            verdicts.get(_related(fired, "triggering-event"), {})) for fired, reason in failures]


def _reason(failed: dict) -> str:
    """Prefect's reason for a failed action, with the last line of the block's log when it kept one."""
    payload = failed.get("payload") or {}
    log = str(payload.get("notification_log") or "").strip().splitlines()
    return str(payload.get("reason") or "failed") + (f" ({log[-1].strip()})" if log else "")


def _verdicts(client, ids: set[str]) -> dict[str, dict]:
    """``{event id: {verdict, model, target, prefect_flow_run_id}}`` of the verdict events ``ids`` still stored."""
    if not ids:
        return {}
    found = _events(client, {"id": {"id": sorted(ids)}, "occurred": {"since": "1970-01-01T00:00:00+00:00"}})
    return {e["id"]: {"verdict": e["payload"].get("verdict"), "model": (e["payload"].get("model") or {}).get("name"),
                      "target": e["payload"].get("target"),
                      "prefect_flow_run_id": e["payload"].get("prefect_flow_run_id")} for e in found}
