"""``labelshift alerts``: create or update the automations that notify on re-estimation verdicts (docs/alerts.md).

    labelshift alerts --webhook-url https://hooks.example.com/labelshift --shifted-tv 0.15

Needs a lasting Prefect server (``PREFECT_API_URL``): the automations live on it and its triggers service fires
them. Everything is checked first (URLs, thresholds, the server, the blocks named by ``--block``); only then are
blocks saved and automations written, by :func:`flows.alerts.apply_alerts`.
"""
from __future__ import annotations

import argparse
import json
import textwrap

from runtime import environment as settings_mod
from flows.cli._common import UsageError, add_common, setup

__all__ = ["register", "LISTEN_PORT"]

#: port of ``labelshift alerts listen`` unless --port says otherwise
LISTEN_PORT = 8765


def register(sub) -> None:
    s = settings_mod
    p = sub.add_parser(
        "alerts", help="notify (webhook, Slack, e-mail) on Not label shift, Untrustworthy, No valid data and large "
                       "shifts",
        description=textwrap.fill(
            "Create or update, on the Prefect server of PREFECT_API_URL, the automations that send a notification "
            "when a re-estimation ends Not label shift, Untrustworthy, No valid data (every new batch rejected), or "
            "Shifted by at least a total variation "
            "(--shifted-tv) or an accuracy drop (--shifted-accuracy-drop). Every re-estimation emits a Prefect event "
            "named for its verdict (labelshift.verdict.shifted, .not-label-shift, .untrustworthy, .no-shift, "
            ".no-valid-data) that carries the model, the target, the headline, the prior with its interval, the "
            "p-values and the links to the runs; the automations match those events. Idempotent: running it again "
            "updates the automations (and drops a Shifted alert whose threshold was turned off), never duplicates "
            "them. Nothing is created when an option is wrong.", 79),
        epilog="examples:\n"
               "  labelshift alerts --webhook-url https://hooks.example.com/labelshift\n"
               "  labelshift alerts --slack-webhook-url https://hooks.slack.com/services/T/B/X --shifted-tv 0.2 \\\n"
               "      --shifted-accuracy-drop 0.05 --model fraud-model\n"
               f"  {s.ENV_ALERT_SENDGRID_KEY}=SG.xxx labelshift alerts --email-to ops@example.com "
               "--email-from labelshift@example.com\n"
               "  labelshift alerts --block mattermost-webhook/ops     # any notification block you created\n"
               "  labelshift alerts --remove                           # delete these automations\n"
               "  labelshift alerts --failures                         # notifications that did not arrive (24 h)\n"
               "A flag wins over its environment variable. Thresholds are fractions in whole percents (0.1 = 10%).\n"
               "Exit status: 0 done, 1 the Prefect server is unreachable, 2 bad options or an unknown block "
               "(nothing created), 3 --failures found some.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p, top=False)
    n = p.add_argument_group("where notifications go (at least one)")
    n.add_argument("--webhook-url", metavar="URL",
                   help="POST a JSON message {subject, body, text} to this URL (a Custom Webhook block of this "
                        "scope: labelshift-alerts-all-models, or labelshift-alerts-model-<name>-<hash> with --model) "
                        f"(default: ${s.ENV_ALERT_WEBHOOK_URL})")
    n.add_argument("--slack-webhook-url", metavar="URL",
                   help="post to Slack through this incoming-webhook URL (a Slack Webhook block) "
                        f"(default: ${s.ENV_ALERT_SLACK_URL})")
    n.add_argument("--email-to", metavar="ADDRESS,...",
                   help="e-mail these addresses through SendGrid (a SendGrid Email block; the API key from "
                        f"${s.ENV_ALERT_SENDGRID_KEY}) (default: ${s.ENV_ALERT_EMAIL_TO})")
    n.add_argument("--email-from", metavar="ADDRESS",
                   help=f"sender of those e-mails (default: ${s.ENV_ALERT_EMAIL_FROM})")
    n.add_argument("--block", action="append", metavar="TYPE/NAME",
                   help="also notify through this existing notification block, e.g. sendgrid-email/ops or "
                        "microsoft-teams-webhook/ml (repeatable; `prefect block ls` lists them) "
                        f"(default: ${s.ENV_ALERT_BLOCKS}, comma-separated)")
    t = p.add_argument_group("when to notify (Not label shift, Untrustworthy and No valid data always)")
    t.add_argument("--shifted-tv", metavar="T",
                   help="notify of a Shifted verdict whose total variation between source and target prior is at "
                        f"least T, in [0, 1] by 0.01; 'off': never (default: ${s.ENV_ALERT_TV} or "
                        f"{s.DEFAULT_ALERT_TV})")
    t.add_argument("--shifted-accuracy-drop", metavar="D",
                   help="notify of a Shifted verdict whose expected accuracy on the target is at least D below the "
                        f"accuracy on the source, in [0, 1] by 0.01; 'off': never (default: ${s.ENV_ALERT_ACCURACY_DROP}"
                        " or off)")
    t.add_argument("--model", metavar="NAME",
                   help="only the re-estimations of this registered model (NAME or models:/NAME@ALIAS) (default: "
                        "every model); each scope has its own automations")
    p.add_argument("--remove", action="store_true",
                   help="delete the automations of this scope instead, and the blocks saved for it")
    p.add_argument("--failures", nargs="?", type=float, const=24.0, metavar="HOURS",
                   help="instead, list the notifications of these automations that did not arrive in the last HOURS "
                        "(default 24), with why and for which run; exit 3 when there are some (Prefect retries a "
                        "failed webhook within a second and then drops it: see docs/alerts.md)")
    p.set_defaults(handler=run)
    _register_listen(p)


def _register_listen(alerts_parser) -> None:
    sub = alerts_parser.add_subparsers(dest="alerts_action", metavar="listen", title="optional subcommand")
    p = sub.add_parser(
        "listen", help="a webhook receiver on loopback that prints each notification it gets",
        description=textwrap.fill(
            "Print each message POSTed to http://HOST:PORT/ (any path): the text of a labelshift notification, "
            "else the body as it came. A receiver to try the alerts on one machine: pass its URL to "
            "`labelshift alerts --webhook-url` in another shell. Answers 200 to every POST; not a server for "
            "production.", 79),
        epilog="example:\n"
               "  labelshift alerts listen --port 8765 &\n"
               "  labelshift alerts --webhook-url http://127.0.0.1:8765/labelshift\n"
               "Exit status: 0 after --count messages, 2 when the port is taken, 130 on Ctrl-C.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=LISTEN_PORT,
                   help=f"port to listen on; 0 for any free one (printed) (default: {LISTEN_PORT})")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, loopback only)")
    p.add_argument("--count", type=int, metavar="N", help="stop after N messages (default: until Ctrl-C)")
    p.set_defaults(handler=listen)


def _model_name(value: str | None) -> str | None:
    if not value:
        return None
    if value.startswith("models:/"):
        return value[len("models:/"):].split("@", 1)[0].split("/", 1)[0] or None
    return value


def _listed(text: str | None) -> list[str]:
    return [t for t in (text or "").split(",") if t.strip()]


def plan_from_args(args):
    """The checked :class:`flows.alerts.AlertPlan` of the command line and the environment; UsageError when wrong."""
    from flows.alerts import check_alerts
    from labelshift.errors import InputError

    s, read = settings_mod, settings_mod.read
    try:
        return check_alerts(
            webhook_url=args.webhook_url or read(s.ENV_ALERT_WEBHOOK_URL),
            slack_url=args.slack_webhook_url or read(s.ENV_ALERT_SLACK_URL),
            email_to=_listed(args.email_to or read(s.ENV_ALERT_EMAIL_TO)),
            email_from=args.email_from or read(s.ENV_ALERT_EMAIL_FROM),
            sendgrid_api_key=read(s.ENV_ALERT_SENDGRID_KEY),
            blocks=args.block or _listed(read(s.ENV_ALERT_BLOCKS)),
            tv=args.shifted_tv or read(s.ENV_ALERT_TV) or s.DEFAULT_ALERT_TV,
            accuracy_drop=args.shifted_accuracy_drop or read(s.ENV_ALERT_ACCURACY_DROP),
            model=_model_name(args.model), remove=args.remove)
    except InputError as exc:
        raise UsageError(str(exc)) from None


def _lasting_server(args) -> settings_mod.Settings:
    """Resolve the settings; UsageError naming PREFECT_API_URL when there is no lasting Prefect server."""
    env = setup(args)
    if env.prefect_api_url is None:
        raise UsageError(f"alerts need a lasting Prefect server: the automations live on it and its triggers fire "
                         f"them. Set {settings_mod.ENV_PREFECT_API_URL} (e.g. http://127.0.0.1:4200/api of "
                         "`labelshift stack up` or `prefect server start`)")
    return env


def failures(args) -> int:
    """``labelshift alerts --failures [HOURS]``: print each notification that did not arrive
    (:func:`flows.alerts.delivery_failures`); 3 when there is one, else 0."""
    if not 0 < args.failures <= 24 * 366:
        raise UsageError(f"--failures {args.failures:g}: pass a number of hours above 0 (at most a year), e.g. 24")
    _lasting_server(args)
    from flows.alerts import delivery_failures

    found = delivery_failures(hours=args.failures)
    for failure in found:
        v = failure.verdict
        run = (f"{v.get('verdict')} of {v.get('model')} on {v.get('target')}, flow run {v.get('prefect_flow_run_id')}"
               if v else "its verdict event is no longer stored")
        print(f"{failure.occurred}  '{failure.automation}' did not notify ({run}): {failure.reason}")
    if not found:
        print(f"no failed notification of `labelshift alerts` automations in the last {args.failures:g} h")
        return 0
    print(f"{len(found)} notification(s) did not arrive; the verdicts are in the runs' summaries and MLflow. Fix the "
          "receiver (or the block), and see docs/alerts.md ('When a notification fails')")
    return 3


def run(args) -> int:
    if args.failures is not None:
        return failures(args)
    plan = plan_from_args(args)                       # every option checked before anything is contacted
    env = _lasting_server(args)
    from flows.alerts import apply_alerts
    from labelshift.errors import InputError

    try:
        done = apply_alerts(plan)
    except InputError as exc:
        raise UsageError(str(exc)) from None
    for word in ("created", "updated", "deleted"):
        for name in done[word]:
            print(f"{word} automation '{name}'")
    for ref in done.get("deleted_blocks", []):
        print(f"deleted block '{ref}'")
    if not plan.remove:
        print(f"notifications through {len(done['blocks'])} block(s); every re-estimation emits "
              "labelshift.verdict.<verdict> (docs/alerts.md)")
        # a later run from this home on a temporary server (PREFECT_API_URL not set) then says its alerts are missed
        settings_mod.record_alerts_server(env.home, env.prefect_api_url)
    return 0


def message_text(body: bytes) -> str:
    """What ``listen`` prints of a POST body: the ``text`` of a labelshift notification (JSON with ``text``, as the
    Custom Webhook block of ``alerts`` sends it), else the body decoded as UTF-8 (undecodable bytes replaced)."""
    raw = body.decode("utf-8", errors="replace")
    try:
        message = json.loads(raw)
    except ValueError:
        return raw
    if isinstance(message, dict) and isinstance(message.get("text"), str):
        return message["text"]
    return json.dumps(message, indent=2)


def listen(args) -> int:
    """Serve HTTP on ``args.host:args.port`` and print each POST body (:func:`message_text`) until ``args.count``
    messages arrived (or Ctrl-C). Raises UsageError when the address cannot be bound."""
    from datetime import datetime, timezone
    from http.server import BaseHTTPRequestHandler, HTTPServer

    if args.count is not None and args.count < 1:
        raise UsageError(f"--count must be at least 1, got {args.count}; leave it out to listen until Ctrl-C")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            self.send_response(200)
            self.end_headers()
            when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            print(f"--- {when}  POST {self.path}\n{message_text(body)}", flush=True)

        def log_message(self, *args):
            pass

    try:
        server = HTTPServer((args.host, args.port), Handler)
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port} ({exc.strerror}); pick another --port "
                         "(0 for any free one)") from None
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}/ (pass it to `labelshift alerts --webhook-url`; Ctrl-C to stop)",
          flush=True)
    handled = 0
    with server:
        while args.count is None or handled < args.count:
            server.handle_request()
            handled += 1
    return 0
