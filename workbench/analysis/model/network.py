"""The network of the scaling model: the ring-allreduce cost, link presets, and a network fitted to
multi-rank traces (:func:`fit_network`), with its residual or the reason there is none.

Pure pandas/numpy; no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analysis.measured.comm_samples import STEP_KEYS
from workbench.analysis.measured.links import INTER, INTRA, nodes_link_class
from workbench.analysis.measured.stored import is_stored
from workbench.analysis.measured.windows import check_columns, measured_steps

#: Distinct multi-rank world sizes a fit needs: two parameters (bandwidth, latency) and at least
#: one more point, so that the residual says how well the ring model fits.
MIN_FIT_WORLD_SIZES = 3


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


def as_network(network: str | NetworkModel) -> NetworkModel:
    """A preset by name (:data:`NETWORK_PRESETS`), or the model itself; ValueError with the valid
    names otherwise."""
    if isinstance(network, NetworkModel):
        return network
    if network not in NETWORK_PRESETS:
        valid = ", ".join(NETWORK_PRESETS)
        raise ValueError(f"unknown network {network!r}; valid names: {valid}")
    return NETWORK_PRESETS[network]


@dataclass(frozen=True)
class NetworkFit:
    """A network fitted to traces: the model (``None`` when none could be fitted), a note saying
    how it was fitted or why not, the RMS residual of the fit (seconds of allreduce per step; NaN
    without a fit) and the world sizes it used."""

    model: NetworkModel | None
    note: str
    residual_s: float = float("nan")
    world_sizes: tuple[int, ...] = ()


#: The two link classes a network is measured on: ranks on one node, ranks across nodes.
LINK_CLASSES = (INTRA, INTER)
#: The link class of ranks on a number of nodes (one rule with the scaling table's points).
link_class = nodes_link_class


def runs_of_link(runs: pd.DataFrame | None, link: str | None) -> pd.DataFrame | None:
    """The runs of one link class (all of them for ``None`` or without a ``nodes`` column)."""
    if runs is None or link is None or "nodes" not in runs.columns:
        return runs
    if link not in LINK_CLASSES:
        raise ValueError(f"unknown link class {link!r}; valid names: {', '.join(LINK_CLASSES)}")
    return runs[runs["nodes"].map(link_class) == link]


def _fit_runs(
    steps: pd.DataFrame, runs: pd.DataFrame | None, statuses: Sequence[str] | None
) -> tuple[pd.DataFrame, str | None]:
    """Per multi-rank run with communication: median over steps of the smallest ``comm_s`` over
    ranks, bytes, buckets; and why no fit is possible (``None`` if it is, so far)."""
    if is_stored(steps):  # a row per sampled step: its fit's figures over its ranks' rows
        c = steps.comm_steps
        c = c[c["fit_comm_s"].notna()]
        fit = {"fit_comm_s": "comm_s", "fit_bytes": "comm_bytes", "fit_buckets": "comm_buckets"}
        m = c[[*STEP_KEYS, "world_size", *fit]].rename(columns=fit)
    else:
        check_columns(steps, ("world_size", "comm_s", "comm_bytes"), "steps")
        m = measured_steps(steps, ["world_size", "comm_s", "comm_bytes", "comm_buckets"])
    if runs is not None:
        check_columns(runs, ("run_id",), "runs")
        keep = runs
        if statuses is not None and "status" in runs.columns:
            keep = runs[runs["status"].isin(list(statuses))]  # failed runs are never pooled
        m = m[m["run_id"].isin(keep["run_id"])]
    m = m[(m["world_size"] > 1) & (m["comm_s"] > 0) & (m["comm_bytes"] > 0)]
    if m.empty:
        return m, "no network fit: no multi-rank run with communication times"
    if runs is not None and "nodes" in runs.columns:
        nodes = runs.loc[runs["run_id"].isin(pd.unique(m["run_id"])), "nodes"]
        if len({link_class(n) for n in nodes} - {None}) > 1:
            return m, (
                f"no network fit: the runs span {', '.join(map(str, sorted(set(nodes))))} "
                "nodes, whose links differ (within a node, across nodes); fit the runs of one "
                "link class, or pass a network"
            )
    if "comm_buckets" not in m.columns:
        m = m.assign(comm_buckets=1)
    per_step = m.groupby(["run_id", "attempt", "step"]).agg(
        world_size=("world_size", "max"),
        comm_s=("comm_s", "min"),
        comm_bytes=("comm_bytes", "median"),
        comm_buckets=("comm_buckets", "median"),
    )
    return per_step.groupby(level="run_id").median(), None


def _least_squares(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray | None, str]:
    """Seconds per byte and latency, both non-negative, and how they were fitted: both; or the
    bandwidth alone (latency fixed at 0) when the latency would come out negative. ``None`` when
    the bandwidth would come out non-positive (more bytes took no longer: the ring model does not
    describe these runs)."""
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    how = "bandwidth and latency"
    if coef[1] < 0:  # no room for latency: bandwidth alone
        coef = np.array([np.sum(x[:, 0] * y) / np.sum(x[:, 0] ** 2), 0.0])
        how = "bandwidth only (the latency came out negative: fixed at 0)"
    if coef[0] <= 0:
        return None, "the bandwidth came out non-positive (more bytes took no longer)"
    return coef, how


def fit_network(
    steps: pd.DataFrame,
    runs: pd.DataFrame | None = None,
    statuses: Sequence[str] | None = ("completed",),
) -> NetworkFit:
    """Bandwidth and latency fitted to multi-rank runs' ``comm_s`` and ``comm_bytes``.

    Per run: per step the smallest ``comm_s`` over ranks (the last rank to launch waits least
    for the others, so it is closest to the transfer itself), then the median over steps. A
    least-squares fit of ``comm_s = 2 (N-1)/N bytes / bandwidth + 2 (N-1) buckets latency``
    (both non-negative) over the runs needs runs at :data:`MIN_FIT_WORLD_SIZES` or more distinct
    world sizes above one (two parameters and a residual); with fewer there is no fit and the
    note says why. With ``runs``, only runs of ``statuses`` are pooled, and runs of both link
    classes are not (one node and several: intra- and inter-node links differ). ``residual_s``
    is the RMS of measured minus fitted ``comm_s``. A latency that would come out negative is
    fixed at 0 (the note says so); a bandwidth that would come out non-positive gives no fit.
    Waiting for stragglers and bucket queueing inflate ``comm_s`` (and DDP's sampled span also
    holds the backward compute between buckets), so the bandwidth is a lower bound.
    """
    per_run, why = _fit_runs(steps, runs, statuses)
    if why is not None:
        return NetworkFit(None, why)
    sizes = tuple(sorted({int(n) for n in per_run["world_size"]}))
    if len(sizes) < MIN_FIT_WORLD_SIZES:
        return NetworkFit(
            None,
            f"no network fit: it needs runs at {MIN_FIT_WORLD_SIZES} or more world sizes above 1 "
            f"(these have {', '.join(map(str, sizes))}); pass a network preset",
            world_sizes=sizes,
        )
    n = per_run["world_size"].to_numpy(dtype="float64")
    x = np.column_stack(
        [2 * (n - 1) / n * per_run["comm_bytes"].to_numpy(), 2 * (n - 1) * per_run["comm_buckets"]]
    ).astype("float64")
    y = per_run["comm_s"].to_numpy(dtype="float64")
    coef, how = _least_squares(x, y)
    if coef is None:
        return NetworkFit(None, f"no network fit: {how}; pass a network preset", world_sizes=sizes)
    residual = float(np.sqrt(np.mean((y - x @ coef) ** 2)))
    note = (
        f"measured: least-squares fit of {how} over {len(per_run)} runs at world sizes "
        f"{', '.join(map(str, sizes))}, RMS residual {residual:.3g} s"
    )
    model = NetworkModel(
        name="measured",
        bandwidth_bytes_per_s=float(1 / coef[0]),
        latency_s=float(coef[1]),
        description=note,
    )
    return NetworkFit(model, note, residual, sizes)


def measured_network(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> NetworkModel | None:
    """The model of :func:`fit_network`, or ``None`` when there is none (its note says why)."""
    return fit_network(steps, runs).model


def benchmarked_network(
    runs: pd.DataFrame | None,
    statuses: Sequence[str] | None = ("completed",),
    link: str | None = None,
) -> NetworkFit:
    """The network the runs measured directly: each multi-rank run's allreduce micro-benchmark
    at its own bucket sizes (``network_busbw_bytes_per_s`` of the runs frame, nccl-tests' bus
    bandwidth) and its one-element allreduce (``network_latency_s``, per hop), medians over
    the runs. The bucket's time holds the ring's hops too, ``2(n-1)`` latencies: the bandwidth
    is what carries the bytes in the rest (:func:`_bytes_bandwidth`), so the model is exact at
    the runs' own bucket sizes and world size, and a change of the bytes (a compression hook,
    fewer buckets) moves only their part. Without a latency measured (an older run), it is
    folded into the bandwidth (0 s). ``model`` is ``None`` when no run has a benchmark.
    ``link`` keeps the runs of one link class (:func:`link_class`); without it, runs on one
    node and across nodes are not pooled (``model`` ``None``, the note says so)."""
    column = "network_busbw_bytes_per_s"
    runs = runs_of_link(runs, link)
    if runs is None or column not in runs.columns:
        return NetworkFit(None, "no allreduce micro-benchmark in the runs")
    keep = runs
    if statuses is not None and "status" in runs.columns:
        keep = runs[runs["status"].isin(list(statuses))]
    busbw = pd.to_numeric(keep[column], errors="coerce").dropna()
    busbw = busbw[busbw > 0]
    if busbw.empty:
        return NetworkFit(None, "no allreduce micro-benchmark in the runs")
    if link is None and "nodes" in keep.columns:
        classes = {link_class(v) for v in keep.loc[busbw.index, "nodes"]} - {None}
        if len(classes) > 1:
            return NetworkFit(
                None,
                "no single network: the benchmarks span intra-node and inter-node links, "
                "measured per link class instead",
            )
    sizes: tuple[int, ...] = ()
    if "world_size" in keep.columns:
        sizes = tuple(sorted({int(n) for n in keep.loc[busbw.index, "world_size"]}))
    bandwidth, latency = _bytes_bandwidth(keep.loc[busbw.index], busbw)
    where = f" ({link})" if link else ""
    hops = (
        f"; per hop {latency * 1e6:.3g} us (its one-element allreduce), the bytes' bandwidth "
        f"{bandwidth / 1e9:.3g} GB/s"
        if latency > 0
        else "; latency folded into that bandwidth"
    )
    timed, factor = _collectives(keep.loc[busbw.index])
    note = (
        f"measured directly{where}: {timed} micro-benchmark at the runs' own sizes, bus "
        "bandwidth "
        f"(nccl-tests: bytes / time x {factor}) median {float(busbw.median()) / 1e9:.3g} GB/s "
        f"over {len(busbw)} run(s) at world sizes {', '.join(map(str, sizes)) or '?'}{hops}"
    )
    model = NetworkModel(
        name="benchmark",
        bandwidth_bytes_per_s=bandwidth,
        latency_s=latency,
        description=f"measured {timed}, busbw {float(busbw.median()) / 1e9:.3g} GB/s"
        + (f", {latency * 1e6:.3g} us a hop" if latency > 0 else ""),
    )
    return NetworkFit(model, note, world_sizes=sizes)


def _collectives(runs: pd.DataFrame) -> tuple[str, str]:
    """What the runs' benchmarks timed: DDP's allreduce, FSDP's all-gather and reduce-scatter
    (both rings of the same bus bandwidth, nccl-tests' terms), or both; and the bus factor."""
    strategies = set(runs["strategy"].astype(str)) if "strategy" in runs.columns else set()
    if strategies == {"fsdp"}:
        return "all-gather and reduce-scatter", "(n-1)/n"
    if "fsdp" in strategies:
        return "allreduce, all-gather and reduce-scatter", "2(n-1)/n, (n-1)/n for the others"
    return "allreduce", "2(n-1)/n"


#: The largest share of a benchmarked bucket's time put down to its hops' latency: the bytes
#: keep at least the rest (a one-element allreduce that took as long as the bucket, on a
#: loaded host, would otherwise leave them an infinite bandwidth).
MAX_LATENCY_SHARE = 0.9


def _bytes_bandwidth(runs: pd.DataFrame, busbw: pd.Series) -> tuple[float, float]:
    """The ring's bandwidth for the bytes and its latency per hop, medians over ``runs``: each
    run's time for one step's ``k`` buckets ``T`` (``network_time_s``) less their ``k x 2(n-1)``
    hops of measured latency ``L``, at most :data:`MAX_LATENCY_SHARE` of it:
    ``busbw x T / (T - k 2(n-1) L)``. Without ``network_latency_s`` (or ``network_time_s``,
    ``network_buckets``, ``world_size``): the bus bandwidth, 0 s."""
    needed = ("network_latency_s", "network_time_s", "network_buckets", "world_size")
    if not all(c in runs.columns for c in needed):
        return float(busbw.median()), 0.0
    latency = pd.to_numeric(runs["network_latency_s"], errors="coerce")
    time_s = pd.to_numeric(runs["network_time_s"], errors="coerce")
    buckets = pd.to_numeric(runs["network_buckets"], errors="coerce")
    hops = 2 * (pd.to_numeric(runs["world_size"], errors="coerce") - 1) * buckets
    ok = latency.notna() & (latency >= 0) & (time_s > 0) & (hops > 0)
    if not ok.any():
        return float(busbw.median()), 0.0
    share = (hops * latency / time_s).clip(upper=MAX_LATENCY_SHARE)
    bandwidth = (busbw / (1 - share)).where(ok, busbw)
    return float(bandwidth.median()), float(latency[ok].median())


def network_fit(
    network: str | NetworkModel | NetworkFit | None,
    steps: pd.DataFrame,
    runs: pd.DataFrame | None = None,
    link: str | None = None,
) -> NetworkFit:
    """``network`` as a fit: a given preset or model as it is; ``None``: the runs' own allreduce
    micro-benchmark (:func:`benchmarked_network`: the collective's own time) where they have
    one, else a fit to the traces' sampled ``comm_s`` (:func:`fit_network`), whose span also
    holds backward compute (the model then calibrates its overlap on that same span, so the
    backward is counted once). ``link``: measure on the runs of that link class only."""
    if isinstance(network, NetworkFit):
        return network
    if network is None:
        measured = benchmarked_network(runs, link=link)
        if measured.model is not None:
            return measured
        fitted = fit_network(steps, runs_of_link(runs, link))
        if fitted.model is None and measured.note.startswith("no single network"):
            return measured
        return fitted
    model = as_network(network)
    return NetworkFit(model, model.description or model.name)
