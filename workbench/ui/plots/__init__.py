"""Tables and frames to plotly figures: one function per figure, each returning a
:class:`~workbench.ui.plots.figure.Figure` (plotly's plain spec, validated into a ``go.Figure``
only where plotly's API is asked of it: ``fig.data``, ``fig.show()``).

No function shows or writes a figure: the notebook, the widgets and the report decide. Inputs are
the tables of :mod:`workbench.analysis` and :mod:`workbench.analysis.model.scaling_model` (or the
raw trace frames for curves and heatmaps); scaling figures take the ``group_by`` list the table was
computed with. Units are in axis titles and hover text. No torch.

``scaling`` (against devices), ``timing`` (phases, heatmap), ``spread`` (a value across ranks over
the steps), ``memory``, ``curves`` (loss, metric, evaluation parts), ``binning`` (how figures of
many ranks and steps are binned), ``style`` (what they share) and ``figure`` (the spec).
"""

from workbench.ui.plots.curves import (
    eval_breakdown_figure,
    hidden_curves,
    loss_curves_figure,
    metric_curves_figure,
)
from workbench.ui.plots.figure import Figure
from workbench.ui.plots.memory import memory_figure
from workbench.ui.plots.scaling import (
    epoch_time_figure,
    predicted_vs_measured_figure,
    quality_vs_devices_figure,
    speedup_figure,
    throughput_per_device_figure,
    tradeoff_figure,
)
from workbench.ui.plots.spread import rank_spread_figure
from workbench.ui.plots.style import (
    GIB,
    group_labels,
    message_figure,
    split_definition,
    subtitle,
)
from workbench.ui.plots.timing import PHASE_NAMES, phase_breakdown_figure, step_time_heatmap

__all__ = [
    "Figure",
    "split_definition",
    "GIB",
    "PHASE_NAMES",
    "epoch_time_figure",
    "eval_breakdown_figure",
    "group_labels",
    "hidden_curves",
    "loss_curves_figure",
    "memory_figure",
    "message_figure",
    "metric_curves_figure",
    "phase_breakdown_figure",
    "predicted_vs_measured_figure",
    "quality_vs_devices_figure",
    "rank_spread_figure",
    "speedup_figure",
    "step_time_heatmap",
    "subtitle",
    "throughput_per_device_figure",
    "tradeoff_figure",
]
