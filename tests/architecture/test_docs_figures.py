"""Docs that cannot drift from the benchmarks: every measured figure quoted in README.md and docs/*.md is tied to the
section of benchmarks/README.md (or benchmarks/HISTORY.md) it comes from, and that section says the same figure.

The rule, as this test applies it:

* A page is cut into *units*: a paragraph, a list item (with its continuation lines) or a table; code blocks (fenced,
  or indented four spaces) and headings are not units. A table also counts the paragraph above it (its caption), a
  list item the paragraph that leads into its list: their links, and their cue words (next point).
* A unit *reports a measurement* when its prose (inline code and link targets removed) says so: ``measured``,
  ``measures``, ``took``, ``takes``, ``timed``, ``covered``, ``covers``, ``coverage``, ``false alarm``, ``power``,
  ``rejected``, ``peak RSS``, ``wall time`` or ``benchmark`` (not "size": "of the same size" is too common).
* Its *measured figures* are the numbers with a unit -- ``%``, ``ms``, ``s``, ``seconds``, ``min``, ``minutes``,
  ``hours``, ``GiB``, ``MiB``, ``GB``, ``MB``, or an ``x`` written against the number (``1.9x``) -- both ends of a
  range (``52-57 s``), and the decimals written with three digits between 0.100 and 0.999 (coverages, accuracies:
  ``0.946``).
* Each needs a link in its unit to ``benchmarks/README.md#...`` or ``benchmarks/HISTORY.md#...`` whose anchor is a
  heading there (``##`` or deeper: the page's title would be the whole page), and its number must appear, as a
  whole number, in one of the linked sections (from the heading to the next of the same or a higher level).
  Numbers are compared without thousands' commas and trailing zeros (``1,000`` is ``1000``, ``63%`` is ``63.0%``);
  a percentage must appear as one (``95%`` is not ``0.95``: the docs write a figure as its section does).

Not measured figures, and so not checked:

* settings and defaults: a level (``at 5%``, ``level 1%``, ``nominal 5%``, ``a 5% level``), an interval's nominal
  coverage (``95% interval``, ``95% Fisher interval``, ``95% confidence``), a threshold as a share (``30% of the
  level``, ``5% of a standard error``), a default (``2 s by default``);
* goals and bounds: a number after ``goal``, ``at most``, ``at least``, ``up to``, ``within``, ``under``, ``over``,
  ``more than``, ``less than``, ``below``, ``above``, ``<=``, ``>=`` (a bound is a claim checked against the
  figures, not a figure);
* code: flags (``--level 0.05``), equations' constants, and the outputs of the walk-throughs, which are one example
  run (the walk-throughs say so), not a measurement -- nor the prose that quotes them: a figure shown in a code
  block of the unit's own section (any heading level) is that run's;
* numbers without a unit (counts, sizes such as ``m = 2,000``, seeds) and two-digit decimals (``0.95``, ``0.05``:
  levels and settings far more often than measurements).

Gaps: a measurement written without a cue word is not checked; a bound word drops a measured maximum ("up to
7.8%"); a small number (``6 MB``) can be found in a long linked section by chance. ``NOT_FROM_BENCHMARKS`` lists the
units whose figures come from elsewhere on purpose, each with where; an entry that matches no unit with figures
fails, so the list can only shrink.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.architecture.test_docs_commands import PAGES, ROOT, _slug

BENCHMARK_PAGES = {"README.md": ROOT / "benchmarks" / "README.md", "HISTORY.md": ROOT / "benchmarks" / "HISTORY.md"}

CUES = re.compile(r"\bmeasur(?:ed|es)\b|\btook\b|\btakes\b|\btimed\b|\bcover(?:ed|s|age)\b|false alarms?|\bpower\b"
                  r"|\brejected\b|peak RSS|wall time|\bbenchmark", re.I)

_NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"
_UNIT = r"%|\s?(?:ms|s|min|minutes?|seconds?|hours?|GiB|MiB|GB|MB)\b|x\b"
#: a number with a unit, or a range of two with one unit; or a three-digit decimal between 0.100 and 0.999
FIGURE = re.compile(rf"(?<![\w.,])(?P<a>{_NUMBER})(?:\s?(?:-|–|to)\s?(?P<b>{_NUMBER}))?(?P<unit>{_UNIT})"
                    rf"|(?<![\w.,])(?P<c>0\.[1-9]\d\d)(?!\d|\.\d)")

#: settings, defaults and bounds: the figure that follows (or precedes) these words is not a measurement
_BOUND_BEFORE = re.compile(r"(?:\b(?:goals?|at most|at least|up to|within|under|over|more than|less than|below"
                           r"|above|level|nominal|at|alpha)\s*[:=]?|[<>]=?|≤|≥)\s*$", re.I)
_SETTING_AFTER = re.compile(r"^\s*(?:(?:[\w-]+\s+){0,2}(?:intervals?|confidence|credible)\b|level|prediction"
                            r"|significance|of the level|of a standard error|of the score|by default|\(?default)", re.I)

_MOVED_INTERVALS = ("intervals.md, 'Measured coverage': runs of 2026-11-26 whose figures moved to benchmarks/HISTORY.md "
                    "when the section was rewritten (issue 38); not tied yet")
_MOVED_NO_SHIFT = ("uncertainty.md, 'No-shift test': runs before the holdout's kappa, whose table moved to "
                   "benchmarks/HISTORY.md (issue 38); not tied yet")
_DESIGN = "the label-shift test's design history: prototype and review runs, recorded only here"


def _same_reason(page: str, reason: str, *words: str) -> dict:
    """Entries of NOT_FROM_BENCHMARKS for the units of ``page`` containing each of ``words``, all for ``reason``."""
    return {(page, w): reason for w in words}


#: (page, words the unit contains) -> where its figures come from, when not from benchmarks/
NOT_FROM_BENCHMARKS = {
    ("operations.md", "| fault | what happens | what to do |"):
        "one run of each fault test (tests/integration/test_faults_*.py, test_workers.py), which assert the bounds",
    **_same_reason("label_shift_test.md", _DESIGN, "**Smoothing.**", "How the weights were chosen, and what was tried",
                   "*Why this world.*", "a *density-ratio* test that uses calibration",
                   "weights fixed from the data for all draws", "the log-odds moments with q from the binned MLLS",
                   "leaving out the blocks of predicted classes", "| case | Wald size | likelihood-ratio size |",
                   "Other regions did not help the region part", "*How the level split was chosen, and checked.*",
                   "*The trade-offs measured on the way.*"),
    ("label_shift_test.md", "*Why this criterion and not a cap on the rate given that holdout.*"):
        "kappa(r) and the rate of the one-direction model evaluated at chosen r: computed from the formulas above",
    ("label_shift_test.md", "**The fix: draw the holdout's error kappa times over.**"):
        "chi^2 tail probabilities at kappa = 1 and 2, computed from the linearised law above",
    **_same_reason("intervals.md", _MOVED_INTERVALS, "* **Coverage, free classes**", "* **Classes pinned at w = 0**",
                   "* **Untrustworthy**: with the rule above", "* **Time** at m = 100,000, k = 10, n = 1000",
                   "The same problem with temperature scaling (TS)"),
    ("uncertainty.md", "Measured coverage of the small class near the boundary"):
        "tests/unit/inference/test_intervals_no_shift_identifiability.py measures it and asserts the bound",
    **_same_reason("uncertainty.md", _MOVED_NO_SHIFT, "**f and p_s estimated: the two-sample test**",
                   "*Why not each side's own covariance.*", "* The estimated covariance is noisy",
                   "*The calibrator fit on the holdout.*", "*Measured size* at a nominal 5%",
                   "*Power.* Under a mild shift"),
}

_ITEM = re.compile(r"\s*(?:[-*]|\d+\.)\s")
BENCH_LINK = re.compile(r"\]\((?:\.\./)?benchmarks/(README|HISTORY)\.md#([\w-]+)\)")


def units(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph, list item and table of a markdown page, code blocks (fenced, or indented
    by four spaces after a blank line, outside a list) left out.
    A table's text starts with the paragraph above it (blank lines between allowed, no heading), its caption."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    blocks: list[list | None] = []          # [first line, lines, kind], None for a heading
    gap, code = True, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("    ") and (gap or code) and not (blocks and blocks[-1] and blocks[-1][2] == "item"):
            code = True                                             # an indented code block: equations, outputs
            continue
        code = False
        if not line.strip() or line.startswith("#"):
            gap = True
            if line.startswith("#"):
                blocks.append(None)
            continue
        kind = "table" if line.lstrip().startswith("|") else "item" if _ITEM.match(line) else "text"
        last = blocks[-1] if blocks else None
        if last and not gap and (kind == last[2] == "table" or (kind == "text" and last[2] != "table")):
            last[1].append(line)                                    # the same paragraph, item or table goes on
        elif last and kind == "table" and last[2] == "text":
            last[1].append(line)                                    # a table under its caption
            last[2] = "table"
        else:
            blocks.append([number, [line], kind])
        gap = False
    return [(block[0], "\n".join(block[1])) for block in blocks if block]


def _prose(text: str) -> str:
    """Text without inline code and link targets."""
    return re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", " ", text))


def measured_figures(unit: str, lead: str = "") -> list[str]:
    """The measured figures of one unit, as written (``52-57 s`` gives ``52`` and ``57``); none unless the unit (or
    ``lead``, the paragraph that leads into a list item's list) says it reports a measurement."""
    prose = _prose(unit)
    if not CUES.search(prose) and not CUES.search(_prose(lead)):
        return []
    figures = []
    for match in FIGURE.finditer(prose):
        before, after = prose[:match.start()], prose[match.end():]
        if _BOUND_BEFORE.search(before[-12:]) or _SETTING_AFTER.match(after):
            continue
        percent = "%" if match.group("unit") == "%" else ""
        figures += [n + percent for n in match.group("a", "b", "c") if n]
    return figures


def _sections(page: Path) -> dict[str, str]:
    """Anchor -> text of each section of a page: from its heading to the next heading of the same or a higher level."""
    lines = page.read_text(encoding="utf-8").splitlines()
    heads = [(i, len(m.group(1)), _slug(m.group(2))) for i, line in enumerate(lines)
             if (m := re.match(r"(#+) (.+)$", line))]
    out = {}
    for pos, (i, level, anchor) in enumerate(heads):
        if level == 1:          # the page's title: a link to it would tie a figure to the whole page
            continue
        end = next((j for j, lvl, _ in heads[pos + 1:] if lvl <= level), len(lines))
        out.setdefault(anchor, "\n".join(lines[i:end]))
    return out


def _plain(text: str) -> str:
    """Numbers written one way: thousands' commas and a decimal's trailing zeros dropped (``1,000.0`` -> ``1000``)."""
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)
    text = re.sub(r"(\d\.\d*?)0+(?!\d)", r"\1", text)
    return re.sub(r"(?<=\d)\.(?!\d)", "", text)


def _said(number: str, text: str) -> bool:
    """Whether ``number`` appears in ``text`` as a whole number (``4.5`` not in ``14.5`` or ``4.55``, ``96`` not in a
    commit's ``96bfd5a``; ``63`` in ``63.0``; ``1,000`` in ``1000``); a percentage (``4.5%``) as a percentage
    (``4.5%``, ``4.5 %``, or a range's first end, ``4.5-6.0%``)."""
    plain = _plain(number)
    after = r"(?:\s?[-–]\s?[\d.]+)?\s?%" if plain.endswith("%") else r"(?![a-f]|\.?\d)"  # 4.5%, 4.5-6%; no hash
    return re.search(rf"(?<![\w.]){re.escape(plain.rstrip('%'))}{after}", _plain(text)) is not None


def example_outputs(text: str) -> dict[int, str]:
    """Line -> the text of the fenced code blocks of the section (any heading level) that line is in: the commands
    and outputs of a walk-through, whose figures the prose around it may quote."""
    sections: list[tuple[list[int], list[str]]] = [([], [])]
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#+ ", line):
            sections.append(([], []))
        sections[-1][0].append(number)
        if fenced:
            sections[-1][1].append(line)
    return {number: "\n".join(code) for numbers, code in sections for number in numbers}


def figures_by_unit(text: str) -> list[tuple[int, str, list, list[str]]]:
    """(line, unit, its links to benchmarks/, its measured figures) of each unit with measured figures; a list item
    also counts the links and cue words of the paragraph that leads into its list, and a figure that the section's
    code blocks show is left out (quoted from an example run)."""
    found, lead, shown = [], "", example_outputs(text)
    for line, unit in units(text):
        item = _ITEM.match(unit) is not None
        if not item:
            lead = unit
        links = BENCH_LINK.findall(unit) + (BENCH_LINK.findall(lead) if item else [])
        figures = [f for f in measured_figures(unit, lead if item else "") if not _said(f, shown[line])]
        if figures:
            found.append((line, unit, links, figures))
    return found


def untied_figures(text: str, sections: dict[str, dict[str, str]], exempt: list[str] = ()) -> list[str]:
    """What is wrong with the figures of one page: ``line: figure: why``. ``sections`` maps README.md / HISTORY.md to
    their sections by anchor; a unit that contains one of ``exempt``'s strings is left out."""
    problems = []
    for line, unit, links, figures in figures_by_unit(text):
        if any(words in unit for words in exempt):
            continue
        if not links:
            problems.append(f"{line}: {', '.join(figures)}: no link to the benchmarks section they come from")
            continue
        bad = [f"benchmarks/{page}.md#{anchor}" for page, anchor in links if anchor not in sections[f"{page}.md"]]
        if bad:
            problems.append(f"{line}: no such section: {', '.join(bad)}")
            continue
        linked = "\n".join(sections[f"{page}.md"][anchor] for page, anchor in links)
        missing = [f for f in figures if not _said(f, linked)]
        if missing:
            problems.append(f"{line}: {', '.join(missing)}: not in the linked section(s) "
                            f"{', '.join(a for _, a in links)}")
    return problems


def _benchmark_sections() -> dict[str, dict[str, str]]:
    return {name: _sections(path) for name, path in BENCHMARK_PAGES.items()}


def test_the_rule_catches_a_figure_not_in_its_section_and_one_without_a_link(tmp_path):
    bench = tmp_path / "bench.md"
    bench.write_text("# Bench\n## Speed of the thing\n\nIt took 2.5 s and 1.49 GiB; coverage 0.946.\n"
                     "## Other\n\n3.1 s\n", encoding="utf-8")
    sections = {"README.md": _sections(bench), "HISTORY.md": {}}
    link = "[bench](../benchmarks/README.md#speed-of-the-thing)"
    page = (f"# Page\n\nThe run took 2.5 s at 1.49 GiB ({link}).\n\n"               # tied: passes
            f"Its coverage was 0.946 and it took 3.1 s ({link}).\n\n"                 # 3.1 s is another section's
            "The run took 12.5 s, at a 5% level and within 60 s.\n\n"                # no link
            "Set `--timeout 30` (30 s); a 95% interval; the level is 5%.\n\n"        # settings: not checked
            "## Walk-through\n\n```\n$ labelshift estimate\nwall time 99.9 s\n```\n\n"
            "That run took 99.9 s (measured once).\n\n"                                # quotes the example run
            "- The list item measured 1,000 s ([b](benchmarks/README.md#no-such-section)).\n\n"
            f"Measured ({link}):\n\n- 2.5 s\n- 2.6 s\n")                            # items take their lead's link
    assert untied_figures(page, sections) == [
        "5: 3.1: not in the linked section(s) speed-of-the-thing",
        "7: 12.5: no link to the benchmarks section they come from",
        "20: no such section: benchmarks/README.md#no-such-section",
        "25: 2.6: not in the linked section(s) speed-of-the-thing",
    ]
    assert measured_figures("The run took 12.5 s, at a 5% level and within 60 s.") == ["12.5"]
    assert measured_figures("Coverage 0.93-0.97 measured, peak RSS 1.5-2 GiB, 1.9x faster, 0.950.") == \
        ["1.5", "2", "1.9", "0.950"]      # two-digit decimals are not taken; a range with a unit gives both ends
    assert measured_figures("A list item, 4 s", lead="What was measured:") == ["4"]
    assert _said("1,000", "took 1000 s") and not _said("4.5", "14.5% and 4.55%") and _said("63%", "(63.0%)")
    assert _said("4.5%", "4.5-6.0%") and not _said("4.5%", "4.5 s") and not _said("96", "commit 96bfd5a")


def test_units_keep_list_items_apart_and_tables_with_their_caption():
    text = "Intro measured:\n\n- one 1 s\n  more\n- two 2 s\n\nCaption [x](y)\n\n| a |\n|---|\n| 3 s |\nAfter.\n" \
           "## H\n| b |\n"
    assert units(text) == [(1, "Intro measured:"), (3, "- one 1 s\n  more"), (5, "- two 2 s"),
                           (7, "Caption [x](y)\n| a |\n|---|\n| 3 s |"), (12, "After."), (14, "| b |")]


def _exempt(page: Path, text: str) -> tuple[list[str], set]:
    """The words of the page's ``NOT_FROM_BENCHMARKS`` entries, and the entries that match a unit with figures."""
    mine = [key for key in NOT_FROM_BENCHMARKS if key[0] == page.name]
    used = {key for _, unit, _, _ in figures_by_unit(text) for key in mine if key[1] in unit}
    return [key[1] for key in mine], used


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_measured_figure_is_linked_to_the_benchmarks_section_that_says_it(page):
    text = page.read_text(encoding="utf-8")
    exempt, used = _exempt(page, text)
    stale = {key for key in NOT_FROM_BENCHMARKS if key[0] == page.name} - used
    assert not stale, f"NOT_FROM_BENCHMARKS entries that match no unit with figures: {stale}"
    problems = untied_figures(text, _benchmark_sections(), exempt)
    assert not problems, f"{page.relative_to(ROOT)}, figures not tied to benchmarks/README.md:\n" + "\n".join(problems)
