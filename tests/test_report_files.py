"""The report's files as others on a shared cluster find them: readable as the umask allows, and
plotly.js either inside the report or once beside a folder of reports."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from workbench.store.files import current_umask
from workbench.ui.report import report_from_store, write_report

from .frames import scaling_sweep, write_scaling_sweep


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _store(root: Path) -> Path:
    return write_scaling_sweep(root)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_results_and_report_are_readable_by_group_and_others_under_umask_022(
    tmp_path: Path,
) -> None:
    with umask(0o022):
        assert current_umask() == 0o022
        sweep = _store(tmp_path)
        report = report_from_store(sweep, sweep / "report.html", summary_csv=sweep / "summary.csv")
    files = [report, sweep / "summary.csv", sweep / "ws1" / "run.json"]
    assert [oct(_mode(p)) for p in files] == [oct(0o644)] * 3  # rw-r--r--, as `touch` gives


def test_a_private_umask_keeps_them_private(tmp_path: Path) -> None:
    with umask(0o077):
        assert current_umask() == 0o077
        sweep = _store(tmp_path)
        report = report_from_store(sweep, sweep / "report.html", summary_csv=sweep / "summary.csv")
    files = [report, sweep / "summary.csv", sweep / "ws1" / "run.json"]
    assert [oct(_mode(p)) for p in files] == [oct(0o600)] * 3


def test_plotly_js_inline_once_or_one_copy_beside_many_reports(tmp_path: Path) -> None:
    runs, steps, evals = scaling_sweep()
    inline = write_report(runs, steps, evals, tmp_path / "inline" / "report.html")
    text = inline.read_text()
    assert len(re.findall(r"\* plotly\.js v\d", text)) == 1  # the library, once, minified
    assert not list(inline.parent.glob("*.js"))
    size_inline = inline.stat().st_size

    folder = tmp_path / "reports"
    first = write_report(runs, steps, evals, folder / "a.html", plotly_js="directory")
    library = folder / "plotly.min.js"
    inode = library.stat().st_ino
    second = write_report(runs, steps, evals, folder / "b.html", plotly_js="directory")
    assert library.stat().st_ino == inode, "the second report reuses the copy there"
    assert len(re.findall(r"\* plotly\.js v\d", library.read_text())) == 1
    for page in (first, second):
        text = page.read_text()
        assert re.findall(r'<script[^>]+src="([^"]+)"', text) == ["plotly.min.js"]
        assert not re.search(r"\* plotly\.js v\d", text)
        # the report less the library: all of the 3.5 MB and more saved is plotly.js
        assert page.stat().st_size + library.stat().st_size > size_inline
        assert page.stat().st_size < size_inline - 3_500_000


def test_an_unknown_plotly_js_choice_is_refused(tmp_path: Path) -> None:
    runs, steps, evals = scaling_sweep()
    with pytest.raises(ValueError, match="plotly_js='cdn': valid values are 'inline' and"):
        write_report(runs, steps, evals, tmp_path / "r.html", plotly_js="cdn")  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())
