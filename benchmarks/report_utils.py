"""Shared by the benchmark scripts: the CPU they ran on, writing their section of benchmarks/README.md
(``--write-readme`` replaces the script's own section, from its ``## `` heading to the next one, with what it
measured, or appends it when it is not there yet), and the environment they set before importing numpy or the
services' clients. This module imports neither, so a script can import it first."""
from __future__ import annotations

import multiprocessing as mp
import os
import platform
import re
import sys
import time
from pathlib import Path

README = Path(__file__).resolve().parent / "README.md"

# Prefect and MLflow quiet (no analytics, no console logging, no progress bars): they must be set before either is
# imported, and a value the user set wins
QUIET_SERVICES = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
                  "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "CRITICAL", "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL",
                  "MLFLOW_LOGGING_LEVEL": "WARNING", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def quiet_services() -> None:
    """Set :data:`QUIET_SERVICES` (where not set already); call before importing prefect or mlflow."""
    for name, value in QUIET_SERVICES.items():
        os.environ.setdefault(name, value)


def one_blas_thread() -> None:
    """One BLAS thread per process (where not set already), for scripts that run worker processes; call before
    importing numpy."""
    for name in BLAS_THREADS:
        os.environ.setdefault(name, "1")


def write_section(heading: str, section: str, readme: Path = README) -> None:
    text = readme.read_text() if readme.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    readme.write_text(text.rstrip("\n") + "\n")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's processor or machine name elsewhere)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return cpu


def publish(heading: str, lines: list[str], write_readme: bool, readme: Path = README) -> str:
    """Print a script's report (its lines joined) and, with ``write_readme``, put it in its section of the README."""
    report = "\n".join(lines) + "\n"
    print(report)
    if write_readme:
        write_section(heading, report, readme)
        print(f"written to {readme}", file=sys.stderr)
    return report


def run_chunks(fn, tasks: list, workers: int, t0: float) -> dict:
    """Run ``fn`` over ``tasks`` on ``workers`` forked processes; each call returns (key, list of results) and the
    lists are joined per key. Progress on stderr every 20 chunks (seconds since ``t0``)."""
    rows: dict = {}
    with mp.get_context("fork").Pool(workers) as pool:
        for i, (key, chunk) in enumerate(pool.imap_unordered(fn, tasks)):
            rows.setdefault(key, []).extend(chunk)
            if (i + 1) % 20 == 0:
                print(f"  {i + 1}/{len(tasks)} chunks, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return rows
