"""Training and evaluation over time: loss and metric curves per run, and the evaluation's
parts per run.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.breakdown import EVAL_PARTS
from workbench.analysis.display import downsample_for_display
from workbench.analysis.windows import check_columns
from workbench.ui.plots.style import LAYOUT


def eval_breakdown_figure(evals_table: pd.DataFrame, ranks: str = "rank0") -> go.Figure:
    """Stacked predict / gather / metric / broadcast seconds per evaluation, one bar per run.

    ``ranks="rank0"`` shows rank 0's times; ``"slowest"`` the parts of each evaluation's slowest
    rank (one rank's parts, so the stack is at most that rank's evaluation time).
    """
    if ranks not in ("rank0", "slowest"):
        raise ValueError(f"unknown ranks={ranks!r}; valid names: rank0, slowest")
    suffix = "" if ranks == "rank0" else "_slowest"
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
        **LAYOUT,
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
        title="Training loss", xaxis_title="step", yaxis_title="loss (mean over ranks)", **LAYOUT
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
        title=f"Evaluation {metric}", xaxis_title="step", yaxis_title=metric, **LAYOUT
    )
    return fig
