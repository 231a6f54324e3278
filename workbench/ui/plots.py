"""Tables and frames to plotly figures: one function per figure, each returning a ``go.Figure``.

No function shows or writes a figure: the notebook, the widgets and the report decide. Inputs are
the tables of :mod:`workbench.analysis` and :mod:`workbench.scaling_model` (or the raw trace frames
for curves and heatmaps). Units are in axis titles and hover text. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from workbench.analysis.tables import (
    CONFIG_COLUMNS,
    EVAL_PARTS,
    check_columns,
    comm_filled,
    downsample_for_display,
    measured_steps,
)

GIB = float(1 << 30)
PHASE_NAMES = {
    "data_s": "data",
    "forward_s": "forward",
    "backward_s": "backward",
    "optimizer_s": "optimizer",
    "other_s": "other",
}
_COLORS = qualitative.Plotly
_LAYOUT = {
    "template": "plotly_white",
    "hovermode": "closest",
    "legend_title_text": "",
    "showlegend": True,  # a single group still names its config
}


def _group_by(table: pd.DataFrame, group_by: Sequence[str] | None) -> list[str]:
    if group_by is None:
        group_by = table.attrs.get("group_by")
    if group_by is None:
        group_by = [c for c in CONFIG_COLUMNS if c in table.columns]
    group_by = [group_by] if isinstance(group_by, str) else list(group_by)
    check_columns(table, group_by, "table group")
    return group_by


def group_labels(table: pd.DataFrame, group_by: Sequence[str] | None = None) -> pd.Series:
    """A legend label per row: ``col=value`` for the group columns that differ between groups."""
    cols = _group_by(table, group_by)
    varying = [c for c in cols if table[c].nunique(dropna=False) > 1]
    if not varying:
        label = ", ".join(f"{c}={table[c].iloc[0]}" for c in cols[:2]) if len(table) else ""
        return pd.Series(label or "all runs", index=table.index)
    parts = [c + "=" + table[c].astype(str) for c in varying]
    out = parts[0]
    for p in parts[1:]:
        out = out + ", " + p
    return out


def _groups(table: pd.DataFrame, group_by: Sequence[str] | None):  # type: ignore[no-untyped-def]
    """(label, color, rows sorted by world size) per group, in table order."""
    labels = group_labels(table, group_by)
    for i, label in enumerate(pd.unique(labels)):
        rows = table[labels == label].sort_values("world_size", kind="stable")
        yield label, _COLORS[i % len(_COLORS)], rows


def _std(rows: pd.DataFrame, col: str) -> dict[str, object] | None:
    std = f"{col}_std"
    if std not in rows.columns or rows[std].isna().all():
        return None
    return {"type": "data", "array": rows[std].fillna(0).to_numpy(), "visible": True}


def _devices_axis(fig: go.Figure, table: pd.DataFrame, **where: int) -> None:
    ticks = sorted(pd.unique(table["world_size"]))
    fig.update_xaxes(title_text="devices (world size)", tickvals=ticks, **where)


def _group_line(
    rows: pd.DataFrame, y: str, label: str, color: str, hover: str, showlegend: bool = True
) -> go.Scatter:
    """One configuration group's line against devices, with its spread as error bars."""
    return go.Scatter(
        x=rows["world_size"],
        y=rows[y],
        error_y=_std(rows, y),
        mode="lines+markers",
        name=label,
        legendgroup=label,
        showlegend=showlegend,
        line={"color": color},
        hovertemplate=f"{label}<br>%{{x}} devices<br>{hover}<extra></extra>",
    )


def _line_per_group(
    table: pd.DataFrame,
    y: str,
    y_title: str,
    hover: str,
    title: str,
    group_by: Sequence[str] | None,
) -> go.Figure:
    check_columns(table, ["world_size", y], "table")
    fig = go.Figure()
    for label, color, rows in _groups(table, group_by):
        fig.add_trace(_group_line(rows, y, label, color, hover))
    fig.update_layout(title=title, yaxis_title=y_title, **_LAYOUT)
    _devices_axis(fig, table)
    return fig


def throughput_per_device_figure(
    table: pd.DataFrame, group_by: Sequence[str] | None = None
) -> go.Figure:
    """Samples per second per device against devices, one line per config group."""
    return _line_per_group(
        table,
        "samples_per_s_per_device",
        "throughput per device (samples/s)",
        "%{y:.4g} samples/s per device",
        "Throughput per device",
        group_by,
    )


def epoch_time_figure(table: pd.DataFrame, group_by: Sequence[str] | None = None) -> go.Figure:
    """Time per epoch (train_samples / throughput) against devices."""
    return _line_per_group(
        table, "epoch_s", "time per epoch (s)", "%{y:.4g} s per epoch", "Time per epoch", group_by
    )


def speedup_figure(table: pd.DataFrame, group_by: Sequence[str] | None = None) -> go.Figure:
    """Speedup against devices with the ideal (linear) line; efficiency as point labels."""
    check_columns(table, ["world_size", "speedup", "efficiency", "base_world_size"], "table")
    fig = go.Figure()
    for label, color, rows in _groups(table, group_by):
        fig.add_trace(
            go.Scatter(
                x=rows["world_size"],
                y=rows["speedup"],
                error_y=_std(rows, "speedup"),
                mode="lines+markers+text",
                text=[f"{e:.0%}" for e in rows["efficiency"]],
                textposition="top center",
                customdata=rows["efficiency"],
                name=label,
                line={"color": color},
                hovertemplate=f"{label}<br>%{{x}} devices<br>speedup %{{y:.3g}}x<br>"
                "efficiency %{customdata:.1%}<extra></extra>",
            )
        )
    for base in sorted(pd.unique(table["base_world_size"])):
        top = table.loc[table["base_world_size"] == base, "world_size"].max()
        x = np.array([base, top], dtype="float64")
        fig.add_trace(
            go.Scatter(
                x=x,
                y=x / base,
                mode="lines",
                name="ideal" if table["base_world_size"].nunique() == 1 else f"ideal (from {base})",
                line={"color": "gray", "dash": "dash"},
                hovertemplate="ideal<br>%{x} devices<br>speedup %{y:.3g}x<extra></extra>",
            )
        )
    fig.update_layout(title="Speedup (labels: scaling efficiency)", yaxis_title="speedup (x)")
    fig.update_layout(**_LAYOUT)
    _devices_axis(fig, table)
    return fig


def phase_breakdown_figure(
    phases: pd.DataFrame, run_id: str | None = None, by: str = "rank"
) -> go.Figure:
    """Stacked mean phase times (s per step): per rank of one run, or per run (mean of ranks).

    ``by="rank"``: bars per rank (x = rank for one run, ``run/rank`` labels for several);
    ``by="run"``: one bar per run, averaged over its ranks.
    """
    check_columns(phases, ["run_id", "rank", *PHASE_NAMES], "phases")
    if by not in ("rank", "run"):
        raise ValueError(f"unknown by={by!r}; valid names: rank, run")
    if run_id is not None:
        _check_run(phases, run_id)
        phases = phases[phases["run_id"] == run_id]
    cols = [*PHASE_NAMES, "comm_s"] if "comm_s" in phases.columns else list(PHASE_NAMES)
    if by == "run":
        frame = phases.groupby("run_id", sort=False)[cols].mean().reset_index()
        x = frame["run_id"].astype(str).tolist()
        x_title = "run"
    else:
        frame = phases
        one_run = phases["run_id"].nunique() == 1
        x = (
            frame["rank"].tolist()
            if one_run
            else (frame["run_id"] + "/r" + frame["rank"].astype(str)).tolist()
        )
        x_title = "rank" if one_run else "run / rank"
    fig = go.Figure()
    for col, name in PHASE_NAMES.items():
        extra = ""
        custom = None
        if col == "backward_s" and "comm_s" in frame.columns:
            custom = frame["comm_s"].to_numpy()
            extra = "<br>allreduce inside backward: %{customdata:.4g} s"
        fig.add_trace(
            go.Bar(
                x=x,
                y=frame[col],
                name=name,
                customdata=custom,
                hovertemplate=f"%{{x}}<br>{name}: %{{y:.4g}} s per step{extra}<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        title="Where a step's time goes",
        xaxis_title=x_title,
        yaxis_title="mean time per step (s)",
        **_LAYOUT,
    )
    if by == "rank" and x and not isinstance(x[0], str):
        fig.update_xaxes(type="category")
    return fig


def _check_run(frame: pd.DataFrame, run_id: str) -> None:
    runs = pd.unique(frame["run_id"])
    if run_id not in set(runs):
        raise ValueError(f"unknown run_id {run_id!r}; valid names: {', '.join(map(str, runs))}")


def _one_run(frame: pd.DataFrame, run_id: str | None) -> str:
    runs = pd.unique(frame["run_id"])
    if run_id is None:
        if len(runs) != 1:
            raise ValueError(f"several runs: pass run_id, one of {', '.join(map(str, runs))}")
        return str(runs[0])
    _check_run(frame, run_id)
    return run_id


def step_time_heatmap(
    steps: pd.DataFrame,
    run_id: str | None = None,
    value: str = "step_s",
    max_steps: int = 400,
) -> go.Figure:
    """Rank x step heatmap of one run's measured step time (or ``compute_s = step_s - comm_s``).

    Steps are averaged into at most ``max_steps`` columns for display (bins of consecutive steps,
    labelled by their first step). In DDP ``step_s`` is nearly equal across ranks; a straggler
    stands out in ``compute_s``.
    """
    run_id = _one_run(steps, run_id)
    if value != "compute_s":
        check_columns(steps, [value], "steps")
    cols = ["step_s", "comm_s"] if value == "compute_s" else [value]
    m = measured_steps(
        steps.loc[steps["run_id"] == run_id, ["run_id", "rank", "step", "warmup", *cols]]
    )
    v = m["step_s"] - comm_filled(m).fillna(0) if value == "compute_s" else m[value]
    frame = pd.DataFrame({"rank": m["rank"], "step": m["step"], "v": v.astype("float64")})
    frame = frame.groupby(["rank", "step"], as_index=False)["v"].mean()
    ranks = frame["rank"].nunique()
    frame = downsample_for_display(frame, max_steps * max(ranks, 1), x="step", by=["rank"])
    grid = frame.pivot(index="rank", columns="step", values="v").sort_index()
    label = "compute time (step − comm)" if value == "compute_s" else value.removesuffix("_s")
    fig = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(),
            x=grid.columns.to_numpy(),
            y=grid.index.to_numpy(),
            colorscale="Viridis",
            colorbar={"title": {"text": "s"}},
            name=label,
            hovertemplate=f"rank %{{y}}<br>step %{{x}}<br>{label}: %{{z:.4g}} s<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"{label} per rank and step, run {run_id}",
        xaxis_title="step" + (" (bin start)" if grid.shape[1] < m["step"].nunique() else ""),
        yaxis_title="rank",
        **_LAYOUT,
    )
    return fig


def memory_figure(memory: pd.DataFrame, run_id: str | None = None) -> go.Figure:
    """Peak process RSS and CUDA peak per rank (GiB), grouped bars."""
    check_columns(memory, ["run_id", "rank", "rss_peak_bytes"], "memory")
    if run_id is not None:
        _check_run(memory, run_id)
        memory = memory[memory["run_id"] == run_id]
    one_run = memory["run_id"].nunique() == 1
    x = (
        memory["rank"].astype(str)
        if one_run
        else memory["run_id"] + "/r" + memory["rank"].astype(str)
    )
    fig = go.Figure()
    series = {
        "process RSS peak": "rss_peak_bytes",
        "CUDA peak": "cuda_peak_bytes",
        "GPU memory (NVML) peak": "device_peak_bytes",
    }
    for name, col in series.items():
        if col in memory.columns and memory[col].notna().any():
            fig.add_trace(
                go.Bar(
                    x=x.tolist(),
                    y=memory[col] / GIB,
                    name=name,
                    hovertemplate=f"%{{x}}<br>{name}: %{{y:.3f}} GiB<extra></extra>",
                )
            )
    fig.update_layout(
        barmode="group",
        title="Peak memory per rank" + (f", run {memory['run_id'].iloc[0]}" if one_run else ""),
        xaxis_title="rank" if one_run else "run / rank",
        yaxis_title="peak memory (GiB)",
        **_LAYOUT,
    )
    fig.update_xaxes(type="category")
    return fig


def eval_breakdown_figure(evals_table: pd.DataFrame, ranks: str = "rank0") -> go.Figure:
    """Stacked predict / gather / metric / broadcast seconds per evaluation, one bar per run.

    ``ranks="rank0"`` shows rank 0's times; ``"max"`` the slowest rank's per part.
    """
    if ranks not in ("rank0", "max"):
        raise ValueError(f"unknown ranks={ranks!r}; valid names: rank0, max")
    suffix = "" if ranks == "rank0" else "_max"
    cols = [f"{p}{suffix}" for p in EVAL_PARTS]
    check_columns(evals_table, ["run_id", "world_size", *cols], "eval table")
    x = (evals_table["run_id"] + " (N=" + evals_table["world_size"].astype(str) + ")").tolist()
    fig = go.Figure()
    for col, part in zip(cols, EVAL_PARTS, strict=True):
        name = part.removesuffix("_s")
        fig.add_trace(
            go.Bar(
                x=x,
                y=evals_table[col],
                name=name,
                hovertemplate=f"%{{x}}<br>{name}: %{{y:.4g}} s per evaluation<extra></extra>",
            )
        )
    who = "rank 0" if ranks == "rank0" else "slowest rank"
    fig.update_layout(
        barmode="stack",
        title=f"Evaluation time ({who})",
        xaxis_title="run",
        yaxis_title="mean time per evaluation (s)",
        **_LAYOUT,
    )
    return fig


def loss_curves_figure(steps: pd.DataFrame, max_points: int = 500) -> go.Figure:
    """Training loss (mean over ranks) against step, one line per run; down-sampled for display."""
    check_columns(steps, ["run_id", "world_size", "step", "loss"], "steps")
    per_step = steps.groupby(["run_id", "step"], as_index=False).agg(
        loss=("loss", "mean"), world_size=("world_size", "max")
    )
    fig = go.Figure()
    for run_id, rows in per_step.groupby("run_id", sort=True):
        rows = downsample_for_display(rows, max_points, x="step")
        name = f"{run_id} (N={int(rows['world_size'].iloc[0])})"
        fig.add_trace(
            go.Scatter(
                x=rows["step"],
                y=rows["loss"],
                mode="lines",
                name=name,
                hovertemplate=f"{name}<br>step %{{x}}<br>loss %{{y:.4g}}<extra></extra>",
            )
        )
    fig.update_layout(
        title="Training loss", xaxis_title="step", yaxis_title="loss (mean over ranks)", **_LAYOUT
    )
    return fig


def metric_curves_figure(evals: pd.DataFrame) -> go.Figure:
    """Evaluation metric (rank 0's) against step, one line per run."""
    check_columns(evals, ["run_id", "rank", "world_size", "step", "metric_value"], "evals")
    first = evals.groupby(["run_id", "step"])["rank"].transform("min")
    rows0 = evals[evals["rank"] == first].sort_values(["run_id", "step"])
    metric = (
        str(rows0["metric_name"].iloc[0]) if "metric_name" in rows0 and len(rows0) else "metric"
    )
    fig = go.Figure()
    for run_id, rows in rows0.groupby("run_id", sort=True):
        name = f"{run_id} (N={int(rows['world_size'].iloc[0])})"
        fig.add_trace(
            go.Scatter(
                x=rows["step"],
                y=rows["metric_value"],
                mode="lines+markers",
                name=name,
                hovertemplate=f"{name}<br>step %{{x}}<br>{metric} %{{y:.4g}}<extra></extra>",
            )
        )
    fig.update_layout(
        title=f"Evaluation {metric}", xaxis_title="step", yaxis_title=metric, **_LAYOUT
    )
    return fig


def _metric_title(table: pd.DataFrame) -> str:
    if "metric_name" in table.columns and table["metric_name"].notna().any():
        return str(table["metric_name"].dropna().iloc[0])
    return "metric"


def quality_vs_devices_figure(
    table: pd.DataFrame, group_by: Sequence[str] | None = None
) -> go.Figure:
    """Final training loss and final evaluation metric against devices (two panels)."""
    check_columns(table, ["world_size", "final_loss"], "table")
    metric = _metric_title(table)
    has_metric = "final_metric" in table.columns and table["final_metric"].notna().any()
    titles = ("final training loss", f"final {metric}") if has_metric else ("final training loss",)
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles)
    panels = [("final_loss", "loss")] + ([("final_metric", metric)] if has_metric else [])
    for col_i, (col, unit) in enumerate(panels, start=1):
        for label, color, rows in _groups(table, group_by):
            fig.add_trace(
                _group_line(rows, col, label, color, f"{unit} %{{y:.4g}}", col_i == 1),
                row=1,
                col=col_i,
            )
        fig.update_yaxes(title_text=unit, row=1, col=col_i)
        _devices_axis(fig, table, row=1, col=col_i)
    fig.update_layout(title="Quality against devices", **_LAYOUT)
    return fig


def tradeoff_figure(table: pd.DataFrame, group_by: Sequence[str] | None = None) -> go.Figure:
    """The trade-off view: final metric against devices next to speedup against devices."""
    check_columns(table, ["world_size", "final_metric", "speedup"], "table")
    metric = _metric_title(table)
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"final {metric}", "speedup"))
    for label, color, rows in _groups(table, group_by):
        for col_i, (col, hover) in enumerate(
            (("final_metric", f"{metric} %{{y:.4g}}"), ("speedup", "speedup %{y:.3g}x")), start=1
        ):
            fig.add_trace(_group_line(rows, col, label, color, hover, col_i == 1), row=1, col=col_i)
    fig.update_yaxes(title_text=metric, row=1, col=1)
    fig.update_yaxes(title_text="speedup (x)", row=1, col=2)
    for col_i in (1, 2):
        _devices_axis(fig, table, row=1, col=col_i)
    fig.update_layout(title=f"What more devices cost in {metric}, and buy in speed", **_LAYOUT)
    return fig


def predicted_vs_measured_figure(
    pvm: pd.DataFrame, group_by: Sequence[str] | None = None, network: str = ""
) -> go.Figure:
    """Measured speedup (markers) and the ring-allreduce model's prediction (dashed) per group."""
    check_columns(pvm, ["world_size", "predicted_speedup", "measured_speedup"], "table")
    fig = go.Figure()
    model = f"predicted ({network})" if network else "predicted"
    for label, color, rows in _groups(pvm, group_by):
        measured = rows[rows["measured_speedup"].notna()]
        fig.add_trace(
            go.Scatter(
                x=measured["world_size"],
                y=measured["measured_speedup"],
                mode="markers",
                marker={"color": color, "size": 10},
                name=f"{label} measured",
                hovertemplate=f"{label}<br>%{{x}} devices<br>measured %{{y:.3g}}x<extra></extra>",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=rows["world_size"],
                y=rows["predicted_speedup"],
                mode="lines",
                line={"color": color, "dash": "dash"},
                name=f"{label} {model}",
                hovertemplate=f"{label}<br>%{{x}} devices<br>{model} %{{y:.3g}}x<extra></extra>",
            )
        )
    fig.update_layout(
        title="Predicted against measured speedup", yaxis_title="speedup (x)", **_LAYOUT
    )
    _devices_axis(fig, pvm)
    return fig
