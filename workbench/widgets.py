"""ipywidgets for notebooks: a launch panel, a live run monitor and a dashboard over the store.

Widgets only compose :mod:`workbench.analysis` (tables) and :mod:`workbench.plots` (figures); they
compute nothing of their own. The monitor reads the run's streaming trace files (JSONL while the
run is live, Parquet after), so it works for any executor and never polls a scheduler. No torch
at import time: a dashboard opens on a laptop with no GPU stack.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from . import analysis, plots, schema
from .config import MODEL_OPTIONS, PRECISIONS, RunConfig
from .errors import ConfigError, PreflightError
from .launch import RunHandle
from .store import iter_run_dirs, load_runs, load_traces, read_json

FINAL_STATUSES = ("completed", "failed", "cancelled", "preempted")

#: Dashboard figures: label shown in the dropdown -> key.
FIGURES: dict[str, str] = {
    "throughput per device": "throughput",
    "speedup (with ideal)": "speedup",
    "time per epoch": "epoch_time",
    "accuracy vs devices (trade-off)": "tradeoff",
    "phase breakdown (per run)": "phases",
    "phase breakdown (per rank of one run)": "phases_rank",
    "step-time heatmap (one run)": "heatmap",
    "memory per rank": "memory",
    "evaluation breakdown": "eval",
    "loss curves": "loss",
    "predicted vs measured": "predicted",
}
_ONE_RUN_FIGURES = ("phases_rank", "heatmap")
#: The group-by dropdown's value for :func:`workbench.analysis.default_group_by` (a Dropdown
#: treats None as "nothing selected", so a sentinel string stands for it).
DEFAULT_GROUPING = "default"
_TABLE_COLUMNS = (
    "world_size",
    "runs",
    "samples_per_s",
    "samples_per_s_per_device",
    "speedup",
    "ideal_speedup",
    "efficiency",
    "epoch_s",
    "final_loss",
    "final_metric",
)


def message_figure(text: str) -> go.Figure:
    """An empty figure that says why there is nothing to plot."""
    fig = go.Figure(layout={"template": "plotly_white", "title": {"text": text}})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def replace_figure(widget: go.FigureWidget, fig: go.Figure) -> None:
    """Show ``fig`` in ``widget`` in place: the same FigureWidget gets the new traces and layout.

    Assigning a layout only sends the new keys to the browser, so keys of the old layout are
    removed first (else a second subplot's axis or title would linger).
    """
    widget.data = ()
    stale = [k for k in widget.layout.to_plotly_json() if k != "template"]
    if stale:
        widget.plotly_relayout({k: None for k in stale})
    widget.add_traces(list(fig.data))
    widget.layout = fig.layout


def _table_html(table: pd.DataFrame) -> str:
    keys = [c for c in table.attrs.get("group_by", []) if c in table.columns]
    cols = keys + [c for c in _TABLE_COLUMNS if c in table.columns and c not in keys]
    body = table[cols].to_html(
        index=False, border=0, na_rep="", float_format=lambda v: f"{v:.4g}", classes="table"
    )
    return f'<div style="overflow-x:auto">{body}</div>'


class Dashboard(widgets.VBox):
    """Pick sweeps and runs, a grouping and a figure; the figure and the scaling table follow.

    ``figure`` is one ``plotly.graph_objects.FigureWidget`` updated in place when a control
    changes; ``table`` an HTML widget with the scaling table. :meth:`refresh` reloads the store.
    """

    def __init__(
        self, output_dir: str | Path = "experiments/results", sweeps: Iterable[str] | None = None
    ) -> None:
        self.output_dir = Path(output_dir)
        self._cache: dict[str, tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]] = {}
        self._busy = False  # set while controls are filled in code: one redraw, not many
        self._built: tuple[Any, Any, pd.DataFrame | None] | None = None
        layout = widgets.Layout(width="auto")
        self.sweeps = widgets.SelectMultiple(description="sweeps", rows=4, layout=layout)
        self.runs = widgets.SelectMultiple(description="runs", rows=6, layout=layout)
        self.group_by = widgets.Dropdown(description="group by", layout=layout)
        self.figure_kind = widgets.Dropdown(
            description="figure", options=list(FIGURES.items()), value="throughput"
        )
        self.focus_run = widgets.Dropdown(description="run", layout=layout)
        self.refresh_button = widgets.Button(description="reload", icon="refresh")
        self.message = widgets.HTML()
        self.table = widgets.HTML(layout=widgets.Layout(max_width="100%", overflow="auto"))
        self._fill_sweeps(list(sweeps) if sweeps is not None else None)
        self._fill_runs(redraw=False)
        # Created with the first figure's data and layout: a widget's later updates travel as
        # messages, so a saved notebook (papermill, static export) keeps only what it began with.
        fig, table = self._build_or_explain()
        self.figure = go.FigureWidget(data=fig.data, layout=fig.layout)
        self._show_table(table)
        controls = widgets.HBox(
            [
                widgets.VBox([self.sweeps, self.runs]),
                widgets.VBox(
                    [self.figure_kind, self.group_by, self.focus_run, self.refresh_button]
                ),
            ]
        )
        super().__init__([controls, self.message, self.figure, self.table])
        self.sweeps.observe(self._on_sweeps, "value")
        for control in (self.runs, self.group_by, self.figure_kind, self.focus_run):
            control.observe(self._on_control, "value")
        self.refresh_button.on_click(lambda _: self.refresh())

    # -- data
    def _sweep_data(self, sweep: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        if sweep not in self._cache:
            dirs = iter_run_dirs(self.output_dir, [sweep])
            self._cache[sweep] = (
                load_runs(self.output_dir, [sweep]),
                load_traces(dirs, "steps"),
                load_traces(dirs, "eval"),
            )
        return self._cache[sweep]

    def selection(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """runs, steps and evals of the selected runs."""
        parts = [self._sweep_data(s) for s in self.sweeps.value]
        if not parts:
            return pd.DataFrame(columns=["run_id"]), load_traces([]), load_traces([], "eval")
        runs, steps, evals = (pd.concat([p[i] for p in parts], ignore_index=True) for i in range(3))
        chosen = list(self.runs.value)
        return (
            runs[runs["run_id"].isin(chosen)].reset_index(drop=True),
            steps[steps["run_id"].isin(chosen)].reset_index(drop=True),
            evals[evals["run_id"].isin(chosen)].reset_index(drop=True),
        )

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
        default = analysis.default_group_by(runs) if len(runs) else []
        options: list[tuple[str, str | tuple[str, ...]]] = [
            (f"default: {', '.join(default) or 'all runs'}", DEFAULT_GROUPING)
        ]
        options += [(c, (c,)) for c in analysis.CONFIG_COLUMNS if c in runs.columns]
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
        self._built = None
        self._fill_sweeps(None)
        self._fill_runs()

    # -- drawing
    def _build_or_explain(self) -> tuple[go.Figure, pd.DataFrame | None]:
        self.focus_run.disabled = self.figure_kind.value not in _ONE_RUN_FIGURES
        try:
            return self.build()
        except ValueError as exc:  # e.g. a grouping that the selected runs cannot form
            return message_figure(f"cannot draw this: {exc}"), None

    def _show_table(self, table: pd.DataFrame | None) -> None:
        self.table.value = (
            _table_html(table)
            if table is not None and len(table)
            else "<i>No completed run with measured steps selected: no scaling table.</i>"
        )

    def _redraw(self) -> None:
        fig, table = self._build_or_explain()
        replace_figure(self.figure, fig)
        self._show_table(table)

    def build(self) -> tuple[go.Figure, pd.DataFrame | None]:
        """The selected figure and the scaling table for the current controls."""
        chosen = self.group_by.value
        group_by = None if chosen in (None, DEFAULT_GROUPING) else list(chosen)
        # Switching figures must not recompute the table: keep it for the same selection.
        key = (self.sweeps.value, self.runs.value, chosen)
        if self._built is None or self._built[0] != key:
            runs, steps, evals = self.selection()
            table = None
            if len(steps):
                evals_or_none = evals if len(evals) else None
                table = analysis.scaling_table(runs, steps, evals_or_none, group_by=group_by)
            self._built = (key, (runs, steps, evals), table)
        _, (runs, steps, evals), table = self._built
        if table is None:
            return message_figure("No traced steps in the selected runs"), None
        evals_or_none = evals if len(evals) else None
        return self._figure(
            self.figure_kind.value, runs, steps, evals_or_none, table, group_by
        ), table

    def _figure(
        self,
        kind: str,
        runs: pd.DataFrame,
        steps: pd.DataFrame,
        evals: pd.DataFrame | None,
        table: pd.DataFrame,
        group_by: Sequence[str] | None,
    ) -> go.Figure:
        has = {c: c in table.columns and table[c].notna().any() for c in table.columns}
        if kind in ("throughput", "speedup", "epoch_time", "tradeoff") and not len(table):
            return message_figure("No completed run with measured steps selected")
        if kind == "throughput":
            return plots.throughput_per_device_figure(table)
        if kind == "speedup":
            return plots.speedup_figure(table)
        if kind == "epoch_time":
            if not has.get("epoch_s"):
                return message_figure("No train_samples recorded: no time per epoch")
            return plots.epoch_time_figure(table)
        if kind == "tradeoff":
            if has.get("final_metric"):
                return plots.tradeoff_figure(table)
            return plots.quality_vs_devices_figure(table)
        if kind == "phases":
            return plots.phase_breakdown_figure(analysis.phase_breakdown(steps), by="run")
        if kind == "phases_rank":
            phases = analysis.phase_breakdown(steps)
            run_id = self.focus_run.value
            if run_id not in set(phases["run_id"]):
                return message_figure(f"No measured steps in run {run_id}")
            return plots.phase_breakdown_figure(phases, run_id)
        if kind == "heatmap":
            return plots.step_time_heatmap(steps, self.focus_run.value)
        if kind == "memory":
            return plots.memory_figure(analysis.memory_by_rank(steps))
        if kind == "eval":
            if evals is None:
                return message_figure("No evaluations in the selected runs")
            return plots.eval_breakdown_figure(analysis.eval_breakdown(evals))
        if kind == "loss":
            return plots.loss_curves_figure(steps)
        if kind == "predicted":
            from .scaling_model import measured_network, predicted_vs_measured

            net = measured_network(steps)
            if net is None:
                return message_figure("No multi-rank run with communication: no network estimate")
            pvm = predicted_vs_measured(runs, steps, net, group_by=group_by)
            return plots.predicted_vs_measured_figure(pvm, network=net.description)
        raise ValueError(f"unknown figure {kind!r}; valid names: {', '.join(FIGURES.values())}")


class _TraceTail:
    """The step rows of one run so far, read incrementally: new JSONL lines since the last read,
    and a rank's Parquet file again only when it changed. Rows are keyed by (rank, attempt, step),
    so a row seen in both files (during consolidation) counts once."""

    _KEEP = (
        "rank",
        "world_size",
        "attempt",
        "step",
        "warmup",
        "t_start_s",
        "step_s",
        "samples",
        "loss",
        "run_id",
    )

    def __init__(self, traces_dir: Path) -> None:
        self.dir = traces_dir
        self._parquet: dict[Path, tuple[tuple[float, int], dict[tuple[int, int], dict]]] = {}
        self._jsonl: dict[Path, tuple[int, int, dict[tuple[int, int], dict]]] = {}

    def _read_parquet(self, path: Path) -> dict[tuple[int, int], dict]:
        stamp = (path.stat().st_mtime, path.stat().st_size)
        cached = self._parquet.get(path)
        if cached is None or cached[0] != stamp:
            import pyarrow.parquet as pq

            table = pq.read_table(path, columns=[c for c in self._KEEP])
            rows = {(r["attempt"], r["step"]): r for r in table.to_pylist()}
            self._parquet[path] = cached = (stamp, rows)
        return cached[1]

    def _read_jsonl(self, path: Path) -> dict[tuple[int, int], dict]:
        import json

        inode = path.stat().st_ino
        offset, old_inode, rows = self._jsonl.get(path, (0, inode, {}))
        if inode != old_inode or path.stat().st_size < offset:  # rewritten: read it afresh
            offset, rows = 0, {}
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits
        for line in complete.splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            rows[(r.get("attempt", 0), r["step"])] = {k: r.get(k) for k in self._KEEP}
        self._jsonl[path] = (offset + len(complete), inode, rows)
        return rows

    def frame(self) -> pd.DataFrame:
        """Every step row so far (the monitor's columns only)."""
        rows: list[dict] = []
        stems = {p.name.split(".")[0] for p in self.dir.glob("steps-rank*.*")}
        for stem in sorted(stems):
            merged: dict[tuple[int, int], dict] = {}
            for suffix, reader in ((".parquet", self._read_parquet), (".jsonl", self._read_jsonl)):
                path = self.dir / f"{stem}{suffix}"
                try:
                    merged.update(reader(path))
                except FileNotFoundError:  # consolidated (jsonl gone) or not written yet
                    self._jsonl.pop(path, None)
            rows.extend(merged.values())
        return pd.DataFrame(rows, columns=list(self._KEEP))


class RunMonitor(widgets.VBox):
    """Live progress of one run from its trace files: a bar per rank (steps done of
    ``config.total_steps``), throughput over the measured window, the latest loss and the status.

    ``run`` is a :class:`RunHandle` or a run folder. The status comes from the store (the ranks'
    own records), never from a scheduler, so it works for local and Slurm runs alike.
    """

    def __init__(self, run: RunHandle | str | Path, poll_s: float = 1.0) -> None:
        self.handle = run if isinstance(run, RunHandle) else None
        self.path = Path(run.path if isinstance(run, RunHandle) else run)
        self.config = RunConfig.load(self.path / schema.CONFIG_FILE)
        self.poll_s = poll_s
        self.total_steps = self.config.total_steps
        # A handle without a job: status() reads the store and the ranks' pids, nothing else.
        self._status_source = self.handle or RunHandle(self.path, self.config, None)
        self._tail = _TraceTail(self.path / schema.TRACES_DIR)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.status = "pending"
        self.steps_done: dict[int, int] = {}
        self.samples_per_s: float | None = None
        self.latest_loss: float | None = None
        self.error: str | None = None
        world = int(self.config.world_size)  # type: ignore[arg-type]
        self.bars = [
            widgets.IntProgress(value=0, min=0, max=self.total_steps, description=f"rank {r}")
            for r in range(world)
        ]
        self.bar_labels = [widgets.Label(f"0 / {self.total_steps}") for _ in range(world)]
        self.title = widgets.HTML(
            f"<b>{html.escape(self.path.name)}</b> &nbsp; sweep {html.escape(self.config.sweep)},"
            f" {self.config.model}, {world} rank(s), {self.total_steps} steps"
        )
        self.status_label = widgets.Label("status: pending")
        self.throughput_label = widgets.Label("throughput: -")
        self.loss_label = widgets.Label("loss: -")
        rows = [widgets.HBox([b, lab]) for b, lab in zip(self.bars, self.bar_labels, strict=True)]
        facts = widgets.HBox(
            [self.status_label, self.throughput_label, self.loss_label],
            layout=widgets.Layout(justify_content="space-between", width="600px"),
        )
        super().__init__([self.title, *rows, facts])

    @property
    def ended(self) -> bool:
        return self._final(self.status)

    def _final(self, status: str) -> bool:
        """Whether the run is over. "preempted" is final only once the run's record says it
        ended; until then the job is being requeued and will report "running" again."""
        if status != "preempted":
            return status in FINAL_STATUSES
        return read_json(self.path / schema.RUN_FILE).get("ended_at") is not None

    def refresh(self) -> str:
        """Read the store once and update the widgets; returns the status."""
        with self._lock:
            status = self._status_source.status()
            steps = self._tail.frame()
            self._show(status, steps)
            return status

    def _show(self, status: str, steps: pd.DataFrame) -> None:
        self.status = status
        if len(steps):
            done = steps.groupby("rank")["step"].max()
            self.steps_done = {int(r): int(s) for r, s in done.items()}
            window = analysis.measured_window(steps)
            rate = float(window["samples_per_s"].iloc[0]) if len(window) else float("nan")
            self.samples_per_s = None if pd.isna(rate) else rate
            last = steps[steps["step"] == steps["step"].max()]
            loss = last["loss"].astype("float64").mean()
            self.latest_loss = None if pd.isna(loss) else float(loss)
        for rank, (bar, label) in enumerate(zip(self.bars, self.bar_labels, strict=True)):
            bar.value = min(self.steps_done.get(rank, 0), self.total_steps)
            bar.bar_style = {"completed": "success", "failed": "danger"}.get(status, "")
            label.value = f"{self.steps_done.get(rank, 0)} / {self.total_steps}"
        self.status_label.value = f"status: {status}"
        if self.samples_per_s is not None:
            self.throughput_label.value = f"throughput: {self.samples_per_s:,.1f} samples/s"
        if self.latest_loss is not None:
            self.loss_label.value = f"loss: {self.latest_loss:.4g}"
        if status == "failed":
            failure = self._failure_text()
            self.status_label.value = f"status: failed ({failure})" if failure else "status: failed"

    def _failure_text(self) -> str | None:
        try:
            failure = read_json(self.path / schema.RUN_FILE).get("failure") or {}
        except (OSError, ValueError):
            return None
        if failure.get("exception"):
            return f"rank {failure.get('rank')}: {failure['exception']}"
        return None

    def _finish(self) -> None:
        """With a handle, let it record the outcome in run.json (status, summary) and clean up;
        the ranks are done by now, so this returns promptly."""
        if self.handle is not None:
            try:
                self.handle.wait(raise_on_failure=False)
            except Exception as exc:  # the monitor reports; it must not raise from a thread
                self.error = f"{type(exc).__name__}: {exc}"
        self.refresh()

    def wait(self, timeout_s: float | None = None) -> str:
        """Poll until the run ends (``TimeoutError`` after ``timeout_s``; the run goes on), then
        refresh a last time. Returns the final status."""
        self.stop()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._final(self.refresh()):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.path.name} still {self.status} after {timeout_s} s")
            time.sleep(self.poll_s)
        self._finish()
        return self.status

    def start(self) -> RunMonitor:
        """Poll in a background thread until the run ends (or :meth:`stop`); returns self."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    if self._final(self.refresh()):
                        self._finish()
                        return
                except Exception as exc:  # a torn file or a vanished folder: show, keep polling
                    self.error = f"{type(exc).__name__}: {exc}"
                self._stop.wait(self.poll_s)

        self._thread = threading.Thread(target=loop, name=f"monitor-{self.path.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop background polling (the run itself goes on)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._thread = None


class LaunchPanel(widgets.VBox):
    """A form for the main knobs of a run. :meth:`config` builds and validates a RunConfig
    (problems are shown in the panel, not raised); the Launch button, or :meth:`launch`, starts
    it and shows a :class:`RunMonitor` below.

    ``base`` supplies every field the form does not show (dataset sizes, epochs, seed...).
    """

    def __init__(
        self, base: RunConfig | None = None, executor: str = "local", **executor_options: Any
    ) -> None:
        self.base = base or RunConfig(per_device_batch_size=32, max_steps=50)
        self.executor = executor
        self.executor_options = executor_options
        b = self.base
        style = {"description_width": "170px"}
        self.model = widgets.Dropdown(
            description="model",
            options=list(MODEL_OPTIONS),
            value=b.model if b.model in MODEL_OPTIONS else "mlp",
            style=style,
        )
        self.world_size = widgets.BoundedIntText(
            description="world_size", value=b.world_size, min=1, max=4096, style=style
        )
        self.per_device_batch_size = widgets.BoundedIntText(
            description="per_device_batch_size",
            value=b.per_device_batch_size,
            min=1,
            max=1 << 20,
            style=style,
        )
        self.max_steps = widgets.BoundedIntText(
            description="max_steps (0: epochs)",
            value=b.max_steps or 0,
            min=0,
            max=10**9,
            style=style,
        )
        self.precision = widgets.Dropdown(
            description="precision", options=list(PRECISIONS), value=b.precision, style=style
        )
        self.learning_rate = widgets.FloatText(
            description="learning_rate", value=b.learning_rate, style=style
        )
        self.sweep = widgets.Text(description="sweep", value=b.sweep, style=style)
        self.launch_button = widgets.Button(
            description="Launch", button_style="primary", icon="play"
        )
        self.errors = widgets.HTML()
        self.monitor_box = widgets.VBox()
        self.monitor: RunMonitor | None = None
        self.handle: RunHandle | None = None
        fields = [
            self.model,
            self.world_size,
            self.per_device_batch_size,
            self.max_steps,
            self.precision,
            self.learning_rate,
            self.sweep,
        ]
        for f in fields:
            f.observe(lambda _: self.config(), "value")
        self.launch_button.on_click(lambda _: self.launch())
        super().__init__([*fields, self.launch_button, self.errors, self.monitor_box])
        self.config()

    def _show_problems(self, title: str, problems: Sequence[Any]) -> None:
        items = "".join(f"<li>{html.escape(str(p))}</li>" for p in problems)
        self.errors.value = (
            f'<div style="color:#b00020"><b>{html.escape(title)}</b><ul>{items}</ul></div>'
        )

    def config(self) -> RunConfig | None:
        """The RunConfig the form describes, or None (the problems are shown in the panel)."""
        changes: dict[str, Any] = {
            "model": self.model.value,
            "world_size": self.world_size.value,
            "tasks_per_node": None,
            "nodes": 1,
            "per_device_batch_size": self.per_device_batch_size.value,
            "global_batch_size": None,
            "max_steps": self.max_steps.value or None,
            "precision": self.precision.value,
            "learning_rate": self.learning_rate.value,
            "sweep": self.sweep.value.strip(),
            "run_name": None,
        }
        if self.model.value != self.base.model:
            changes["model_options"] = {}  # another model's sizes would not fit this one
        try:
            config = self.base.replace(**changes)
        except ConfigError as exc:
            self._show_problems("Fix these before launching:", exc.problems)
            return None
        self.errors.value = (
            f"<span style='color:#555'>{config.total_steps} steps, global batch "
            f"{config.global_batch_size}, {config.train_samples} training samples</span>"
        )
        return config

    def launch(self) -> RunHandle | None:
        """Launch the form's config and show a live monitor below; None when it is invalid or
        the machine cannot run it (the problems are shown in the panel)."""
        from .launch import launch

        config = self.config()
        if config is None:
            return None
        try:
            handle = launch(config, self.executor, **self.executor_options)
        except PreflightError as exc:
            self._show_problems("Cannot launch on this machine:", exc.problems)
            return None
        if self.monitor is not None:
            self.monitor.stop()
        self.handle = handle
        self.monitor = RunMonitor(handle)
        self.monitor_box.children = [self.monitor]
        self.monitor.start()
        return handle
