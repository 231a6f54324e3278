"""Training and evaluation over time: loss and metric curves per run, and the evaluation's
parts per run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.measured.display import downsample_for_display
from workbench.analysis.measured.stored import is_stored
from workbench.analysis.measured.windows import check_columns
from workbench.analysis.throughput.breakdown import EVAL_PARTS
from workbench.ui.plots.figure import Figure
from workbench.ui.plots.style import LAYOUT, MS, subtitle


def eval_breakdown_figure(evals_table: pd.DataFrame, ranks: str = "rank0") -> Figure:
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
    fig = Figure()
    for col, part in zip(cols, EVAL_PARTS, strict=True):
        name = part.removesuffix("_s")
        fig.add_trace(
            {
                "type": "bar",
                "x": x,
                "y": evals_table[col] * MS,
                "name": name,
                "hovertemplate": f"%{{x}}<br>{name}: %{{y:.3g}} ms per evaluation<extra></extra>",
            }
        )
    who = "rank 0" if ranks == "rank0" else "slowest rank"
    fig.update_layout(
        barmode="stack",
        title={"text": f"Evaluation time ({who})"},
        xaxis={"title": {"text": "run"}},
        yaxis={"title": {"text": "mean time per evaluation (ms)"}},
        **LAYOUT,
    )
    return fig


def hidden_curves(curves: dict[str, pd.Series], tolerance: float = 0.005) -> dict[str, str]:
    """Which curve hides under which: ``{hidden: on top}`` for two curves (y indexed by x) at the
    same x values whose y differ by at most ``tolerance`` of the figure's y range everywhere.
    Plotly draws later curves on top, so each hidden curve names the last one that covers it."""
    values = pd.concat(list(curves.values())) if curves else pd.Series(dtype="float64")
    span = float(values.max() - values.min()) if len(values) else 0.0
    names = list(curves)
    out: dict[str, str] = {}
    for i, below in enumerate(names):
        for above in reversed(names[i + 1 :]):
            a, b = curves[below], curves[above]
            if len(a) and a.index.equals(b.index):
                diff = np.abs(a.to_numpy(dtype="float64") - b.to_numpy(dtype="float64"))
                if np.nanmax(diff) <= tolerance * span:
                    out[below] = above
                    break
    return out


def _global_batch(steps: pd.DataFrame) -> pd.Series:
    """Per run, samples of all ranks in one step (the first measured one), when traced."""
    if is_stored(steps):
        return steps.loss_per_step.groupby("run_id")["samples"].first()
    if "samples" not in steps.columns:
        return pd.Series(dtype="float64")
    per_step = steps.groupby(["run_id", "step"])["samples"].sum()
    return per_step.groupby(level="run_id").first()


def _overlap_notes(hidden: dict[str, str], batch: pd.Series) -> str:
    """``a, b hidden under c: same global batch`` for each curve on top of others."""
    notes = []
    for above in dict.fromkeys(hidden.values()):
        below = [name for name, top in hidden.items() if top == above]
        same = {above, *below} <= set(batch.index) and batch[[above, *below]].nunique() == 1
        why = "same global batch" if same else "same values"
        notes.append(f"{', '.join(below)} hidden under {above}: {why}")
    return "; ".join(notes) + "." if notes else ""


def _curve(
    x: pd.Series, y: pd.Series, name: str, hover: str, dashed: bool, markers: bool = True
) -> dict[str, Any]:
    """One run's curve (a scatter trace); markers alone for a single point (a line needs
    two)."""
    mode = "markers" if len(x) < 2 else "lines+markers" if markers else "lines"
    return {
        "type": "scatter",
        "x": x,
        "y": y,
        "mode": mode,
        "marker": {"size": 6 if len(x) > 1 else 10},
        "line": {"dash": "dash"} if dashed else None,
        "name": name,
        "hovertemplate": f"{name}<br>step %{{x}}<br>{hover} %{{y:.4g}}<extra></extra>",
    }


def loss_curves_figure(steps: pd.DataFrame, max_points: int = 500) -> Figure:
    """Training loss (mean over ranks) against step, one line per run; down-sampled for display.
    A curve that another hides exactly says so in the subtitle, and the one on top is dashed."""
    if is_stored(steps):
        per_step = steps.loss_per_step[["run_id", "step", "loss", "world_size"]]
    else:
        check_columns(steps, ["run_id", "world_size", "step", "loss"], "steps")
        per_step = steps.groupby(["run_id", "step"], as_index=False).agg(
            loss=("loss", "mean"), world_size=("world_size", "max")
        )
    shown = {
        str(run_id): downsample_for_display(rows, max_points, x="step")
        for run_id, rows in per_step.groupby("run_id", sort=True)
    }
    hidden = hidden_curves({r: rows.set_index("step")["loss"] for r, rows in shown.items()})
    fig = Figure()
    for run_id, rows in shown.items():
        name = f"{run_id} (N={int(rows['world_size'].iloc[0])})"
        on_top = run_id in hidden.values()
        fig.add_trace(_curve(rows["step"], rows["loss"], name, "loss", on_top, markers=False))
    fig.update_layout(
        title={"text": "Training loss"},
        xaxis={"title": {"text": "step"}},
        yaxis={"title": {"text": "loss (mean over ranks)"}},
        **LAYOUT,
    )
    return subtitle(fig, _overlap_notes(hidden, _global_batch(steps)))


def metric_curves_figure(evals: pd.DataFrame) -> Figure:
    """Evaluation metric (rank 0's) against step, one line per run (markers for a run with one
    evaluation); a curve that another hides exactly says so in the subtitle."""
    check_columns(evals, ["run_id", "rank", "world_size", "step", "metric_value"], "evals")
    first = evals.groupby(["run_id", "step"])["rank"].transform("min")
    rows0 = evals[evals["rank"] == first].sort_values(["run_id", "step"])
    metric = (
        str(rows0["metric_name"].iloc[0]) if "metric_name" in rows0 and len(rows0) else "metric"
    )
    per_run = {str(r): rows for r, rows in rows0.groupby("run_id", sort=True)}
    hidden = hidden_curves(
        {r: rows.set_index("step")["metric_value"] for r, rows in per_run.items()}
    )
    fig = Figure()
    for run_id, rows in per_run.items():
        name = f"{run_id} (N={int(rows['world_size'].iloc[0])})"
        on_top = run_id in hidden.values()
        fig.add_trace(_curve(rows["step"], rows["metric_value"], name, metric, on_top))
    fig.update_layout(
        title={"text": f"Evaluation {metric}"},
        xaxis={"title": {"text": "step"}},
        yaxis={"title": {"text": metric}},
        **LAYOUT,
    )
    return subtitle(fig, _overlap_notes(hidden, pd.Series(dtype="float64")))
