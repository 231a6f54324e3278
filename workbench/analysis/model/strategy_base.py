"""What a curve of one strategy gives the model of another: its base's compute (the step less the
communication it exposed), its samples a step, its parameters' layout and knobs, and for FSDP the
all-gathers and reduce-scatters it traced (bytes and calls at its smallest multi-rank world size,
the share of their time the steps waited for). DDP's own base is the scaling model's
(:mod:`workbench.analysis.model.scaling_model`). No torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd

from workbench.analysis.measured.stored import StoredSteps, is_stored
from workbench.analysis.measured.windows import measured_steps
from workbench.analysis.model.curve_links import base_point
from workbench.analysis.model.memory import DTYPE_BYTES, Layout, Traffic

#: FSDP's step columns per kind (trace schema 2).
KINDS = ("all_gather", "reduce_scatter")


def column_median(
    steps: pd.DataFrame | StoredSteps, column: str, run_ids: Sequence[object]
) -> float:
    """The median of ``column`` over the measured rows of ``run_ids`` (NaN: none)."""
    ids = [str(r) for r in run_ids]
    if is_stored(steps):
        return float(steps.median(column, ids))
    frame = cast(pd.DataFrame, steps)
    if column not in frame.columns:
        return float("nan")
    rows = measured_steps(frame[frame["run_id"].astype(str).isin(ids)], [column])
    return float(rows[column].median()) if len(rows) else float("nan")


def _setting(curve: pd.DataFrame, column: str, default: Any) -> Any:
    """The curve's value of a config column (its first run's), or ``default`` where absent."""
    if column not in curve.columns:
        return default
    value = curve[column].iloc[0]
    return default if value is None or (isinstance(value, float) and np.isnan(value)) else value


@dataclass
class SourceCurve:
    """One measured curve, as the strategies' model reads it."""

    strategy: str
    curve: pd.DataFrame
    base_n: int
    base_nodes: int
    samples_per_step: float
    base_throughput: float
    scaling: str
    layout: Layout | None
    knobs: dict[str, Any] = field(default_factory=dict)
    #: FSDP source: its base's compute a step, its traced traffic at ``traced_n`` and the share
    #: of the collectives' time the steps waited for (NaN elsewhere).
    compute_s: float = float("nan")
    traced: Traffic | None = None
    traced_n: int = 0
    exposed_share: float = float("nan")
    notes: list[str] = field(default_factory=list)

    #: The base's optimizer step, seconds (median over its measured steps; NaN: not traced).
    optimizer_s: float = float("nan")
    #: FSDP source whose base is 1 rank: the compute a step at ``traced_n`` (its step less the
    #: collectives it exposed). FSDP2 on one rank gathers and reduces nothing, so it skips its
    #: collectives' host work (the copies in and out of their buffers) that every larger
    #: world size does: the compute beyond 1 rank is measured where they ran (NaN: no such run).
    multi_compute_s: float = float("nan")
    #: Activations saved for backward a sample, bytes (the base's runs; NaN: not counted).
    activation_per_sample: float = float("nan")

    def compute_at(self, n: int) -> float:
        """The FSDP base's compute a step at ``n`` ranks (weak: the same but the optimizer's
        step, which FSDP takes on 1/N of the parameters; strong: all of it base N / N). Beyond
        1 rank, from a 1-rank base, weak: the smallest multi-rank run's compute, where known."""
        if self.scaling == "strong":
            return self.compute_s * self.base_n / n
        if n > 1 and np.isfinite(self.multi_compute_s):
            full = self.full_optimizer_at_base()
            return self.multi_compute_s - full * (1 / self.traced_n - 1 / n)
        return self.compute_s - self.sharded_optimizer_saving(n)

    def sharded_optimizer_saving(self, n: int) -> float:
        """What the base's optimizer step saves at ``n`` ranks when it steps 1/N of the
        parameters (FSDP) instead of 1/base N of them (negative below the base)."""
        opt = self.optimizer_s if np.isfinite(self.optimizer_s) else 0.0
        return opt * (1 - self.base_n / n)

    def full_optimizer_at_base(self) -> float:
        """The optimizer step on every parameter (DDP's), from the base's on its 1/base N."""
        opt = self.optimizer_s if np.isfinite(self.optimizer_s) else 0.0
        return opt * self.base_n

    def samples_at(self, n: int) -> float:
        """Samples a step at ``n`` ranks (weak: per device x n; strong: the base's)."""
        if self.scaling == "strong":
            return self.samples_per_step
        return self.samples_per_step / self.base_n * n

    def activations_at(self, n: int) -> float:
        """Bytes of activations a rank saves for its backward at ``n`` ranks: the bytes a
        sample measured (:mod:`workbench.rank.activations`) times the micro-batch a device
        runs at ``n`` (a step's samples / n / micro-steps); NaN where not measured."""
        micro = self.samples_at(n) / n / max(int(self.knobs.get("micro_steps", 1)), 1)
        return self.activation_per_sample * micro


def layout_of(curve: pd.DataFrame, layouts: Mapping[str, Any]) -> Layout | None:
    """The first recorded parameter layout of the curve's runs (the same model in each)."""
    for run_id in curve["run_id"]:
        record = layouts.get(str(run_id))
        if record:
            return Layout.of(record)
    return None


def knobs_of(curve: pd.DataFrame) -> dict[str, Any]:
    """The knobs the strategies' traffic and memory depend on, as the curve ran them (for a
    strategy it did not run: that strategy's defaults)."""
    gather = DTYPE_BYTES.get(str(_setting(curve, "fsdp_param_dtype", "")))
    reduce = DTYPE_BYTES.get(str(_setting(curve, "fsdp_reduce_dtype", "")))
    return {
        "reshard_after_forward": bool(_setting(curve, "reshard_after_forward", True)),
        "gather_bytes": gather,
        "reduce_bytes": reduce or gather,
        "micro_steps": int(_setting(curve, "gradient_accumulation_steps", 1)),
        "bucket_view": bool(_setting(curve, "gradient_as_bucket_view", False)),
        "bucket_cap_mb": float(_setting(curve, "bucket_cap_mb", 25.0)),
    }


def source_curve(
    curve: pd.DataFrame, steps: pd.DataFrame | StoredSteps, layouts: Mapping[str, Any]
) -> SourceCurve:
    """The curve's base (its smallest world size on the fewest nodes, the mean of its repeats:
    the step at which its samples give their mean throughput) and, for FSDP, its traffic."""
    base_n, base_nodes = base_point(curve)
    repeats = curve[(curve["world_size"] == base_n) & (curve["nodes"] == base_nodes)]
    samples = float((repeats["samples"] / repeats["steps"]).mean())
    throughput = float(repeats["samples_per_s"].mean())
    scaling = _setting(curve, "scaling", "weak")
    src = SourceCurve(
        strategy=str(_setting(curve, "strategy", "ddp")),
        curve=curve,
        base_n=base_n,
        base_nodes=base_nodes,
        samples_per_step=samples,
        base_throughput=throughput,
        scaling=scaling if scaling in ("weak", "strong") else "weak",
        layout=layout_of(curve, layouts),
        knobs=knobs_of(curve),
    )
    src.optimizer_s = column_median(steps, "optimizer_s", list(repeats["run_id"]))
    if "memory_activation_bytes_max" in repeats.columns:
        per_sample = pd.to_numeric(repeats["memory_activation_bytes_max"], errors="coerce") / (
            pd.to_numeric(repeats["memory_activation_samples_max"], errors="coerce")
        )
        src.activation_per_sample = float(per_sample.mean())
    if src.strategy == "fsdp":
        _fsdp_base(src, steps, repeats["run_id"])
    return src


def _fsdp_base(src: SourceCurve, steps: pd.DataFrame | StoredSteps, base_runs: pd.Series) -> None:
    """An FSDP curve's base compute, traced traffic and exposed share, in ``src``."""
    curve = src.curve
    multi = curve[curve["world_size"] > 1]
    step_s = src.samples_per_step / src.base_throughput if src.base_throughput > 0 else np.nan

    def summed(what: str, runs: Sequence[object]) -> float:
        return sum(column_median(steps, f"{k}_{what}", runs) for k in KINDS)

    exposed_b = 0.0
    if src.base_n > 1:
        exposed_b = summed("exposed_s", list(base_runs))
        exposed_b = exposed_b if np.isfinite(exposed_b) else summed("s", list(base_runs))
    src.compute_s = step_s - exposed_b
    if multi.empty:
        src.exposed_share = 1.0
        src.notes.append("no multi-rank FSDP run: its traffic from the layout, all exposed")
        return
    src.traced_n = int(multi["world_size"].min())
    ids = list(multi.loc[multi["world_size"] == src.traced_n, "run_id"])
    src.traced = Traffic(
        *(column_median(steps, f"{k}_{what}", ids) for k in KINDS for what in ("bytes", "calls"))
    )
    if src.base_n == 1:  # FSDP's collectives' host work, absent at 1 rank (see the field)
        at = multi[multi["world_size"] == src.traced_n]
        rate = float(at["samples_per_s"].mean())
        samples = float((at["samples"] / at["steps"]).mean())
        exposed_m = summed("exposed_s", ids)
        exposed_m = exposed_m if np.isfinite(exposed_m) else summed("s", ids)
        if rate > 0 and np.isfinite(exposed_m):
            src.multi_compute_s = samples / rate - exposed_m
    every = list(multi["run_id"])
    total, exposed = summed("s", every), summed("exposed_s", every)
    if np.isfinite(total) and total > 0 and np.isfinite(exposed):
        src.exposed_share = float(min(max(exposed / total, 0.0), 1.0))
    else:
        src.exposed_share = 1.0
        src.notes.append("FSDP's exposed time not traced: all of it taken as exposed")
