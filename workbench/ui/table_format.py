"""Tables for people: the columns that matter first, what every row shares said once in a
caption, empty columns left out, and every number in its unit (``21,005/s``, ``1.52 ms``,
``78 %``, ``0.58x``, ``0.31 GiB``), never in exponent notation. The CSV summary keeps the raw
numbers and every column; this is only how the report and the dashboard show them. No torch.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analysis.measured import units

Formatter = Callable[[float], str]

#: The columns a reader looks for first, in this order, in every table that has them.
LEAD_COLUMNS = (
    "world_size",
    "per_device_batch_size",
    "global_batch_size",
    "speedup",
    "speedup_std",
    "efficiency",
)


def number(value: float) -> str:
    """A plain number, never in exponent notation: ``4,096``, ``12.8``, ``0.00152``."""
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return str(np.format_float_positional(value, precision=3, fractional=False, trim="-"))


def _rate(value: float) -> str:
    return units.rate(value) if abs(value) >= 0.01 else f"{number(value)}/s"


def _seconds(value: float) -> str:
    if value == 0:
        return "0 s"
    if abs(value) >= 1000:
        return f"{value:,.0f} s"
    return units.seconds(value) if abs(value) >= 1e-6 else f"{number(value)} s"


def _gib(nbytes: float) -> str:
    return units.gib(nbytes) if nbytes < 100 * 2**30 else f"{nbytes / 2**30:,.0f} GiB"


def _tflops(value: float) -> str:
    return f"{number(value)} TFLOP/s"


#: Column name -> how its numbers read; a column not named here goes by its name's ending
#: (:data:`SUFFIX_FORMATS`), a ``_std`` column as the column it is the spread of.
COLUMN_FORMATS: dict[str, Formatter] = {
    "speedup": units.ratio,
    "ratio": units.ratio,
    "efficiency": units.percent,
    "mfu": units.percent,
    "slow_fraction": units.percent,
    "relative_error": units.percent,
    "tflops_per_device": _tflops,
    "speedup_low": units.ratio,
    "speedup_high": units.ratio,
    "samples_per_s_half_width": lambda v: f"+-{units.percent(v)}",
    "device_s": lambda v: f"{v:,.0f} device-s",
}
#: Name endings -> formatter, tried in order (``samples_per_s`` before ``_s``).
SUFFIX_FORMATS: tuple[tuple[str, Formatter], ...] = (
    ("samples_per_s", _rate),
    ("samples_per_s_per_device", _rate),
    ("_speedup", units.ratio),
    ("_share", units.percent),
    ("_bytes", _gib),
    ("_s", _seconds),
)
#: How a value that every row shares reads in the caption (``{}``: the formatted value); a
#: column not named here reads ``name value``, or the value alone when it is a word that says
#: what it is (:data:`SELF_NAMED`).
CAPTION_FORMATS = {
    "learning_rate": "lr {}",
    "train_samples": "{} samples",
    "nodes": "{} node(s)",
    "runs": "{} run(s) per point",
    "scaling": "{} scaling",
    "world_size": "{} rank(s)",
    "per_device_batch_size": "batch {} per device",
    "global_batch_size": "global batch {}",
    "fixed_batch_size": "fixed batch {}",
    "base_world_size": "base {} rank(s)",
}
SELF_NAMED = ("model", "precision", "optimizer", "strategy", "dataset", "metric_name", "host")


def column_format(column: str) -> Formatter:
    """How the numbers of ``column`` read: :data:`COLUMN_FORMATS`, then
    :data:`SUFFIX_FORMATS`, else :func:`number`."""
    name = column.removesuffix("_std")
    if name in COLUMN_FORMATS:
        return COLUMN_FORMATS[name]
    return next((f for end, f in SUFFIX_FORMATS if name.endswith(end)), number)


def cell_text(column: str, value: object) -> str:
    """One cell as people read it (empty for a missing value)."""
    if value is None or value is pd.NA or value is pd.NaT:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, float, np.integer, np.floating)):
        number_ = float(value)
        return column_format(column)(number_) if math.isfinite(number_) else ""
    return str(value)


def _caption_item(column: str, text: str) -> str:
    if column in CAPTION_FORMATS:
        plural = "" if text == "1" else "s"
        return CAPTION_FORMATS[column].format(text).replace("(s)", plural)
    if column in SELF_NAMED:
        return text
    name = column.replace("_", " ")
    return f"{name}: {text}" if " " in text else f"{name} {text}"


@dataclass
class PeopleTable:
    """A table as people read it: ``columns`` shown, ``rows`` of cell texts and ``fixed``, the
    caption items for the columns every row shares."""

    columns: list[str]
    rows: list[list[str]]
    fixed: list[str]


def people_table(frame: pd.DataFrame, lead: Sequence[str] = LEAD_COLUMNS) -> PeopleTable:
    """``frame`` for people: empty columns dropped; from two rows on, the columns with one value
    in every row said once in the caption (in the frame's order); the others with
    :data:`LEAD_COLUMNS` first."""
    cells = {str(c): [cell_text(str(c), v) for v in frame[c].tolist()] for c in frame.columns}
    columns, fixed = [], []
    for column, texts in cells.items():
        if all(t == "" for t in texts):
            continue  # nothing to read: no column
        if len(texts) >= 2 and len(set(texts)) == 1:
            fixed.append(_caption_item(column, texts[0]))
        else:
            columns.append(column)
    columns = [c for c in lead if c in columns] + [c for c in columns if c not in lead]
    rows = [[cells[c][i] for c in columns] for i in range(len(frame))]
    return PeopleTable(columns, rows, fixed)


def table_html(frame: pd.DataFrame, lead: Sequence[str] = LEAD_COLUMNS) -> str:
    """:func:`people_table` of ``frame`` as an HTML table (class ``table``, the shared values in
    a caption line ``fixed: ...``) in a box that scrolls sideways instead of overflowing."""
    table = people_table(frame, lead)
    esc = html.escape
    caption = (
        f'<caption class="fixed">fixed: {esc(", ".join(table.fixed))}</caption>'
        if table.fixed
        else ""
    )
    head = "".join(f"<th>{esc(c)}</th>" for c in table.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{esc(t)}</td>" for t in row) + "</tr>" for row in table.rows
    )
    return (
        '<div class="scroll" style="overflow-x:auto"><table class="table">'
        f"{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )
