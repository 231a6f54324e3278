"""The scaling model's arithmetic: from a base (a measured world size's step, its exposed
communication, gradient bytes and buckets) and a network, the step time, throughput and speedup
at other world sizes::

    step_s(N) = compute_s(N) + (1 - overlap) * allreduce_time(gradient_bytes, N, network)

with the exposed part never less than the allreduce less the backward compute it can hide
behind. Where the base comes from: :mod:`workbench.analysis.model.scaling_model`. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analysis.model.cluster_network import allreduce_time
from workbench.analysis.model.network import NetworkModel


@dataclass(frozen=True)
class Base:
    """What the model starts from: the base world size, its wall step time and samples per step
    (means over its repeats), its measured exposed communication per step (0 for one rank),
    gradient bytes and buckets, and the family (``weak`` or ``strong``)."""

    world_size: int
    step_s: float
    samples_per_step: float
    exposed_comm_s: float
    gradient_bytes: float
    buckets: int
    scaling: str = "weak"
    #: Seconds of backward compute per step at the base: the most communication any overlap
    #: can hide (NaN: not measured, no bound). Scales with the per-device work like compute.
    backward_compute_s: float = float("nan")
    #: The communication's time as a multiple of the ring allreduce's: a comm hook's measured
    #: time over the plain allreduce's on the same buckets (1: the plain allreduce).
    comm_scale: float = 1.0


def model_curve(
    base: Base, network: NetworkModel, world_sizes: Sequence[int], overlap: float
) -> pd.DataFrame:
    """:func:`model_arrays` as a frame, one row per world size."""
    return pd.DataFrame(model_arrays(base, network, world_sizes, overlap))


def model_arrays(
    base: Base, network: NetworkModel, world_sizes: Sequence[int], overlap: float
) -> dict[str, np.ndarray]:
    """The model at ``world_sizes`` from ``base``: ``world_size, compute_s, comm_s`` (ring time),
    ``exposed_comm_s, step_s, samples_per_s, samples_per_s_per_device``, ``speedup`` (over one
    device running compute only) and ``efficiency``. Exposed communication is ``(1 - overlap)``
    of the ring time, but never less than the ring time less the backward compute it can hide
    behind (``base.backward_compute_s``, scaled with compute; no bound when NaN). The base's
    compute is its step less its
    exposed communication; when that is not positive (nothing left to scale: the step was all
    communication, or not measured) compute and every rate are NaN, never a division by 0."""
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap must be within [0, 1], got {overlap}")
    if base.scaling not in ("weak", "strong"):
        raise ValueError(f"scaling must be weak or strong, got {base.scaling!r}")
    n = np.asarray(sorted({int(w) for w in world_sizes}), dtype="int64")
    compute_b = base.step_s - base.exposed_comm_s
    if not (np.isfinite(compute_b) and compute_b > 0):
        compute_b = float("nan")
    per_device = base.samples_per_step / base.world_size  # samples per device at the base
    if base.scaling == "weak":
        compute = np.full(len(n), compute_b)
        samples = per_device * n
    else:  # the global batch is fixed: each device gets base N / N of its base share
        compute = compute_b * base.world_size / n
        samples = np.full(len(n), base.samples_per_step)
    comm = allreduce_time(network, base.gradient_bytes, n, base.buckets) * base.comm_scale
    exposed = (1 - overlap) * comm
    hideable = base.backward_compute_s * compute / compute_b if compute_b > 0 else np.nan
    bounded = np.isfinite(hideable)
    # no overlap hides more than the backward compute it runs behind: a long allreduce on a
    # slow link is exposed beyond that, whatever share of a short one was hidden
    exposed = np.where(
        bounded, np.maximum(exposed, comm - np.where(bounded, hideable, 0.0)), exposed
    )
    step = compute + exposed
    with np.errstate(divide="ignore", invalid="ignore"):
        one_device = np.float64(base.samples_per_step) / (compute_b * base.world_size)
        rate = np.where(step > 0, samples / np.where(step > 0, step, 1.0), np.nan)
        speedup = rate / one_device
    return {
        "world_size": n,
        "compute_s": compute,
        "comm_s": comm,
        "exposed_comm_s": exposed,
        "step_s": step,
        "samples_per_s": rate,
        "samples_per_s_per_device": rate / n,
        "speedup": speedup,
        "efficiency": speedup / n,
    }
