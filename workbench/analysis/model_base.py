"""The scaling model's base, measured: DDP's sampled timers on their own steps (never carried to
the steps between), the overlap they calibrate, the exposed communication and the backward
compute of a base run. Pure pandas/numpy; no torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.analysis.windows import sampled_comm


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
