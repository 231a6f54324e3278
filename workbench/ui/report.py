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

from workbench.analysis.comm import communication
from workbench.analysis.finding import findings
from workbench.analysis.groups import resolve_group_by
from workbench.analysis.scaling_model import NetworkModel
from workbench.analysis.slow_ranks import stragglers
from workbench.store.files import atomic_write_bytes
from workbench.store.load import iter_run_dirs, load_runs, load_traces
from workbench.ui.catalogue import available_figures, figure_context, focus_run
from workbench.ui.tables import frame_html, model_table_html, scaling_table_html

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1200px; color: #222; }
table.table { border-collapse: collapse; font-size: 0.85rem; margin: 1rem 0; }
table.table th, table.table td { border-bottom: 1px solid #ddd; padding: 0.25rem 0.6rem;
  text-align: right; }
table.table th { background: #f4f4f4; }
.note { color: #555; font-size: 0.9rem; }
section.figure { margin: 1.5rem 0; }
section.finding { background: #f3f7fc; border-left: 4px solid #3a6ea5; padding: 0.2rem 1rem;
  font-size: 1.05rem; }
div.scroll { overflow-x: auto; }
"""

_DEFINITIONS = """
<ul class="note">
<li><b>scaling group</b>: runs are repeats of one point when every config field agrees but world
size, nodes, tasks per node, seed, run name, where results are filed, the port and timeouts. A
group is <b>weak</b> scaling (per-device batch fixed, global batch grows with the world size) or
<b>strong</b> (global batch fixed); a study holding both warns and keeps both, and a run at their
crossing counts in each.</li>
<li><b>throughput</b>: samples of all ranks over the wall time of the measured window (first
measured step start to last step end, across ranks; the warm-up steps of each attempt left out),
never a sum of per-rank rates: end to end (<i>samples_per_s</i>), and training alone
(<i>train_samples_per_s</i>: the window less the evaluations and checkpoints inside it, each the
slowest rank's). <b>between steps</b> in the step breakdown: the time from a step's end to the
next step's start (<i>gap_s</i>) less the checkpoint (<i>save_s</i>) and evaluation shown beside
it, so a bar adds up to the wall time per step. <b>speedup</b>: mean throughput over the mean
throughput of the group's smallest world size;
<b>efficiency</b>: speedup / (world size / smallest world size). <b>_std</b>: standard deviation of
the runs of a point (ddof 1; empty from one run). <b>speedup_std</b> = speedup &times;
&radic;((s<sub>N</sub>/m<sub>N</sub>)&sup2; + (s<sub>B</sub>/m<sub>B</sub>)&sup2;) with the means m
and standard deviations s of both ends' throughputs; empty when either end is one run, and at the
base. An empty spread draws no error bar.</li>
<li><b>scaling model</b>: step time at N = compute + (1 - overlap) &times; ring allreduce time of
the gradient bytes at N. Compute is the base's wall step time (the one that gives the mean
throughput of its repeats) less (1 - overlap) &times; its traced communication (none at one
rank); weak curves keep it, strong curves divide it by N / base N. The network is a preset, or
the runs' own allreduce micro-benchmark (run before the first step at the run's bucket sizes:
bus bandwidth = bytes / time &times; 2(n-1)/n, as nccl-tests define it; the median over the
runs), or, without one, fitted over runs at three or more world sizes (its RMS residual in the
note); with none of these there is no prediction, and the figure says why.</li>
<li><b>exposed communication</b>: where DDP's own timer was read (sampled steps), its
communication span less the part overlapped with backward compute, i.e. the time from the last
gradient ready to the end of the allreduces (method "measured"); otherwise backward time beyond
the same config's backward time at the smallest world size (DDP's backward waits for the last
allreduce), at most comm_s; without such a reference, min(comm_s, backward_s), the no-overlap
bound. <b>comm_s</b> is a span from the first bucket's launch to the last one's end, mostly
hidden behind backward: not the cost of communication.</li>
<li><b>straggler</b>: a rank whose compute time (step_s - comm_s) exceeds the median of the other
ranks' by more than the threshold on most steps of a window, from the reported step on;
<i>slow_phase</i> is the traced phase (data, forward, backward less communication, optimizer) in
which it exceeds the others' median the most, by <i>slow_phase_extra_s</i> per step.</li>
<li><b>tflops_per_device</b>: FLOPs of one training step (forward + backward over every gradient
accumulation micro-batch, counted once per run by PyTorch's FlopCounterMode on rank 0 before the
measured window, so the count costs the measured steps nothing) per sample, &times; samples_per_s
over the measured window / world size, in TFLOP/s. <b>mfu</b>: tflops_per_device over the
device's dense (no 2:4 sparsity) peak for the run's precision, from a table of vendor datasheets
(<i>mfu_note</i> names the peak and its source); a CPU or an unknown device has no MFU and the
note says why.</li>
</ul>
"""


def build_figures(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    evals: pd.DataFrame | None,
    network: str | NetworkModel | None = None,
    group_by: Sequence[str] | None = None,
) -> tuple[list[tuple[str, go.Figure]], dict[str, pd.DataFrame]]:
    """The report's (heading, figure) pairs, only those with data, and the tables behind them.

    Figures come from :data:`workbench.ui.catalogue.CATALOGUE`; one-run figures show the first
    run with a straggler, else the largest. Tables: ``scaling``, ``stragglers``,
    ``communication`` (mean over ranks per run) and ``predicted`` (when the model has rows).
    """
    if steps.empty:
        return [], {}
    keys = resolve_group_by(runs, group_by)
    found = stragglers(steps)
    ctx = figure_context(runs, steps, evals, keys, focus=focus_run(steps, found), network=network)
    comm = communication(steps, runs, group_by=keys)
    tables = {
        "scaling": ctx.table,
        "stragglers": found,
        "communication": comm.groupby("run_id", sort=True)[
            ["world_size", "step_s", "comm_s", "comm_share", "exposed_comm_s", "exposed_share"]
        ].mean(),
    }
    figs = available_figures(ctx)
    if len(ctx.predicted):
        tables["predicted"] = ctx.predicted
    return figs, tables


def _tables_html(tables: dict[str, pd.DataFrame], group_by: Sequence[str]) -> list[str]:
    """The report's table sections: scaling, stragglers, communication, scaling model."""
    parts = []
    table = tables.get("scaling")
    if table is not None and len(table):
        parts += ["<h2>Scaling</h2>", scaling_table_html(table, group_by)]
    else:
        parts.append('<p class="note">No completed run with measured steps: no scaling table.</p>')
    found = tables.get("stragglers")
    if found is not None:
        parts.append("<h2>Stragglers</h2>")
        parts.append(frame_html(found) if len(found) else '<p class="note">None found.</p>')
    if "communication" in tables:
        parts += [
            "<h2>Communication (mean over ranks)</h2>",
            frame_html(tables["communication"].reset_index()),
        ]
    if "predicted" in tables:
        parts += ["<h2>Scaling model</h2>", model_table_html(tables["predicted"], group_by)]
    return parts


def _finding_html(runs: pd.DataFrame, steps: pd.DataFrame, group_by: Sequence[str]) -> str:
    """The study's finding in plain words (:func:`workbench.analysis.finding.findings`), first."""
    said = findings(runs, steps, group_by)
    if not said:
        return ""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in said)
    return f'<section class="finding"><h2>Finding</h2><ul>{items}</ul></section>'


def _figures_html(figs: list[tuple[str, go.Figure]]) -> list[str]:
    """One section per figure; plotly.js inline once, with the first."""
    parts = []
    for i, (heading, fig) in enumerate(figs):
        div = fig.to_html(
            full_html=False,
            include_plotlyjs=i == 0,  # plotly.js inline once; later figures reuse it
            include_mathjax=False,
            config={"displaylogo": False, "responsive": True},
            default_height="460px",
            div_id=f"fig-{i}",
        )
        parts.append(f'<section class="figure"><h2>{html.escape(heading)}</h2>{div}</section>')
    return parts


def write_report(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    evals: pd.DataFrame | None,
    path: str | os.PathLike[str],
    title: str = "Scaling report",
    network: str | NetworkModel | None = None,
    group_by: Sequence[str] | None = None,
    summary_csv: str | os.PathLike[str] | None = None,
) -> Path:
    """Write the report to ``path`` (atomically) and return the path.

    ``network`` feeds the scaling model (a preset name or a :class:`NetworkModel`); by default it
    is :func:`workbench.analysis.network.fit_network` of these runs, and without a fit the
    predicted view shows the measurements and says why there is no prediction. ``summary_csv``:
    also write the scaling table the report computed there, as CSV (atomically; header only when
    there is none).
    """
    keys = resolve_group_by(runs, group_by)
    figs, tables = build_figures(runs, steps, evals, network, keys)
    if summary_csv is not None:
        table = tables.get("scaling", pd.DataFrame())
        atomic_write_bytes(Path(summary_csv), table.to_csv(index=False).encode("utf-8"))
    esc = html.escape
    traced = steps["run_id"].nunique() if len(steps) else 0
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        _finding_html(runs, steps, keys),
        f'<p class="note">{len(runs)} runs, {traced} with traces; written {stamp}.</p>',
        _DEFINITIONS,
        *_tables_html(tables, keys),
        *_figures_html(figs),
        "</body></html>",
    ]
    out = Path(path)
    atomic_write_bytes(out, "\n".join(parts).encode("utf-8"))
    return out


def report_from_store(
    target: str | Path,
    output: str | Path,
    output_dir: str | Path = "experiments/results",
    title: str | None = None,
    summary_csv: str | Path | None = None,
) -> Path:
    """Write the offline HTML report for a sweep name, a sweep folder or a run folder.

    ``summary_csv``: also write the scaling table the report computes there, as CSV (atomically),
    so that a caller needing both computes the table once.
    """
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
        summary_csv=summary_csv,
    )
