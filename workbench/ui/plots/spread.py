"""One run's per-rank values over its steps: a line per rank up to ``BAND_RANKS`` ranks, past
that the spread across ranks as quantile bands (min, p10, median, p90, max) with the slowest
rank's own line, so 1,024 ranks draw as six lines, not 1,024."""

from __future__ import annotations

from typing import Any

import pandas as pd

from workbench.analysis.measured.stored import is_stored
from workbench.ui.plots.binning import (
    BAND_RANKS,
    MAX_COLUMNS,
    bin_steps,
    rank_bands,
    slowest_rank,
)
from workbench.ui.plots.figure import Figure
from workbench.ui.plots.style import COLORS, LAYOUT, MS, one_run, subtitle
from workbench.ui.plots.timing import rank_step_values, stored_run, value_label

#: The bands' colour (the slowest rank's line is drawn in red over it).
BAND = "rgba(31, 119, 180, {alpha})"


def _line(frame: pd.DataFrame, y: str, name: str, hover: str, **style: object) -> dict[str, Any]:
    return {
        "type": "scatter",
        "x": frame["step"],
        "y": frame[y] * MS,
        "mode": "lines",
        "name": name,
        "hovertemplate": f"{hover}<br>step %{{x}}<br>%{{y:.3g}} ms<extra></extra>",
        **style,
    }


def rank_spread_figure(
    steps: pd.DataFrame,
    run_id: str | None = None,
    value: str = "compute_s",
    max_steps: int = MAX_COLUMNS,
    max_ranks: int = BAND_RANKS,
) -> Figure:
    """``value`` (default ``compute_s``, what each rank computes itself) per rank against step,
    each rank's steps binned to at most ``max_steps`` points (the median per bin of consecutive
    steps, :func:`workbench.ui.plots.binning.bin_steps`). Up to ``max_ranks`` ranks: a line per
    rank. More: the min, p10, median, p90 and max across ranks per bin
    (:func:`workbench.ui.plots.binning.rank_bands`; p10-p90 and min-max shaded) and the
    slowest rank's own line, named (the largest median over its bins)."""
    if is_stored(steps):  # binned in the engine
        run_id = stored_run(steps, run_id)
        binned, size = steps.binned(run_id, value, max_steps)
        binned, label = binned.drop(columns="host"), value_label(value)
    else:
        run_id = one_run(steps, run_id)
        frame, label = rank_step_values(steps, run_id, value)
        binned, size = bin_steps(frame, "v", max_steps)
    ranks = binned["rank"].nunique()
    per_bin = "" if size == 1 else f", median per bin of {size} steps"
    fig = Figure()
    if ranks <= max_ranks:
        for i, (rank, rows) in enumerate(binned.groupby("rank", sort=True)):
            color = COLORS[i % len(COLORS)]
            fig.add_trace(_line(rows, "v", f"rank {rank}", f"rank {rank}", line={"color": color}))
        how = f"a line per rank{per_bin}"
    else:
        bands = rank_bands(binned, "v")
        # plotly fills each trace down to the one before it: max, then p90 (max-p90 shaded
        # light), p10 (p90-p10, darker: the middle 80 % of ranks), min (p10-min, light)
        line = {"width": 0.5, "color": BAND.format(alpha=0.6)}
        fig.add_trace(_line(bands, "max", "max", "max across ranks", line=line))
        for name, alpha in (("p90", 0.15), ("p10", 0.35), ("min", 0.15)):
            fill = {"fill": "tonexty", "fillcolor": BAND.format(alpha=alpha)}
            fig.add_trace(_line(bands, name, name, f"{name} across ranks", line=line, **fill))
        median = {"color": BAND.format(alpha=1), "width": 2}
        fig.add_trace(_line(bands, "median", "median", "median across ranks", line=median))
        slow = slowest_rank(binned, "v")
        if slow is not None:
            rows = binned[binned["rank"] == slow]
            name = f"slowest: rank {slow}"
            fig.add_trace(_line(rows, "v", name, name, line={"color": "#d62728", "dash": "dot"}))
        how = (
            f"{ranks:,} ranks (more than {max_ranks}): min, p10, median, p90 and max across "
            f"ranks{per_bin}, and the slowest rank"
        )
    fig.update_layout(
        title={"text": f"{label.capitalize()} across ranks, run {run_id}"},
        xaxis={"title": {"text": "step" + (" (bin start)" if size > 1 else "")}},
        yaxis={"title": {"text": f"{label} (ms)"}},
        **LAYOUT,
    )
    return subtitle(fig, how[0].upper() + how[1:] + ".")
