"""Where a step's time goes: stacked phase times per rank or per run, and a rank x step heatmap."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.display import downsample_for_display
from workbench.analysis.windows import check_columns, comm_filled, measured_steps
from workbench.ui.plots.style import LAYOUT, check_run, one_run

PHASE_NAMES = {
    "data_s": "data",
    "forward_s": "forward",
    "backward_s": "backward",
    "optimizer_s": "optimizer",
    "other_s": "other",
    "between_s": "between steps",
    "save_s": "checkpoint",
    "eval_s": "evaluation",
}


def phase_breakdown_figure(
    phases: pd.DataFrame, run_id: str | None = None, by: str = "rank"
) -> go.Figure:
    """Stacked mean times per step: the phases, then what follows each step (between steps,
    checkpoint, evaluation), so a bar is the rank's wall time per step (``wall_step_s``): per
    rank of one run, or per run (mean of ranks).

    ``by="rank"``: bars per rank (x = rank for one run, ``run/rank`` labels for several);
    ``by="run"``: one bar per run, averaged over its ranks.
    """
    check_columns(phases, ["run_id", "rank", *PHASE_NAMES], "phases")
    if by not in ("rank", "run"):
        raise ValueError(f"unknown by={by!r}; valid names: rank, run")
    if run_id is not None:
        check_run(phases, run_id)
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
        yaxis_title="mean wall time per step (s)",
        **LAYOUT,
    )
    if by == "rank" and x and not isinstance(x[0], str):
        fig.update_xaxes(type="category")
    return fig


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
    run_id = one_run(steps, run_id)
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
        **LAYOUT,
    )
    return fig
