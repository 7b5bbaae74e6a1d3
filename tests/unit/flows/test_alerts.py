"""Alerts on re-estimation verdicts: the event of a verdict (``tasks.reestimation.alerts``), the automations and the
``labelshift alerts`` command's checks (``flows.alerts``, ``flows.cli.alerts``). The end-to-end test against a real
Prefect server is ``tests/integration/test_alerts_e2e.py``."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from flows.alerts import AlertPlan, automation_specs, check_alerts, parse_threshold
from flows.cli import main
from labelshift.errors import InputError
from labelshift import Holdout, Target, AssessmentSettings
from tasks.reestimation.alerts import (LABEL_ACCURACY_DROP_PERCENT, LABEL_MODEL, LABEL_TV_PERCENT, emit_verdict, percent_label,
                          verdict_event)

MODEL = {"name": "fraud-model", "version": "7", "uri": "models:/fraud-model@production"}


def _summary(**case) -> dict:
    """A reestimate summary around a real source-aware ShiftReport of a well-specified Gaussian problem."""
    from labelshift.inference.report import assess_shift
    from tests.unit.inference.test_report import _gaussian_case

    Xh, yh, Xt, cal, sp, pt, prior = _gaussian_case(**case)
    report = assess_shift(Holdout(sp, yh, prior, outputs=Xh, calibrator=cal),
                          Target(pt, Xt),
                          AssessmentSettings(interval="source-aware"))
    return {"verdict": report.verdict, "headline": f"headline of {report.verdict}", "sequence": 4,
            "classes": ["a", "b", "c"], "model": MODEL, "target": "s3://bucket/target", "batches": ["d1.npy"],
            "result": report.to_dict(), "prefect_flow_run_id": "fr-1",
            "mlflow": {"run_id": "mlrun-1", "experiment_id": "3"},
            "links": {"MLflow run": "http://mlflow:5000/#/experiments/3/runs/mlrun-1", "watermark": "s3://x"}}


@pytest.fixture(scope="module")
def shifted():
    return _summary(prior=[0.6, 0.3, 0.1])


def test_a_shifted_verdict_is_an_event_on_the_target_that_names_the_model_and_carries_the_numbers(shifted):
    res = shifted["result"]
    assert shifted["verdict"] == "Shifted" and "accuracy" in res
    ev = verdict_event(shifted, prefect_run_url="http://prefect:4200/runs/flow-run/fr-1")
    assert ev["event"] == "labelshift.verdict.shifted"
    r = ev["resource"]
    assert r["prefect.resource.id"] == "labelshift.target.s3://bucket/target"
    assert (r[LABEL_MODEL], r["labelshift.model.version"], r["labelshift.verdict"]) == ("fraud-model", "7", "Shifted")
    assert r[LABEL_TV_PERCENT] == str(int(np.floor(100 * res["total_variation"])))
    drop = res["accuracy"]["source"] - res["accuracy"]["expected"]
    assert r[LABEL_ACCURACY_DROP_PERCENT] == percent_label(drop)
    p = ev["payload"]
    assert p["headline"] == "headline of Shifted" and p["model"] == MODEL and p["target"] == "s3://bucket/target"
    assert p["prior"]["target"] == pytest.approx(res["target_prior"]) and p["prior"]["classes"] == ["a", "b", "c"]
    assert p["prior"]["lower"] == pytest.approx(res["interval"]["lower"]) and p["prior"]["level"] == 0.95
    assert p["prior_text"].startswith("a ") and "->" in p["prior_text"]
    assert p["p_values"]["no_shift"] == pytest.approx(res["no_shift_test"]["p_value"])
    assert p["p_values"]["label_shift"] == pytest.approx(res["label_shift_test"]["p_value"])
    assert p["total_variation"] == pytest.approx(res["total_variation"])
    assert p["accuracy"]["drop"] == pytest.approx(drop)
    assert p["links"] == {"prefect_run": "http://prefect:4200/runs/flow-run/fr-1",
                          "mlflow_run": "http://mlflow:5000/#/experiments/3/runs/mlrun-1"}
    json.dumps(p, allow_nan=False)                  # what Prefect's event store takes
    assert {x["prefect.resource.role"] for x in ev["related"]} == {"model", "mlflow-run"}
    assert verdict_event(shifted)["id"] == ev["id"]           # one re-estimation, one event id


def test_not_label_shift_carries_the_test_and_no_accuracy():
    summary = _summary(drift=2.0)
    assert summary["verdict"] == "Not label shift"
    ev = verdict_event(summary)
    assert ev["event"] == "labelshift.verdict.not-label-shift"
    assert ev["payload"]["accuracy"] is None and LABEL_ACCURACY_DROP_PERCENT not in ev["resource"]
    assert ev["payload"]["p_values"]["label_shift"] is not None and ev["payload"]["links"]["prefect_run"] is None


def test_no_valid_data_and_no_new_data():
    summary = {"verdict": "No valid data", "headline": "No valid data: ...", "target": "file:///t", "batches": [],
               "rejected": [{"key": "bad.npy", "reason": "shape"}], "mlflow": {"run_id": "r9"}}
    ev = verdict_event(summary, model=MODEL)
    assert ev["event"] == "labelshift.verdict.no-valid-data" and ev["resource"][LABEL_MODEL] == "fraud-model"
    assert ev["payload"]["rejected"] == ["bad.npy"] and LABEL_TV_PERCENT not in ev["resource"]
    assert ev["payload"]["links"] == {"prefect_run": None, "mlflow_run": None}       # sqlite store, temporary server
    served = {**summary, "mlflow": {"run_id": "r9", "ui": "http://mlflow:5000/#/experiments/3/runs/r9"}}
    ev = verdict_event(served, model=MODEL, prefect_run_url="http://prefect:4200/runs/flow-run/fr-9")
    assert ev["payload"]["links"] == {"prefect_run": "http://prefect:4200/runs/flow-run/fr-9",
                                      "mlflow_run": "http://mlflow:5000/#/experiments/3/runs/r9"}
    body = _message(served, model=MODEL, prefect_run_url="http://prefect:4200/runs/flow-run/fr-9")
    assert body.splitlines()[2:] == ["rejected batches: bad.npy", "Prefect run: http://prefect:4200/runs/flow-run/fr-9",
                                     "MLflow run: http://mlflow:5000/#/experiments/3/runs/r9"], body
    with pytest.raises(ValueError, match="has no event"):
        verdict_event({"verdict": "No new data", "target": "x"})
    assert emit_verdict.fn({"verdict": "No new data", "target": "x"}) is None


def test_emitting_never_fails_the_run(shifted, monkeypatch, caplog):
    import prefect.events

    def broken(**_):
        raise RuntimeError("events client down")

    monkeypatch.setattr(prefect.events, "emit_event", broken)
    with caplog.at_level("WARNING"):
        assert emit_verdict.fn(shifted) is None
    assert "was not emitted (RuntimeError: events client down)" in caplog.text


def _message(summary: dict, **options) -> str:
    """The notification body of ``summary``'s event as Prefect's actions service renders it."""
    from prefect.server.utilities.user_templates import render_user_template_sync, validate_user_template

    from flows.alerts import MESSAGE_BODY

    validate_user_template(MESSAGE_BODY)
    return render_user_template_sync(MESSAGE_BODY, {"event": verdict_event(summary, **options)})


def test_the_message_gives_the_figures_rounded_and_names_what_is_missing(shifted):
    """Found in the walk-through (docs/operations.md): the message printed floats to 17 digits ("total variation
    0.14342965906558353", "drop 3.1583058911155426e-05"); it gives them as the CLI does."""
    res = shifted["result"]
    body = _message(shifted, prefect_run_url="http://prefect:4200/runs/flow-run/fr-1")
    lines = body.splitlines()
    assert lines[0] == "Shifted: model fraud-model v7 on s3://bucket/target" and lines[1] == "headline of Shifted"
    p_values = f"no shift {res['no_shift_test']['p_value']:.3g}, label shift {res['label_shift_test']['p_value']:.3g}"
    assert lines[3] == f"total variation {res['total_variation']:.3f}; p-values: {p_values}"
    acc = res["accuracy"]
    assert lines[4] == (f"accuracy: {acc['source']:.3f} on the source, expected {acc['expected']:.3f} "
                        f"[{acc['lower']:.3f}, {acc['upper']:.3f}] on the target "
                        f"(drop {acc['source'] - acc['expected']:.3f})")
    assert lines[5:] == ["Prefect run: http://prefect:4200/runs/flow-run/fr-1",
                         "MLflow run: http://mlflow:5000/#/experiments/3/runs/mlrun-1"]
    untested = copy.deepcopy(shifted)
    untested["result"]["label_shift_test"] = None
    assert "label shift not run" in _message(untested)
    body = _message({"verdict": "No valid data", "headline": "No valid data: ...", "target": "file:///t",
                     "batches": [], "rejected": [{"key": "bad.npy", "reason": "shape"}], "mlflow": {"run_id": "r9"},
                     "prefect_flow_run_id": "fr-2"}, model=MODEL)
    assert body.splitlines() == ["No valid data: model fraud-model v7 on file:///t", "No valid data: ...",
                                 "rejected batches: bad.npy", "Prefect run: fr-2", "MLflow run: r9"]


@pytest.mark.parametrize("fraction, label", [(0.29, "29"), (0.999, "99"), (1.0, "100"), (0.0, "0"), (-0.02, "-2"),
                                             (0.1, "10"), (0.57, "57")])
def test_percent_labels_round_down(fraction, label):
    assert percent_label(fraction) == label


def test_the_shifted_alerts_match_the_labels_from_the_threshold_on():
    specs = automation_specs(AlertPlan(webhook_url="http://x", tv_percent=15, accuracy_drop_percent=5,
                                       model="fraud-model"))
    assert [s.name for s in specs] == ["labelshift: Not label shift (fraud-model)",
                                       "labelshift: Untrustworthy (fraud-model)",
                                       "labelshift: No valid data (fraud-model)",
                                       "labelshift: Shifted, total variation >= 15% (fraud-model)",
                                       "labelshift: Shifted, accuracy drop >= 5% (fraud-model)"]
    tv = specs[3].match[LABEL_TV_PERCENT]
    assert tv[0] == "15" and tv[-1] == "100" and "14" not in tv and specs[3].event == "labelshift.verdict.shifted"
    assert specs[4].match[LABEL_ACCURACY_DROP_PERCENT][0] == "5" and specs[0].match[LABEL_MODEL] == "fraud-model"
    assert specs[2].event == "labelshift.verdict.no-valid-data" and specs[2].match == specs[0].match
    every = automation_specs(AlertPlan(webhook_url="http://x", tv_percent=None))
    assert len(every) == 3 and LABEL_MODEL not in every[0].match and every[0].name.endswith("(all models)")


def test_thresholds():
    assert parse_threshold("0.1", "--t") == 10 and parse_threshold("off", "--t") is None
    assert parse_threshold(0, "--t") == 0 and parse_threshold("1", "--t") == 100
    with pytest.raises(InputError, match=r"--t must be in \[0, 1\], got 1.5"):
        parse_threshold("1.5", "--t")
    with pytest.raises(InputError, match="not a whole percent.*pass 0.12"):
        parse_threshold("0.125", "--t")
    with pytest.raises(InputError, match="'ten' is not a number"):
        parse_threshold("ten", "--t")
    with pytest.raises(InputError, match="no notification target"):
        check_alerts()


def test_help_explains_the_command(capsys):
    with pytest.raises(SystemExit):
        main(["alerts", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in ("--webhook-url", "--slack-webhook-url", "--email-to", "--block TYPE/NAME", "--shifted-tv",
                 "--shifted-accuracy-drop", "labelshift.verdict.shifted", ".not-label-shift", "Idempotent", "PREFECT_API_URL",
                 "LABELSHIFT_ALERT_WEBHOOK_URL", "--remove"):
        assert text in out, text


@pytest.mark.parametrize("argv, expected", [
    (["--webhook-url", "ftp://example.com/x"], "--webhook-url 'ftp://example.com/x' is not an http(s) URL"),
    (["--webhook-url", "http://"], "is not an http(s) URL; pass one such as https://"),
    (["--slack-webhook-url", "hooks.slack.com/x"], "--slack-webhook-url 'hooks.slack.com/x' is not an http(s) URL"),
    (["--webhook-url", "http://h/x", "--shifted-tv", "1.5"], "--shifted-tv must be in [0, 1], got 1.5"),
    (["--webhook-url", "http://h/x", "--shifted-accuracy-drop", "-0.1"], "--shifted-accuracy-drop must be in [0, 1]"),
    (["--webhook-url", "http://h/x", "--shifted-tv", "0.155"], "not a whole percent"),
    (["--block", "sendgrid-email"], "--block 'sendgrid-email' must be <block type slug>/<block name>"),
    (["--email-to", "ops@example.com"], "--email-to needs --email-from and a SendGrid API key"),
    (["--email-to", "not-an-address", "--email-from", "a@b.co"], "'not-an-address' is not an e-mail address"),
    ([], "no notification target: pass --webhook-url URL"),
])
def test_bad_options_exit_2_before_anything_is_contacted(argv, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")     # nothing listens: never contacted
    assert main(["alerts", "--home", str(tmp_path), *argv]) == 2
    assert expected in capsys.readouterr().err


def test_environment_variables_configure_it_and_flags_win(monkeypatch):
    from flows.cli import build_parser
    from flows.cli.alerts import plan_from_args

    monkeypatch.setenv("LABELSHIFT_ALERT_WEBHOOK_URL", "https://env.example.com/h")
    monkeypatch.setenv("LABELSHIFT_ALERT_SHIFTED_TV", "0.3")
    monkeypatch.setenv("LABELSHIFT_ALERT_BLOCKS", "sendgrid-email/ops, slack-webhook/team")
    plan = plan_from_args(build_parser().parse_args(["alerts", "--shifted-accuracy-drop", "0.05",
                                                     "--model", "models:/m@prod"]))
    assert (plan.webhook_url, plan.tv_percent, plan.accuracy_drop_percent, plan.model) == \
        ("https://env.example.com/h", 30, 5, "m")
    assert plan.blocks == ("sendgrid-email/ops", "slack-webhook/team")
    plan = plan_from_args(build_parser().parse_args(["alerts", "--shifted-tv", "off"]))
    assert plan.tv_percent is None


def test_alerts_need_a_lasting_prefect_server(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert main(["alerts", "--home", str(tmp_path), "--webhook-url", "http://h/x"]) == 2
    assert "alerts need a lasting Prefect server" in capsys.readouterr().err


def _listener(*argv: str):
    """``labelshift alerts listen --port 0 ...`` in a subprocess, and the URL of its first line."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "alerts", "listen", "--port", "0", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first = proc.stdout.readline()
    assert first.startswith("listening on http://127.0.0.1:"), (first, proc.stderr.read() if not first else "")
    return proc, first.split()[2]


def test_listen_prints_the_notification_it_receives():
    """The receiver of the walk-through (docs/alerts.md): a message as the Custom Webhook block posts it is printed
    as its text, a body that is not JSON as it came; --count ends it."""
    import urllib.request

    proc, url = _listener("--count", "2")
    try:
        message = {"subject": "labelshift: Shifted -- m on s3://b/t", "body": "Shifted: model m v1 on s3://b/t",
                   "text": "labelshift: Shifted -- m on s3://b/t\nShifted: model m v1 on s3://b/t"}
        for data, kind in ((json.dumps(message).encode(), "application/json"), (b"plain words", "text/plain")):
            request = urllib.request.Request(url + "hook", data=data, headers={"Content-Type": kind})
            with urllib.request.urlopen(request, timeout=10) as answer:
                assert answer.status == 200
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "POST /hook\nlabelshift: Shifted -- m on s3://b/t\nShifted: model m v1 on s3://b/t\n" in out
    assert out.rstrip().endswith("POST /hook\nplain words")


def test_listen_on_a_taken_port_names_the_fix(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["alerts", "listen", "--port", str(taken.getsockname()[1])]) == 2
    assert "pick another --port (0 for any free one)" in capsys.readouterr().err


def test_the_all_models_automations_skip_the_models_with_a_scope_of_their_own():
    """Prefect's own trigger (the server's, which decides) fires the all-models automation for a model without a
    scope of its own only; a list of negated values in one specification would let every model through."""
    from prefect.server.events.schemas.automations import EventTrigger
    from prefect.server.events.schemas.events import RelatedResource, Resource

    specs = automation_specs(AlertPlan(webhook_url="http://h/x"), scoped=("pets-logs", "fraud-model"))
    assert all(s.match_related == [{"prefect.resource.role": "model", "prefect.resource.id": "!labelshift.model.fraud-model"},
                                   {"prefect.resource.role": "model", "prefect.resource.id": "!labelshift.model.pets-logs"}]
               for s in specs)
    trigger = EventTrigger(expect={specs[0].event}, match=specs[0].match, match_related=specs[0].match_related,
                           posture="Reactive", threshold=1)

    def covers(model: str) -> bool:
        resource = Resource({"prefect.resource.id": "labelshift.target.s3://b/t", LABEL_MODEL: model})
        related = [RelatedResource({"prefect.resource.id": f"labelshift.model.{model}", "prefect.resource.role": "model"}),
                   RelatedResource({"prefect.resource.id": "prefect.flow-run.1", "prefect.resource.role": "flow-run"})]
        return trigger.covers_resources(resource, related)

    assert covers("other-model") and not covers("pets-logs") and not covers("fraud-model")
    scoped = automation_specs(AlertPlan(webhook_url="http://h/x", model="pets-logs"), scoped=("pets-logs",))
    assert all(s.match_related == [] and s.match[LABEL_MODEL] == "pets-logs" for s in scoped)
    with pytest.raises(InputError, match="without '\\*'"):
        check_alerts(webhook_url="http://h/x", model="pets*")


def test_the_temporary_server_of_a_command_is_recognised_by_its_prefect_home(tmp_path):
    """A command without PREFECT_API_URL sets PREFECT_HOME to <LABELSHIFT_HOME>/prefect for its temporary server
    (runtime.environment.apply); the local stack's server and workers live under <home>/stack/."""
    from runtime import environment

    env: dict = {}
    environment.apply(environment.resolve(tmp_path / "home", environ={}), environ=env)
    assert environment.on_temporary_prefect_server(env)
    assert not environment.on_temporary_prefect_server({**env, "PREFECT_HOME": str(tmp_path / "home" / "stack" /
                                                                                   "workers")})
    assert not environment.on_temporary_prefect_server({"PREFECT_HOME": env["PREFECT_HOME"]})


def test_a_failed_action_is_told_with_prefects_reason_and_the_blocks_last_log_line():
    from flows.alerts import _reason

    assert _reason({"payload": {"reason": "Notification failed",
                                "notification_log": "Sending...\nSlack responded with 404: no_service\n"}}) == \
        "Notification failed (Slack responded with 404: no_service)"
    assert _reason({"payload": {"reason": "The referenced block was not a notification block"}}) == \
        "The referenced block was not a notification block"
    assert _reason({}) == "failed"


def test_failures_takes_a_positive_number_of_hours_before_contacting_anything(capsys, tmp_path):
    assert main(["alerts", "--home", str(tmp_path), "--failures", "0"]) == 2
    assert "--failures 0: pass a number of hours above 0" in capsys.readouterr().err
