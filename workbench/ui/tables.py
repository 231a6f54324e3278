"""Tables as HTML, the same in the report and the dashboard: the scaling table's chosen columns
and a generic renderer for any other frame. No torch."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

#: The scaling table's columns shown after the group columns, in order (only those present).
SCALING_COLUMNS = (
    "world_size",
    "nodes",
    "runs",
    "samples_per_s",
    "samples_per_s_std",
    "samples_per_s_per_device",
    "speedup",
    "efficiency",
    "step_s",
    "epoch_s",
    "final_loss",
    "final_metric",
    "time_to_quality_s",
)


def frame_html(frame: pd.DataFrame) -> str:
    """``frame`` as an HTML table (class ``table``, floats to 4 significant digits, empty cells
    for missing values) in a box that scrolls sideways instead of overflowing."""
    table = frame.to_html(
        index=False, border=0, classes="table", na_rep="", float_format=lambda v: f"{v:.4g}"
    )
    return f'<div class="scroll" style="overflow-x:auto">{table}</div>'


def scaling_columns(table: pd.DataFrame, group_by: Sequence[str]) -> list[str]:
    """The columns to show of a scaling table: its group columns, then :data:`SCALING_COLUMNS`."""
    keys = [c for c in group_by if c in table.columns]
    return keys + [c for c in SCALING_COLUMNS if c in table.columns and c not in keys]


def scaling_table_html(table: pd.DataFrame, group_by: Sequence[str]) -> str:
    """The scaling table as HTML: ``group_by`` (the list it was computed with) and the columns of
    :data:`SCALING_COLUMNS` that it has, one row per scaling point."""
    return frame_html(table[scaling_columns(table, group_by)])
