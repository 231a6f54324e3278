"""The dashboard answers at a glance without overstating: the report's finding on top, no speedup
of 100 % from a group that never ran on one rank, throughput on an axis from zero, controls and
figure as wide as the cell. Hand-built stores (see frames.write_run)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from workbench.ui.baseline import honest_table, speedup_rows
from workbench.ui.dashboard import Dashboard

from .frames import (
    make_evals,
    make_steps,
    room_for_evals,
    write_run,
    write_scaling_sweep,
)

MESSAGE = "no 1-rank run in this group: speedup needs a baseline; add world_size=1 to the sweep"


class _Cells(HTMLParser):
    """The header and body cells of an HTML table, as text."""

    def __init__(self) -> None:
        super().__init__()
        self.header: list[str] = []
        self.rows: list[list[str]] = []
        self._cell: str | None = None

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th"):
            self._cell = ""

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append(self._cell.strip())
            self._cell = None


def table_rows(html_text: str) -> list[dict[str, str]]:
    """The rendered scaling table as one dict per row (column -> cell text)."""
    parser = _Cells()
    parser.feed(html_text)
    header, *body = [r for r in parser.rows if r]
    return [dict(zip(header, row, strict=True)) for row in body]


def _run(store: Path, sweep: str, run_id: str, world_size: int, **config: object) -> None:
    steps, evals = room_for_evals(
        make_steps(run_id, world_size=world_size), make_evals(run_id, world_size)
    )
    write_run(
        store,
        sweep,
        run_id,
        steps,
        evals,
        world_size=world_size,
        per_device_batch_size=8,
        train_samples=640,
        **config,
    )


def test_one_run_at_two_ranks_says_speedup_needs_a_baseline(tmp_path: Path) -> None:
    # The quickstart's store: one run of 2 ranks, 8 samples per rank per 1 s step.
    _run(tmp_path, "quick", "q2", 2)
    dash = Dashboard(tmp_path, sweeps=["quick"])
    assert dash.children[0] is dash.finding  # the finding comes first
    # The report's first sentence for this study, word for word.
    assert (
        "only 2 ranks measured: no speedup to report; add a run at a smaller world size (1 rank) "
        "as the baseline" in dash.finding.value
    )
    assert MESSAGE in dash.baseline.value

    # Throughput: 16 samples/s over 2 devices = 8 per device, on an axis from zero.
    assert list(dash.figure.data[0].y) == pytest.approx([8.0])
    assert dash.figure.layout.yaxis.rangemode == "tozero"
    assert dash.figure.layout.autosize is True

    dash.figure_kind.value = "speedup"
    assert dash.figure.layout.title.text == MESSAGE
    assert len(dash.figure.data) == 0  # no point at 1x, no "100%" label
    (row,) = table_rows(dash.table.value)
    assert row["world_size"] == "2" and row["samples_per_s"] == "16/s"
    # not 1 and 100 %: empty, and the table drops a column with nothing in it
    assert row.get("speedup", "") == "" and row.get("efficiency", "") == ""


def test_a_group_from_two_ranks_up_keeps_its_relative_speedup(tmp_path: Path) -> None:
    # 2 and 4 ranks at 1 s per step: 16 and 32 samples/s, speedup 2 relative to 2 ranks.
    _run(tmp_path, "up", "u2", 2)
    _run(tmp_path, "up", "u4", 4)
    dash = Dashboard(tmp_path, sweeps=["up"])
    assert dash.baseline.value.count("<li>") == 1
    assert f"{MESSAGE} (its speedup and efficiency here are relative to 2 ranks)" in (
        dash.baseline.value
    )
    dash.figure_kind.value = "speedup"
    assert list(dash.figure.data[0].x) == [2, 4]
    assert list(dash.figure.data[0].y) == pytest.approx([1.0, 2.0])
    rows = table_rows(dash.table.value)
    assert [(r["world_size"], r["speedup"], r["efficiency"]) for r in rows] == [
        ("2", "", ""),  # its own base: nothing measured
        ("4", "2.00x", "100 %"),
    ]


def test_groups_with_and_without_a_baseline_side_by_side(tmp_path: Path) -> None:
    write_scaling_sweep(tmp_path, train_samples=640)  # 1, 2 and 4 ranks in fp32
    _run(tmp_path, "half", "b2", 2, precision="bf16")  # bf16 only at 2 ranks
    dash = Dashboard(tmp_path)
    assert dash.baseline.value.count("<li>") == 1
    assert f"precision=bf16: {MESSAGE}" in dash.baseline.value
    assert "precision=fp32" not in dash.baseline.value
    dash.figure_kind.value = "speedup"
    lines = {t.name: list(t.y) for t in dash.figure.data}
    # the lone bf16 point is left out; one group left, so its label names its first two columns
    assert lines.keys() == {"model=mlp, precision=fp32", "ideal"}
    assert lines["model=mlp, precision=fp32"] == pytest.approx([1.0, 1.6, 2.5])
    assert dash.figure.layout.yaxis.rangemode == "tozero"

    dash.sweeps.value = ("weak",)  # every group has its 1-rank run: nothing to warn about
    assert dash.baseline.value == ""
    # every cell in its unit, none in exponent form
    cells = [v for row in table_rows(dash.table.value) for v in row.values()]
    assert len(cells) > 20 and not [c for c in cells if re.search(r"e[+-]\d\d", c)], cells


def test_honest_table_and_speedup_rows_on_a_hand_built_table() -> None:
    table = pd.DataFrame(
        {
            "model": ["a", "a", "b", "c", "c"],
            "world_size": [1, 2, 2, 2, 4],
            "base_world_size": [1, 1, 2, 2, 2],
            "speedup": [1.0, 1.8, 1.0, 1.0, 1.5],
            "efficiency": [1.0, 0.9, 1.0, 1.0, 0.75],
        }
    )
    honest = honest_table(table)
    assert honest["speedup"].isna().tolist() == [False, False, True, True, False]
    assert honest["efficiency"].isna().tolist() == [False, False, True, True, False]
    assert table["speedup"].notna().all()  # the caller's table is left as it was
    assert speedup_rows(table, ["model"])["model"].tolist() == ["a", "a", "c", "c"]


def test_controls_fill_the_cell(tmp_path: Path) -> None:
    _run(tmp_path, "quick", "q2", 2)
    dash = Dashboard(tmp_path, sweeps=["quick"])
    assert dash.layout.width == "100%"
    for control in (dash.sweeps, dash.runs, dash.group_by, dash.figure_kind, dash.focus_run):
        assert control.layout.width == "100%", control.description
    columns, group_by = dash.children[1].children
    assert [c.layout.flex for c in columns.children] == ["3 1 0%", "2 1 0%"]
    assert group_by is dash.group_by  # a row of its own: its label names many columns
