"""docs/verified.md, "What was verified": its table names tests that exist: every
``file.py::test_name`` (and ``::test_name`` continuing the file before it) is a test function in
that file, and every file named alone exists, so the table cannot drift from the suite it cites."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def verified_rows() -> list[str]:
    text = (ROOT / "docs" / "verified.md").read_text()
    section = text.split("# What was verified", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and "`" in line]


def functions_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_every_cited_test_exists() -> None:
    rows = verified_rows()
    assert len(rows) >= 30, "the table was not found"
    missing = []
    for row in rows:
        tests_cell = row.rstrip(" |").rsplit(" | ", 1)[-1]
        current: Path | None = None
        for cited in re.findall(r"`([^`]+)`", tests_cell):
            file, _, name = cited.partition("::")
            if file:
                current = ROOT / "tests" / file
                if not current.is_file():
                    missing.append(cited)
                    continue
            if name and (current is None or name not in functions_in(current)):
                missing.append(f"{current.name if current else '?'}::{name}")
    assert missing == [], missing
