"""One offline HTML report of a set of runs, in the order people read it: the finding, a table of
contents, every figure with data (the speedup first), the tables, and a folded glossary.

plotly.js is embedded once (with the first figure), or written once beside the report as
``plotly.min.js`` for a folder of many reports; nothing is loaded from a CDN, so the report
opens with no network. No torch.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import pandas as pd

from workbench.analysis.advice.finding import findings
from workbench.analysis.measured.stored import StoredSteps, is_stored
from workbench.analysis.measured.windows import warmup_once
from workbench.analysis.model.scaling_model import NetworkModel
from workbench.analysis.run_digests import open_steps
from workbench.analysis.stragglers.slow_ranks import stragglers, stragglers_in_store
from workbench.analysis.throughput.comm import communication
from workbench.analysis.throughput.fsdp_comm import KINDS
from workbench.analysis.throughput.groups import resolve_group_by
from workbench.store.digests.on_disk import digest_state
from workbench.store.engine import parquet_rows
from workbench.store.files import atomic_write_bytes
from workbench.store.load import iter_run_dirs, load_runs, load_traces
from workbench.store.tunes import load_tunes
from workbench.ui.catalogue import (
    FigureContext,
    available_figures,
    figure_context,
    focus_run,
)
from workbench.ui.failures_html import failures_html
from workbench.ui.finding_html import definition_toggle, finding_items
from workbench.ui.glossary import glossary_html
from workbench.ui.plots import Figure, split_definition
from workbench.ui.report_stages import ReportProgress, Stages
from workbench.ui.tables import fit_error_note, frame_html, model_table_html, scaling_table_html
from workbench.ui.unmeasured import unmeasured_lines

#: Where plotly.js comes from: inside the report, or a ``plotly.min.js`` beside it.
PlotlyJs = Literal["inline", "directory"]
PLOTLY_FILE = "plotly.min.js"
#: The figure shown first, on the report's first screen with the finding.
LEAD_FIGURE = "Speedup"
#: Its height at least (CSS pixels): a short lead chart is still a chart.
LEAD_HEIGHT = 420

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1rem auto; max-width: 1200px; color: #222;
  padding: 0 1rem; }
h1 { font-size: 1.5rem; margin: 0.3rem 0; }
h2 { font-size: 1.15rem; margin: 0.6rem 0 0.3rem; }
table.table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0 1rem; }
table.table th, table.table td { border-bottom: 1px solid #ddd; padding: 0.25rem 0.6rem;
  text-align: right; white-space: nowrap; }
table.table th { background: #f4f4f4; }
table.table caption { caption-side: top; text-align: left; color: #555; font-size: 0.85rem;
  padding: 0.2rem 0; }
.note { color: #555; font-size: 0.9rem; margin: 0.3rem 0; }
section.figure { margin: 0.8rem 0 1.5rem; }
section.finding { background: #f3f7fc; border-left: 4px solid #3a6ea5; padding: 0.1rem 1rem;
  font-size: 0.98rem; }
section.finding h2 { margin: 0.4rem 0 0.2rem; }
section.finding ul { margin: 0.2rem 0 0.4rem; padding-left: 1.2rem; }
section.finding li { margin: 0.15rem 0; padding-left: 0.4rem; border-left: 4px solid transparent; }
section.finding li.good { border-left-color: #2e8b57; }
section.finding li.bad { border-left-color: #c0392b; }
section.finding li.warn { border-left-color: #e67e22; }
nav.toc { font-size: 0.85rem; line-height: 1.5; margin: 0.4rem 0; }
nav.toc a { white-space: nowrap; }
details.glossary { margin: 1.5rem 0; }
details.glossary summary { cursor: pointer; font-weight: 600; }
div.scroll { overflow-x: auto; }
"""


def build_figures(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    evals: pd.DataFrame | None,
    network: str | NetworkModel | None = None,
    group_by: Sequence[str] | None = None,
    found: pd.DataFrame | None = None,
) -> tuple[list[tuple[str, Figure]], dict[str, pd.DataFrame]]:
    """The report's (heading, figure) pairs, only those with data, and the tables behind them.

    Figures come from :data:`workbench.ui.catalogue.CATALOGUE`, in its order but the speedup
    first (the answer a scaling study is read for); one-run figures show the first run with a
    straggler, else the largest. Tables: ``scaling``, ``stragglers``,
    ``communication`` (mean over ranks per run) and ``predicted`` (when the model has rows).
    ``found``: the stragglers, when the caller has them (else computed from ``steps``).
    """
    figs, tables, _ = _figures_tables_context(runs, steps, evals, network, group_by, found)
    return figs, tables


def _figures_tables_context(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    evals: pd.DataFrame | None,
    network: str | NetworkModel | None,
    group_by: Sequence[str] | None,
    found: pd.DataFrame | None,
) -> tuple[list[tuple[str, Figure]], dict[str, pd.DataFrame], FigureContext | None]:
    """:func:`build_figures`, and the figure context it computed (``None`` without steps), for
    the finding to reuse its tables."""
    if steps.empty:
        return [], {}, None
    keys = resolve_group_by(runs, group_by)
    if found is None:
        found = (
            stragglers_in_store(steps.run_dirs, stored=steps)
            if is_stored(steps)
            else stragglers(steps)
        )
    ctx = figure_context(runs, steps, evals, keys, focus=focus_run(steps, found), network=network)
    # the context's, so that the figures that draw it reuse it
    comm = ctx.comm if ctx.comm is not None else communication(steps, runs, group_by=keys)
    tables = {
        "scaling": ctx.table,
        "stragglers": found,
        "communication": comm.groupby("run_id", sort=True)[
            [
                *("world_size", "step_s", "comm_s", "comm_share", "exposed_comm_s"),
                *("exposed_share", "exposed_transfer_s", "wait_s", "hidden_comm_s"),
                *FSDP_TABLE,
            ]
        ].mean(),
    }
    figs = sorted(available_figures(ctx), key=lambda hf: hf[0] != LEAD_FIGURE)  # stable
    if len(ctx.predicted):
        tables["predicted"] = ctx.predicted
    return figs, tables, ctx


def _tables_html(tables: dict[str, pd.DataFrame], group_by: Sequence[str]) -> list[str]:
    """The report's table sections: scaling, stragglers, communication, scaling model (each a
    ``<section id="table-...">`` that the table of contents links to)."""
    parts = []
    table = tables.get("scaling")
    if table is not None and len(table):
        parts.append(_section("table-scaling", "Scaling", scaling_table_html(table, group_by)))
    else:
        parts.append('<p class="note">No completed run with measured steps: no scaling table.</p>')
    found = tables.get("stragglers")
    if found is not None:
        shown = frame_html(found) if len(found) else '<p class="note">None found.</p>'
        parts.append(_section("table-stragglers", "Stragglers", shown))
    if "communication" in tables:
        shown = frame_html(tables["communication"].reset_index())
        heading = "Communication (mean over ranks)"
        parts.append(_section("table-communication", heading, shown))
    if "predicted" in tables:
        note = f'<p class="note">{html.escape(fit_error_note(tables["predicted"]))}</p>'
        shown = note + model_table_html(tables["predicted"], group_by)
        parts.append(_section("table-predicted", "Scaling model", shown))
    return parts


def _section(anchor: str, heading: str, body: str) -> str:
    return f'<section class="table" id="{anchor}"><h2>{html.escape(heading)}</h2>{body}</section>'


#: FSDP's columns of the communication table (left out where no run traced them: empty).
FSDP_TABLE = [f"{k}_{w}" for k in KINDS for w in ("exposed_s", "exposed_share", "hidden_s")]
TABLE_HEADINGS = {
    "table-scaling": "Scaling",
    "table-stragglers": "Stragglers",
    "table-communication": "Communication",
    "table-predicted": "Scaling model",
}


def _toc_html(figs: list[tuple[str, Figure]], parts: list[str]) -> str:
    """The table of contents as one short paragraph of links (it must leave the first screen to
    the finding and the speedup chart): every figure, every table present, the glossary."""
    esc = html.escape
    figures = [f'<a href="#figure-{i}">{esc(h)}</a>' for i, (h, _) in enumerate(figs)]
    tables = [
        f'<a href="#{anchor}">{name}</a>'
        for anchor, name in TABLE_HEADINGS.items()
        if any(f'id="{anchor}"' in p for p in parts)
    ]
    groups = [("Figures", figures), ("Tables", tables), ("", ['<a href="#glossary">Glossary</a>'])]
    text = " | ".join(
        (f"<b>{name}:</b> " if name else "") + " &middot; ".join(links)
        for name, links in groups
        if links
    )
    return f'<nav class="toc">{text}</nav>'


def _finding_html(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    group_by: Sequence[str],
    evals: pd.DataFrame | None,
    found: pd.DataFrame | None = None,
    comm: pd.DataFrame | None = None,
) -> str:
    """The study's finding in plain words (:func:`workbench.analysis.advice.finding.findings`),
    first."""
    tunes = load_tunes(runs["path"]) if "path" in runs.columns else []
    said = findings(runs, steps, group_by, evals, found=found, comm=comm, tunes=tunes)
    said += unmeasured_lines(runs)
    if not said:
        return ""
    return f'<section class="finding"><h2>Finding</h2><ul>{finding_items(said)}</ul></section>'


def _figures_html(figs: list[tuple[str, Figure]], plotly_js: PlotlyJs) -> list[str]:
    """One section per figure (id ``figure-N``); plotly.js once, with the first: inline, or a
    ``<script src="plotly.min.js">`` for the copy beside the report."""
    if plotly_js not in ("inline", "directory"):
        raise ValueError(f"plotly_js={plotly_js!r}: valid values are 'inline' and 'directory'")
    first: bool | str = True if plotly_js == "inline" else "directory"
    parts = []
    for i, (heading, fig) in enumerate(figs):
        fig, definition = split_definition(fig)
        height = "460px"
        if i == 0 and heading == LEAD_FIGURE:  # shorter, to share the first screen
            fig.update_layout(height=max(LEAD_HEIGHT, (fig.value("height") or 0) - 130))
            height = f"{fig.value('height')}px"
        # the figure's spec as it is: plotly's validation would cost a report about a second
        div = fig.to_html(
            full_html=False,
            include_plotlyjs=first if i == 0 else False,  # later figures reuse it
            include_mathjax=False,
            config={"displaylogo": False, "responsive": True},
            default_height=height,
            div_id=f"fig-{i}",
        )
        parts.append(
            f'<section class="figure" id="figure-{i}"><h2>{html.escape(heading)}</h2>'
            f"{definition_toggle(definition)}{div}</section>"
        )
    return parts


def _write_plotly_js(folder: Path) -> None:
    """plotly.js (minified) as ``plotly.min.js`` in ``folder``, unless that copy is current:
    the reports of a folder share one."""
    from plotly.offline import get_plotlyjs

    path = folder / PLOTLY_FILE
    data = get_plotlyjs().encode("utf-8")
    if not (path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data):
        atomic_write_bytes(path, data)


def write_report(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    evals: pd.DataFrame | None,
    path: str | os.PathLike[str],
    title: str = "Scaling report",
    network: str | NetworkModel | None = None,
    group_by: Sequence[str] | None = None,
    summary_csv: str | os.PathLike[str] | None = None,
    plotly_js: PlotlyJs = "inline",
    found: pd.DataFrame | None = None,
) -> Path:
    """Write the report to ``path`` (atomically, readable by others as the umask allows) and
    return the path.

    ``network`` feeds the scaling model (a preset name or a :class:`NetworkModel`); by default it
    is :func:`workbench.analysis.model.network.fit_network` of these runs, and without a fit the
    predicted view shows the measurements and says why there is no prediction. ``summary_csv``:
    also write the scaling table the report computed there, as CSV (atomically; every column,
    raw numbers; header only when there is none). ``plotly_js``: ``"inline"`` embeds plotly.js
    (one file, about 4.8 MB); ``"directory"`` writes it once as ``plotly.min.js`` beside the
    report and links it, so a folder of reports holds one copy (move them together).
    ``found``: the stragglers, when the caller has them (``stragglers_in_store`` of these runs:
    the finding and the stragglers table both show them); computed from ``steps`` when None.
    """
    keys = resolve_group_by(runs, group_by)
    with warmup_once():  # every table and figure asks for the same frame's warm-up
        figs, tables, ctx = _figures_tables_context(runs, steps, evals, network, keys, found)
        comm = ctx.comm if ctx is not None else None
        finding = _finding_html(runs, steps, keys, evals, found, comm)
    if summary_csv is not None:
        table = tables.get("scaling", pd.DataFrame())
        atomic_write_bytes(Path(summary_csv), table.to_csv(index=False).encode("utf-8"))
    out = Path(path)
    figures = _figures_html(figs, plotly_js)
    if plotly_js == "directory" and figs:
        _write_plotly_js(out.parent)
    esc = html.escape
    traced = len(steps.run_ids) if is_stored(steps) else steps["run_id"].nunique()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    table_parts = _tables_html(tables, keys)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        finding,
        failures_html(runs),  # a run that failed says why, before any chart
        *figures[:1],  # the lead chart on the first screen, with the finding
        f'<p class="note">{len(runs)} runs, {traced} with traces{esc(_source(steps))}; '
        f"written {stamp}.</p>",
        _toc_html(figs, table_parts),
        *figures[1:],
        *table_parts,
        glossary_html(),
        "</body></html>",
    ]
    atomic_write_bytes(out, "\n".join(parts).encode("utf-8"))
    return out


def _source(steps: pd.DataFrame | StoredSteps) -> str:
    """Where a report's figures were read from, when it came from a store: the runs' digests,
    or the step rows and why."""
    if not is_stored(steps):
        return ""
    if steps.source == "digests":
        return ", read from their digests (written once, when each run ended)"
    return f"; {steps.note}" if steps.note else ""


def report_from_store(
    target: str | Path,
    output: str | Path,
    output_dir: str | Path = "experiments/results",
    title: str | None = None,
    summary_csv: str | Path | None = None,
    plotly_js: PlotlyJs = "inline",
    progress: ReportProgress | None = None,
) -> Path:
    """Write the offline HTML report for a sweep name, a sweep folder or a run folder.

    ``summary_csv``: also write the scaling table the report computes there, as CSV (atomically),
    so that a caller needing both computes the table once. ``plotly_js``: as for
    :func:`write_report`. ``progress``: told at each stage (``report_stages.STAGE_STARTS``) and
    after each run attempt the straggler pass ranks (a large sweep's report takes a minute).
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
    # the rows' count from the files' footers (a thousand files: half a second) only where a
    # pass will read them; a digest counts its own
    digested = all(digest_state(d) == "valid" for d in run_dirs)
    tell = Stages(progress, 0 if digested else parquet_rows(run_dirs))
    evals = load_traces(run_dirs, "eval")  # one row per rank and evaluation: small
    with open_steps(run_dirs, evals, stage=tell, ranked=tell.ranked) as steps:  # builds them
        tell.rows = tell.rows or int(steps.runs["rows"].sum())
        if steps.source == "rows":  # a run still running: the step rows stay in the engine
            tell("steps, per step")
            tell("per rank and stragglers")
            steps.start_passes()  # the per-rank and DDP timers' passes beside the stragglers
        found = stragglers_in_store(run_dirs, stored=steps, ranked=tell.ranked)
        tell("figures and tables")
        path = write_report(
            runs,
            steps,
            evals,
            output,
            title=title or f"Scaling report: {target_path.name}",
            summary_csv=summary_csv,
            plotly_js=plotly_js,
            found=found,
        )
    tell("written")
    return path
