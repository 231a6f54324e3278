"""The scaling model's base, measured: DDP's sampled timers on their own steps (never carried to
the steps between), the overlap they calibrate, the exposed communication and the backward
compute of a base run, and the rows of a curve they are read from (:class:`CurveRows`, from a
frame or from the engine). No torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.analysis.measured.stored import StoredSteps, is_stored
from workbench.analysis.measured.windows import measured_steps, sampled_comm


def sampled_medians(m: pd.DataFrame) -> tuple[float, float, bool]:
    """The multi-rank runs of ``m`` (measured steps), on their sampled steps alone (never
    carried to the steps between samples): per run the medians over sampled steps of the
    smallest exposed communication and span over ranks, then the mean over the runs;
    ``(exposed_s, span_s, exposed measured)``. NaN where no step was sampled."""
    if "comm_s" not in m.columns:
        return float("nan"), float("nan"), False
    sampled = sampled_comm(m)
    sampled = sampled[sampled["world_size"] > 1]
    if sampled.empty:
        return float("nan"), float("nan"), False
    per_run = sampled.groupby("run_id")[["comm_s", "comm_exposed_s"]].median()
    exposed = per_run["comm_exposed_s"]
    measured = bool(exposed.notna().any())
    mean_exposed = float(exposed.mean()) if measured else float("nan")
    return mean_exposed, float(per_run["comm_s"].mean()), measured


def backward_compute(m: pd.DataFrame, exposed_s: float) -> float:
    """Seconds of backward compute per step in ``m`` (measured steps): DDP's timer on its
    sampled steps (median), else the backward less the exposed communication; NaN without
    either."""
    timer = m["backward_compute_s"].dropna() if "backward_compute_s" in m.columns else None
    if timer is not None and len(timer):
        return float(timer.median())
    if "backward_s" not in m.columns or m["backward_s"].dropna().empty:
        return float("nan")
    exposed = exposed_s if np.isfinite(exposed_s) else 0.0
    return max(float(m["backward_s"].median()) - exposed, 0.0)


def calibrated_overlap(exposed_s: float, span_s: float, measured: bool) -> float:
    """The share of the allreduce span hidden behind backward, from the run's own sampled
    steps: ``1 - exposed / span`` within [0, 1]; 0 (no overlap, the pessimistic bound) when the
    trace has no exposed timer or no span."""
    if not measured or not (np.isfinite(span_s) and span_s > 0) or not np.isfinite(exposed_s):
        return 0.0
    return float(min(max(1 - exposed_s / span_s, 0.0), 1.0))


def exposed_at_base(exposed_s: float, span_s: float, measured: bool, overlap: float) -> float:
    """The base's exposed communication per step: measured, else ``(1 - overlap) x span``."""
    return exposed_s if measured else (1 - overlap) * span_s


class CurveRows:
    """The measured rows of one curve the scaling model's base needs, from a frame or from the
    engine: the multi-rank runs' (``multi``) and the base repeats' (``base_sampled``)."""

    COLUMNS = ["world_size", "comm_s", "comm_exposed_s", "comm_bytes", "comm_buckets"]
    COLUMNS += ["backward_s", "backward_compute_s", "step_s"]

    def __init__(
        self, steps: pd.DataFrame | StoredSteps, curve_runs: pd.Series, base_runs: pd.Series
    ):
        self.steps = steps
        self.curve_runs = list(curve_runs)
        self.base_runs = list(base_runs)
        if is_stored(steps):  # a row per sampled step (its ranks' minima and maxima)
            self.multi = steps.comm_steps_of(self.curve_runs, 1)
            self.base_sampled = steps.comm_steps_of(self.base_runs)
        else:
            curve = steps[steps["run_id"].isin(self.curve_runs) & (steps["world_size"] > 1)]
            self.multi = measured_steps(curve, self.COLUMNS)
            base = steps[steps["run_id"].isin(self.base_runs)]
            self.base_sampled = measured_steps(base, self.COLUMNS)

    @property
    def smallest(self) -> pd.DataFrame:
        """The rows of the multi-rank runs at their smallest world size."""
        m = self.multi
        if is_stored(self.steps):  # the smallest with measured rows, sampled or not
            p = self.steps.measured_per_rank
            sizes = p.loc[p["run_id"].isin(self.curve_runs) & (p["world_size"] > 1), "world_size"]
            return m[m["world_size"] == sizes.min()]
        return m[m["world_size"] == m["world_size"].min()]

    def has_bytes(self) -> bool:
        """Whether a multi-rank run handed gradient bytes to allreduce."""
        if is_stored(self.steps):
            p = self.steps.measured_per_rank
            p = p[p["run_id"].isin(self.curve_runs) & (p["world_size"] > 1)]
            return bool((p["comm_bytes"].fillna(0) > 0).any())
        return bool(len(self.multi)) and bool((self.multi["comm_bytes"].fillna(0) > 0).any())

    def multi_median(self, column: str) -> float:
        """The median of ``column`` over the multi-rank runs' measured rows (NaN: none)."""
        if is_stored(self.steps):
            return self.steps.multi_rank_median(column, self.curve_runs)
        return float(self.multi[column].median())

    def base_backward_compute(self, exposed_s: float) -> float:
        """:func:`backward_compute` of the base repeats' measured rows."""
        if not is_stored(self.steps):
            return backward_compute(self.base_sampled, exposed_s)
        timer = self.steps.backward_of(self.base_runs)["backward_compute_s"]
        if len(timer):  # DDP's timer runs on the sampled rows alone
            return float(timer.median())
        median = self.steps.median("backward_s", self.base_runs)
        if not np.isfinite(median):
            return float("nan")
        return max(median - (exposed_s if np.isfinite(exposed_s) else 0.0), 0.0)
