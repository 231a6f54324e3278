"""What every figure shares: layout, colours, group labels and lines, the devices axis, run checks
and the empty figure that says why there is nothing to plot. No torch."""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.io as pio
from plotly.colors import qualitative

from workbench.analysis.measured.windows import check_columns
from workbench.analysis.throughput.groups import FAMILY_COLUMNS, curve_words, default_group_by
from workbench.ui.plots.figure import Figure

GIB = float(1 << 30)
MS = 1e3  # seconds to milliseconds
COLORS = qualitative.Plotly
#: Longest legend name: longer ones squeeze the plot; detail goes to the hover and subtitle.
LEGEND_CHARS = 39
#: The trace types the workbench draws: the template keeps their defaults only.
TRACE_TYPES = ("scatter", "bar", "heatmap")


def _white_template() -> dict[str, Any]:
    """plotly's ``plotly_white``, less the defaults of traces and axes the workbench never draws
    (polar, ternary, 3-D, maps): the same look. A figure's JSON carries its template (7.1 KB
    whole, 2.4 KB trimmed), and a figure validated into plotly's objects validates and copies
    it (23 ms whole, 6 ms trimmed)."""
    white = pio.templates["plotly_white"].to_plotly_json()
    return {
        "data": {k: v for k, v in white["data"].items() if k in TRACE_TYPES},
        "layout": {
            k: v
            for k, v in white["layout"].items()
            if k not in ("polar", "ternary", "scene", "geo")
        },
    }


TEMPLATE = _white_template()
LAYOUT: dict[str, Any] = {
    "template": TEMPLATE,
    "hovermode": "closest",
    # below the plot, horizontal: long names never take the plot's width
    "legend": {
        "orientation": "h",
        "yanchor": "top",
        "y": -0.2,
        "xanchor": "left",
        "x": 0,
        "title": {"text": ""},
    },
    "showlegend": True,  # a single group still names its config
}
#: Characters per subtitle line (plotly does not wrap text).
SUBTITLE_CHARS = 120
#: Height (px) of a figure with a one-line subtitle: plot, axes and a legend below.
PLOT_HEIGHT = 500


def group_keys(table: pd.DataFrame, group_by: Sequence[str] | str | None) -> list[str]:
    """The group columns of ``table``: ``group_by`` checked, or (``None``) the default grouping
    of the table's own config columns. Pass the list the table was computed with."""
    if group_by is None:
        group_by = default_group_by(table)
    group_by = [group_by] if isinstance(group_by, str) else list(group_by)
    check_columns(table, group_by, "table group")
    return group_by


def _family_part(rows: pd.DataFrame) -> pd.Series:
    """``weak, per-device batch 32`` / ``strong, global batch 256`` per row."""
    scaling = rows["scaling"].map(str)
    if "fixed_batch_size" not in rows.columns:
        return scaling
    which = scaling.map({"weak": "per-device", "strong": "global"}).fillna("fixed")
    fixed = rows["fixed_batch_size"].map(lambda v: f"{v:g}" if isinstance(v, float) else str(v))
    return scaling + ", " + which + " batch " + fixed


def group_labels(table: pd.DataFrame, group_by: Sequence[str] | None = None) -> pd.Series:
    """A legend label per row: ``col=value`` for the group columns that differ between groups (the
    family columns as ``weak, per-device batch 32``, the strategy by name: ``FSDP``); with one
    group, its first two columns."""
    cols = group_keys(table, group_by)
    varying = [c for c in cols if table[c].nunique(dropna=False) > 1]
    if not varying:
        label = ", ".join(curve_words(c, table[c].iloc[0]) for c in cols[:2]) if len(table) else ""
        return pd.Series(label or "all runs", index=table.index)
    family = [c for c in varying if c in FAMILY_COLUMNS]
    # map (each value as text), not astype(str): pandas 3 keeps a missing value missing through
    # astype(str), and one missing option (model_options.x of another model) would blank the
    # whole label
    parts = [
        table[c].map(functools.partial(curve_words, c)) for c in varying if c not in FAMILY_COLUMNS
    ]
    if family:
        parts.append(_family_part(table) if "scaling" in table.columns else table[family[0]])
    out = parts[0]
    for p in parts[1:]:
        out = out + ", " + p
    return out


def groups(
    table: pd.DataFrame, group_by: Sequence[str] | None
) -> Iterator[tuple[str, str, pd.DataFrame]]:
    """(label, color, rows sorted by world size) per group, in table order."""
    labels = group_labels(table, group_by)
    for i, label in enumerate(pd.unique(labels)):
        rows = table[labels == label].sort_values("world_size", kind="stable")
        yield label, COLORS[i % len(COLORS)], rows


#: A point's marker by the link class its allreduce crossed (the scaling table's
#: ``link_class``): across nodes stands out from one node.
LINK_SYMBOLS = {"none": "circle", "intra-node": "circle", "inter-node": "diamond"}


def where_text(rows: pd.DataFrame) -> list[str]:
    """Per point, where it ran: ``2 nodes, inter-node`` (``1 node, intra-node``; one rank:
    ``1 node``); empty without a ``nodes`` column."""
    if "nodes" not in rows.columns:
        return [""] * len(rows)
    links = rows["link_class"] if "link_class" in rows.columns else pd.Series("", rows.index)
    out = []
    for nodes, link in zip(rows["nodes"], links, strict=True):
        n = pd.to_numeric(nodes, errors="coerce")
        text = f"{int(n)} node{'s' if n != 1 else ''}" if np.isfinite(n) else "nodes unknown"
        out.append(text + (f", {link}" if isinstance(link, str) and link != "none" else ""))
    return out


def link_markers(rows: pd.DataFrame, **marker: object) -> dict[str, object]:
    """``marker`` with a symbol per point by its link class (:data:`LINK_SYMBOLS`), where the
    rows have one."""
    if "link_class" in rows.columns:
        marker["symbol"] = [LINK_SYMBOLS.get(str(v), "circle") for v in rows["link_class"]]
    return marker


def error_bars(rows: pd.DataFrame, col: str) -> dict[str, object] | None:
    """Error bars from ``<col>_std`` where it is finite and the point has repeats (``runs`` >= 2
    where the table says): none at all when no point has one, and NaN (no bar, never a bar of
    0) for a point without one (a single run, or the base)."""
    std = f"{col}_std"
    if std not in rows.columns:
        return None
    values = pd.to_numeric(rows[std], errors="coerce").to_numpy(dtype="float64")
    finite = np.isfinite(values)
    if "runs" in rows.columns:
        finite &= pd.to_numeric(rows["runs"], errors="coerce").fillna(0).to_numpy() >= 2
    if not finite.any():
        return None
    return {"type": "data", "array": np.where(finite, values, np.nan), "visible": True}


def short_name(label: str, limit: int = LEGEND_CHARS) -> str:
    """``label`` for a legend: as is when short enough, else cut to ``limit`` characters with an
    ellipsis (the hover keeps the full label)."""
    return label if len(label) <= limit else label[: limit - 1].rstrip(" ,=") + "…"


def wrap(text: str, width: int = SUBTITLE_CHARS) -> str:
    """``text`` in lines of at most ``width`` characters, joined by ``<br>``."""
    # never at a hyphen: "warm-up" split over two lines reads as "warm- up"
    return "<br>".join(textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False))


def subtitle(fig: Figure, *texts: str) -> Figure:
    """Add ``texts`` (notes, a definition) to ``fig``'s subtitle, each wrapped, after what it
    already says; the top margin and the height grow with the lines, so the plot keeps its
    height."""
    old = fig.value("title", "subtitle", "text")
    parts = [old] if old else []
    parts += [wrap(t) for t in texts if t]
    if not parts:
        return fig
    text = "<br>".join(parts)
    lines = text.count("<br>") + 1
    above = 24 if fig.value("annotations") else 0  # subplot titles sit between it and the plot
    fig.update_layout(
        {
            # from the top down: the title, then its subtitle, then the plot
            "title": {
                "subtitle": {"text": text, "font": {"size": 11}},
                "y": 1,
                "yref": "container",
                "yanchor": "top",
                "pad": {"t": 12},
            },
            "margin": {"t": 50 + 14 * lines + above},
            # the plot keeps its height under a long subtitle
            "height": PLOT_HEIGHT + 14 * lines + above,
        }
    )
    return fig


def split_definition(fig: Figure) -> tuple[Figure, str]:
    """``fig`` without its definition (``layout.meta["definition"]``, which :func:`subtitle`
    wrapped last into the subtitle) and that definition, for a page that folds it behind a
    toggle; the margin and height shrink by its lines. ``(fig, "")`` when it has none."""
    meta = fig.value("meta")
    definition = meta.get("definition", "") if isinstance(meta, dict) else ""
    text = fig.value("title", "subtitle", "text") or ""
    part = wrap(definition)
    if not definition or not text.endswith(part):
        return fig, ""
    rest = text[: -len(part)].removesuffix("<br>")
    lines = part.count("<br>") + 1
    height = fig.value("height")
    fig.update_layout(
        {
            "title": {"subtitle": {"text": rest or None}},
            "margin": {"t": max((fig.value("margin", "t") or 0) - 14 * lines, 50)},
            "height": height - 14 * lines if height else None,
        }
    )
    return fig, definition


def note_shortened(fig: Figure) -> Figure:
    """Say in the subtitle when a legend name was shortened (the hover has it in full)."""
    if any("…" in str(t.get("name") or "") for t in fig.spec["data"]):
        subtitle(fig, "Legend names shortened: the hover names each group in full.")
    return fig


def devices_axis(fig: Figure, table: pd.DataFrame, **where: int) -> None:
    """The x axis of a scaling figure: devices, a tick per measured world size."""
    ticks = sorted(pd.unique(table["world_size"]))
    fig.update_xaxes(title={"text": "devices (world size)"}, tickvals=ticks, **where)


def group_line(
    rows: pd.DataFrame, y: str, label: str, color: str, hover: str, showlegend: bool = True
) -> dict[str, Any]:
    """One configuration group's line against devices (a scatter trace), with its spread as
    error bars (a diamond: the point crossed nodes)."""
    return {
        "type": "scatter",
        "x": rows["world_size"],
        "y": rows[y],
        "error_y": error_bars(rows, y),
        "mode": "lines+markers" if len(rows) > 1 else "markers",
        "name": short_name(label),
        "legendgroup": label,
        "showlegend": showlegend,
        "line": {"color": color},
        "marker": link_markers(rows),
        "hovertemplate": f"{label}<br>%{{x}} devices<br>{hover}<extra></extra>",
    }


def check_run(frame: pd.DataFrame, run_id: str) -> None:
    """Raise ValueError listing the valid run ids when ``run_id`` is not in ``frame``."""
    runs = pd.unique(frame["run_id"])
    if run_id not in set(runs):
        raise ValueError(f"unknown run_id {run_id!r}; valid names: {', '.join(map(str, runs))}")


def one_run(frame: pd.DataFrame, run_id: str | None) -> str:
    """``run_id`` checked, or the frame's only run; ValueError when there are several."""
    runs = pd.unique(frame["run_id"])
    if run_id is None:
        if len(runs) != 1:
            raise ValueError(f"several runs: pass run_id, one of {', '.join(map(str, runs))}")
        return str(runs[0])
    check_run(frame, run_id)
    return run_id


def metric_title(table: pd.DataFrame) -> str:
    """The evaluation metric's name in ``table`` (``metric_name``), else ``"metric"``."""
    if "metric_name" in table.columns and table["metric_name"].notna().any():
        return str(table["metric_name"].dropna().iloc[0])
    return "metric"


def message_figure(text: str) -> Figure:
    """An empty figure that says why there is nothing to plot."""
    layout = {"template": TEMPLATE, "title": {"text": text}}
    return Figure(layout={**layout, "xaxis": {"visible": False}, "yaxis": {"visible": False}})
