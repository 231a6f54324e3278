"""What of a step's compute grows with the batch: ``compute = per_step + per_sample x samples``
(samples a rank computes a step: its per-device batch times the accumulation micro-steps),
fitted by least squares on the runs of a study that differ from a point only in their batch, at
its world size (the same sharing of the cores). Without two batch sizes there is no fit, and a
prediction assumes all of the compute grows with the batch. Pure pandas; no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analysis.measured.units import seconds

#: Columns that say the batch, or follow from it: left out when matching runs to a point.
BATCH_COLUMNS = ("per_device_batch_size", "global_batch_size", "fixed_batch_size", "scaling")


@dataclass(frozen=True)
class BatchCost:
    """A point's compute per step: ``per_step_s`` plus ``per_sample_s`` a sample, fitted on
    ``batches`` (per-device) at ``world_size``."""

    per_step_s: float
    per_sample_s: float
    batches: tuple[int, ...]
    world_size: int
    #: How the points were got: ``fitted on`` a study's runs (:func:`batch_cost`), or a tune's
    #: probe (``workbench.tune.probe.probe_split``: the line through its two points).
    how: str = "fitted on"

    def per_step_share(self, samples: float) -> float:
        """The share of the compute at ``samples`` a rank that does not grow with the batch."""
        total = self.per_step_s + self.per_sample_s * samples
        return min(max(self.per_step_s / total, 0.0), 1.0) if total > 0 else 0.0

    def words(self) -> str:
        """``with 400 ms of its compute a step and 62.5 ms a sample (fitted on ...)``."""
        batches = ", ".join(str(b) for b in self.batches[:-1]) + f" and {self.batches[-1]}"
        ranks = f"{self.world_size} rank" + ("s" if self.world_size > 1 else "")
        source = f"({self.how} per-device batches {batches} at {ranks})"
        if self.per_sample_s == 0:
            each = seconds(self.per_step_s)
            return f"with all of its compute a step ({each}), none a sample {source}"
        return (
            f"with {seconds(self.per_step_s)} of its compute a step and "
            f"{seconds(self.per_sample_s)} a sample {source}"
        )


def batch_cost(
    per_run: pd.DataFrame, parts: pd.DataFrame, top_runs: Sequence[object], keys: Sequence[str]
) -> BatchCost | None:
    """The fit for the point of ``top_runs`` (see the module docstring), from ``per_run`` (a
    run table: its curve ``keys``, ``world_size``, ``per_device_batch_size``) and ``parts``
    (:func:`~workbench.analysis.advice.losses.run_parts`: ``compute`` seconds a step). ``None``
    without two per-device batches."""
    if "per_device_batch_size" not in per_run.columns:
        return None
    runs = per_run.drop_duplicates("run_id").set_index("run_id")
    top = runs.loc[[r for r in top_runs if r in runs.index]]
    if top.empty:
        return None
    point = top.iloc[0]
    same = runs["world_size"] == point["world_size"]
    for key in keys:
        if key in runs.columns and key not in BATCH_COLUMNS:
            same &= runs[key].map(str) == str(point[key])
    mine = runs[same]
    accumulation = mine.get("gradient_accumulation_steps", pd.Series(1, index=mine.index))
    samples = pd.to_numeric(mine["per_device_batch_size"], errors="coerce") * accumulation
    compute = parts["compute"].reindex(mine.index)
    ok = samples.notna() & compute.notna() & np.isfinite(compute)
    samples, compute = samples[ok].astype("float64"), compute[ok].astype("float64")
    batches = tuple(sorted({int(b) for b in mine.loc[ok[ok].index, "per_device_batch_size"]}))
    return fit_batch_cost(samples.to_numpy(), compute.to_numpy(), batches, int(point["world_size"]))


def fit_batch_cost(
    samples: Sequence[float],
    compute: Sequence[float],
    batches: tuple[int, ...],
    world_size: int,
    how: str = "fitted on",
) -> BatchCost | None:
    """The least-squares line ``compute = per_step + per_sample x samples`` through the points
    (samples a rank computes a step, its compute seconds a step), its slope at least 0: where
    the compute did not grow with the samples (a step that is all per-step work, measured
    within its noise), all of it is per-step, their mean. ``None`` without two sample counts.
    ``how``: how the points were got, for :meth:`BatchCost.words`."""
    x, y = np.asarray(samples, dtype="float64"), np.asarray(compute, dtype="float64")
    if len(np.unique(x)) < 2 or not np.isfinite(y).all():
        return None
    slope, intercept = np.polyfit(x, y, 1)
    if not slope > 0:  # the least squares with the slope held at 0: the mean
        slope, intercept = 0.0, float(y.mean())
    return BatchCost(max(float(intercept), 0.0), float(slope), batches, world_size, how)
