"""The front door and the pages behind it: the README stays one page (at most 200 lines), every
page under docs/ is linked from it, and every relative link in the README, docs/, BENCHMARKS.md
and tests/README.md reaches a file that exists and, where it names one, a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "tests" / "README.md"] + sorted(
    (ROOT / "docs").glob("*.md")
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks (a ``](x)`` inside code is not a link)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {
        _anchor(line.lstrip("#"))
        for line in _prose(path.read_text()).splitlines()
        if line.startswith("#")
    }


def _relative_links(path: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(_prose(path.read_text()))
        if not re.match(r"[a-z]+:", target)
    ]


def broken_links(pages: list[Path]) -> list[str]:
    """Each relative link of the pages that reaches no file, or no heading of its file."""
    broken = []
    for page in pages:
        for target in _relative_links(page):
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    return broken


def test_every_relative_link_reaches_a_file_and_its_heading() -> None:
    assert broken_links(PAGES) == []


def test_the_readme_is_one_page_that_links_every_doc() -> None:
    readme = ROOT / "README.md"
    lines = readme.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the rest belongs in docs/"
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in _relative_links(readme)}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert unlinked == [], f"docs pages the README does not link: {unlinked}"


def test_the_link_check_finds_a_broken_link(tmp_path: Path) -> None:
    """Positive control: a missing file and a missing heading are named; a good link to a
    heading with punctuation, an outside address and a link inside code are not."""
    (tmp_path / "other.md").write_text("# What if: `workbench predict`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n[a](missing.md) [b](#nowhere) [c](#title) [d](other.md#nope)\n"
        "[e](other.md#what-if-workbench-predict) [f](https://example.org/x)\n```\n[g](x.md)\n```\n"
    )
    assert broken_links([page]) == [
        "page.md: missing.md (no such file)",
        "page.md: #nowhere (no such heading)",
        "page.md: other.md#nope (no such heading)",
    ]
