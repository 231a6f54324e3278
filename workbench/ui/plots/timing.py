"""Where a step's time goes: stacked phase times per rank or per run, and a rank x step heatmap."""

from __future__ import annotations

import numpy as np
import pandas as pd
from plotly.colors import sequential

from workbench.analysis.measured.stored import StoredSteps, is_stored
from workbench.analysis.measured.windows import check_columns, measured_steps
from workbench.analysis.stragglers.slow_ranks import rank_compute
from workbench.ui.plots.binning import (
    BAND_RANKS,
    MAX_COLUMNS,
    MAX_ROWS,
    grid_of_binned,
    heat_grid,
    many_ranks_note,
    quantile_label,
    quantile_ranks,
)
from workbench.ui.plots.figure import Figure
from workbench.ui.plots.style import LAYOUT, MS, check_run, one_run, subtitle

#: The step columns a rank's own compute is made of.
COMPUTE_INPUTS = (
    "data_s",
    "forward_s",
    "optimizer_s",
    "backward_s",
    "comm_s",
    "backward_compute_s",
)

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
#: The backward segment split in two when the exposed communication is known.
BACKWARD_COMPUTE = "backward compute"
EXPOSED_COMM = "exposed communication"
#: What the breakdown says of an FSDP rank's communication, which it does not split out.
FSDP_INSIDE = (
    "FSDP: its all-gathers inside forward and backward, its reduce-scatters inside backward "
    "(the communication table has their exposed parts)"
)
#: The heatmaps' colours: plotly's Viridis as the scale its validator makes of the name (the
#: colours evenly spaced), not plotly.js's own Viridis, whose stops differ.
VIRIDIS = [[i / (len(sequential.Viridis) - 1), c] for i, c in enumerate(sequential.Viridis)]


def _with_comm(phases: pd.DataFrame, comm: pd.DataFrame) -> pd.DataFrame:
    """``phases`` with ``exposed_comm_s``, ``hidden_comm_s`` and ``backward_compute_s`` (backward
    less exposed communication) per run and rank from ``comm``
    (:func:`workbench.analysis.communication`); a rank with no communication timed
    (``trace_comm='off'``) has 0 exposed, its whole backward as compute and method
    ``not traced`` (an FSDP rank: :data:`FSDP_INSIDE`)."""
    check_columns(comm, ["run_id", "rank", "exposed_comm_s", "overlapped_comm_s"], "comm")
    cols = ["run_id", "rank", "exposed_comm_s", "overlapped_comm_s", "method", "fsdp_exposed_s"]
    found = comm[[c for c in cols if c in comm.columns]]
    out = phases.drop(columns=["exposed_comm_s", "method"], errors="ignore")
    out = out.merge(found, on=["run_id", "rank"], how="left")
    known = out["exposed_comm_s"].notna()
    exposed = out["exposed_comm_s"].fillna(0.0).clip(upper=out["backward_s"])
    method = out["method"] if "method" in out.columns else pd.Series("", index=out.index)
    fsdp = out.pop("fsdp_exposed_s") if "fsdp_exposed_s" in out.columns else None
    unknown = pd.Series("not traced", index=out.index)
    if fsdp is not None:  # no allreduce: FSDP's collectives sit inside forward and backward
        unknown = unknown.where(fsdp.isna(), FSDP_INSIDE)
    return out.assign(
        exposed_comm_s=exposed,
        hidden_comm_s=out["overlapped_comm_s"].fillna(0.0),
        backward_compute_s=out["backward_s"] - exposed,
        method=method.where(known, unknown),
    )


def _segments(comm: bool) -> dict[str, str]:
    """Column -> segment name, in stacking order."""
    if not comm:
        return PHASE_NAMES
    out = {}
    for col, name in PHASE_NAMES.items():
        if col == "backward_s":
            out["backward_compute_s"] = BACKWARD_COMPUTE
            out["exposed_comm_s"] = EXPOSED_COMM
        else:
            out[col] = name
    return out


def _hover_extra(col: str, frame: pd.DataFrame) -> tuple[object, str]:
    """customdata and hover lines besides the segment's own time: its share of the wall step,
    the hidden communication under backward compute, the exposed estimate's method."""
    share = (frame[col] / frame["wall_step_s"].where(frame["wall_step_s"] > 0) * 100).to_numpy()
    extra, columns = "", [share]
    if col == "backward_compute_s":
        columns.append((frame["hidden_comm_s"] * MS).to_numpy())
        extra = "<br>communication hidden behind it: %{customdata[1]:.3g} ms"
    elif col == "exposed_comm_s":
        columns.append(frame["method"].map(str).to_numpy())
        extra = "<br>method: %{customdata[1]}"
    elif col == "backward_s" and "comm_s" in frame.columns:
        columns.append((frame["comm_s"] * MS).to_numpy())
        extra = "<br>allreduce span inside backward: %{customdata[1]:.3g} ms"
    return np.column_stack(columns), "<br>%{customdata[0]:.1f} % of the wall step" + extra


def phase_breakdown_figure(
    phases: pd.DataFrame,
    run_id: str | None = None,
    by: str = "rank",
    comm: pd.DataFrame | None = None,
) -> Figure:
    """Stacked mean milliseconds per step: the phases, then what follows each step (between
    steps, checkpoint, evaluation), so a bar is the rank's wall time per step (``wall_step_s``):
    per rank of one run, or per run (mean of ranks). Past ``BAND_RANKS`` ranks in a run, its
    bars are the ranks at the quantiles of their own compute
    (:func:`workbench.ui.plots.binning.quantile_ranks`), each named, and the subtitle says so.

    With ``comm`` (:func:`workbench.analysis.communication` of the same steps) backward is split
    into backward compute and exposed communication (not hidden behind backward); the hidden
    part is in the backward compute's hover. ``by="rank"``: bars per rank (x = rank for one
    run, ``run/rank`` labels for several); ``by="run"``: one bar per run, averaged over ranks.
    """
    check_columns(phases, ["run_id", "rank", *PHASE_NAMES], "phases")
    if by not in ("rank", "run"):
        raise ValueError(f"unknown by={by!r}; valid names: rank, run")
    if run_id is not None:
        check_run(phases, run_id)
        phases = phases[phases["run_id"] == run_id]
    if "wall_step_s" not in phases.columns:
        phases = phases.assign(wall_step_s=phases[list(PHASE_NAMES)].sum(axis=1))
    if comm is not None:
        phases = _with_comm(phases, comm)
    segments = _segments(comm is not None)
    frame, x, x_title, note = _bars(phases, by)
    fig = Figure()
    for col, name in segments.items():
        custom, extra = _hover_extra(col, frame)
        fig.add_trace(
            {
                "type": "bar",
                "x": x,
                "y": frame[col] * MS,
                "name": name,
                "customdata": custom,
                "hovertemplate": f"%{{x}}<br>{name}: %{{y:.3g}} ms per step{extra}<extra></extra>",
            }
        )
    fig.update_layout(
        barmode="stack",
        title={"text": "Where a step's time goes, " + ("per run" if by == "run" else "per rank")},
        xaxis={"title": {"text": x_title}},
        yaxis={"title": {"text": "mean wall time per step (ms)"}},
        **LAYOUT,
    )
    if by == "rank" and x and not isinstance(x[0], str):
        fig.update_xaxes(type="category")
    return subtitle(fig, note)


def _own_compute(phases: pd.DataFrame) -> pd.Series:
    """Per row, what the rank computes itself (data, forward, backward compute, optimizer):
    the value that orders ranks when only those at the quantiles are drawn. Backward compute is
    backward less exposed communication where known, else backward less the allreduce span
    (``comm_s``: a rank that waits for the others holds its allreduce longer)."""
    if "backward_compute_s" in phases.columns:
        backward = phases["backward_compute_s"]
    elif "comm_s" in phases.columns:
        backward = (phases["backward_s"] - phases["comm_s"].fillna(0.0)).clip(lower=0.0)
    else:
        backward = phases["backward_s"]
    return phases["data_s"] + phases["forward_s"] + backward + phases["optimizer_s"]


def _quantile_rows(phases: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Per run, the rows of the ranks at the quantiles of their own compute, and their labels
    (``p90 (rank 812)``, after ``run/`` when there are several runs)."""
    several = phases["run_id"].nunique() > 1
    parts, labels = [], []
    for run, rows in phases.groupby("run_id", sort=False):
        by_rank = rows.set_index("rank")
        picked = quantile_ranks(_own_compute(by_rank))
        parts.append(by_rank.loc[[r for _, r in picked]].reset_index())
        prefix = f"{run}/" if several else ""
        labels += [prefix + quantile_label(name, r) for name, r in picked]
    return pd.concat(parts, ignore_index=True), labels


def _bars(phases: pd.DataFrame, by: str) -> tuple[pd.DataFrame, list[object], str, str]:
    """The rows drawn as bars (per rank, or per run averaged over its ranks), their x labels,
    the x axis title and a note when only the ranks at the quantiles are drawn."""
    if by == "run":
        numeric = [c for c in phases.columns if c not in ("run_id", "rank", "method", "host")]
        frame = phases.groupby("run_id", sort=False)[numeric].mean().reset_index()
        if "method" in phases.columns:
            methods = phases.groupby("run_id", sort=False)["method"].agg(_distinct)
            frame["method"] = frame["run_id"].map(methods)
        x = frame["run_id"].astype(str).tolist()
        return frame, x, "run", ""
    most = int(phases.groupby("run_id")["rank"].nunique().max()) if len(phases) else 0
    if most > BAND_RANKS:
        frame, labels = _quantile_rows(phases)
        note = many_ranks_note(
            most, "their own compute (data + forward + backward compute + optimizer)"
        )
        return frame, list(labels), "rank at a quantile of own compute", note
    if phases["run_id"].nunique() == 1:
        return phases, phases["rank"].tolist(), "rank", ""
    return (
        phases,
        (phases["run_id"] + "/r" + phases["rank"].astype(str)).tolist(),
        "run / rank",
        "",
    )


def _distinct(values: pd.Series) -> str:
    return ", ".join(sorted({str(v) for v in values.dropna()}))


def rank_step_values(steps: pd.DataFrame, run_id: str, value: str) -> tuple[pd.DataFrame, str]:
    """One run's measured steps as ``rank, step, v`` (and ``host`` where traced): ``value`` in
    seconds, or with ``compute_s`` what each rank computes itself
    (:func:`workbench.analysis.stragglers.slow_ranks.rank_compute`); and the value's name for
    people."""
    if value != "compute_s":
        check_columns(steps, [value], "steps")
    cols = [*COMPUTE_INPUTS] if value == "compute_s" else [value]
    # step_s and attempt too: the detected warm-up is read from them
    keep = ["run_id", "rank", "step", "attempt", "warmup", "host", "step_s", *cols]
    keep = [c for c in dict.fromkeys(keep) if c in steps]
    m = measured_steps(steps.loc[steps["run_id"] == run_id, keep])
    v = rank_compute(m)["compute_s"] if value == "compute_s" else m[value]
    frame = pd.DataFrame({"rank": m["rank"], "step": m["step"], "v": v.astype("float64")})
    if "host" in m.columns:
        frame["host"] = m["host"]
    return frame, value_label(value)


def value_label(value: str) -> str:
    """A per-rank value's name for people."""
    if value == "compute_s":
        return "compute time (own phases)"
    return "step time" if value == "step_s" else value.removesuffix("_s")


def stored_run(steps: StoredSteps, run_id: str | None) -> str:
    """:func:`workbench.ui.plots.style.one_run` for step rows left in the store."""
    runs = steps.run_ids
    if run_id is None:
        if len(runs) != 1:
            raise ValueError(f"several runs: pass run_id, one of {', '.join(runs)}")
        return runs[0]
    if run_id not in runs:
        raise ValueError(f"unknown run_id {run_id!r}; valid names: {', '.join(runs)}")
    return run_id


def step_time_heatmap(
    steps: pd.DataFrame,
    run_id: str | None = None,
    value: str = "step_s",
    max_steps: int = MAX_COLUMNS,
    max_rows: int = MAX_ROWS,
) -> Figure:
    """Rank x step heatmap of one run's measured step time (or ``compute_s``, what each rank
    computes itself: data, forward, optimizer and DDP's backward compute timer, see
    :func:`workbench.analysis.stragglers.slow_ranks.rank_compute`; blank on steps DDP did not
    sample).

    At most ``max_steps`` columns and ``max_rows`` rows (:func:`workbench.ui.plots.binning.
    heat_grid`): each cell the median over a bin of consecutive steps (labelled by its first
    step); past ``max_rows`` ranks a row is a host (or a block of consecutive ranks), its
    slowest rank's median. The subtitle states the binning. In DDP ``step_s`` is nearly equal
    across ranks; a straggler stands out in ``compute_s``.
    """
    if is_stored(steps):  # binned in the engine
        run_id = stored_run(steps, run_id)
        binned, size = steps.binned(run_id, value, max_steps)
        hosts = binned.groupby("rank", sort=True)["host"].first()
        grid = grid_of_binned(binned.drop(columns="host"), "v", size, hosts, max_rows)
        label = value_label(value)
    else:
        run_id = one_run(steps, run_id)
        frame, label = rank_step_values(steps, run_id, value)
        grid = heat_grid(frame, "v", max_steps, max_rows)
    who = "%{y}" if grid.rows.grouped else "rank %{y}"
    span = "" if grid.steps_per_bin == 1 else f" (bin of {grid.steps_per_bin} steps)"
    y: object = grid.rows.labels if grid.rows.grouped else [int(r) for r in grid.rows.row.index]
    fig = Figure()
    fig.add_trace(
        {
            "type": "heatmap",
            "z": grid.z * MS,
            "x": grid.steps,
            "y": y,
            "colorscale": VIRIDIS,
            "colorbar": {"title": {"text": "ms"}},
            "name": label,
            "hovertemplate": f"{who}<br>step %{{x}}{span}<br>{label}: %{{z:.3g}} ms<extra></extra>",
        }
    )
    fig.update_layout(
        title={"text": f"{label.capitalize()} per rank and step, run {run_id}"},
        xaxis={"title": {"text": "step" + (" (bin start)" if grid.steps_per_bin > 1 else "")}},
        **LAYOUT,
    )
    if grid.rows.grouped:
        fig.update_yaxes(title={"text": "ranks"}, type="category")
    else:  # ranks are whole numbers: one tick each, never -0.5 or 0.5
        fig.update_yaxes(title={"text": "rank"}, dtick=1, tickformat="d", tick0=0)
    return subtitle(
        fig, grid.statistic[:1].upper() + grid.statistic[1:] + "." if grid.statistic else ""
    )
