"""SIGKILL of ``labelshift estimate``, ``reproduce``, ``serve`` and ``report`` at several moments: no process they
started survives it by more than 10 s, and a run to completion afterwards counts every batch exactly once (``report``:
writes the same page an uninterrupted run writes). SIGTERM of ``labelshift estimate`` while its flow runs: exit 143
within seconds, its MLflow run ended KILLED by itself, nothing committed.

Each command runs as a user runs it, a separate process with no PREFECT_API_URL (so it starts its temporary
Prefect server), on a local folder target and a local SQLite MLflow store. The processes it started are found two
ways: its descendants, recorded while it runs, and every process carrying its marker (``LABELSHIFT_COMMAND``),
which also finds those that left its tree. The moments are found by watching, not by timing: the server process
appears; the temporary server holds a running flow run; the first output file appears beside a batch (for
``report``: the first figure under ``--out``).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest

from runtime.lifetime import MARKER_ENV
from runtime.processes import wait_until
from tests.reestimation_support import SHIFTED_PRIOR, draw, register_model

pytestmark = pytest.mark.integration

ROOT = str(Path(__file__).resolve().parents[2])
#: how long the processes of a killed command may outlive it
ORPHAN_LIMIT_S = 10.0
#: a bound for each command (a command that hangs fails the test instead of the session)
COMMAND_LIMIT_S = 240.0
BATCHES = ["day-1.npy", "day-2.npy", "day-3.npy"]


@pytest.fixture(scope="module")
def setting(tmp_path_factory, mlflow_database_template):
    folder = tmp_path_factory.mktemp("faults")
    shutil.copyfile(mlflow_database_template, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    model = register_model(uri, "faults-model", n_holdout=600)
    target = folder / "target"
    target.mkdir()
    rng = np.random.default_rng(7)
    for name in BATCHES:
        np.save(target / name, draw(SHIFTED_PRIOR, 40_000, rng)[0])
    return dict(folder=folder, uri=uri, model=model["model_uri"], target=target, env=_command_env())


def _command_env() -> dict:
    """The environment of a command as a user runs it: no Prefect settings, no marker of this process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != MARKER_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    return env


def _estimate(setting) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "estimate", "--home", str(setting["folder"] / "home"), "--model",
            setting["model"], "--target", str(setting["target"]), "--tracking-uri", setting["uri"]]


def _marked(command: psutil.Process, create_time: float) -> set[int]:
    """Processes carrying the marker of ``command``."""
    value = f"{command.pid}-{int(create_time)}"
    found = set()
    for process in psutil.process_iter():
        try:
            if process.environ().get(MARKER_ENV) == value:
                found.add(process.pid)
        except (psutil.Error, OSError):
            continue
    return found


def _alive(pids: dict[int, psutil.Process]) -> list[str]:
    left = []
    for process in pids.values():
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{process.pid} {' '.join(process.cmdline())[:120]}")
        except psutil.Error:
            continue
    return left


def _server_port(processes: dict[int, psutil.Process]) -> int | None:
    for process in processes.values():
        try:
            cmd = process.cmdline()
        except psutil.Error:
            continue
        if "uvicorn" in cmd and "--port" in cmd:
            return int(cmd[cmd.index("--port") + 1])
    return None


def _flow_running(port: int | None) -> bool:
    if port is None:
        return False
    body = json.dumps({"flow_runs": {"state": {"type": {"any_": ["RUNNING"]}}}}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/flow_runs/filter", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return bool(json.loads(response.read()))
    except (OSError, ValueError):
        return False


def kill_at(argv: list[str], env: dict, moment, sig: int = signal.SIGKILL, victims=None,
            limit_s: float = COMMAND_LIMIT_S) -> dict:
    """Run ``argv``, send ``sig`` (SIGKILL) when ``moment(processes)`` holds -- to the command, or to the processes
    ``victims(processes)`` picks among those it started (the command when it returns None) (or any others) -- and return what happened: whether the
    signal came before the command ended, the processes it had started, those still running 10 s after, and how
    long the command took to end after the signal. A command still running ``limit_s`` after the signal is killed
    (its ``ended_s`` then exceeds ``limit_s``)."""
    command = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    me = psutil.Process(command.pid)
    created = me.create_time()
    seen: dict[int, psutil.Process] = {}

    def record() -> dict[int, psutil.Process]:
        try:
            for child in me.children(recursive=True):
                seen.setdefault(child.pid, child)
        except psutil.Error:
            pass
        for pid in _marked(me, created):
            try:
                seen.setdefault(pid, psutil.Process(pid))
            except psutil.Error:
                pass
        return seen

    reached = wait_until(lambda: command.poll() is not None or moment(record()), COMMAND_LIMIT_S, step=0.05)
    killed = command.poll() is None
    record()
    if killed:
        for process in ((victims(seen) if victims else None) or [me]):
            process.send_signal(sig)
    sent = time.monotonic()
    try:
        stderr = command.communicate(timeout=limit_s)[1]
    except subprocess.TimeoutExpired:               # a hung command fails its test, and is not left running
        command.kill()
        stderr = command.communicate()[1] + f"\n(test: still running {limit_s:.0f} s after the signal; killed)"
    ended_s = time.monotonic() - sent
    orphans_gone = wait_until(lambda: not _alive(seen) and not _marked(me, created), ORPHAN_LIMIT_S)
    left = _alive(seen)
    # leave nothing behind even when the test fails
    for process in seen.values():
        try:
            process.kill()
        except psutil.Error:
            pass
    return dict(reached=reached, killed=killed, started=len(seen), gone=orphans_gone, left=left,
                stderr=stderr, returncode=command.returncode, ended_s=ended_s)


def _server_started(processes) -> bool:
    return _server_port(processes) is not None


def _flow_started(processes) -> bool:
    return _flow_running(_server_port(processes))


def _outputs_started(setting):
    def moment(processes) -> bool:
        return any(p.name.endswith(".corrected.npy") or ".tmp" in p.name or p.name.startswith(".")
                   for p in setting["target"].iterdir() if p.name not in BATCHES)
    return moment


def test_sigkill_leaves_no_process_and_the_next_run_counts_every_batch_once(setting):
    results = {}
    for name, moment in (("server start", _server_started), ("flow running", _flow_started),
                         ("writing outputs", _outputs_started(setting))):
        result = kill_at(_estimate(setting), setting["env"], moment)
        results[name] = result
        assert result["gone"], f"killed during {name}: still running after {ORPHAN_LIMIT_S} s: {result['left']}"
        assert result["started"] >= 2, result          # the watchdog and the server at least
    # the first two moments are reached before the command ends on any machine: the kill happened there
    assert results["server start"]["killed"] and results["flow running"]["killed"], results

    watermark_file = setting["target"] / "_labelshift" / "watermark.json"
    done = subprocess.run(_estimate(setting), env=setting["env"], capture_output=True, text=True,
                          timeout=COMMAND_LIMIT_S)
    watermark = json.loads(watermark_file.read_text())
    counted = [b for entry in watermark["history"] for b in entry.get("batches", [])]
    processed = sorted(watermark["processed"])
    assert done.returncode == 0, done.stderr
    assert processed == BATCHES, watermark
    assert sorted(counted) == BATCHES, f"each batch in exactly one run: {watermark['history']}"
    for name in BATCHES:
        assert (setting["target"] / name.replace(".npy", ".corrected.npy")).exists()

    from mlflow import MlflowClient

    client = MlflowClient(setting["uri"])
    experiment = client.get_experiment_by_name("reestimation")
    runs = [r for r in client.search_runs([experiment.experiment_id]) if "labelshift.sequence" in r.data.tags]
    finished = [r for r in runs if r.info.status == "FINISHED"]
    running = [r for r in runs if r.info.status == "RUNNING"]
    killed = [r for r in runs if r.info.status == "KILLED"]
    assert len(finished) == len(watermark["history"])
    # a run killed outright cannot close its MLflow run; the next run ends it KILLED, none is left RUNNING
    assert not running, [r.info.run_id for r in running]
    assert all(r.data.tags.get("labelshift.ended_by") for r in killed)
    print(f"kills: {[(n, r['killed'], r['started']) for n, r in results.items()]}; MLflow re-estimation runs: "
          f"{len(finished)} FINISHED, {len(killed)} KILLED by the next run")


def _copy_target(setting, folder: Path) -> Path:
    target = folder / "target"
    target.mkdir()
    for name in BATCHES:
        shutil.copyfile(setting["target"] / name, target / name)
    return target


def _runs_of(setting, target: Path) -> list:
    """The MLflow re-estimation runs on ``target``."""
    from mlflow import MlflowClient

    client = MlflowClient(setting["uri"])
    experiment = client.get_experiment_by_name("reestimation")
    return [] if experiment is None else [
        r for r in client.search_runs([experiment.experiment_id])
        if r.data.tags.get("labelshift.kind") == "reestimation"
        and r.data.tags.get("labelshift.target", "").endswith(str(target))]


def _mlflow_run_started(setting, target: Path):
    def moment(processes) -> bool:                  # the flow is past loading the model and scoring
        return any(r.info.status == "RUNNING" for r in _runs_of(setting, target))
    return moment


def _next_run_counts_every_batch_once(argv, env, target: Path) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=COMMAND_LIMIT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    watermark = json.loads((target / "_labelshift" / "watermark.json").read_text())
    assert sorted(b for entry in watermark["history"] for b in entry.get("batches", [])) == BATCHES


def test_sigterm_while_the_flow_runs_ends_the_command_cleanly_and_the_next_run_takes_the_batches(setting, tmp_path):
    """SIGTERM (systemctl stop, kill, a worker cancelling) while the flow runs: the command ends within seconds with
    exit 143 and a sentence that says so, its MLflow run ended KILLED by itself (not left RUNNING), the watermark
    as it was, no process left; the next run counts every batch once."""
    target = _copy_target(setting, tmp_path)
    argv = [*_estimate(setting)[:-4], "--target", str(target), "--tracking-uri", setting["uri"]]
    result = kill_at(argv, setting["env"], _mlflow_run_started(setting, target), sig=signal.SIGTERM)
    assert result["killed"], result                             # the run was under way when the signal came
    assert result["returncode"] == 143 and result["ended_s"] < 30, result
    assert "stopped by SIGTERM" in result["stderr"], result["stderr"][-2000:]
    assert result["gone"], f"still running after {ORPHAN_LIMIT_S} s: {result['left']}"
    assert not (target / "_labelshift" / "watermark.json").exists()
    assert not any(p.name.endswith(".corrected.npy") for p in target.iterdir())
    mine = _runs_of(setting, target)
    assert [r.info.status for r in mine] == ["KILLED"], [(r.info.status, r.data.tags) for r in mine]
    assert not mine[0].data.tags.get("labelshift.ended_by")     # ended by the run itself, not the next one
    _next_run_counts_every_batch_once(argv, setting["env"], target)


def _temporary_server(processes) -> list[psutil.Process]:
    return [p for p in processes.values() if _server_port({p.pid: p}) is not None]


#: how long the server may be silent before the command stops the run, here (the setting; 15 s by default)
LOST_AFTER_S = 3


#: a slow estimation (a 4,000-resample bootstrap: about 30 s here) so that the server is lost while it runs
SLOW = ["--interval", "bootstrap", "--bootstrap", "4000"]


@pytest.mark.parametrize("how,during", [(signal.SIGKILL, "estimation"), (signal.SIGSTOP, "estimation"),
                                        (signal.SIGKILL, "the end")],
                         ids=["killed-estimating", "frozen-estimating", "killed-near-the-end"])
def test_a_prefect_server_lost_during_the_run_ends_the_command_within_the_bound(setting, tmp_path, how, during):
    """The temporary Prefect server killed (a crash, the OOM killer) or frozen (SIGSTOP: it accepts connections
    and never answers) while the flow runs: the command ends within LABELSHIFT_SERVER_LOST_S + UNWIND_S (+ the
    health check's own seconds) with exit 75 and one sentence naming the server. Lost during the estimation, the
    run stops before its commit (the watermark as it was, no output, its MLflow run ended KILLED by itself); lost
    near the end (the flow needs no server to finish), the sentence says whether the run had committed, and it is
    true. No process left (the frozen server too); the next run counts every batch once."""
    from runtime.timeouts import UNWIND_S

    target = _copy_target(setting, tmp_path)
    argv = [*_estimate(setting)[:-4], "--target", str(target), "--tracking-uri", setting["uri"]]
    env = {**setting["env"], "LABELSHIFT_SERVER_LOST_S": str(LOST_AFTER_S)}
    result = kill_at(argv + (SLOW if during == "estimation" else []), env, _mlflow_run_started(setting, target),
                     sig=how, victims=_temporary_server)
    assert result["killed"], result
    assert result["returncode"] == 75, result
    assert result["ended_s"] < LOST_AFTER_S + UNWIND_S + 8, result
    assert "stopped answering" in result["stderr"] and "Prefect server at http://127.0.0.1:" in result["stderr"], \
        result["stderr"][-2000:]
    assert result["gone"], f"still running after {ORPHAN_LIMIT_S} s: {result['left']}"
    mine = _runs_of(setting, target)
    assert not [r for r in mine if r.info.status == "RUNNING"], [(r.info.status, r.data.tags) for r in mine]
    if "had committed" in result["stderr"]:
        assert during == "the end" and (target / "_labelshift" / "watermark.json").exists()
        assert [r.info.status for r in mine] == ["FINISHED"], [(r.info.status, r.data.tags) for r in mine]
    else:
        assert "nothing was committed" in result["stderr"], result["stderr"][-2000:]
        assert not (target / "_labelshift" / "watermark.json").exists()
        assert not any(p.name.endswith(".corrected.npy") for p in target.iterdir())
        assert [r.info.status for r in mine] == ["KILLED"], [(r.info.status, r.data.tags) for r in mine]
    print(f"server {signal.Signals(how).name}: exit {result['returncode']} {result['ended_s']:.1f} s after; "
          f"{result['stderr'].strip().splitlines()[-1][:160]}")
    _next_run_counts_every_batch_once(argv, setting["env"], target)


def test_the_temporary_server_killed_while_it_starts_ends_the_command_with_a_sentence(setting, tmp_path):
    """The temporary Prefect server killed the moment it starts: the command ends within seconds with exit 1 and a
    sentence naming the server, the signal and the fix; nothing read or written; no process left."""
    target = _copy_target(setting, tmp_path)
    argv = [*_estimate(setting)[:-4], "--target", str(target), "--tracking-uri", setting["uri"]]
    result = kill_at(argv, setting["env"], _server_started, victims=_temporary_server)
    assert result["killed"], result
    assert result["returncode"] == 1 and result["ended_s"] < 20, result
    assert ("temporary Prefect server exited while starting (killed by SIGKILL): nothing was read or written"
            in result["stderr"] and "PREFECT_API_URL" in result["stderr"]), result["stderr"][-2000:]
    assert result["gone"], f"still running after {ORPHAN_LIMIT_S} s: {result['left']}"
    assert not (target / "_labelshift").exists() and _runs_of(setting, target) == []


def _sweep_runs(home: Path) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def _sweep_run_started(home: Path):
    """When the sweep's MLflow runs exist, RUNNING: read from the SQLite file read-only (an MLflow client would
    create or migrate the database while the command does)."""
    def moment(processes) -> bool:
        try:
            with sqlite3.connect(f"file:{home / 'mlflow.db'}?mode=ro", uri=True, timeout=1) as db:
                return bool(db.execute("SELECT 1 FROM runs WHERE status = 'RUNNING' LIMIT 1").fetchall())
        except sqlite3.Error:                       # not there yet, or its tables not yet made
            return False
    return moment


@pytest.mark.parametrize("how", ["SIGTERM", "server lost"])
def test_sigterm_or_a_lost_server_stops_reproduce_cleanly(setting, tmp_path, how):
    """SIGTERM to ``labelshift reproduce`` during its sweep, or its temporary Prefect server killed: the command ends
    within seconds with exit 143 (75) and a sentence saying why, every MLflow run of the sweep ended by itself
    (KILLED on SIGTERM; KILLED or FAILED when the server went first; none left RUNNING), no process left."""
    from runtime.timeouts import UNWIND_S

    home = tmp_path / "home"
    argv = [sys.executable, "-m", "flows.cli", "reproduce", "--quick", "--seeds", "5000", "--home", str(home),
            "--tracking-uri", f"sqlite:///{home / 'mlflow.db'}"]
    env = {**setting["env"], "LABELSHIFT_SERVER_LOST_S": str(LOST_AFTER_S)}
    if how == "SIGTERM":
        result = kill_at(argv, env, _sweep_run_started(home), sig=signal.SIGTERM)
        code, words, bound = 143, "stopped by SIGTERM", 30
    else:
        result = kill_at(argv, env, _sweep_run_started(home), victims=_temporary_server)
        code, words, bound = 75, "stopped answering", LOST_AFTER_S + UNWIND_S + 8
    assert result["killed"], result["stderr"][-3000:]
    assert result["returncode"] == code and result["ended_s"] < bound, (result, result["stderr"][-3000:])
    assert words in result["stderr"] and "the sweep's MLflow runs are closed KILLED" in result["stderr"], \
        result["stderr"][-2000:]
    assert result["gone"], f"still running after {ORPHAN_LIMIT_S} s: {result['left']}"
    runs = _sweep_runs(home)
    ended = {"KILLED"} if how == "SIGTERM" else {"KILLED", "FAILED"}   # tasks may fail first without their server
    assert runs and all(r.info.status in ended for r in runs), ([(r.info.run_name, r.info.status) for r in runs],
                                                                 result["stderr"][-3000:])
    print(f"reproduce, {how}: exit {result['returncode']} {result['ended_s']:.1f} s after, {len(runs)} runs KILLED")


def test_sigkill_of_reproduce_leaves_no_process(setting, tmp_path):
    argv = [sys.executable, "-m", "flows.cli", "reproduce", "--quick", "--home", str(tmp_path / "home")]
    result = kill_at(argv, setting["env"], _flow_started)
    assert result["killed"] and result["started"] >= 2, result
    assert result["gone"], f"still running after {ORPHAN_LIMIT_S} s: {result['left']}"


def _serve_ready(processes) -> bool:
    """``labelshift serve``'s own Prefect server (``prefect server start --port N``) answers its health check."""
    from runtime.processes import http_ok

    for process in list(processes.values()):
        try:
            cmd = process.cmdline()
        except psutil.Error:
            continue
        if "server" in cmd and "start" in cmd and "--port" in cmd:
            return http_ok(f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}/api/health", timeout=1.0)
    return False


def test_sigkill_of_serve_leaves_no_process(setting, tmp_path):
    """serve with no PREFECT_API_URL runs a Prefect server (with its UI) for as long as it runs: killed outright
    once that server answers, neither the server nor anything else it started outlives it by 10 s."""
    argv = [sys.executable, "-m", "flows.cli", "serve", "--home", str(tmp_path / "home"),
            "--tracking-uri", setting["uri"]]
    result = kill_at(argv, setting["env"], _serve_ready)
    assert result["killed"] and result["started"] >= 2, result
    assert result["gone"], f"still running after {ORPHAN_LIMIT_S} s: {result['left']}"


# -- labelshift report -------------------------------------------------------------------------------------------------
REPORT_DATASETS = [f"set-{i}" for i in range(8)]
REPORT_FIGURES = ["mse_vs_shift.png", "mse_vs_size.png", "mse_vs_bins.png"]
REPORT_METHODS = ["BBSE-hard", "RLLS", "MLLS-CM", "MLLS"]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, mlflow_database_template):
    """A SQLite MLflow store holding one finished sweep per dataset, as ``reproduce`` leaves it for ``report``: a
    parent run tagged ``dataset`` with ``tables/summary.csv`` and ``figures/*.png`` (1 MB each: eight datasets of
    three figures keep ``report`` busy long enough to be killed while it writes them)."""
    from mlflow import MlflowClient

    folder = tmp_path_factory.mktemp("faults-report")
    shutil.copyfile(mlflow_database_template, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("report-faults", artifact_location=(folder / "mlartifacts").as_uri())
    rng = np.random.default_rng(11)
    files = folder / "files"
    for dataset in REPORT_DATASETS:
        run_id = client.create_run(experiment, tags={"dataset": dataset}).info.run_id
        client.log_param(run_id, "n_seeds", "4")
        client.log_param(run_id, "methods", ",".join(REPORT_METHODS))
        lines = ["experiment,value,method,mse_mean,mse_se"]
        for experiment_kind, values in (("shift", (0.1, 0.5)), ("size", (100, 300)), ("bins", (2, 4))):
            for value in values:
                for method in REPORT_METHODS:
                    lines.append(f"{experiment_kind},{value},{method},{rng.uniform(0.01, 1):.6f},"
                                 f"{rng.uniform(0.001, 0.01):.6f}")
        (files / dataset / "tables").mkdir(parents=True)
        (files / dataset / "tables" / "summary.csv").write_text("\n".join(lines) + "\n")
        client.log_artifact(run_id, str(files / dataset / "tables" / "summary.csv"), artifact_path="tables")
        (files / dataset / "figures").mkdir()
        for name in REPORT_FIGURES:
            png = files / dataset / "figures" / name
            png.write_bytes(b"\x89PNG\r\n\x1a\n" + rng.bytes(1 << 20))
            client.log_artifact(run_id, str(png), artifact_path="figures")
        client.set_terminated(run_id, "FINISHED")
    tmp = folder / "tmp"
    tmp.mkdir()
    env = {**_command_env(), "TMPDIR": str(tmp)}      # where report's download folder appears (and stays if killed)
    return dict(folder=folder, uri=uri, env=env, tmp=tmp)


def _report(sweeps, out: Path) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "report", "--home", str(sweeps["folder"] / "home"), "--out", str(out),
            "--tracking-uri", sweeps["uri"], "--experiment-name", "report-faults"]


def _tree(folder: Path) -> dict[str, bytes]:
    """relative path -> content of every file under ``folder`` (empty when it does not exist)."""
    if not folder.exists():
        return {}
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _not_whole(out: Path, reference: dict[str, bytes]) -> list[str]:
    """The outputs under ``out`` that are neither absent nor the complete file of an uninterrupted run (temporary
    files of an atomic write, hidden ``.NAME.tmp``, aside: the next run replaces them)."""
    bad = []
    for path, data in _tree(out).items():
        name = path.rpartition("/")[2]
        if name.startswith(".") and name.endswith(".tmp"):
            continue
        if reference.get(path) != data:
            bad.append(f"{path}: {len(data)} bytes" + ("" if path in reference else " (not an output)"))
    return bad


def _watchdog_started(processes) -> bool:
    return bool(processes)


def _writing_figures(out: Path):
    def moment(processes) -> bool:
        return (out / "figures").exists() and any(p.is_file() for p in (out / "figures").rglob("*"))
    return moment


def _downloading(tmp: Path):
    """A new ``labelshift-report-*`` download folder in ``tmp`` (those of killed runs stay)."""
    before = set(tmp.iterdir())

    def moment(processes) -> bool:
        return any(p.name.startswith("labelshift-report-") for p in set(tmp.iterdir()) - before)
    return moment


def test_sigkill_of_report_leaves_no_process_and_no_partial_page(sweeps, tmp_path):
    """``report`` starts no server and no flow: its only child is the watchdog (``setup`` without a Prefect
    server; MLflow is read with the plain client, here from SQLite and local artifacts). What it writes is
    ``results.md`` and ``figures/<dataset>/*.png`` under ``--out``. Killed outright once its watchdog runs (before
    MLflow is read), once the first figure appears under ``--out``, and once its download folder appears over a
    complete earlier report: the watchdog ends within 10 s, every file under ``--out`` is absent or exactly the
    file of an uninterrupted run, and a rerun writes the same report as an uninterrupted run. (Before each file was
    written atomically, a kill while the figures were written left a truncated PNG about one time in six.)"""
    reference_out = tmp_path / "reference"
    done = subprocess.run(_report(sweeps, reference_out), env=sweeps["env"], capture_output=True, text=True,
                          timeout=COMMAND_LIMIT_S)
    assert done.returncode == 0, done.stderr
    reference = _tree(reference_out)
    assert "results.md" in reference and len(reference) == 1 + len(REPORT_DATASETS) * len(REPORT_FIGURES)

    out = tmp_path / "report"
    results = {}
    for name, moment in (("watchdog started", _watchdog_started), ("writing figures", _writing_figures(out))):
        result = kill_at(_report(sweeps, out), sweeps["env"], moment)
        results[name] = result
        assert result["killed"] and result["started"] >= 1, (name, result)
        assert result["gone"], f"killed once {name}: still running after {ORPHAN_LIMIT_S} s: {result['left']}"
        assert not _not_whole(out, reference), (name, _not_whole(out, reference))

    rerun = subprocess.run(_report(sweeps, out), env=sweeps["env"], capture_output=True, text=True,
                           timeout=COMMAND_LIMIT_S)
    assert rerun.returncode == 0, rerun.stderr
    assert _tree(out) == reference, sorted(set(_tree(out)) ^ set(reference))

    # killed while it rewrites a complete report: still every file whole
    result = kill_at(_report(sweeps, out), sweeps["env"], _downloading(sweeps["tmp"]))
    results["over a complete report"] = result
    assert result["killed"] and result["gone"], result
    assert not _not_whole(out, reference), _not_whole(out, reference)
    assert set(reference) <= set(_tree(out))
    print(f"kills: {[(n, r['killed'], r['started']) for n, r in results.items()]}")
