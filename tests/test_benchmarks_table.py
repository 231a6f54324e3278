"""BENCHMARKS.md's "Current figures" table reads at a glance: no row over 300 characters, and each
row's "what" links to the heading of the section that holds its full text, history and
explanation."""

from __future__ import annotations

import re
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
MAX_ROW = 300
HEADING = "## Current figures"
PAGE_LINK = re.compile(r"\]\(#([^)\s]+)\)")


def _heading_anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def table_rows(text: str) -> list[str]:
    """The lines of the table under ``## Current figures`` (header and separator included)."""
    lines = text.splitlines()
    if HEADING not in lines:
        return []
    rows = []
    for line in lines[lines.index(HEADING) + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append(line)
    return rows


def table_problems(text: str) -> list[str]:
    """Each row of the current-figures table that is over MAX_ROW characters, or whose first cell
    links to no heading of the page; a missing table is a problem too."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    anchors = {
        _heading_anchor(line.lstrip("#")) for line in prose.splitlines() if line.startswith("#")
    }
    rows = table_rows(prose)
    if len(rows) < 3:
        return [f"no table with figures under {HEADING!r}"]
    problems = [
        f"row {n}: {len(row)} characters (at most {MAX_ROW}): {row[:60]}..."
        for n, row in enumerate(rows, 1)
        if len(row) > MAX_ROW
    ]
    for n, row in enumerate(rows[2:], 3):
        what = row.strip().strip("|").split(" | ")[0]
        targets = PAGE_LINK.findall(what)
        if not targets:
            problems.append(f"row {n}: its 'what' links to no section: {what[:60]}...")
        problems += [
            f"row {n}: #{t} is no heading of the page" for t in targets if t not in anchors
        ]
    return problems


def test_every_current_figure_is_a_short_row_linking_its_section() -> None:
    text = BENCHMARKS.read_text()
    assert len(table_rows(text)) > 10, "the current-figures table lost its rows"
    assert table_problems(text) == []


def test_the_check_finds_a_long_row_and_a_row_without_its_section() -> None:
    """Positive control: a long row, a row without a link, a link to no heading and a missing
    table are named; a short row linking a heading with punctuation is not."""
    good = "| [tune](#tune-predicted-against-measured-x) | 5.9 % | 3 pairs | 2026-11-28 | `x` |"
    page = "\n".join(
        [
            "# Benchmarks",
            HEADING,
            "| what | ratio (median) | 95 % interval | date | command |",
            "| --- | --- | --- | --- | --- |",
            good,
            "| [long](#tune-predicted-against-measured-x) | " + "1.0, " * 60 + " | - | - | `x` |",
            "| no link | 1.0 | - | - | see [there](#tune-predicted-against-measured-x) |",
            "| [gone](#nowhere) | 1.0 | - | - | `x` |",
            "## Tune: predicted against measured (`x`)",
        ]
    )
    problems = table_problems(page)
    assert [p.split(":")[0] for p in problems] == ["row 4", "row 5", "row 6"], problems
    assert "characters (at most 300)" in problems[0]
    assert "links to no section" in problems[1]
    assert "#nowhere is no heading" in problems[2]
    assert table_problems("# Benchmarks\n\nno table\n") == [
        "no table with figures under '## Current figures'"
    ]
