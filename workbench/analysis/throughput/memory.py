"""Memory per rank: peak process RSS and CUDA / NVML peaks; the parts a rank's memory is counted
in (``run.json``'s ``memory_parts``), in words."""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.analysis.measured.stored import is_stored
from workbench.analysis.measured.windows import check_columns

#: The parts of a rank's memory counted from its tensors (``run.json``'s ``memory_parts``, the
#: runs frame's ``memory_<part>_max``), in words.
MEMORY_WORDS = {
    "param_bytes": "parameters",
    "grad_bytes": "gradients",
    "optimizer_bytes": "optimizer state",
}


def memory_by_rank(steps: pd.DataFrame) -> pd.DataFrame:
    """Per run and rank, peak process RSS and CUDA peaks (bytes, all steps incl. warm-up).

    Columns ``rss_peak_bytes``, ``cuda_peak_bytes`` (``mem_peak_bytes``),
    ``cuda_reserved_peak_bytes`` and ``device_peak_bytes`` (``mem_device_bytes``, what NVML sees
    of this process on its GPU); the CUDA ones are NaN on CPU.
    """
    if is_stored(steps):
        cols = ["run_id", "rank", "all_world_size", "all_host", "rss_peak_bytes"]
        cols += ["cuda_peak_bytes", "cuda_reserved_peak_bytes", "device_peak_bytes"]
        p = steps.per_rank[cols]  # over all rows: warm-up included
        return p.rename(columns={"all_world_size": "world_size", "all_host": "host"})
    check_columns(steps, ("run_id", "rank", "world_size", "rss_bytes"), "steps")
    aggs: dict[str, tuple[str, str]] = {"world_size": ("world_size", "max")}
    if "host" in steps.columns:
        aggs["host"] = ("host", "first")
    aggs["rss_peak_bytes"] = ("rss_bytes", "max")
    cuda = {
        "mem_peak_bytes": "cuda_peak_bytes",
        "mem_reserved_bytes": "cuda_reserved_peak_bytes",
        "mem_device_bytes": "device_peak_bytes",  # NVML: allocator + context + NCCL buffers
    }
    for src, dst in cuda.items():
        if src in steps.columns:
            aggs[dst] = (src, "max")
    out = steps.groupby(["run_id", "rank"], sort=True).agg(**aggs).reset_index()
    for dst in cuda.values():
        if dst not in out.columns:
            out[dst] = np.nan
    return out
