"""A ring-allreduce model of DDP scaling: predict step time and speedup at larger world sizes.

    step_s(N) = compute_s + (1 - overlap) * ring_allreduce_time(gradient_bytes, N, bw, latency)

with ``compute_s`` taken from one measured run, gradient bytes and bucket count from its trace
(``comm_bytes``, ``comm_buckets``) and the network from :data:`NETWORK_PRESETS` or
:func:`measured_network`. It is a weak-scaling model: the per-device batch, hence the per-device
compute, stays fixed as N grows. Pure pandas/numpy; no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analysis.groups import resolve_group_by
from workbench.analysis.scaling import run_table, scaling_table
from workbench.analysis.windows import check_columns, comm_filled, measured_steps


@dataclass(frozen=True, kw_only=True)
class NetworkModel:
    """The two numbers of the ring model, for one link class."""

    name: str
    #: Bytes per second one rank sends to its ring neighbour (one direction).
    bandwidth_bytes_per_s: float
    #: Seconds per ring hop per bucket (launch + wire latency).
    latency_s: float
    description: str = ""


# Sources: line rates from the specifications (NVIDIA A100 datasheet: NVLink 3 600 GB/s total,
# i.e. 300 GB/s per direction; InfiniBand HDR 200 Gb/s per port; IEEE 802.3 25GBASE / 10GBASE),
# derated to what an NCCL/gloo ring typically sustains (about 75-90 % of line rate). Latencies
# are orders of magnitude (microseconds for NVLink/IB verbs, tens of microseconds for TCP).
# None of these was measured on this project's machines: they are assumptions to replace with
# measured_network() as soon as a multi-rank trace exists.
NETWORK_PRESETS: dict[str, NetworkModel] = {
    "nvlink": NetworkModel(
        name="nvlink",
        bandwidth_bytes_per_s=230e9,
        latency_s=5e-6,
        description="NVLink 3 class (A100, 300 GB/s per direction, ~230 GB/s sustained)",
    ),
    "infiniband-hdr": NetworkModel(
        name="infiniband-hdr",
        bandwidth_bytes_per_s=22e9,
        latency_s=5e-6,
        description="InfiniBand HDR 200 Gb/s (25 GB/s line rate, ~22 GB/s sustained)",
    ),
    "ethernet-25g": NetworkModel(
        name="ethernet-25g",
        bandwidth_bytes_per_s=2.8e9,
        latency_s=50e-6,
        description="25 GbE over TCP (3.125 GB/s line rate, ~2.8 GB/s sustained)",
    ),
    "ethernet-10g": NetworkModel(
        name="ethernet-10g",
        bandwidth_bytes_per_s=1.1e9,
        latency_s=50e-6,
        description="10 GbE over TCP (1.25 GB/s line rate, ~1.1 GB/s sustained)",
    ),
}


def ring_allreduce_time(
    nbytes: float | np.ndarray,
    world_size: int | np.ndarray,
    bandwidth_bytes_per_s: float,
    latency_s: float,
    buckets: int | np.ndarray = 1,
) -> float | np.ndarray:
    """Seconds for a ring allreduce of ``nbytes`` over ``world_size`` ranks.

    ``2 (N-1)/N * nbytes / bandwidth + 2 (N-1) * latency * buckets``: reduce-scatter then
    all-gather, each N-1 hops carrying 1/N of the data; every bucket pays the hop latencies.
    Zero for one rank.
    """
    if bandwidth_bytes_per_s <= 0 or latency_s < 0:
        raise ValueError(
            f"need bandwidth_bytes_per_s > 0 and latency_s >= 0, got "
            f"{bandwidth_bytes_per_s} and {latency_s}"
        )
    n = np.asarray(world_size, dtype="float64")
    if np.any(n < 1):
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    t = 2 * (n - 1) / n * np.asarray(nbytes, dtype="float64") / bandwidth_bytes_per_s
    t = t + 2 * (n - 1) * latency_s * np.asarray(buckets, dtype="float64")
    return float(t) if np.ndim(t) == 0 else t


def _network(network: str | NetworkModel) -> NetworkModel:
    if isinstance(network, NetworkModel):
        return network
    if network not in NETWORK_PRESETS:
        valid = ", ".join(NETWORK_PRESETS)
        raise ValueError(f"unknown network {network!r}; valid names: {valid}")
    return NETWORK_PRESETS[network]


def predict_scaling(
    steps: pd.DataFrame,
    network: str | NetworkModel,
    world_sizes: Sequence[int],
    overlap: float = 0.0,
    gradient_bytes: float | None = None,
    buckets: int | None = None,
) -> pd.DataFrame:
    """Predicted step time, throughput and speedup of one run's config at ``world_sizes``.

    From the run's measured steps (medians over steps and ranks): ``compute_s = step_s -
    (1 - overlap) * comm_s`` (the model's own decomposition, so a 1-rank run gives its step
    time), gradient bytes (``comm_bytes``) and ``comm_buckets`` unless given (a 1-rank run
    without DDP traces no bytes: pass ``gradient_bytes``). ``overlap`` in [0, 1] is the share
    of the allreduce hidden behind backward; 0 is the pessimistic no-overlap case. Columns:
    ``world_size, compute_s, comm_s`` (ring time), ``exposed_comm_s, step_s, samples_per_s,
    samples_per_s_per_device, speedup`` (over one device: compute_s only), ``efficiency``, and
    the model's inputs on every row: ``network`` (its name), ``gradient_bytes``, ``buckets`` and
    ``overlap``.
    """
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap must be within [0, 1], got {overlap}")
    net = _network(network)
    check_columns(steps, ("step_s", "comm_s", "comm_bytes", "samples"), "steps")
    run_ids = pd.unique(steps["run_id"])
    if len(run_ids) != 1:
        raise ValueError(f"predict_scaling needs the steps of one run, got runs {list(run_ids)}")
    m = measured_steps(steps, ["step_s", "comm_s", "comm_bytes", "comm_buckets", "samples"])
    if m.empty:
        raise ValueError(f"run {run_ids[0]!r} has no measured (non-warm-up) steps")
    comm = comm_filled(m).fillna(0)
    compute_s = float(np.median(m["step_s"] - (1 - overlap) * comm))
    nbytes = (
        float(np.median(m["comm_bytes"].fillna(0))) if gradient_bytes is None else gradient_bytes
    )
    if buckets is None:
        has = "comm_buckets" in m.columns and m["comm_buckets"].notna().any()
        buckets = max(1, int(np.median(m["comm_buckets"].dropna()))) if has else 1
    samples = float(np.median(m["samples"]))
    n = np.asarray(sorted({int(w) for w in world_sizes}), dtype="int64")
    comm_s = np.asarray(
        ring_allreduce_time(nbytes, n, net.bandwidth_bytes_per_s, net.latency_s, buckets)
    )
    exposed = (1 - overlap) * comm_s
    step_s = compute_s + exposed
    out = pd.DataFrame(
        {
            "world_size": n,
            "compute_s": compute_s,
            "comm_s": comm_s,
            "exposed_comm_s": exposed,
            "step_s": step_s,
            "samples_per_s": n * samples / step_s,
            "samples_per_s_per_device": samples / step_s,
            "speedup": n * compute_s / step_s,
        }
    )
    out["efficiency"] = out["speedup"] / out["world_size"]
    return out.assign(network=net.name, gradient_bytes=nbytes, buckets=buckets, overlap=overlap)


def measured_network(steps: pd.DataFrame, latency_s: float = 0.0) -> NetworkModel | None:
    """Bandwidth and latency estimated from multi-rank runs' ``comm_s`` and ``comm_bytes``.

    Per run: per step the smallest ``comm_s`` over ranks (the last rank to launch waits least
    for the others, so it is closest to the transfer itself), then the median over steps. With
    runs of at least two different ``(2 (N-1)/N bytes, 2 (N-1) buckets)`` points, a
    non-negative least-squares fit gives both ``1/bandwidth`` and ``latency``; with one point
    the latency is taken as ``latency_s`` and the bandwidth is the bus bandwidth. ``None`` when
    no multi-rank run has communication. Waiting for stragglers and bucket queueing inflate
    ``comm_s``, so the bandwidth is a lower bound.
    """
    check_columns(steps, ("world_size", "comm_s", "comm_bytes"), "steps")
    m = measured_steps(steps, ["world_size", "comm_s", "comm_bytes", "comm_buckets"])
    m = m[(m["world_size"] > 1) & (m["comm_s"] > 0) & (m["comm_bytes"] > 0)]
    if m.empty:
        return None
    if "comm_buckets" not in m.columns:
        m = m.assign(comm_buckets=1)
    per_step = m.groupby(["run_id", "attempt", "step"]).agg(
        world_size=("world_size", "max"),
        comm_s=("comm_s", "min"),
        comm_bytes=("comm_bytes", "median"),
        comm_buckets=("comm_buckets", "median"),
    )
    runs = per_step.groupby(level="run_id").median()
    n = runs["world_size"].to_numpy(dtype="float64")
    x = np.column_stack(
        [2 * (n - 1) / n * runs["comm_bytes"].to_numpy(), 2 * (n - 1) * runs["comm_buckets"]]
    )
    y = runs["comm_s"].to_numpy(dtype="float64")
    if len(runs) >= 2 and np.linalg.matrix_rank(x / x.max(axis=0)) == 2:
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        if coef[1] < 0:  # no room for latency: bandwidth alone
            coef = np.array([np.sum(x[:, 0] * y) / np.sum(x[:, 0] ** 2), 0.0])
        elif coef[0] <= 0:  # latency alone cannot give a bandwidth: fall back to bus bandwidth
            coef = np.array([np.median(y / x[:, 0]), 0.0])
        how = f"least-squares fit over {len(runs)} runs"
    else:
        per_byte = np.median((y - x[:, 1] * latency_s) / x[:, 0])
        if per_byte <= 0:
            return None
        coef = np.array([per_byte, latency_s])
        how = f"bus bandwidth of {len(runs)} run(s), latency assumed {latency_s:g} s"
    return NetworkModel(
        name="measured",
        bandwidth_bytes_per_s=float(1 / coef[0]),
        latency_s=float(coef[1]),
        description=f"measured: {how} ({', '.join(map(str, runs.index))})",
    )


def _group_prediction(
    steps: pd.DataFrame,
    group: pd.DataFrame,
    network: str | NetworkModel,
    world_sizes: Sequence[int],
    overlap: float,
) -> pd.DataFrame:
    """One group's prediction, fed by its smallest-world-size run, at its sizes + ``world_sizes``.

    A 1-rank base run hands no bytes to allreduce: they come from the group's multi-rank runs.
    """
    base = group.sort_values("world_size", kind="stable").iloc[0]
    sizes = sorted(set(group["world_size"]) | {int(w) for w in world_sizes})
    multi = steps[steps["run_id"].isin(group["run_id"]) & (steps["world_size"] > 1)]
    multi = measured_steps(multi, ["comm_bytes", "comm_buckets"])
    nbytes = float(multi["comm_bytes"].median()) if len(multi) else None
    nbuckets = (
        int(multi["comm_buckets"].median()) if "comm_buckets" in multi and len(multi) else None
    )
    pred = predict_scaling(
        steps[steps["run_id"] == base["run_id"]],
        network,
        sizes,
        overlap=overlap,
        gradient_bytes=nbytes if base["world_size"] == 1 else None,
        buckets=nbuckets if base["world_size"] == 1 else None,
    )
    base_thr = pred.loc[pred["world_size"] == base["world_size"], "samples_per_s"].iloc[0]
    return pd.DataFrame(
        {
            "world_size": pred["world_size"],
            "base_run_id": base["run_id"],
            "predicted_step_s": pred["step_s"],
            "predicted_comm_s": pred["exposed_comm_s"],
            "predicted_samples_per_s": pred["samples_per_s"],
            "predicted_speedup": pred["samples_per_s"] / base_thr,
        }
    )


def predicted_vs_measured(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    network: str | NetworkModel,
    group_by: Sequence[str] | None = None,
    world_sizes: Sequence[int] = (),
    overlap: float = 0.0,
) -> pd.DataFrame:
    """Per group: the model fed by the group's smallest-world-size run next to the measurements.

    Rows cover the group's measured world sizes plus ``world_sizes`` (extrapolations, with NaN
    measured columns). Speedups are over the group's smallest world size, as in
    :func:`workbench.analysis.scaling_table`. ``relative_error = predicted_samples_per_s /
    measured_samples_per_s - 1``. The group columns are ``group_by`` resolved as by
    :func:`workbench.analysis.resolve_group_by`: pass the same list to the figure.
    """
    keys = resolve_group_by(runs, group_by)
    per_run = run_table(runs, steps, group_by=keys)
    table = scaling_table(runs, steps, group_by=keys)
    if not keys:
        per_run["_group"] = table["_group"] = "all"
        keys = ["_group"]
    parts = []
    for key, group in per_run.groupby(keys, dropna=False, sort=True):
        part = _group_prediction(steps, group, network, world_sizes, overlap)
        key = key if isinstance(key, tuple) else (key,)
        for k, v in reversed(list(zip(keys, key, strict=True))):
            part.insert(0, k, v)
        parts.append(part)
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=keys)
    measured = table[[*keys, "world_size", "step_s", "samples_per_s", "speedup"]]
    measured = measured.groupby([*keys, "world_size"], dropna=False).mean().reset_index()
    measured = measured.rename(
        columns={c: f"measured_{c}" for c in ("step_s", "samples_per_s", "speedup")}
    )
    out = out.merge(measured, on=[*keys, "world_size"], how="left")
    out["relative_error"] = out["predicted_samples_per_s"] / out["measured_samples_per_s"] - 1
    return out.drop(columns="_group") if keys == ["_group"] else out
