"""What if: the scaling model's prediction for the selected runs at other world sizes on another
network, as a control under the dashboard (the same figures and words as ``workbench predict``).

The widget only composes :func:`workbench.analysis.model.predict.predict` (a study with FSDP
runs: :func:`workbench.analysis.model.strategies.compare_strategies`, its own strategies
compared, as ``workbench predict`` compares them without ``--strategy``); the lines it shows come
from :func:`prediction_lines` (:func:`~workbench.analysis.model.strategy_words.strategy_lines`),
which the command prints too.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable

import ipywidgets as widgets
import pandas as pd

from workbench.analysis.measured.units import percent, rate, ratio, seconds
from workbench.analysis.model.predict import (
    PredictionError,
    parse_rate,
    parse_seconds,
    predict,
    target_network,
)
from workbench.analysis.model.strategies import compare_strategies
from workbench.analysis.model.strategy_words import own_strategies, strategy_lines
from workbench.store.load import parameter_layouts

#: The network control's choices: label -> what the number means.
NETWORK_KINDS = (("bus bandwidth (nccl-tests)", "busbw"), ("link rate", "link"))
#: Shown until the runs measured a network of their own.
DEFAULT_BUSBW = "9.5GB/s"
BOX = "border-left: 4px solid {}; background: {}; padding: 0.2rem 1rem; margin: 0.4rem 0"


def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


def prediction_lines(table: pd.DataFrame) -> list[str]:
    """One line per predicted point of :func:`~workbench.analysis.model.predict.predict`'s table:
    throughput with its interval, the step as compute plus exposed communication, speedup over
    the curve's base and efficiency; then the model's notes."""
    keys = list(table.columns[: list(table.columns).index("world_size")])
    lines = []
    for _, row in table.iterrows():
        label = ", ".join(f"{k}={row[k]}" for k in keys)
        interval = ""
        if math.isfinite(row["low"]):
            interval = f" ({rate(row['low'])} to {rate(row['high'])})"
        lines.append(
            f"{label + ': ' if label else ''}{_ranks(int(row['world_size']))}: "
            f"{rate(row['samples_per_s'])}{interval}, step {seconds(row['step_s'])} = compute "
            f"{seconds(row['compute_s'])} + exposed communication "
            f"{seconds(row['exposed_comm_s'])}; {ratio(row['speedup'])} of "
            f"{_ranks(int(row['base_world_size']))}, {percent(row['efficiency'])} of ideal"
            + (f"; bound by the {row['bound_by']} links" if _given(row.get("bound_by")) else "")
        )
    notes = dict.fromkeys(str(n) for n in table["note"])
    lines.append("model: " + "; ".join(notes))
    return lines


def _given(value: object) -> bool:
    return isinstance(value, str) and bool(value)


def parse_world_sizes(text: str) -> list[int]:
    """``"2, 8,64"`` -> ``[2, 8, 64]``; a clear error for anything else."""
    try:
        sizes = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ValueError(f"world sizes: give whole numbers of 1 or more, e.g. 2,8,64; got {text!r}")
    return sizes


def measured_busbw(runs: pd.DataFrame) -> str | None:
    """The runs' own allreduce bus bandwidth (the median over their network benchmarks; those
    of the runs across nodes where some crossed nodes), as the control's starting value: the
    first question is more ranks, or more nodes, on the same network."""
    if "network_busbw_bytes_per_s" not in runs.columns:
        return None
    values = pd.to_numeric(runs["network_busbw_bytes_per_s"], errors="coerce")
    if "nodes" in runs.columns:
        across = values[pd.to_numeric(runs["nodes"], errors="coerce") > 1].dropna()
        values = across if len(across) else values
    values = values.dropna()
    return bytes_rate(float(values.median())) if len(values) else None


def bytes_rate(value: float) -> str:
    """Bytes per second as the rate control takes them: ``9.5GB/s``, ``240MB/s``, ``12kB/s``."""
    for scale, unit in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


class WhatIf(widgets.VBox):
    """World sizes, a network (bus bandwidth or link rate) and a latency; **predict** shows the
    model's throughput, step and efficiency at each size for the runs ``data()`` returns
    (``runs``, ``steps``), or what the runs lack to support a prediction."""

    def __init__(self, data: Callable[[], tuple[pd.DataFrame, pd.DataFrame]]) -> None:
        self.data = data
        wide = {"style": {"description_width": "90px"}}
        self.world_sizes = widgets.Text(value="2,8,64", description="world sizes", **wide)
        self.network_kind = widgets.Dropdown(
            options=list(NETWORK_KINDS), value="busbw", description="network", **wide
        )
        self.rate = widgets.Text(value=DEFAULT_BUSBW, description="rate", **wide)
        self.latency = widgets.Text(value="0us", description="latency", **wide)
        self.button = widgets.Button(description="predict", icon="calculator")
        self.output = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.button.on_click(lambda _: self.predict())
        title = widgets.HTML("<b>What if</b>: more ranks, another network (the scaling model)")
        inputs = [self.world_sizes, self.network_kind, self.rate, self.latency, self.button]
        row = widgets.HBox(inputs, layout=widgets.Layout(flex_flow="row wrap"))
        super().__init__([title, row, self.output], layout=widgets.Layout(width="100%"))

    def follow(self, runs: pd.DataFrame) -> None:
        """Start the rate at the runs' own measured bus bandwidth, where they measured one."""
        own = measured_busbw(runs)
        if own and self.network_kind.value == "busbw":
            self.rate.value = own

    def predict(self) -> str:
        """Predict with the controls' values; the result (or the reason there is none) is shown
        and returned as HTML."""
        try:
            sizes = parse_world_sizes(self.world_sizes.value)
            given = parse_rate(self.rate.value, bits=self.network_kind.value == "link")
            network = target_network(
                busbw_bytes_per_s=given if self.network_kind.value == "busbw" else None,
                link_bits_per_s=given * 8 if self.network_kind.value == "link" else None,
                latency_s=parse_seconds(self.latency.value),
            )
            runs, steps = self.data()
            strategies = own_strategies(runs, None)
            if strategies:
                layouts = parameter_layouts(runs["path"]) if "path" in runs.columns else {}
                table = compare_strategies(runs, steps, layouts, sizes, strategies, network)
            else:
                table = predict(runs, steps, sizes, network)
        except (PredictionError, ValueError) as exc:
            self.output.value = _box("#c60", "#fff4e5", "No prediction", [str(exc)])
        else:
            if strategies:
                text = html.escape("\n".join(strategy_lines(table, sizes, None, network)))
                self.output.value = _box("#3a6ea5", "#f3f7fc", "Predicted", [], pre=text)
            else:
                lines = [f"network: {network.description}", *prediction_lines(table)]
                self.output.value = _box("#3a6ea5", "#f3f7fc", "Predicted", lines)
        return self.output.value


def _box(edge: str, fill: str, title: str, lines: list[str], pre: str = "") -> str:
    """A titled box of ``lines`` as a list, or of ``pre``: text already escaped, kept as it is
    laid out (the strategies' table)."""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    body = f"<pre>{pre}</pre>" if pre else f"<ul>{items}</ul>"
    return f'<div style="{BOX.format(edge, fill)}"><b>{title}</b>{body}</div>'
