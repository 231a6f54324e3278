"""Peak memory per rank: process RSS, CUDA allocator and NVML peaks in GiB."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.windows import check_columns
from workbench.ui.plots.style import GIB, LAYOUT, check_run


def memory_figure(memory: pd.DataFrame, run_id: str | None = None) -> go.Figure:
    """Peak process RSS and CUDA peak per rank (GiB), grouped bars."""
    check_columns(memory, ["run_id", "rank", "rss_peak_bytes"], "memory")
    if run_id is not None:
        check_run(memory, run_id)
        memory = memory[memory["run_id"] == run_id]
    one_run = memory["run_id"].nunique() == 1
    x = (
        memory["rank"].astype(str)
        if one_run
        else memory["run_id"] + "/r" + memory["rank"].astype(str)
    )
    fig = go.Figure()
    series = {
        "process RSS peak": "rss_peak_bytes",
        "CUDA peak": "cuda_peak_bytes",
        "GPU memory (NVML) peak": "device_peak_bytes",
    }
    for name, col in series.items():
        if col in memory.columns and memory[col].notna().any():
            fig.add_trace(
                go.Bar(
                    x=x.tolist(),
                    y=memory[col] / GIB,
                    name=name,
                    hovertemplate=f"%{{x}}<br>{name}: %{{y:.3f}} GiB<extra></extra>",
                )
            )
    fig.update_layout(
        barmode="group",
        title="Peak memory per rank" + (f", run {memory['run_id'].iloc[0]}" if one_run else ""),
        xaxis_title="rank" if one_run else "run / rank",
        yaxis_title="peak memory (GiB)",
        **LAYOUT,
    )
    fig.update_xaxes(type="category")
    return fig
