"""Docs that cannot drift from the CLI: every ``labelshift ...`` command written in README.md and docs/ parses with
the CLI's own parser (a flag that does not exist, a choice it does not offer or a missing value fails here), and
every relative link between those pages, anchors included, resolves."""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from flows.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands_in_blocks(text: str) -> list[str]:
    """Command lines in fenced code blocks: ``labelshift ...`` or ``$ labelshift ...`` (output lines such as
    ``labelshift estimate: ...`` excluded), backslash continuations joined."""
    found = []
    for block in re.findall(r"```[\w-]*\n(.*?)```", text, re.S):
        lines = block.replace("\\\n", " ").splitlines()
        for line in lines:
            line = line.strip().removeprefix("$ ")
            if re.match(r"labelshift [a-z][\w-]*(?:\s|$)", line) and not re.match(r"labelshift [\w-]+:", line):
                found.append(line)
    return found


def _commands_inline(text: str) -> list[str]:
    """Commands in inline code spans that give at least one option: ```labelshift estimate --check```."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return [c for c in re.findall(r"`(labelshift [a-z][^`]*)`", prose) if " --" in c]


#: a value written as a placeholder: ``...``, a metavariable (``FILE``, ``N``, ``[HOURS]``)
_PLACEHOLDER = re.compile(r"\.\.\.|…|\[?[A-Z][A-Z_0-9]*(?:,\.\.\.)?\]?")


def _argv(command: str) -> list[str]:
    """The arguments of one written command: a trailing comment, a shell continuation (``&&``, ``|``, ``;``, ``&``)
    and its redirections dropped; optional parts' brackets (``[--class-names a,b]``) dropped, alternatives
    (``logits|probabilities``) taken at their first; a placeholder value (``...``, ``FILE``, ``[HOURS]``) becomes
    ``1``, which an int, a float and a string option all take -- the flags themselves are checked as written."""
    words = shlex.split(command, comments=True)[1:]
    for stop in ("&&", "||", "|", ";", "&", ">", "2>&1"):
        if stop in words:
            words = words[:words.index(stop)]
    out = []
    for word in words:
        if word.startswith(("<", ">")):
            continue
        if _PLACEHOLDER.fullmatch(word):
            word = "1" if out and out[-1].startswith("--") else None
        elif word.startswith("[--"):
            word = word[1:].rstrip("]")
        elif "|" in word:
            word = word.split("|")[0]
        if word is not None:
            out.append(word.rstrip("]"))
    return out


def _parse_error(argv: list[str], fragment: bool) -> str | None:
    """The parser's error for ``argv``, or None. A fragment (inline prose) may leave out required options."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            if exc.code in (0, None):
                return None
            message = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
            if fragment and "the following arguments are required" in message:
                return None
            return message
    return None


def written_commands() -> list[tuple[str, str, bool]]:
    """(page, command, fragment) of every command written in the pages."""
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        out += [(page.name, c, False) for c in _commands_in_blocks(text)]
        out += [(page.name, c, True) for c in _commands_inline(text)]
    return out


def test_the_reader_finds_commands_and_the_parser_refuses_a_flag_that_does_not_exist():
    text = "run\n```bash\n$ labelshift estimate --modle x  # typo\nlabelshift estimate: done\n```\nor `labelshift " \
           "estimate --check`, and `labelshift reproduce`"
    assert _commands_in_blocks(text) == ["labelshift estimate --modle x  # typo"]
    assert _commands_inline(text) == ["labelshift estimate --check"]
    assert "unrecognized arguments: --modle" in _parse_error(_argv("labelshift estimate --modle x"), False)
    assert _parse_error(_argv("labelshift estimate --model models:/m@a --check # and so on"), False) is None
    assert _argv("labelshift reference register --holdout FILE --outputs logits|probabilities [--alias A] ...") == \
        ["reference", "register", "--holdout", "1", "--outputs", "logits", "--alias", "1"]
    assert _parse_error(["reference", "register"], True) is None         # prose may leave out what is required
    assert "required" in _parse_error(["reference", "register"], False)


def test_every_written_command_parses():
    commands = written_commands()
    assert len(commands) > 30
    bad = [f"{page}: {command!r}: {error}" for page, command, fragment in commands
           if (error := _parse_error(_argv(command), fragment))]
    assert not bad, "commands in the docs that the CLI refuses:\n" + "\n".join(bad)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(page):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and file.suffix == ".md":
            headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), re.M)}
            if anchor not in headings:
                broken.append(f"{target}: no heading #{anchor}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def _subcommands(parser, prefix: str = "") -> list[str]:
    """Every command path of the CLI: ``estimate``, ``reference register``, ``stack up`` ..."""
    import argparse

    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                path = f"{prefix}{name}"
                nested = _subcommands(sub, path + " ")
                found += nested or [path]
    return found


def test_the_commands_table_of_the_operations_manual_names_every_command():
    """docs/operations.md's table names each command (``labelshift stack up|down|status`` names three)."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    table = re.search(r"^## The commands\n(.*?)(?=^## )", text, re.M | re.S).group(1)
    named = set()
    for cell in re.findall(r"^\| `labelshift ([^`]*)`", table, re.M):
        words = cell.replace("\\|", "|").split()
        head = [w for w in words if not w.startswith("-") and not w.isupper()]
        if len(head) >= 2 and "|" in head[1]:
            named |= {f"{head[0]} {alt}" for alt in head[1].split("|")}
        else:
            named |= {" ".join(head[:2]), head[0]}
    missing = [c for c in _subcommands(build_parser()) if c not in named]
    assert not missing, f"docs/operations.md, 'The commands', has no row for: {missing}"
