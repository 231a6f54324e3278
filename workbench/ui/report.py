"""One self-contained, offline HTML report of a set of runs: tables and every figure with data.

plotly.js is embedded once (with the first figure); nothing is loaded from a CDN, so the file opens
with no network. No torch.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from workbench.analysis import tables as analysis
from workbench.analysis.scaling_model import NetworkModel, measured_network, predicted_vs_measured
from workbench.store.files import atomic_write_bytes
from workbench.store.load import iter_run_dirs, load_runs, load_traces
from workbench.ui import plots

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1200px; color: #222; }
table.table { border-collapse: collapse; font-size: 0.85rem; margin: 1rem 0; }
table.table th, table.table td { border-bottom: 1px solid #ddd; padding: 0.25rem 0.6rem;
  text-align: right; }
table.table th { background: #f4f4f4; }
.note { color: #555; font-size: 0.9rem; }
section.figure { margin: 1.5rem 0; }
div.scroll { overflow-x: auto; }
"""

_SCALING_COLUMNS = (
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

_DEFINITIONS = """
<ul class="note">
<li><b>throughput</b>: samples of all ranks over the wall time of the measured window (first
measured step start to last step end, across ranks; warm-up steps left out), never a sum of per-rank
rates. <b>speedup</b>: throughput over that of the group's smallest world size;
<b>efficiency</b>: speedup / (world size / smallest world size).</li>
<li><b>exposed communication</b>: backward time beyond the same config's backward time at the
smallest world size (DDP's backward waits for the last allreduce), at most comm_s; without such a
reference, min(comm_s, backward_s), the no-overlap bound.</li>
<li><b>straggler</b>: a rank whose compute time (step_s - comm_s) exceeds the median of the other
ranks' by more than the threshold on most steps of a window, from the reported step on.</li>
</ul>
"""


def _table_html(frame: pd.DataFrame) -> str:
    table = frame.to_html(
        index=False, border=0, classes="table", na_rep="", float_format=lambda v: f"{v:.4g}"
    )
    return f'<div class="scroll">{table}</div>'  # wide tables scroll instead of overflowing


def _focus_run(steps: pd.DataFrame, found: pd.DataFrame) -> str | None:
    """The run to show per rank: the first with a straggler, else the largest world size."""
    if len(found):
        return str(found["run_id"].iloc[0])
    if steps.empty:
        return None
    sizes = steps.groupby("run_id", sort=True)["world_size"].max()
    return str(sizes.idxmax())


def build_figures(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    evals: pd.DataFrame | None,
    network: str | NetworkModel | None = None,
    group_by: Sequence[str] | None = None,
) -> tuple[list[tuple[str, go.Figure]], dict[str, pd.DataFrame]]:
    """The report's (heading, figure) pairs, only those with data, and the tables behind them."""
    evals = evals if evals is not None and len(evals) else None
    figs: list[tuple[str, go.Figure]] = []
    tables: dict[str, pd.DataFrame] = {}
    if steps.empty:
        return figs, tables
    table = analysis.scaling_table(runs, steps, evals, group_by=group_by)
    tables["scaling"] = table
    found = analysis.stragglers(steps)
    tables["stragglers"] = found
    if len(table):
        figs.append(("Throughput per device", plots.throughput_per_device_figure(table)))
        figs.append(("Speedup", plots.speedup_figure(table)))
        if "epoch_s" in table.columns and table["epoch_s"].notna().any():
            figs.append(("Time per epoch", plots.epoch_time_figure(table)))
        if "final_metric" in table.columns and table["final_metric"].notna().any():
            figs.append(("Accuracy against speed", plots.tradeoff_figure(table)))
        if "final_loss" in table.columns and table["final_loss"].notna().any():
            figs.append(("Quality against devices", plots.quality_vs_devices_figure(table)))
    phases = analysis.phase_breakdown(steps)
    figs.append(("Phases per run", plots.phase_breakdown_figure(phases, by="run")))
    focus = _focus_run(steps, found)
    if focus is not None and focus in set(phases["run_id"]):
        figs.append((f"Phases per rank, run {focus}", plots.phase_breakdown_figure(phases, focus)))
        figs.append((f"Step time, run {focus}", plots.step_time_heatmap(steps, focus)))
        if steps.loc[steps["run_id"] == focus, "world_size"].max() > 1:
            heat = plots.step_time_heatmap(steps, focus, value="compute_s")
            figs.append((f"Compute time, run {focus}", heat))
    memory = analysis.memory_by_rank(steps)
    focus_memory = memory[memory["run_id"] == focus] if focus is not None else memory
    figs.append(("Peak memory per rank", plots.memory_figure(focus_memory)))
    comm = analysis.communication(steps, runs, group_by=group_by)
    tables["communication"] = comm.groupby("run_id", sort=True)[
        ["world_size", "step_s", "comm_s", "comm_share", "exposed_comm_s", "exposed_share"]
    ].mean()
    if "loss" in steps.columns and steps["loss"].notna().any():
        figs.append(("Training loss", plots.loss_curves_figure(steps)))
    if evals is not None:
        figs.append(
            ("Evaluation time", plots.eval_breakdown_figure(analysis.eval_breakdown(evals)))
        )
        if evals["metric_value"].notna().any():
            figs.append(("Evaluation metric", plots.metric_curves_figure(evals)))
    net = measured_network(steps) if network is None else network
    if net is not None and len(table):
        pvm = predicted_vs_measured(runs, steps, net, group_by=group_by)
        if len(pvm):
            name = net.description if isinstance(net, NetworkModel) else net
            tables["predicted"] = pvm
            figs.append(
                (
                    "Predicted against measured",
                    plots.predicted_vs_measured_figure(pvm, network=name),
                )
            )
    return figs, tables


def write_report(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    evals: pd.DataFrame | None,
    path: str | os.PathLike[str],
    title: str = "Scaling report",
    network: str | NetworkModel | None = None,
    group_by: Sequence[str] | None = None,
) -> Path:
    """Write the report to ``path`` (atomically) and return the path.

    ``network`` feeds the scaling model (a preset name or a :class:`NetworkModel`); by default it
    is :func:`workbench.scaling_model.measured_network` of these traces, and the predicted view is
    left out when that cannot be estimated.
    """
    figs, tables = build_figures(runs, steps, evals, network, group_by)
    esc = html.escape
    traced = steps["run_id"].nunique() if len(steps) else 0
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="note">{len(runs)} runs, {traced} with traces; written {stamp}.</p>',
        _DEFINITIONS,
    ]
    table = tables.get("scaling")
    if table is not None and len(table):
        keys = list(table.attrs.get("group_by", []))
        cols = keys + [c for c in _SCALING_COLUMNS if c in table.columns and c not in keys]
        parts += ["<h2>Scaling</h2>", _table_html(table[cols])]
    else:
        parts.append('<p class="note">No completed run with measured steps: no scaling table.</p>')
    found = tables.get("stragglers")
    if found is not None:
        parts.append("<h2>Stragglers</h2>")
        parts.append(_table_html(found) if len(found) else '<p class="note">None found.</p>')
    if "communication" in tables:
        parts += [
            "<h2>Communication (mean over ranks)</h2>",
            _table_html(tables["communication"].reset_index()),
        ]
    if "predicted" in tables:
        parts += ["<h2>Scaling model</h2>", _table_html(tables["predicted"])]
    for i, (heading, fig) in enumerate(figs):
        div = fig.to_html(
            full_html=False,
            include_plotlyjs=i == 0,  # plotly.js inline once; later figures reuse it
            include_mathjax=False,
            config={"displaylogo": False, "responsive": True},
            default_height="460px",
            div_id=f"fig-{i}",
        )
        parts.append(f'<section class="figure"><h2>{esc(heading)}</h2>{div}</section>')
    parts.append("</body></html>")
    out = Path(path)
    atomic_write_bytes(out, "\n".join(parts).encode("utf-8"))
    return out


def report_from_store(
    target: str | Path,
    output: str | Path,
    output_dir: str | Path = "experiments/results",
    title: str | None = None,
) -> Path:
    """Write the offline HTML report for a sweep name, a sweep folder or a run folder."""
    target_path = Path(target)
    if (target_path / "run.json").exists():
        run_dirs = [target_path]
        sweep_root, sweeps = target_path.parent.parent, [target_path.parent.name]
    else:
        if target_path.is_dir():
            sweep_root, sweeps = target_path.parent, [target_path.name]
        else:
            sweep_root, sweeps = Path(output_dir), [str(target)]
        run_dirs = iter_run_dirs(sweep_root, sweeps)
    if not run_dirs:
        raise ValueError(
            f"target={str(target)!r}: no runs found (looked in {sweep_root} for sweep "
            f"{sweeps[0]!r}); `workbench ls` lists what the store holds"
        )
    runs = load_runs(sweep_root, sweeps)
    runs = runs[runs["path"].isin([str(p) for p in run_dirs])]
    return write_report(
        runs,
        load_traces(run_dirs, "steps"),
        load_traces(run_dirs, "eval"),
        output,
        title=title or f"Scaling report: {target_path.name}",
    )
