"""Peak memory per rank: process RSS, CUDA allocator and NVML peaks in GiB."""

from __future__ import annotations

import pandas as pd

from workbench.analysis.measured.windows import check_columns
from workbench.ui.plots.binning import (
    BAND_RANKS,
    many_ranks_note,
    quantile_label,
    quantile_ranks,
)
from workbench.ui.plots.figure import Figure
from workbench.ui.plots.style import GIB, LAYOUT, check_run, subtitle


def _at_quantiles(memory: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series]:
    """Per run, the rows of the ranks at the quantiles of their RSS peak, and their labels."""
    several = memory["run_id"].nunique() > 1
    parts, labels = [], []
    for run, rows in memory.groupby("run_id", sort=False):
        by_rank = rows.set_index("rank")
        picked = quantile_ranks(by_rank["rss_peak_bytes"])
        parts.append(by_rank.loc[[r for _, r in picked]].reset_index())
        labels += [(f"{run}/" if several else "") + quantile_label(n, r) for n, r in picked]
    frame = pd.concat(parts, ignore_index=True)
    return frame, pd.Series(labels, index=frame.index)


def memory_figure(memory: pd.DataFrame, run_id: str | None = None) -> Figure:
    """Peak process RSS and CUDA peak per rank (GiB), grouped bars; past ``BAND_RANKS`` ranks in
    a run, the ranks at the quantiles of the RSS peak, each named."""
    check_columns(memory, ["run_id", "rank", "rss_peak_bytes"], "memory")
    if run_id is not None:
        check_run(memory, run_id)
        memory = memory[memory["run_id"] == run_id]
    one_run = memory["run_id"].nunique() == 1
    most = int(memory.groupby("run_id")["rank"].nunique().max()) if len(memory) else 0
    note = ""
    if most > BAND_RANKS:
        memory, x = _at_quantiles(memory)
        note = many_ranks_note(most, "the process RSS peak", top="the largest")
    else:
        x = (
            memory["rank"].astype(str)
            if one_run
            else memory["run_id"] + "/r" + memory["rank"].astype(str)
        )
    fig = Figure()
    series = {
        "process RSS peak": "rss_peak_bytes",
        "CUDA peak": "cuda_peak_bytes",
        "GPU memory (NVML) peak": "device_peak_bytes",
    }
    for name, col in series.items():
        if col in memory.columns and memory[col].notna().any():
            fig.add_trace(
                {
                    "type": "bar",
                    "x": x.tolist(),
                    "y": memory[col] / GIB,
                    "name": name,
                    "hovertemplate": f"%{{x}}<br>{name}: %{{y:.3f}} GiB<extra></extra>",
                }
            )
    x_title = ("rank" if one_run else "run / rank") + (" at a quantile of RSS peak" if note else "")
    fig.update_layout(
        barmode="group",
        title={
            "text": "Peak memory per rank"
            + (f", run {memory['run_id'].iloc[0]}" if one_run else "")
        },
        xaxis={"title": {"text": x_title}, "type": "category"},
        yaxis={"title": {"text": "peak memory (GiB)"}},
        **LAYOUT,
    )
    return subtitle(fig, note)
