"""``labelshift estimate`` (the reestimate flow once, a summary table) and ``labelshift data simulate-target``."""
from __future__ import annotations

import json

import numpy as np
import pytest

from flows.cli import main
from tests.reestimation_support import SHIFTED_PRIOR, SOURCE_PRIOR, draw, register_model


@pytest.fixture(scope="module")
def sqlite_model(tmp_path_factory, mlflow_database_template):
    import shutil

    folder = tmp_path_factory.mktemp("estimate-cli")
    shutil.copyfile(mlflow_database_template, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    return dict(register_model(uri, "cli-model", n_holdout=3000), tracking_uri=uri, home=folder / "home")


def test_help_explains_the_options(capsys):
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    out = capsys.readouterr().out
    for option in ("--model", "--target", "--calibrator", "--interval", "--significance", "--check", "--json",
                   "source-aware", "5 when the new data are not label shift", "--label-shift-significance P",
                   "Level of the label-shift test alone", "When not set: the value of --significance"):
        assert option in " ".join(out.split())
    assert "watermark" in out


@pytest.mark.parametrize("argv, expected", [
    (["--cross-check", "FOO"], "--cross-check: unknown estimator"),
    (["--level", "1.5"], "--level must be in (0, 1), got 1.5; pass a confidence level such as 0.95"),
    (["--level", "0"], "--level must be in (0, 1), got 0.0"),
    (["--estimator", "BBSE-soft", "--interval", "source-aware"], "with --estimator BBSE-soft use --interval bootstrap"),
    (["--significance", "0"], "--significance must be in (0, 0.5)"),
    (["--estimator", "BBSE-hard"], "with --estimator BBSE-hard use --interval bootstrap"),
    *[(["--label-shift-significance", value], f"--label-shift-significance must be in (0, 1), got {float(value)}; "
                                              "pass a level such as 0.01, or leave the option out to judge the "
                                              "label-shift test at --significance")
      for value in ("0", "1", "-0.1", "2")],
])
def test_bad_options_exit_2(argv, expected, capsys, tmp_path):
    assert main(["estimate", "--home", str(tmp_path), "--model", "models:/x@y", *argv]) == 2
    assert expected in capsys.readouterr().err


def test_estimate_prints_the_table_and_check_exit_codes(prefect_server, sqlite_model, tmp_path, capsys):
    rng = np.random.default_rng(3)
    target = tmp_path / "incoming"
    target.mkdir()
    np.save(target / "day-1.npy", draw(SHIFTED_PRIOR, 3000, rng)[0])
    base = ["estimate", "--home", str(sqlite_model["home"]), "--model", sqlite_model["model_uri"],
            "--target", str(target), "--tracking-uri", sqlite_model["tracking_uri"]]
    assert main([*base, "--check"]) == 3                       # shifted
    out = capsys.readouterr().out
    assert out.startswith("Shifted: ")
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["0", "1", "2"]
    # the source column is the holdout's label frequencies; the target column sums to 1
    assert np.allclose([float(r[1]) for r in rows], SOURCE_PRIOR, atol=0.03)
    assert sum(float(r[2]) for r in rows) == pytest.approx(1.0, abs=2e-4)
    assert (target / "day-1.corrected.npy").exists() and (target / "_labelshift" / "watermark.json").exists()

    assert main([*base, "--check", "--json"]) == 0             # nothing new: not a failure, not a shift
    assert json.loads(capsys.readouterr().out)["verdict"] == "No new data"

    np.save(target / "day-2.npy", draw(SOURCE_PRIOR, 3000, rng)[0])
    assert main([*base, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["batches"] == ["day-2.npy"] and summary["sequence"] == 2
    assert "label_shift_significance" not in summary["result"]          # not given: written as before
    # unshifted data: the two-sample test's p-value is uniform under H0, below 0.001 one time in a thousand
    assert summary["result"]["no_shift_test"]["p_value"] > 0.001
    lo, hi = np.array(summary["result"]["interval"]["lower"]), np.array(summary["result"]["interval"]["upper"])
    assert np.all(lo <= hi)

    # BBSE with bootstrap intervals; a width threshold no estimate from 1000 rows can meet -> Untrustworthy (exit 4)
    np.save(target / "day-3.npy", draw(SHIFTED_PRIOR, 1000, rng)[0])
    assert main([*base, "--estimator", "BBSE-soft", "--interval", "bootstrap", "--bootstrap", "50",
                 "--max-interval-width", "0.01", "--check"]) == 4
    out = capsys.readouterr().out
    assert out.startswith("Untrustworthy: ") and "NOT TRUSTWORTHY" in out and "0.01" in out
    assert "cross-check MLLS:" in out                          # MLLS always shown beside a BBSE estimator
    watermark = json.loads((target / "_labelshift" / "watermark.json").read_text())
    assert watermark["sequence"] == 3 and watermark["history"][-1]["trustworthy"] is False

    # a class the model never saw (a tight cluster at the centre, 20% of the rows): Not label shift (exit 5), the
    # evidence in the table, no corrected outputs, the batch counted
    x, _ = draw(SOURCE_PRIOR, 2400, rng)
    np.save(target / "day-4.npy", np.concatenate([x, 0.3 * rng.standard_normal((600, 2)).astype(np.float32)]))
    assert main([*base, "--check", "--label-shift-significance", "0.01"]) == 5
    out = capsys.readouterr().out
    assert out.startswith("Not label shift: ") and "label-shift test: Not label shift: p = " in out
    # a level of its own for this test (p < 1e-6 here: it rejects at any level) is named where the verdict is
    assert "(test level 0.01)" in out.splitlines()[0]
    assert any(line.strip().startswith("label-shift test: Not label shift: ") and "(test level 0.01)" in line
               for line in out.splitlines())
    assert "% expected (z = " in out and "NOT MEANINGFUL" in out and "none written" in out
    assert not (target / "day-4.corrected.npy").exists() and not (target / "day-4.summary.json").exists()
    watermark = json.loads((target / "_labelshift" / "watermark.json").read_text())
    assert "day-4.npy" in watermark["processed"] and watermark["history"][-1]["verdict"] == "Not label shift"
    assert "target_prior" not in watermark["history"][-1] and watermark["history"][-1]["label_shift_ok"] is False
    # MLflow logs the level when it is given, and only then (runs 1-3 log the parameters they always did)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(sqlite_model["tracking_uri"])
    params = [client.get_run(h["mlflow_run_id"]).data.params for h in watermark["history"]]
    assert params[-1]["label_shift_significance"] == "0.01" and params[-1]["significance"] == "0.05"
    assert all("label_shift_significance" not in p for p in params[:-1])
    # every setting the parameter model marks as logged is there, and nothing else but what the run resolved
    from flows.params import ReestimateParameters

    assert set(params[0]) == set(ReestimateParameters().as_mlflow_params()) | {"model_version", "target", "n_batches"}


def test_estimate_failure_exits_1_and_says_nothing_was_written(prefect_server, sqlite_model, tmp_path, capsys):
    target = tmp_path / "incoming"
    target.mkdir()
    np.save(target / "bad.npy", np.zeros((10, 5), np.float32))
    base = ["estimate", "--home", str(sqlite_model["home"]), "--model", sqlite_model["model_uri"],
            "--target", str(target), "--tracking-uri", sqlite_model["tracking_uri"]]
    code = main([*base, "--fail-on-invalid"])
    assert code == 1
    err = capsys.readouterr().err
    assert "bad.npy" in err and "shape (10, 5)" in err and "watermark did not move" in err
    assert sorted(p.name for p in target.iterdir()) == ["bad.npy"]
    # the default: the bad batch is rejected (recorded, not counted) and the run completes saying so
    assert main(base) == 0
    out = capsys.readouterr().out
    assert out.startswith("No valid data") and "rejected bad.npy" in out and "shape (10, 5)" in out
    assert json.loads((target / "_labelshift" / "watermark.json").read_text())["processed"] == {}


def test_a_wrong_model_fails_even_when_the_target_has_nothing_new(prefect_server, sqlite_model, tmp_path, capsys):
    """The model is resolved before the target is read: a scheduled job on a typo never stays green with "No new
    data"; a malformed URI exits 2 before any server starts; a second registered model is refused a target whose
    watermark counts another model's runs."""
    rng = np.random.default_rng(5)
    target = tmp_path / "incoming"
    target.mkdir()
    np.save(target / "day-1.npy", draw(SHIFTED_PRIOR, 1500, rng)[0])
    base = ["estimate", "--home", str(sqlite_model["home"]), "--target", str(target), "--tracking-uri",
            sqlite_model["tracking_uri"]]
    assert main([*base, "--model", sqlite_model["model_uri"], "--json"]) == 0
    capsys.readouterr()
    assert main([*base, "--model", sqlite_model["model_uri"], "--json"]) == 0        # nothing new
    assert json.loads(capsys.readouterr().out)["verdict"] == "No new data"

    assert main([*base, "--model", "models:/cli-modle@production"]) == 1           # misspelt: not "No new data"
    err = capsys.readouterr().err
    assert "no registered model 'cli-modle'" in err and "cli-model" in err and "labelshift reference register" in err
    assert main([*base, "--model", "not-a-uri"]) == 2                                # before any server starts
    err = capsys.readouterr().err
    assert "--model: model must be a registered-model URI" in err and "starting a temporary Prefect" not in err

    other = register_model(sqlite_model["tracking_uri"], "cli-model-2", n_holdout=1000, seed=1)
    assert main([*base, "--model", other["model_uri"]]) == 1
    err = capsys.readouterr().err
    assert "re-estimated for the registered model 'cli-model'" in err and "a target folder of its own" in err
    watermark = json.loads((target / "_labelshift" / "watermark.json").read_text())
    assert watermark["sequence"] == 1                                                 # nothing moved


def test_simulate_target_writes_shifted_batches_with_their_truth(tmp_path, capsys):
    store = tmp_path / "store"
    code = main(["data", "simulate-target", "digits", "--home", str(tmp_path / "home"), "--store", str(store),
                 "--prior", "0.5,0.5,0,0,0,0,0,0,0,0", "--batches", "2", "--rows", "400", "--seed", "4"])
    assert code == 0, capsys.readouterr()
    target = store / "target"
    x = np.load(target / "sim-4-0.npy")
    assert x.shape == (400, 1, 8, 8) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1
    truth = json.loads((target / "sim-4-truth.json").read_text())
    assert truth["target_prior"][:2] == [0.5, 0.5]
    freq = np.array(truth["label_frequencies"])
    # 800 labels drawn from (0.5, 0.5): the share of class 0 has sd 0.018; 4 sd
    assert freq[2:].sum() == 0 and abs(freq[0] - 0.5) < 0.07
    from labelshift.monitoring.listing import list_batches
    from labelshift.storage import open_store

    assert [b.key for b in list_batches(open_store(str(target)))] == ["sim-4-0.npy", "sim-4-1.npy"]


def test_a_changed_batch_fails_the_run_unless_reprocessing_is_asked_for(prefect_server, sqlite_model, tmp_path,
                                                                        capsys):
    rng = np.random.default_rng(9)
    target = tmp_path / "incoming"
    target.mkdir()
    np.save(target / "day.npy", draw(SHIFTED_PRIOR, 1000, rng)[0])
    base = ["estimate", "--home", str(sqlite_model["home"]), "--model", sqlite_model["model_uri"],
            "--target", str(target), "--tracking-uri", sqlite_model["tracking_uri"], "--json"]
    assert main(base) == 0
    capsys.readouterr()
    np.save(target / "day.npy", draw(SOURCE_PRIOR, 1000, rng)[0])          # rewritten under the same key
    assert main(base) == 1
    err = capsys.readouterr().err
    assert "day.npy" in err and "changed content" in err and "reprocess" in err
    assert json.loads((target / "_labelshift" / "watermark.json").read_text())["sequence"] == 1
    assert main([*base, "--reprocess-changed"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["batches"] == ["day.npy"] and summary["sequence"] == 2
    watermark = json.loads((target / "_labelshift" / "watermark.json").read_text())
    assert watermark["history"][-1].get("replaced") == ["day.npy"]


@pytest.mark.parametrize("value", [0, 1, -0.1, 2])
def test_label_shift_significance_is_validated_with_the_other_parameters(value):
    from pydantic import ValidationError

    from flows.params import ReestimateParameters

    assert ReestimateParameters().label_shift_significance is None
    assert ReestimateParameters(label_shift_significance=0.01).label_shift_significance == 0.01
    with pytest.raises(ValidationError, match="label_shift_significance"):
        ReestimateParameters(label_shift_significance=value)


def test_every_flow_parameter_has_an_option_with_the_flows_default():
    """The options come from ReestimateParameters; the model and the flow's signature agree on names and defaults."""
    import inspect

    from flows.cli import build_parser
    from flows.params import ReestimateParameters
    from flows.reestimate import reestimate

    signature = inspect.signature(reestimate.fn).parameters
    assert list(signature) == list(ReestimateParameters.model_fields)
    for name, parameter in signature.items():
        assert ReestimateParameters.model_fields[name].default == parameter.default, name
    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions if a.dest == "command").choices["estimate"]
    options = {a.dest: a.option_strings for a in sub._actions}
    assert set(ReestimateParameters.model_fields) <= set(options)
    assert options["n_bootstrap"] == ["--bootstrap"] and options["on_changed"] == ["--reprocess-changed"]
    assert options["mlflow_experiment"] == ["--experiment-name"]
