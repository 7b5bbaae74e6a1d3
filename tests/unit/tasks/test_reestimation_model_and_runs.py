"""The pure helpers of :mod:`labelshift_mlflow.registry` and :mod:`tasks.reestimation.runs` (no servers), and the
message that says how to register a model when the tracking server has none."""
from __future__ import annotations

import pytest

from labelshift.errors import InputError, ObjectNotFoundError
from labelshift.inference.report import ShiftReport
from labelshift import Holdout, Target, AssessmentSettings
from labelshift_mlflow.registry import parse_model_uri
from tasks.reestimation.runs import history_record, prior_metrics


@pytest.mark.parametrize("uri, parsed", [
    ("models:/clf@production", ("clf", "production", None)),
    ("models:/labelshift-mnist-5k/3", ("labelshift-mnist-5k", None, "3")),
])
def test_model_uris(uri, parsed):
    assert parse_model_uri(uri) == parsed


@pytest.mark.parametrize("uri", ["clf@prod", "models:/clf", "models:/clf/x", "runs:/abc/model", "", None])
def test_bad_model_uris_say_the_expected_form(uri):
    with pytest.raises(InputError, match=r"models:/NAME@ALIAS"):
        parse_model_uri(uri)


def _report(shifted=True, trustworthy=True) -> ShiftReport:
    """A two-class report as the flow stores it, read back."""
    return ShiftReport.from_dict({
        "method": "MLLS", "n_target": 100, "n_classes": 2, "source_prior": [0.5, 0.5], "target_prior": [0.2, 0.8],
        "weights": [0.4, 1.6],
        "interval": {"method": "fisher", "level": 0.95, "target_prior": [0.2, 0.8], "lower": [0.1, 0.7],
                     "upper": [0.3, 0.9], "weights": [0.4, 1.6], "weights_lower": [0.2, 1.4],
                     "weights_upper": [0.6, 1.8], "std_error": [0.05, 0.05], "pinned": [False, False],
                     "n_target": 100, "extra": {"z": 1.96}},
        "no_shift_test": {"statistic": 20.0, "dof": 1, "p_value": 1e-5 if shifted else 0.5, "method": "two-sample",
                          "n_target": 100, "n_source": 1000},
        "identifiability": {"min_hessian_eigenvalue": 0.1, "min_free_eigenvalue": 0.1, "confusion_sigma_min": None,
                            "confusion_condition": None, "confusion_snr": None, "n_source": None, "n_target": 100,
                            "trustworthy": trustworthy, "reasons": [] if trustworthy else ["too flat"],
                            "pinned_bounds": [None, None], "max_weight_width": None},
        "cross_check": {"BBSE-soft": {"target_prior": [0.25, 0.75], "weights": [0.5, 1.5]},
                        "BBSE-hard": {"error": "singular"}},
        "significance": 0.05, "converged": True})


def test_metrics_and_verdicts():
    m = prior_metrics(_report())
    assert m["prior/1"] == 0.8 and m["prior_lower/0"] == 0.1 and m["weight/0"] == 0.4
    assert m["cross_check/BBSE-soft/prior/0"] == 0.25 and not any("BBSE-hard" in k for k in m)
    assert "confusion_condition" not in m and m["shifted"] == 1.0
    assert m["total_variation"] == pytest.approx(0.3)
    assert _report().verdict == "Shifted"
    assert _report(shifted=False).verdict == "No shift"
    assert _report(trustworthy=False).verdict == "Untrustworthy"      # untrustworthy wins over the test


def test_history_record_is_small_and_rounded():
    rec = history_record(_report(), "run-1", "clf")
    assert rec == {"model": "clf", "verdict": "Shifted", "n_target": 100, "target_prior": [0.2, 0.8],
                   "lower": [0.1, 0.7], "upper": [0.3, 0.9], "interval": "fisher", "p_value": 1e-5, "shifted": True,
                   "total_variation": 0.3, "trustworthy": True, "mlflow_run_id": "run-1"}


def test_not_label_shift_record_and_metrics_hold_the_test_and_no_estimate():
    from labelshift.inference.report import assess_shift
    from tests.unit.inference.test_report import _gaussian_case

    Xh, yh, Xt, cal, sp, pt, prior = _gaussian_case(drift=2.0)
    report = assess_shift(Holdout(sp, yh, prior, outputs=Xh, calibrator=cal),
                          Target(pt, Xt),
                          AssessmentSettings(interval="source-aware"))
    assert report.verdict == "Not label shift"
    rec = history_record(report, "run-2", "clf")
    assert rec["verdict"] == "Not label shift" and rec["label_shift_ok"] is False
    assert rec["label_shift_p_value"] == pytest.approx(report.label_shift.p_value)
    assert not {"target_prior", "lower", "upper", "p_value", "shifted"} & set(rec)
    m = prior_metrics(report)
    assert m["label_shift_ok"] == 0.0 and m["label_shift_dof"] == report.label_shift.dof
    assert m["label_shift_statistic"] == pytest.approx(report.label_shift.statistic)
    assert "label_shift_p_value" in m or report.label_shift.p_value == 0.0
    assert m["label_shift_p_value_log_odds"] == pytest.approx(report.label_shift.extra["p_value_log_odds"])
    assert m["label_shift_p_value_regions"] == pytest.approx(report.label_shift.extra["p_value_regions"])
    assert "label_shift_statistic" not in prior_metrics(_report())            # an old report: no test, no metric


def test_sync_monitor_logs_each_run_of_its_model_once_and_survives_a_watermark_reset(mlflow_sqlite, tmp_path):
    """The monitor run of (model, target) gets one point per successful run of that model: entries of another model
    on the same target are skipped, an entry already synced is not logged twice, a missed one is added later, and
    after the watermark was deleted (sequences restart at 1) the new runs still get their points."""
    from mlflow import MlflowClient

    from tasks.reestimation.runs import SYNCED_TAG, sync_monitor

    uri = mlflow_sqlite(tmp_path)
    client = MlflowClient(uri)
    exp = client.create_experiment("sync", artifact_location=(tmp_path / "art").as_uri())
    monitor = client.create_run(exp).info.run_id

    def entry(seq, model, prior0):
        child = client.create_run(exp).info.run_id
        return {"sequence": seq, "time": f"2026-11-2{seq}T06:00:00.000+00:00", "model": model, "mlflow_run_id": child,
                "target_prior": [prior0, 1 - prior0], "lower": [0.0, 0.0], "upper": [1.0, 1.0], "p_value": 0.5,
                "shifted": False, "trustworthy": True, "n_target": 10}

    history = [entry(1, "A", 0.1), entry(2, "B", 0.2), entry(3, "A", 0.3)]
    assert sync_monitor(uri, monitor, history[:1], "A") == [1]
    assert sync_monitor(uri, monitor, history, "A") == [3]          # 1 already synced, 2 is model B's
    assert sync_monitor(uri, monitor, history, "A") == []
    assert client.get_run(history[2]["mlflow_run_id"]).data.tags[SYNCED_TAG] == "true"
    points = sorted((p.step, p.value) for p in client.get_metric_history(monitor, "prior/0"))
    assert points == [(1, 0.1), (3, 0.3)]
    reset = [entry(1, "A", 0.7)]                                    # the watermark was deleted and started over
    assert sync_monitor(uri, monitor, reset, "A") == [1]
    assert sorted(p.value for p in client.get_metric_history(monitor, "prior/0")) == [0.1, 0.3, 0.7]


def test_sync_monitor_raises_when_the_server_stops_answering_after_the_point(monkeypatch):
    """The point is logged, then the server stops answering (a frozen MLflow times out): sync_monitor raises
    instead of going on, so the run asks the lost server nothing more (each ask would cost MLflow's retries, about
    70 s frozen); other failures of the tag or the end stay quiet."""
    from types import SimpleNamespace

    from mlflow.exceptions import MlflowException

    from tasks.reestimation import runs

    uri, asked = "http://127.0.0.1:9", []

    class Frozen:
        def __init__(self, tracking_uri):
            pass

        def get_run(self, run_id):
            return SimpleNamespace(info=SimpleNamespace(experiment_id="1", status="RUNNING"))

        def search_runs(self, *args, **kwargs):
            return []

        def log_batch(self, run_id, metrics):
            asked.append("log_batch")

        def set_tag(self, run_id, key, value):
            asked.append("set_tag")
            raise self.error

        def set_terminated(self, run_id, status):
            asked.append("set_terminated")

    monkeypatch.setattr(runs, "MlflowClient", Frozen)
    entry = {"sequence": 1, "time": "2026-11-29T06:00:00+00:00", "model": "A", "mlflow_run_id": "child",
             "target_prior": [0.5, 0.5], "p_value": 0.5}
    Frozen.error = MlflowException(f"API request to {uri}/api/2.0/mlflow/runs/set-tag failed with timeout exception "
                                   "HTTPConnectionPool: Read timed out")
    with pytest.raises(MlflowException, match="timeout"):
        runs.sync_monitor(uri, "monitor", [entry], "A")
    assert asked == ["log_batch", "set_tag"]
    Frozen.error, asked[:] = MlflowException("RESOURCE_DOES_NOT_EXIST: run 'child' not found"), []
    assert runs.sync_monitor(uri, "monitor", [entry], "A") == [1] and asked == ["log_batch", "set_tag"]


def test_a_child_run_whose_process_is_gone_is_ended_killed_by_the_next_run(tmp_path, mlflow_sqlite):
    """A command killed outright cannot end its MLflow run; the next re-estimation of the same target ends it KILLED
    when its owner (host/pid/start time) is a process of this host that no longer runs -- FINISHED when the
    watermark had counted its batches (killed after its commit: seen once in CI, as a race of the kill test) --
    and leaves alone the runs of live processes and of other hosts."""
    import socket
    import subprocess
    import sys

    from mlflow import MlflowClient

    from tasks.reestimation.runs import OWNER_TAG, _owner, end_orphaned_runs

    uri = mlflow_sqlite(tmp_path)
    client = MlflowClient(uri)
    experiment = client.create_experiment("reestimation-orphans", artifact_location=str(tmp_path / "artifacts"))
    monitor = client.create_run(experiment).info.run_id
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead_owner = _owner(child.pid)
    child.kill()
    child.wait()
    owners = {"dead": dead_owner, "committed": dead_owner, "alive": _owner(),
              "elsewhere": f"not-{socket.gethostname()}/1/0.00", "untagged": None}
    ids = {}
    for name, owner in owners.items():
        tags = {"mlflow.parentRunId": monitor, **({OWNER_TAG: owner} if owner else {})}
        ids[name] = client.create_run(experiment, tags=tags).info.run_id
    # "committed": killed after the watermark counted its batches (its id is in the history), so it succeeded
    ended = end_orphaned_runs(client, experiment, monitor, {ids["committed"]})
    assert sorted(ended) == sorted([ids["dead"], ids["committed"]])
    status = {name: client.get_run(run_id).info.status for name, run_id in ids.items()}
    assert status == {"dead": "KILLED", "committed": "FINISHED", "alive": "RUNNING", "elsewhere": "RUNNING",
                      "untagged": "RUNNING"}
    assert "killed before" in client.get_run(ids["dead"]).data.tags["labelshift.ended_by"]
    assert "after its commit" in client.get_run(ids["committed"]).data.tags["labelshift.ended_by"]


def test_a_run_with_no_new_data_catches_up_the_bookkeeping_of_a_run_cut_off_after_its_commit(tmp_path, mlflow_sqlite):
    """A command killed after its commit leaves its child run RUNNING and no monitor point; the next run, even with
    no new data, adds the point and ends that child run FINISHED (its batches are counted). Without an experiment
    or monitor run it creates nothing."""
    from mlflow import MlflowClient

    from tasks.reestimation.runs import catch_up_monitor, start_reestimation_run

    uri = mlflow_sqlite(tmp_path)
    catch_up_monitor(uri, "reestimation-catch-up", "m", "file:///t", [{"sequence": 1}])       # nothing to do
    client = MlflowClient(uri)
    assert client.get_experiment_by_name("reestimation-catch-up") is None
    runs = start_reestimation_run(uri, "reestimation-catch-up", str(tmp_path / "artifacts"), model_name="m",
                                  target_url="file:///t", run_name="reestimate-1", params={}, tags={})
    history = [{"sequence": 1, "time": "2026-11-26T08:00:00Z", "model": "m", "mlflow_run_id": runs.run_id,
                "target_prior": [0.25, 0.75], "lower": [0.2, 0.7], "upper": [0.3, 0.8], "p_value": 0.001}]
    catch_up_monitor(uri, "reestimation-catch-up", "m", "file:///t", history)
    assert client.get_run(runs.run_id).info.status == "FINISHED"
    assert client.get_run(runs.monitor_run_id).data.metrics["prior/1"] == 0.75


def test_no_registered_model_says_how_to_register_one_on_that_tracking_server(mlflow_sqlite, tmp_path):
    from mlflow import MlflowClient

    from labelshift_mlflow.registry import _registry_error

    tracking = mlflow_sqlite(tmp_path)
    error = _registry_error(MlflowClient(tracking), "labelshift-mnist-5k", "latest-good", None,
                            RuntimeError("not found"))
    assert isinstance(error, ObjectNotFoundError)
    assert f"`labelshift reproduce --dataset mnist-5k --tracking-uri {tracking}`" in str(error)
    assert "registered: none" in str(error)


def test_an_unknown_model_of_the_users_names_the_registration_commands(mlflow_sqlite, tmp_path):
    from mlflow import MlflowClient

    from labelshift_mlflow.registry import _registry_error

    tracking = mlflow_sqlite(tmp_path)
    error = str(_registry_error(MlflowClient(tracking), "my-clf", "production", None, RuntimeError("not found")))
    assert "no registered model 'my-clf'" in error and "labelshift reproduce" not in error
    assert "`labelshift reference register --holdout FILE" in error and "register_sklearn_model" in error


def test_a_stop_while_the_run_is_being_started_ends_the_run_it_created(mlflow_sqlite, tmp_path, monkeypatch):
    """SIGTERM (a SystemExit here) after the child run exists and before the caller has it: the run ends KILLED,
    not RUNNING (the fault test saw this window once); the stop is raised again."""
    from mlflow import MlflowClient

    from tasks.reestimation.runs import start_reestimation_run

    def stopped(self, run_id, **kwargs):
        raise SystemExit(143)

    uri = mlflow_sqlite(tmp_path)
    monkeypatch.setattr(MlflowClient, "log_batch", stopped)
    with pytest.raises(SystemExit):
        start_reestimation_run(uri, "reestimation-stopped", str(tmp_path / "artifacts"), model_name="m",
                               target_url="file:///t", run_name="reestimate-1", params={"a": 1}, tags={})
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("reestimation-stopped")
    runs = client.search_runs([experiment.experiment_id], "tags.`labelshift.kind` = 'reestimation'")
    assert [r.info.status for r in runs] == ["KILLED"]
