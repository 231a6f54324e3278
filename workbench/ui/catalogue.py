"""The figure catalogue: every figure of the report and the dashboard, declared once.

A :class:`FigureSpec` names a figure (key, title, the dashboard's label), what it needs
(:class:`Need`: a predicate on the :class:`FigureContext` and what to say when it does not hold)
and how to build it from the context. The report draws every figure whose needs hold
(:func:`available_figures`); the dashboard draws the one picked, or a message figure saying what
is missing (:func:`draw`). No torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.measured.stored import StoredSteps, is_stored
from workbench.analysis.model.curve_links import CurveNetworks, networks_text
from workbench.analysis.model.network import NetworkModel, network_fit
from workbench.analysis.model.scaling_model import predicted_vs_measured
from workbench.analysis.throughput.breakdown import eval_breakdown, phase_breakdown
from workbench.analysis.throughput.comm import communication
from workbench.analysis.throughput.groups import resolve_group_by
from workbench.analysis.throughput.memory import memory_by_rank
from workbench.analysis.throughput.scaling import scaling_table
from workbench.ui import plots
from workbench.ui.plots import definitions as d


@dataclass
class FigureContext:
    """What figures are drawn from: the selected runs' frames, the scaling table computed from
    them with the explicit ``group_by``, the run shown per rank (``focus``) and the network for
    the scaling model (``None``: measured from the traces). Derived tables are computed once, on
    first use; ``focus`` may change between figures."""

    runs: pd.DataFrame
    steps: pd.DataFrame | StoredSteps
    evals: pd.DataFrame | None
    table: pd.DataFrame
    group_by: list[str]
    focus: str | None = None
    network: str | NetworkModel | None = None

    @cached_property
    def phases(self) -> pd.DataFrame:
        """:func:`workbench.analysis.phase_breakdown` of the steps (and evaluations)."""
        return phase_breakdown(self.steps, self.evals)

    @cached_property
    def comm(self) -> pd.DataFrame | None:
        """:func:`workbench.analysis.communication` per run and rank (exposed communication),
        ``None`` when the steps have no communication columns."""
        if not {"comm_s", "comm_bytes", "backward_s"} <= set(self.steps.columns):
            return None
        return communication(self.steps, self.runs, group_by=self.group_by)

    @cached_property
    def memory(self) -> pd.DataFrame:
        """:func:`workbench.analysis.memory_by_rank` of the steps."""
        return memory_by_rank(self.steps)

    @cached_property
    def networks(self) -> CurveNetworks:
        """``network`` as given, or one per link class measured on the completed runs that
        crossed it (within a node, across nodes), as the scaling model uses them."""
        given = None if self.network is None else network_fit(self.network, self.steps, self.runs)
        return CurveNetworks(given, self.runs, self.steps)

    @cached_property
    def predicted(self) -> pd.DataFrame:
        """The scaling model next to the measurements (curves it cannot predict say why in
        ``note``); empty without a table."""
        if not len(self.table):
            return pd.DataFrame()
        # the network as given, else measured per link class (intra-node, inter-node) on the
        # runs that crossed it: one fit over both would describe neither
        network = self.networks.given
        return predicted_vs_measured(self.runs, self.steps, network, group_by=self.group_by)


def figure_context(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    evals: pd.DataFrame | None,
    group_by: Sequence[str] | None = None,
    focus: str | None = None,
    network: str | NetworkModel | None = None,
) -> FigureContext:
    """Resolve ``group_by`` once, compute the scaling table with it, and hold both for figures."""
    evals = evals if evals is not None and len(evals) else None
    keys = resolve_group_by(runs, group_by)
    table = scaling_table(runs, steps, evals, group_by=keys)
    return FigureContext(runs, steps, evals, table, keys, focus=focus, network=network)


def focus_run(steps: pd.DataFrame, found: pd.DataFrame) -> str | None:
    """The run to show per rank: the first with a straggler (``found``), else the largest."""
    if len(found):
        return str(found["run_id"].iloc[0])
    if steps.empty:
        return None
    return str(_world_sizes(steps).idxmax())


def _world_sizes(steps: pd.DataFrame | StoredSteps) -> pd.Series:
    """Per run with step rows (sorted), its largest world size."""
    if is_stored(steps):
        return steps.runs.set_index("run_id")["world_size"]
    return steps.groupby("run_id", sort=True)["world_size"].max()


def _has_loss(steps: pd.DataFrame | StoredSteps) -> bool:
    if is_stored(steps):
        return bool(steps.runs["has_loss"].any())
    return _has(steps, "loss")


def _has(frame: pd.DataFrame | None, column: str) -> bool:
    return frame is not None and column in frame.columns and bool(frame[column].notna().any())


@dataclass(frozen=True)
class Need:
    """One thing a figure needs: what (for people), whether it holds, and what to say if not
    (``{focus}`` is filled in)."""

    what: str
    holds: Callable[[FigureContext], bool]
    message: str


SCALING = Need(
    "the scaling table",
    lambda c: len(c.table) > 0,
    "No completed run with measured steps selected",
)
EPOCH = Need(
    "epoch_s", lambda c: _has(c.table, "epoch_s"), "No train_samples recorded: no time per epoch"
)
FINAL_METRIC = Need(
    "final_metric",
    lambda c: _has(c.table, "final_metric"),
    "No evaluation metric in the selected runs",
)
FINAL_LOSS = Need("final_loss", lambda c: _has(c.table, "final_loss"), "No final training loss")
FOCUS_TRACED = Need(
    "steps of the focus run",
    lambda c: c.focus is not None and c.focus in set(_world_sizes(c.steps).index),
    "No traced steps in run {focus}",
)
FOCUS_MEASURED = Need(
    "measured steps of the focus run",
    lambda c: c.focus is not None and c.focus in set(c.phases["run_id"]),
    "No measured steps in run {focus}",
)
FOCUS_MULTI_RANK = Need(
    "a multi-rank focus run",
    lambda c: _world_sizes(c.steps).get(c.focus, 0) > 1,
    "Run {focus} has one rank: its compute time is its step time",
)
LOSS = Need("loss", lambda c: _has_loss(c.steps), "No training loss in the selected runs")
EVALS = Need("evals", lambda c: c.evals is not None, "No evaluations in the selected runs")
EVAL_METRIC = Need(
    "metric_value",
    lambda c: _has(c.evals, "metric_value"),
    "No evaluation metric in the selected runs",
)
PREDICTED = Need(
    "predicted rows", lambda c: len(c.predicted) > 0, "No run the scaling model can start from"
)


@dataclass(frozen=True)
class FigureSpec:
    """One figure: its key, its title (the report's heading; one-run figures add the run), what
    it needs, how to build it, what it shows (``definition``: formula, window, sampling; the
    figure's subtitle wherever it is drawn), the dashboard's dropdown label (``None``: report
    only), and the figure the dashboard draws instead when a need is missing (``fallback``)."""

    key: str
    title: str
    needs: tuple[Need, ...]
    build: Callable[[FigureContext], go.Figure]
    definition: str
    label: str | None = None
    one_run: bool = False
    fallback: str | None = None

    def missing(self, ctx: FigureContext) -> str | None:
        """What is missing to draw this figure from ``ctx`` (the first unmet need), or None."""
        for need in self.needs:
            if not need.holds(ctx):
                return need.message.format(focus=ctx.focus)
        return None

    def heading(self, ctx: FigureContext) -> str:
        """The title, naming the focus run for a one-run figure."""
        return f"{self.title}, run {ctx.focus}" if self.one_run else self.title

    def figure(self, ctx: FigureContext) -> go.Figure:
        """The figure from ``ctx`` with its definition in the subtitle (after its own notes),
        and in ``layout.meta`` for a page that folds it away (``plots.split_definition``)."""
        fig = plots.subtitle(self.build(ctx), self.definition)
        return fig.update_layout(meta={"definition": self.definition})


def _predicted(c: FigureContext) -> go.Figure:
    links = c.predicted["link_class"] if "link_class" in c.predicted.columns else ()
    name = networks_text(c.networks, list(dict.fromkeys(links)))
    return plots.predicted_vs_measured_figure(c.predicted, group_by=c.group_by, network=name)


_FOCUS = (FOCUS_MEASURED,)

#: Every figure, in the report's order (the dashboard lists those with a label, in this order).
CATALOGUE: tuple[FigureSpec, ...] = (
    FigureSpec(
        "throughput",
        "Throughput per device",
        (SCALING,),
        lambda c: plots.throughput_per_device_figure(c.table, group_by=c.group_by),
        d.definition(d.THROUGHPUT, d.WINDOW, d.SPREAD, d.FLOPS),
        label="throughput per device",
    ),
    FigureSpec(
        "speedup",
        "Speedup",
        (SCALING,),
        lambda c: plots.speedup_figure(c.table, group_by=c.group_by),
        d.definition(d.SPEEDUP, d.EFFICIENCY, d.THROUGHPUT, d.WINDOW, d.SPEEDUP_SPREAD),
        label="speedup (with ideal)",
    ),
    FigureSpec(
        "epoch_time",
        "Time per epoch",
        (SCALING, EPOCH),
        lambda c: plots.epoch_time_figure(c.table, group_by=c.group_by),
        d.definition(d.EPOCH, d.THROUGHPUT, d.WINDOW, d.SPREAD),
        label="time per epoch",
    ),
    FigureSpec(
        "tradeoff",
        "Accuracy against speed",
        (SCALING, FINAL_METRIC),
        lambda c: plots.tradeoff_figure(c.table, group_by=c.group_by),
        d.definition(d.FINAL, d.SPEEDUP, d.SPREAD),
        label="accuracy vs devices (trade-off)",
        fallback="quality",
    ),
    FigureSpec(
        "quality",
        "Quality against devices",
        (SCALING, FINAL_LOSS),
        lambda c: plots.quality_vs_devices_figure(c.table, group_by=c.group_by),
        d.definition(d.FINAL, d.SPREAD),
    ),
    FigureSpec(
        "phases",
        "Phases per run",
        (),
        lambda c: plots.phase_breakdown_figure(c.phases, by="run", comm=c.comm),
        d.definition("One bar per run, mean of its ranks.", d.PHASES, d.WINDOW, d.COMM_SAMPLING),
        label="phase breakdown (per run)",
    ),
    FigureSpec(
        "phases_rank",
        "Phases per rank",
        _FOCUS,
        lambda c: plots.phase_breakdown_figure(c.phases, c.focus, comm=c.comm),
        d.definition("One bar per rank.", d.RANK_QUANTILES, d.PHASES, d.WINDOW, d.COMM_SAMPLING),
        label="phase breakdown (per rank of one run)",
        one_run=True,
    ),
    FigureSpec(
        "heatmap",
        "Step time",
        _FOCUS,
        lambda c: plots.step_time_heatmap(c.steps, c.focus),
        d.definition(d.HEATMAP, d.BINNED, d.WINDOW),
        label="step-time heatmap (one run)",
        one_run=True,
    ),
    FigureSpec(
        "compute_heatmap",
        "Compute time",
        (*_FOCUS, FOCUS_MULTI_RANK),
        lambda c: plots.step_time_heatmap(c.steps, c.focus, value="compute_s"),
        d.definition(d.COMPUTE, d.BINNED, d.WINDOW, d.COMM_SAMPLING),
        one_run=True,
    ),
    FigureSpec(
        "compute_spread",
        "Compute time across ranks",
        (*_FOCUS, FOCUS_MULTI_RANK),
        lambda c: plots.rank_spread_figure(c.steps, c.focus),
        d.definition(d.COMPUTE, d.RANK_BANDS, d.WINDOW, d.COMM_SAMPLING),
        one_run=True,
    ),
    FigureSpec(
        "memory",
        "Peak memory per rank",
        (FOCUS_TRACED,),
        lambda c: plots.memory_figure(c.memory, c.focus),
        d.definition(d.MEMORY, d.RANK_QUANTILES),
        label="memory per rank",
        one_run=True,
    ),
    FigureSpec(
        "eval",
        "Evaluation time",
        (EVALS,),
        lambda c: plots.eval_breakdown_figure(eval_breakdown(c.evals)),
        d.EVAL,
        label="evaluation breakdown",
    ),
    FigureSpec(
        "loss",
        "Training loss",
        (LOSS,),
        lambda c: plots.loss_curves_figure(c.steps),
        d.LOSS,
        label="loss curves",
    ),
    FigureSpec(
        "metric",
        "Evaluation metric",
        (EVALS, EVAL_METRIC),
        lambda c: plots.metric_curves_figure(c.evals),
        d.METRIC,
    ),
    FigureSpec(
        "predicted",
        "Predicted against measured",
        (SCALING, PREDICTED),
        _predicted,
        d.definition(d.PREDICTED, d.SPEEDUP, d.COMM_SAMPLING),
        label="predicted vs measured",
    ),
)


def figure_spec(key: str) -> FigureSpec:
    """The catalogue's figure of that key; ValueError with the valid keys otherwise."""
    for spec in CATALOGUE:
        if spec.key == key:
            return spec
    raise ValueError(f"unknown figure {key!r}; valid names: {', '.join(s.key for s in CATALOGUE)}")


def dashboard_figures() -> dict[str, str]:
    """The dashboard's dropdown: label -> key for the figures that have a label."""
    return {spec.label: spec.key for spec in CATALOGUE if spec.label is not None}


def draw(key: str, ctx: FigureContext) -> go.Figure:
    """The figure ``key`` from ``ctx``; its fallback, or a message figure saying what is missing,
    when a need is not met."""
    spec = figure_spec(key)
    missing = spec.missing(ctx)
    if missing is None:
        return spec.figure(ctx)
    if spec.fallback is not None:
        other = figure_spec(spec.fallback)
        if other.missing(ctx) is None:
            return other.figure(ctx)
    return plots.message_figure(missing)


def available_figures(ctx: FigureContext) -> list[tuple[str, go.Figure]]:
    """(heading, figure) for every figure whose needs ``ctx`` meets, in catalogue order."""
    return [
        (spec.heading(ctx), spec.figure(ctx)) for spec in CATALOGUE if spec.missing(ctx) is None
    ]
