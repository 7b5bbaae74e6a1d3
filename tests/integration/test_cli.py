"""The ``labelshift`` command: help, parameter errors, a failed sweep's exit status, and one real run on the
embedded defaults (a temporary Prefect server, MLflow on SQLite, a local store, all under --home)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from flows.cli import build_parser, main
from flows.params import ReproduceParameters


def test_help_lists_every_parameter(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["reproduce", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--dataset", "--experiments", "--shift-values", "--target-sizes", "--bins", "--target-size",
                   "--size-shift", "--seeds", "--methods", "--base-seed", "--seeds-per-task", "--mu",
                   "--n-source", "--store", "--tracking-uri", "--experiment-name", "--home", "--verbose"):
        assert re.search(rf"{re.escape(option)}\b", out), f"{option} missing from --help"
    assert "p_t(y=1)" in out and "LABELSHIFT_HOME" in out


def test_every_flow_parameter_has_an_option():
    """A parameter added to the flow without a CLI option would be unreachable from the command line."""
    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions if a.dest == "command").choices["reproduce"]
    dests = {a.dest for a in sub._actions}
    assert set(ReproduceParameters.model_fields) <= dests


def test_top_level_help_and_no_command(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    assert "reproduce" in out and "serve" in out


@pytest.mark.parametrize("argv, expected", [
    (["--shift-values", "0.2,1.5"], "--shift-values (item 2): Input should be less than 1; got 1.5"),
    (["--seeds", "1"], "--seeds: Input should be greater than or equal to 2"),
    (["--methods", "MLLS,EM"], "--methods (item 2)"),
    (["--experiments", "shift,shift"], "--experiments: values must be distinct"),
    (["--seeds", "10", "--seeds-per-task", "20"], "seeds_per_task (20) cannot exceed n_seeds (10)"),
])
def test_bad_parameters_name_the_option(argv, expected, capsys):
    assert main(["reproduce", *argv]) == 2
    err = capsys.readouterr().err
    assert "labelshift reproduce: error: invalid option(s)" in err
    assert expected in err
    assert "Traceback" not in err


def test_unparsable_value_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["reproduce", "--shift-values", "0.1,abc"])
    assert exit_info.value.code == 2
    assert "comma-separated float values" in capsys.readouterr().err


def test_where_prints_resolved_locations(tmp_path, capsys, monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "LABELSHIFT_STORE", "PREFECT_API_URL"):
        monkeypatch.delenv(name, raising=False)
    assert main(["where", "--home", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"sqlite:///{tmp_path}/mlflow.db" in out
    assert f"{tmp_path}/store" in out


@pytest.mark.integration
def test_failed_sweep_exits_1_with_the_cause(prefect_server, mlflow_sqlite, tmp_path, monkeypatch, capsys):
    from labelshift.experiments import gaussian

    def broken(*args, **kwargs):
        raise RuntimeError("solver exploded (injected)")

    monkeypatch.setattr(gaussian, "run_setting", broken)
    code = main(["reproduce", "--quick", "--experiments", "shift", "--home", str(tmp_path),
                 "--tracking-uri", mlflow_sqlite(tmp_path)])
    assert code == 1
    err = capsys.readouterr().err
    assert "the sweep failed" in err and "solver exploded (injected)" in err
    assert "marked FAILED" in err


@pytest.mark.integration
def test_reproduce_on_embedded_defaults(tmp_path):
    """`labelshift reproduce --quick` as a user runs it: no servers configured, everything under --home."""
    exe = Path(sys.executable).with_name("labelshift")
    home = tmp_path / "state"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_", "MLFLOW_", "LABELSHIFT_", "AWS_"))}
    proc = subprocess.run([str(exe), "reproduce", "--quick", "--home", str(home)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"mlflow ui --backend-store-uri sqlite:///{home}/mlflow.db" in out
    for experiment in ("shift", "size", "bins"):
        assert re.search(rf"^  {experiment}: .* done", out, re.MULTILINE), out
    figures = re.findall(r"(\S+/figures/mse_vs_\w+\.png)", out)
    assert len(figures) == 3
    assert all(Path(f).read_bytes()[:4] == b"\x89PNG" and Path(f).is_relative_to(home) for f in figures)
    # the temporary Prefect server kept its database under the home, MLflow its store and artifacts
    assert (home / "prefect" / "prefect.db").exists()
    client = MlflowClient(f"sqlite:///{home}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("labelshift-reproduce").experiment_id])
    assert len(runs) == 7 and {r.info.status for r in runs} == {"FINISHED"}
    assert any((home / "mlartifacts").rglob("mse_vs_shift.png"))
    # quiet console: no Prefect log lines or tracebacks
    assert "Traceback" not in proc.stderr
    assert not re.search(r"\| (INFO|WARNING|ERROR) +\|", proc.stdout + proc.stderr), proc.stderr
    assert not list(tmp_path.glob("mlruns")) and not (tmp_path / "mlflow.db").exists()


def test_settings_precedence(tmp_path):
    """Flags win over environment variables, which win over the home folder's defaults."""
    from runtime.environment import resolve

    env = {"LABELSHIFT_HOME": str(tmp_path / "envhome"), "MLFLOW_TRACKING_URI": "http://127.0.0.1:5999"}
    s = resolve(environ=env)
    assert s.home == tmp_path / "envhome"
    assert s.store_uri == str(tmp_path / "envhome" / "store")
    assert s.tracking_uri == "http://127.0.0.1:5999" and s.artifact_root is None   # the server decides
    s = resolve(tmp_path / "flag", store_uri="s3://b/p", tracking_uri=f"sqlite:///{tmp_path}/x/m.db", environ=env)
    assert s.home == tmp_path / "flag" and s.store_uri == "s3://b/p"
    assert s.artifact_root == str(tmp_path / "x" / "mlartifacts")          # beside the SQLite file
    assert s.prefect_api_url is None and s.prefect_home == tmp_path / "flag" / "prefect"


@pytest.mark.integration
@pytest.mark.parametrize("option, expected", [
    (["--tracking-uri", "http://127.0.0.1:9"], "MLflow tracking server at http://127.0.0.1:9 is not reachable"),
    (["--store", "ftp://host/x"], "unsupported scheme 'ftp'"),
])
def test_unreachable_or_malformed_services_fail_fast(prefect_server, tmp_path, capsys, option,
                                                     expected):
    """Mistakes in where results go fail the run before any estimation, with a message that says what to fix."""
    code = main(["reproduce", "--quick", "--experiments", "bins", "--home", str(tmp_path), *option])
    assert code == 1
    err = capsys.readouterr().err
    assert expected in err, err
    assert not (tmp_path / "store").exists()
