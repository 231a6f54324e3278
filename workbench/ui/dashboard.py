"""The dashboard over the store: pick sweeps, runs, a grouping and a figure; the figure and the
scaling table follow.

Widgets only compose :mod:`workbench.analysis` (tables) and the figure catalogue
(:mod:`workbench.ui.catalogue`, shared with the report); they compute nothing of their own. No
torch at import time: a dashboard opens on a laptop with no GPU stack.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.advice.finding import findings
from workbench.analysis.measured.stored import StoredSteps
from workbench.analysis.run_digests import open_steps
from workbench.analysis.throughput.groups import (
    BATCH_COLUMNS,
    LEADING_COLUMNS,
    config_columns,
    default_group_by,
    resolve_group_by,
)
from workbench.store.load import iter_run_dirs, load_runs, load_traces
from workbench.ui.baseline import NO_BASELINE, baseline_notes, honest_table, speedup_rows
from workbench.ui.catalogue import (
    FigureContext,
    dashboard_figures,
    draw,
    figure_context,
    figure_spec,
)
from workbench.ui.finding_html import definition_toggle, finding_items
from workbench.ui.plots import Figure, message_figure, split_definition
from workbench.ui.tables import scaling_table_html
from workbench.ui.what_if import WhatIf

#: Dashboard figures: label shown in the dropdown -> key (from the figure catalogue).
FIGURES: dict[str, str] = dashboard_figures()
#: The group-by dropdown's value for :func:`workbench.analysis.default_group_by` (a Dropdown
#: treats None as "nothing selected", so a sentinel string stands for it).
DEFAULT_GROUPING = "default"
#: Figures whose y axis starts at zero: a single point must not sit on an axis zoomed to +-1.5
#: around it, and a drop reads at its true size.
FROM_ZERO = ("throughput", "epoch_time", "speedup")
#: The frames the finding and the notes sit in (the report's colours).
BOX = "border-left: 4px solid {}; background: {}; padding: 0.2rem 1rem; margin: 0.4rem 0"
FINDING_BOX = BOX.format("#3a6ea5", "#f3f7fc")
WARNING_BOX = BOX.format("#c60", "#fff4e5")
#: The scaling table's cells on one line each: squeezed into the cell's width, a long note
#: (mfu_note) wrapped into a column a word wide and made every row hundreds of pixels tall. The
#: table scrolls sideways instead.
#: The figure's definition, as a caption above it.
DEFINITION_STYLE = "color: #555; font-size: 0.8rem; line-height: 1.3; margin: 0.3rem 0"
TABLE_STYLE = (
    "<style>.workbench-table th, .workbench-table td "
    "{white-space: nowrap; line-height: 1.4; padding: 2px 8px}</style>"
)


def replace_figure(widget: go.FigureWidget, fig: Figure | go.Figure) -> None:
    """Show ``fig`` in ``widget`` in place: the same FigureWidget gets the new traces and layout
    (validated once, by the widget).

    Assigning a layout only sends the new keys to the browser, so keys of the old layout are
    removed first (else a second subplot's axis or title would linger).
    """
    spec = fig.spec if isinstance(fig, Figure) else fig.to_dict()
    widget.data = ()
    stale = [k for k in widget.layout.to_plotly_json() if k != "template"]
    if stale:
        widget.plotly_relayout({k: None for k in stale})
    widget.add_traces(spec["data"])
    widget.layout = spec["layout"]


def lift_definition(fig: Figure) -> tuple[Figure, str]:
    """``fig`` without its subtitle, and above it as HTML: the subtitle's notes as a caption and
    the figure's definition behind a toggle (in a FigureWidget the title is drawn over its
    subtitle, and a caption wraps at the cell's width)."""
    fig, definition = split_definition(fig)
    text = fig.value("title", "subtitle", "text")
    caption = ""
    if text:
        lines = text.count("<br>") + 1
        above = 24 if fig.value("annotations") else 0
        fig.update_layout({"title": {"subtitle": {"text": None}}, "margin": {"t": 50 + above}})
        if fig.value("height"):
            fig.update_layout(height=fig.value("height") - 14 * lines)
        caption = f'<div style="{DEFINITION_STYLE}">{text.replace("<br>", " ")}</div>'
    return fig, caption + definition_toggle(definition)


def _column(grow: str) -> widgets.Layout:
    """A column of the controls that takes ``grow`` shares of the row and may shrink below its
    content's width (else a long run name pushes the other column out of the cell)."""
    return widgets.Layout(flex=f"{grow} 1 0%", min_width="0")


def finding_html(said: list[str]) -> str:
    """The study's finding (:func:`workbench.analysis.advice.finding.findings`) as the report words
    it."""
    if not said:
        return ""
    return f'<div style="{FINDING_BOX}"><b>Finding</b><ul>{finding_items(said)}</ul></div>'


def baseline_html(notes: list[str]) -> str:
    """Groups without a 1-rank run (:func:`workbench.ui.baseline.baseline_notes`), as a warning."""
    if not notes:
        return ""
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return f'<div style="{WARNING_BOX}"><b>No baseline</b><ul>{items}</ul></div>'


class Dashboard(widgets.VBox):
    """Pick sweeps and runs, a grouping and a figure; the figure and the scaling table follow,
    and under them ``what_if`` (:class:`workbench.ui.what_if.WhatIf`): the model's prediction for
    the selected runs at other world sizes on another network.

    ``figure`` is one ``plotly.graph_objects.FigureWidget`` updated in place when a control
    changes; ``table`` an HTML widget with the scaling table. :meth:`refresh` reloads the store.
    """

    def __init__(
        self, output_dir: str | Path = "experiments/results", sweeps: Iterable[str] | None = None
    ) -> None:
        self.output_dir = Path(output_dir)
        self._cache: dict[str, tuple[pd.DataFrame, pd.DataFrame]] = {}
        # the selected runs' step rows, left in the engine (by the runs' folders)
        self._stored: tuple[tuple[str, ...], StoredSteps] | None = None
        # the selection's runs and evaluations, by (sweeps, runs) chosen
        self._selected: tuple[tuple[Any, ...], pd.DataFrame, pd.DataFrame] | None = None
        self._busy = False  # set while controls are filled in code: one redraw, not many
        self._built: tuple[Any, FigureContext | None] | None = None
        self._said: list[str] = []  # the finding for the selection of ``_built``
        # Each control fills its column, so long run names and groupings are not cut off.
        wide = {"layout": widgets.Layout(width="100%"), "style": {"description_width": "70px"}}
        self.sweeps = widgets.SelectMultiple(description="sweeps", rows=4, **wide)
        self.runs = widgets.SelectMultiple(description="runs", rows=6, **wide)
        self.group_by = widgets.Dropdown(description="group by", **wide)
        self.figure_kind = widgets.Dropdown(
            description="figure", options=list(FIGURES.items()), value="throughput", **wide
        )
        self.focus_run = widgets.Dropdown(description="run", **wide)
        self.refresh_button = widgets.Button(description="reload", icon="refresh")
        self.message = widgets.HTML()
        self.finding = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.baseline = widgets.HTML(layout=widgets.Layout(width="100%"))
        # A block, not the HTML widget's flex row: the table scrolls in its own box and the
        # notes under it wrap at the cell's width, not at the table's.
        self.table = widgets.HTML(
            layout=widgets.Layout(display="block", max_width="100%", overflow="auto")
        )
        self.what_if = WhatIf(lambda: self.selection()[:2])
        self._fill_sweeps(list(sweeps) if sweeps is not None else None)
        self._fill_runs(redraw=False)
        # Created with the first figure's data and layout: a widget's later updates travel as
        # messages, so a saved notebook (papermill, static export) keeps only what it began with.
        fig, table = self._build_or_explain()
        fig, definition = lift_definition(fig)
        self.definition = widgets.HTML(definition, layout=widgets.Layout(width="100%"))
        spec = fig.spec  # validated once, by the widget
        self.figure = go.FigureWidget(data=spec["data"], layout=spec["layout"])
        self._show_text(table)
        picks = [self.figure_kind, self.focus_run, self.refresh_button]
        columns = widgets.HBox(
            [
                widgets.VBox([self.sweeps, self.runs], layout=_column("3")),
                widgets.VBox(picks, layout=_column("2")),
            ],
            layout=widgets.Layout(width="100%"),
        )
        # The grouping's label names its columns: a row of its own, so it is not cut off.
        controls = widgets.VBox([columns, self.group_by], layout=widgets.Layout(width="100%"))
        parts = [self.finding, controls, self.message, self.baseline, self.definition]
        parts += [self.figure, self.table, self.what_if]
        super().__init__(parts, layout=widgets.Layout(width="100%"))
        self.sweeps.observe(self._on_sweeps, "value")
        for control in (self.runs, self.group_by, self.figure_kind, self.focus_run):
            control.observe(self._on_control, "value")
        self.refresh_button.on_click(lambda _: self.refresh())

    # -- data
    def _sweep_data(self, sweep: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        if sweep not in self._cache:
            dirs = iter_run_dirs(self.output_dir, [sweep])
            self._cache[sweep] = (load_runs(self.output_dir, [sweep]), load_traces(dirs, "eval"))
        return self._cache[sweep]

    def selection(self) -> tuple[pd.DataFrame, StoredSteps, pd.DataFrame]:
        """runs, steps (left in the engine: a sweep of a thousand ranks stays small here) and
        evals of the selected runs; the same frames while the selection stays (what the
        analysis computed for them is kept with the steps, by frame)."""
        key = (self.sweeps.value, self.runs.value)
        if self._selected is None or self._selected[0] != key:
            runs, evals = self._select()
            self._selected = (key, runs, evals)
        _, runs, evals = self._selected
        paths = tuple(str(p) for p in runs["path"])
        if self._stored is None or self._stored[0] != paths:
            self._close_stored()
            self._stored = (paths, open_steps(paths, evals))  # digests once each run has ended
        return runs, self._stored[1], evals

    def _select(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The selected runs and their evaluations, from the sweeps' frames."""
        parts = [self._sweep_data(s) for s in self.sweeps.value]
        if parts:
            runs, evals = (pd.concat([p[i] for p in parts], ignore_index=True) for i in range(2))
            chosen = list(self.runs.value)
            runs = runs[runs["run_id"].isin(chosen)].reset_index(drop=True)
            evals = evals[evals["run_id"].isin(chosen)].reset_index(drop=True)
        else:
            runs, evals = pd.DataFrame(columns=["run_id", "path"]), load_traces([], "eval")
        return runs, evals

    def _close_stored(self) -> None:
        if self._stored is not None:
            self._stored[1].close()
            self._stored = None

    # -- controls
    def _fill_sweeps(self, wanted: list[str] | None) -> None:
        names = sorted({p.parent.name for p in iter_run_dirs(self.output_dir)})
        keep = [s for s in (self.sweeps.value if wanted is None else wanted) if s in names]
        unknown = sorted(set(wanted or ()) - set(names))
        self._busy = True
        try:
            self.sweeps.options = names
            self.sweeps.value = tuple(keep or (names if wanted is None else []))
        finally:
            self._busy = False
        note = f"sweeps not in {self.output_dir}: {', '.join(unknown)}. " if unknown else ""
        if not names:
            note += f"No runs in {self.output_dir} yet."
        self.message.value = html.escape(note)

    def _fill_runs(self, redraw: bool = True) -> None:
        frames = [self._sweep_data(s)[0] for s in self.sweeps.value]
        runs = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        options = []
        for row in runs.itertuples():
            ws = getattr(row, "world_size", "?")
            options.append((f"{row.sweep}/{row.run_id} (N={ws}, {row.status})", row.run_id))
        self._busy = True
        try:
            # Keep the user's choice; runs that are new to the list start selected.
            previous = {v for _, v in self.runs.options}
            ids = [v for _, v in options]
            kept = [v for v in self.runs.value if v in ids]
            self.runs.options = options
            self.runs.value = tuple(kept + [v for v in ids if v not in previous])
            self._fill_group_by(runs)
            self._fill_focus(runs)
        finally:
            self._busy = False
        if redraw:
            self._redraw()

    def _fill_group_by(self, runs: pd.DataFrame) -> None:
        default = default_group_by(runs) if len(runs) else []
        shown = ", ".join(default[:4]) + (
            f" and {len(default) - 4} more" if len(default) > 4 else ""
        )
        options: list[tuple[str, str | tuple[str, ...]]] = [
            (f"default: {shown or 'all runs'}", DEFAULT_GROUPING)
        ]
        # The usual single columns, and any other config column that differs between runs.
        columns = config_columns(runs) if len(runs) else []
        usual = (*LEADING_COLUMNS, *BATCH_COLUMNS)
        options += [(c, (c,)) for c in columns if c in usual or runs[c].map(str).nunique() > 1]
        values = [v for _, v in options]
        value = self.group_by.value if self.group_by.value in values else DEFAULT_GROUPING
        self.group_by.options = options
        self.group_by.value = value

    def _fill_focus(self, runs: pd.DataFrame) -> None:
        chosen = runs[runs["run_id"].isin(self.runs.value)] if len(runs) else runs
        if len(chosen) and "world_size" in chosen.columns:
            chosen = chosen.sort_values("world_size", ascending=False, kind="stable")
        ids = [str(r) for r in chosen.get("run_id", [])]
        self.focus_run.options = ids
        self.focus_run.value = (
            self.focus_run.value if self.focus_run.value in ids else (ids[0] if ids else None)
        )

    def _on_sweeps(self, _: Any) -> None:
        if not self._busy:
            self._fill_runs()

    def _on_control(self, change: dict[str, Any]) -> None:
        if self._busy:
            return
        if change["owner"] is self.runs:
            self._busy = True
            try:
                frames = [self._sweep_data(s)[0] for s in self.sweeps.value]
                self._fill_focus(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())
            finally:
                self._busy = False
        self._redraw()

    def refresh(self) -> None:
        """Reload the store (new runs, finished runs) and redraw."""
        self._cache.clear()
        self._selected = None
        self._close_stored()
        self._built = None
        self._fill_sweeps(None)
        self._fill_runs()

    # -- drawing
    def _build_or_explain(self) -> tuple[Figure, FigureContext | None]:
        self.focus_run.disabled = not figure_spec(self.figure_kind.value).one_run
        try:
            return self._draw()
        except ValueError as exc:  # e.g. a grouping that the selected runs cannot form
            return message_figure(f"cannot draw this: {exc}"), None

    def _show_text(self, ctx: FigureContext | None) -> None:
        """The scaling table (speedup and efficiency empty where a point is its own baseline
        without being one rank), the finding above the controls and the no-baseline warning."""
        has_table = ctx is not None and len(ctx.table) > 0
        self.table.value = (
            f'{TABLE_STYLE}<div class="workbench-table">'
            f"{scaling_table_html(honest_table(ctx.table), ctx.group_by)}</div>"
            if ctx is not None and has_table
            else "<i>No completed run with measured steps selected: no scaling table.</i>"
        )
        self.finding.value = finding_html(self._said)
        if self._stored is not None and self._stored[1].note:  # the rows read, and why
            self.table.value += f"<i>{html.escape(self._stored[1].note)}.</i>"
        notes = baseline_notes(ctx.table, ctx.group_by) if ctx is not None and has_table else []
        self.baseline.value = baseline_html(notes)

    def _redraw(self) -> None:
        fig, ctx = self._build_or_explain()
        fig, self.definition.value = lift_definition(fig)
        replace_figure(self.figure, fig)
        self._show_text(ctx)

    def _context(self) -> FigureContext | None:
        """The selection's frames, grouping and scaling table; None without traced steps."""
        chosen = self.group_by.value
        group_by = None if chosen in (None, DEFAULT_GROUPING) else list(chosen)
        # Switching figures must not recompute the table: keep it for the same selection.
        key = (self.sweeps.value, self.runs.value, chosen)
        if self._built is None or self._built[0] != key:
            self._built, self._said = None, []  # until this selection's table is made
            runs, steps, evals = self.selection()
            ctx = None
            if not steps.empty:
                keys = resolve_group_by(runs, group_by)
                ctx = figure_context(runs, steps, evals, keys)
                self._said = findings(
                    runs, steps, keys, evals
                )  # the report's words for the same runs
            self.what_if.follow(runs)
            self.what_if.predict()  # for this selection, not the last one
            self._built = (key, ctx)
        return self._built[1]

    def _draw(self) -> tuple[Figure, FigureContext | None]:
        ctx = self._context()
        if ctx is None:
            return message_figure("No traced steps in the selected runs"), None
        ctx.focus = self.focus_run.value
        key = self.figure_kind.value
        fig = self._speedup(ctx) if key == "speedup" else draw(key, ctx)
        if key in FROM_ZERO:
            fig.update_yaxes(rangemode="tozero")
        fig.update_layout(autosize=True)  # the cell's width, not plotly's default 700 px
        return fig, ctx

    def _speedup(self, ctx: FigureContext) -> Figure:
        """The speedup figure without the groups whose only point is their own baseline (a
        speedup of 1 and 100 % by definition); the missing-baseline message when none is left."""
        if not len(ctx.table):
            return draw("speedup", ctx)
        rows = speedup_rows(ctx.table, ctx.group_by)
        if not len(rows):
            return message_figure(NO_BASELINE)
        return draw("speedup", dataclasses.replace(ctx, table=rows))

    def build(self) -> tuple[Figure, pd.DataFrame | None]:
        """The selected figure (from :data:`workbench.ui.catalogue.CATALOGUE`, or a message
        saying what the selection lacks) and the scaling table for the current controls."""
        fig, ctx = self._draw()
        return fig, ctx.table if ctx is not None else None


__all__ = ["FIGURES", "Dashboard", "message_figure", "replace_figure"]
