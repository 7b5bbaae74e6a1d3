"""Shared by the benchmark scripts: the CPU they ran on, and writing their section of benchmarks/README.md
(``--write-readme`` replaces the script's own section, from its ``## `` heading to the next one, with what it
measured, or appends it when it is not there yet)."""
from __future__ import annotations

import platform
import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent / "README.md"


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
