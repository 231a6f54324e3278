"""Scaling figures against devices, one line per config group: throughput per device, speedup,
time per epoch, quality, the accuracy/speed trade-off and the scaling model's prediction.

Pass the ``group_by`` list the table was computed with
(:func:`workbench.analysis.resolve_group_by`); ``None`` falls back to the table's default
grouping.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.measured import units
from workbench.analysis.measured.windows import check_columns
from workbench.ui.plots.figure import Figure, subplots
from workbench.ui.plots.style import (
    LAYOUT,
    devices_axis,
    error_bars,
    group_line,
    groups,
    link_markers,
    metric_title,
    note_shortened,
    short_name,
    subtitle,
    where_text,
    wrap,
)


def _line_per_group(
    table: pd.DataFrame,
    y: str,
    y_title: str,
    hover: str,
    title: str,
    group_by: Sequence[str] | None,
) -> Figure:
    check_columns(table, ["world_size", y], "table")
    fig = Figure()
    for label, color, rows in groups(table, group_by):
        line = group_line(rows, y, label, color, hover)
        if y == "samples_per_s_per_device":
            _flops_hover(line, rows)
        fig.add_trace(line)
    fig.update_layout(title={"text": title}, yaxis={"title": {"text": y_title}}, **LAYOUT)
    devices_axis(fig, table)
    return note_shortened(fig)


def _flops_hover(line: dict[str, Any], rows: pd.DataFrame) -> None:
    """Achieved TFLOP/s per device, MFU and the peak it divides by (with its datasheet) in the
    hover, where the runs' FLOPs were counted."""
    if "tflops_per_device" not in rows.columns or not rows["tflops_per_device"].notna().any():
        return
    note = rows["mfu_note"] if "mfu_note" in rows.columns else pd.Series("", index=rows.index)
    mfu = rows["mfu"] if "mfu" in rows.columns else pd.Series(np.nan, index=rows.index)
    line["customdata"] = np.column_stack(
        [
            rows["tflops_per_device"].to_numpy(dtype="float64"),
            (mfu * 100).to_numpy(dtype="float64"),
            note.fillna("").map(lambda n: wrap(str(n), 80)).to_numpy(),
        ]
    )
    line["hovertemplate"] = line["hovertemplate"].replace(
        "<extra>",
        "<br>%{customdata[0]:.3g} TFLOP/s per device, MFU %{customdata[1]:.1f} %"
        "<br>%{customdata[2]}<extra>",
    )


def throughput_per_device_figure(
    table: pd.DataFrame, group_by: Sequence[str] | None = None
) -> Figure:
    """Samples per second per device against devices, one line per config group."""
    return _line_per_group(
        table,
        "samples_per_s_per_device",
        "throughput per device (samples/s)",
        "%{y:,.4g} samples/s per device",
        "Throughput per device",
        group_by,
    )


def epoch_time_figure(table: pd.DataFrame, group_by: Sequence[str] | None = None) -> Figure:
    """Time per epoch (train_samples / throughput) against devices."""
    return _line_per_group(
        table, "epoch_s", "time per epoch (s)", "%{y:.4g} s per epoch", "Time per epoch", group_by
    )


def speedup_figure(table: pd.DataFrame, group_by: Sequence[str] | None = None) -> Figure:
    """Speedup against devices with the ideal (linear) line; efficiency as point labels."""
    check_columns(table, ["world_size", "speedup", "efficiency", "base_world_size"], "table")
    fig = Figure()
    for label, color, rows in groups(table, group_by):
        fig.add_trace(
            {
                "type": "scatter",
                "x": rows["world_size"],
                "y": rows["speedup"],
                "error_y": error_bars(rows, "speedup"),
                "mode": "lines+markers+text" if len(rows) > 1 else "markers+text",
                "text": [units.percent(e) for e in rows["efficiency"]],
                "textposition": "top center",
                "customdata": np.column_stack(
                    [(rows["efficiency"] * 100).to_numpy(dtype="float64"), where_text(rows)]
                ),
                "name": short_name(label),
                "line": {"color": color},
                "marker": link_markers(rows),
                "hovertemplate": f"{label}<br>%{{x}} devices (%{{customdata[1]}})<br>speedup "
                "%{y:.3g}x<br>efficiency %{customdata[0]:.1f} %<extra></extra>",
            }
        )
    for base in sorted(pd.unique(table["base_world_size"])):
        top = table.loc[table["base_world_size"] == base, "world_size"].max()
        x = np.array([base, top], dtype="float64")
        one = table["base_world_size"].nunique() == 1
        fig.add_trace(
            {
                "type": "scatter",
                "x": x,
                "y": x / base,
                "mode": "lines",
                "name": "ideal" if one else f"ideal (from {base})",
                "line": {"color": "gray", "dash": "dash"},
                "hovertemplate": "ideal<br>%{x} devices<br>speedup %{y:.3g}x<extra></extra>",
            }
        )
    title = "Speedup (labels: scaling efficiency)"
    fig.update_layout(title={"text": title}, yaxis={"title": {"text": "speedup (x)"}}, **LAYOUT)
    devices_axis(fig, table)
    return note_shortened(fig)


def quality_vs_devices_figure(table: pd.DataFrame, group_by: Sequence[str] | None = None) -> Figure:
    """Final training loss and final evaluation metric against devices (two panels)."""
    check_columns(table, ["world_size", "final_loss"], "table")
    metric = metric_title(table)
    has_metric = "final_metric" in table.columns and table["final_metric"].notna().any()
    titles = ("final training loss", f"final {metric}") if has_metric else ("final training loss",)
    fig = subplots(titles)
    panels = [("final_loss", "loss")] + ([("final_metric", metric)] if has_metric else [])
    for col_i, (col, unit) in enumerate(panels, start=1):
        for label, color, rows in groups(table, group_by):
            fig.add_trace(
                group_line(rows, col, label, color, f"{unit} %{{y:.4g}}", col_i == 1),
                row=1,
                col=col_i,
            )
        fig.update_yaxes(title={"text": unit}, row=1, col=col_i)
        devices_axis(fig, table, row=1, col=col_i)
    fig.update_layout(title={"text": "Quality against devices"}, **LAYOUT)
    return note_shortened(fig)


def tradeoff_figure(table: pd.DataFrame, group_by: Sequence[str] | None = None) -> Figure:
    """The trade-off view: final metric against devices next to speedup against devices."""
    check_columns(table, ["world_size", "final_metric", "speedup"], "table")
    metric = metric_title(table)
    fig = subplots((f"final {metric}", "speedup"))
    for label, color, rows in groups(table, group_by):
        for col_i, (col, hover) in enumerate(
            (("final_metric", f"{metric} %{{y:.4g}}"), ("speedup", "speedup %{y:.3g}x")), start=1
        ):
            fig.add_trace(group_line(rows, col, label, color, hover, col_i == 1), row=1, col=col_i)
    fig.update_yaxes(title={"text": metric}, row=1, col=1)
    fig.update_yaxes(title={"text": "speedup (x)"}, row=1, col=2)
    for col_i in (1, 2):
        devices_axis(fig, table, row=1, col=col_i)
    title = f"What more devices cost in {metric}, and buy in speed"
    fig.update_layout(title={"text": title}, **LAYOUT)
    return note_shortened(fig)


def _no_prediction_title(pvm: pd.DataFrame) -> tuple[str, str]:
    """The title, and a note when some curves have no prediction (the notes saying why)."""
    missing = pvm[pvm["predicted_speedup"].isna() & pvm["measured_speedup"].notna()]
    if "note" not in pvm.columns or missing.empty:
        return "Predicted against measured speedup", ""
    notes = "; ".join(str(n) for n in pd.unique(missing["note"].dropna()))
    if pvm["predicted_speedup"].notna().any():
        return "Predicted against measured speedup", f"Some curves not predicted: {notes}"
    return "Measured speedup, not predicted", notes


def predicted_vs_measured_figure(
    pvm: pd.DataFrame, group_by: Sequence[str] | None = None, network: str = ""
) -> Figure:
    """Measured speedup (markers) and the ring-allreduce model's prediction (dashed) per group,
    one curve whatever the node counts (a diamond: the point crossed nodes; the hover says how
    many); a curve without a prediction shows its measurements, and the title says why
    (``note``)."""
    check_columns(pvm, ["world_size", "predicted_speedup", "measured_speedup"], "table")
    fig = Figure()
    model = f"predicted ({network})" if network else "predicted"
    for label, color, rows in groups(pvm, group_by):
        measured = rows[rows["measured_speedup"].notna()]
        short = short_name(label, 28)
        fig.add_trace(
            {
                "type": "scatter",
                "x": measured["world_size"],
                "y": measured["measured_speedup"],
                "mode": "markers",
                "marker": link_markers(measured, color=color, size=10),
                "customdata": where_text(measured),
                "name": f"{short}, measured",
                "legendgroup": label,
                "hovertemplate": f"{label}<br>%{{x}} devices (%{{customdata}})<br>measured "
                "%{y:.3g}x<extra></extra>",
            }
        )
        predicted = rows[rows["predicted_speedup"].notna()]
        if predicted.empty:
            continue
        fig.add_trace(
            {
                "type": "scatter",
                "x": predicted["world_size"],
                "y": predicted["predicted_speedup"],
                "mode": "lines",
                "line": {"color": color, "dash": "dash"},
                "customdata": where_text(predicted),
                "name": f"{short}, predicted",
                "legendgroup": label,
                "hovertemplate": f"{label}<br>%{{x}} devices (%{{customdata}})<br>{model} "
                "%{y:.3g}x<extra></extra>",
            }
        )
    title, why = _no_prediction_title(pvm)
    fig.update_layout(title={"text": title}, yaxis={"title": {"text": "speedup (x)"}}, **LAYOUT)
    devices_axis(fig, pvm)
    net = f"Network: {network}." if network else ""
    return subtitle(note_shortened(fig), why, net)
