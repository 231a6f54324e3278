"""DDP or FSDP, and what fits: each strategy's step time, throughput and memory per rank at each
world size, from a study of either (a strategy is a field, not a fork: one model, a traffic rule
per strategy).

Per point (``world_size`` ranks on ``nodes``, on the network of the link class it crosses)::

    step_s(N) = compute_s(N) + exposed communication of the strategy at N

- compute: the source curve's base, its step less the communication it exposed (DDP's: the
  scaling model's, :mod:`workbench.analysis.model.scaling_model`; FSDP's:
  :mod:`workbench.analysis.model.strategy_base`), the same for the other strategy but its
  optimizer step (the base's ``optimizer_s``), which FSDP takes on 1/N of the parameters and
  DDP on all of them.
- DDP's traffic: a ring allreduce of the gradients, ``2 (N-1)/N`` of their bytes a rank, and
  ``2 (N-1)`` hop latencies a bucket. From a DDP curve, the scaling model itself (its measured
  overlap); from an FSDP curve, the gradients' bytes of the recorded layout in buckets of
  ``bucket_cap_mb``, all exposed (no overlap measured for DDP: the pessimistic bound).
- FSDP's traffic: all-gathers and reduce-scatters, ``(N-1)/N`` of each call's whole buffer a
  rank and ``N-1`` hop latencies a call (half a ring allreduce each, on a cluster half its
  two-level cost). From an FSDP curve: the bytes and calls it traced (scaled by dim 0's
  padding at N), the exposed share it measured; from a DDP curve: worked out from the layout
  (:func:`workbench.analysis.model.memory.fsdp_traffic`), all exposed.
- memory per rank: :func:`workbench.analysis.model.memory.memory_per_rank` (DDP constant, FSDP's
  shards at N; rank 0's, the largest).

No torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.measured.stored import StoredSteps
from workbench.analysis.model.cluster_network import allreduce_time
from workbench.analysis.model.curve_links import (
    CurveNetworks,
    curve_points,
    ranks_per_node,
    with_links,
)
from workbench.analysis.model.memory import (
    MEMORY_COLUMNS,
    STRATEGIES,
    Traffic,
    fsdp_traffic,
    memory_per_rank,
)
from workbench.analysis.model.network import NetworkModel, network_fit
from workbench.analysis.model.prediction_interval import (
    CROSS_STRATEGY_FLOOR,
    half_width,
    model_error,
    per_curve,
    runs_half_width,
)
from workbench.analysis.model.scaling_model import predicted_vs_measured
from workbench.analysis.model.strategy_base import SourceCurve, source_curve
from workbench.analysis.throughput.groups import resolve_group_by
from workbench.analysis.throughput.scaling import run_table

#: The config columns a curve's strategies read, carried from the runs frame.
CONFIG = (
    "strategy",
    "reshard_after_forward",
    "fsdp_param_dtype",
    "fsdp_reduce_dtype",
    "gradient_accumulation_steps",
    "gradient_as_bucket_view",
    "bucket_cap_mb",
)
#: The runs frame's largest rank's counted parts (``memory_<part>_max``).
MEASURED_MEMORY = "memory_total_bytes_max"
#: What a rank's forward saved for its backward, and at how many samples (``activations_at``).
MEASURED_ACTIVATIONS = ("memory_activation_bytes_max", "memory_activation_samples_max")


def fsdp_seconds(network: NetworkModel, traffic: Traffic, n: int) -> float:
    """Seconds of FSDP's collectives a step at ``n`` ranks on ``network``: each kind half a
    ring allreduce of its bytes with its calls as buckets (``(N-1)/N`` bytes, ``N-1`` hops)."""
    total = 0.0
    for nbytes, calls in (
        (traffic.all_gather_bytes, traffic.all_gather_calls),
        (traffic.reduce_scatter_bytes, traffic.reduce_scatter_calls),
    ):
        if nbytes > 0:
            total += float(allreduce_time(network, nbytes, [n], max(1, round(calls)))[0]) / 2
    return total


def _layout_traffic(src: SourceCurve, n: int) -> Traffic | None:
    """FSDP's traffic at ``n`` worked out from the layout, with the source's knobs where it ran
    FSDP (FSDP's defaults where it did not); None without a layout."""
    if src.layout is None:
        return None
    k = src.knobs if src.strategy == "fsdp" else {}
    return fsdp_traffic(
        src.layout,
        n,
        k.get("reshard_after_forward", True),
        k.get("gather_bytes"),
        k.get("reduce_bytes"),
        src.knobs["micro_steps"],
    )


def _fsdp_traffic(src: SourceCurve, n: int) -> Traffic | None:
    """FSDP's traffic at ``n``: the traced, each kind scaled as the layout's grows from the
    traced world size to ``n`` (dim 0's padding); else the layout's."""
    at = _layout_traffic(src, n)
    t = src.traced
    if t is None or not np.isfinite(t.all_gather_bytes):
        return at
    if at is None:
        return t
    base = _layout_traffic(src, src.traced_n)
    assert base is not None

    def scaled(traced: float, layout_at: float, layout_base: float) -> float:
        return traced * layout_at / layout_base if layout_base > 0 else traced

    return Traffic(
        scaled(t.all_gather_bytes, at.all_gather_bytes, base.all_gather_bytes),
        t.all_gather_calls,
        scaled(t.reduce_scatter_bytes, at.reduce_scatter_bytes, base.reduce_scatter_bytes),
        t.reduce_scatter_calls,
    )


def _memory(src: SourceCurve, strategy: str, n: int) -> dict[str, float]:
    """Rank 0's memory at ``n`` under ``strategy``, with the source's knobs where it ran it;
    its activations (not sharded by either strategy) at ``n``'s micro-batch per device, in the
    total where measured (``activation_bytes``: NaN where the runs did not count them)."""
    if src.layout is None:
        return {c: np.nan for c in (*MEMORY_COLUMNS, "total_bytes", "activation_bytes")}
    k = src.knobs if src.strategy == strategy else {}
    out: dict[str, float] = memory_per_rank(  # type: ignore[assignment]
        src.layout,
        strategy,
        n,
        reshard_after_forward=k.get("reshard_after_forward", True),
        gather_bytes=k.get("gather_bytes"),
        bucket_view=k.get("bucket_view", False),
    )
    activations = src.activations_at(n)
    out["activation_bytes"] = activations
    if np.isfinite(activations):
        out["total_bytes"] += activations
    return out


def _ddp_from_fsdp(src: SourceCurve, network: NetworkModel, n: int) -> tuple[float, float]:
    """(compute, exposed allreduce) of DDP at ``n`` from an FSDP curve."""
    if src.layout is None:
        return src.compute_at(n), np.nan
    nbytes = src.layout.gradient_bytes
    buckets = max(1, math.ceil(nbytes / (src.knobs["bucket_cap_mb"] * 2**20)))
    return src.compute_at(n), float(allreduce_time(network, nbytes, [n], buckets)[0])


def _fsdp_at(src: SourceCurve, network: NetworkModel, n: int) -> tuple[float, Traffic | None]:
    """FSDP's exposed communication at ``n`` (its traffic's time times the exposed share the
    source measured; from a DDP curve: all of it), and the traffic."""
    traffic = _fsdp_traffic(src, n)
    if traffic is None:
        return np.nan, None
    share = src.exposed_share if src.strategy == "fsdp" else 1.0
    return (share * fsdp_seconds(network, traffic, n) if n > 1 else 0.0), traffic


def _how(src: SourceCurve, strategy: str) -> str:
    """How a target strategy was modelled from the source curve, for the note."""
    base = f"{src.scaling} scaling from {src.strategy.upper()} at N={src.base_n}"
    if strategy == src.strategy:
        if strategy == "fsdp" and np.isfinite(src.multi_compute_s):
            return (
                f"{base}; compute beyond 1 rank from its N={src.traced_n} run (FSDP's "
                "collectives' host work, which 1 rank skips)"
            )
        return base
    if strategy == "fsdp":
        return (
            f"{base}; FSDP's traffic from the layout, all exposed (no FSDP overlap measured); "
            "FSDP's own host work (its copies, its hooks) not in it: one FSDP run at 1 rank "
            "measures it"
        )
    return f"{base}; DDP's allreduce of the gradients, all exposed (no DDP overlap measured)"


def _ddp_model(
    src: SourceCurve,
    runs: pd.DataFrame,
    steps: pd.DataFrame | StoredSteps,
    network: NetworkModel | None,
    sizes: Sequence[int],
) -> pd.DataFrame:
    """A DDP curve's own model at its points and ``sizes`` (the scaling model's rows: compute
    and exposed allreduce per ``world_size`` and ``nodes``)."""
    mine = runs[runs["run_id"].isin(src.curve["run_id"])]
    pvm = predicted_vs_measured(mine, steps, network, group_by=[], world_sizes=sizes)
    out = pvm[["world_size", "nodes", "note"]].copy()
    out["compute_s"] = pvm["predicted_step_s"] - pvm["predicted_comm_s"]
    out["exposed_comm_s"] = pvm["predicted_comm_s"]
    return out.set_index(["world_size", "nodes"])


def _point(
    src: SourceCurve, strategy: str, n: int, network: NetworkModel, own: pd.Series | None
) -> dict[str, Any]:
    """One strategy at one point: compute, exposed communication, step, rate, speedup, memory;
    ``own``: a DDP source's scaling model at the point."""
    compute = float(own["compute_s"]) if own is not None else src.compute_at(n)
    if strategy == "fsdp" and src.strategy == "ddp":  # FSDP steps 1/N of the parameters
        compute -= src.optimizer_s * (1 - 1 / n) if np.isfinite(src.optimizer_s) else 0.0
    elif strategy == "ddp" and src.strategy == "fsdp":  # DDP steps all of them
        scale = src.base_n / n if src.scaling == "strong" else 1.0
        extra = src.full_optimizer_at_base() - (
            src.optimizer_s if np.isfinite(src.optimizer_s) else 0
        )
        compute = (src.compute_s + extra) * scale
    traffic = None
    if strategy == "ddp" and src.strategy == "ddp":
        exposed = float(own["exposed_comm_s"]) if own is not None else np.nan
    elif strategy == "ddp":
        exposed = _ddp_from_fsdp(src, network, n)[1] if n > 1 else 0.0
    else:
        exposed, traffic = _fsdp_at(src, network, n)
    step = compute + exposed
    rate = src.samples_at(n) / step if step > 0 else np.nan
    memory = _memory(src, strategy, n)
    return {
        "samples_per_s": rate,
        "step_s": step,
        "compute_s": compute,
        "exposed_comm_s": exposed,
        "speedup": rate / src.base_throughput if src.base_throughput > 0 else np.nan,
        **memory,
        "state_bytes": memory["param_bytes"] + memory["grad_bytes"] + memory["optimizer_bytes"],
        "all_gather_bytes": traffic.all_gather_bytes if traffic and n > 1 else np.nan,
        "reduce_scatter_bytes": traffic.reduce_scatter_bytes if traffic and n > 1 else np.nan,
    }


def _measured(src: SourceCurve, strategy: str, n: int, nodes: int) -> dict[str, float]:
    """The source's measurements at a point of its own strategy (NaN elsewhere)."""
    at = src.curve[(src.curve["world_size"] == n) & (src.curve["nodes"] == nodes)]
    if strategy != src.strategy or at.empty:
        return {"measured_samples_per_s": np.nan, "measured_state_bytes": np.nan}
    state = at[MEASURED_MEMORY] if MEASURED_MEMORY in at.columns else pd.Series(dtype=float)
    return {
        "measured_samples_per_s": float(at["samples_per_s"].mean()),
        "measured_state_bytes": float(pd.to_numeric(state, errors="coerce").max()),
    }


def _curve_rows(
    src: SourceCurve,
    strategies: Sequence[str],
    nets: CurveNetworks,
    runs: pd.DataFrame,
    steps: pd.DataFrame | StoredSteps,
    sizes: Sequence[int],
) -> list[dict[str, Any]]:
    """Every strategy at every point of one source curve (its measured points and ``sizes``)."""
    per_node = nets.per_node() or ranks_per_node(src.curve)
    points = curve_points(src.curve, sizes, per_node)
    given = nets.given.model if nets.given is not None else None
    ddp = _ddp_model(src, runs, steps, given, sizes) if src.strategy == "ddp" else None
    classes = list(dict.fromkeys(src.curve.sort_values("world_size")["link_class"]))
    rows = []
    for n, nodes, link in points[["world_size", "nodes", "link_class"]].itertuples(index=False):
        fit = nets.for_point(link, classes, int(n), int(nodes))
        own = ddp.loc[(n, nodes)] if ddp is not None and (n, nodes) in ddp.index else None
        for strategy in strategies:
            row: dict[str, Any] = {"from_strategy": src.strategy, "strategy": strategy}
            row.update(world_size=int(n), nodes=int(nodes), link_class=link)
            note = "; ".join([_how(src, strategy), *src.notes])
            if fit.model is None:
                row.update(note=f"{note}; no network: {fit.note}")
            else:
                row.update(_point(src, strategy, int(n), fit.model, own), note=note)
                row["network"] = fit.model.description or fit.model.name
            if src.layout is None:
                row["note"] += "; memory not predicted: the runs recorded no parameter layout"
            row.update(_measured(src, strategy, int(n), int(nodes)))
            rows.append(row)
    return rows


def compare_strategies(
    runs: pd.DataFrame,
    steps: pd.DataFrame | StoredSteps,
    layouts: Mapping[str, Any],
    world_sizes: Sequence[int],
    strategies: Sequence[str] = STRATEGIES,
    network: NetworkModel | None = None,
    device_memory_bytes: float | None = None,
    group_by: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Per source curve (the study's scaling groups, each of one strategy), each of
    ``strategies`` at the curve's measured points and ``world_sizes``: ``samples_per_s``,
    ``step_s`` = ``compute_s`` + ``exposed_comm_s``, ``speedup`` over the source's base,
    rank 0's memory (:data:`~workbench.analysis.model.memory.MEMORY_COLUMNS`, ``state_bytes``:
    parameters, gradients and optimizer state, ``total_bytes`` with the working set), ``fits``
    (``total_bytes`` within ``device_memory_bytes``; None without it), the measurements where
    the point is the source's own (``measured_samples_per_s``, ``measured_state_bytes``: the
    largest rank's counted parts), ``relative_error``, and how (``network``, ``note``).
    ``layouts``: run id -> ``memory_parts``' layout record. ``network``: every point on it;
    None: each on its link class's network as the study measured it."""
    bad = [s for s in strategies if s not in STRATEGIES]
    if bad or not strategies:
        raise ValueError(f"strategies {list(strategies)}: each one of {', '.join(STRATEGIES)}")
    sizes = sorted({int(n) for n in world_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"world sizes must be 1 or more, got {list(world_sizes)}")
    keys = resolve_group_by(runs, group_by)
    per_run = with_links(run_table(runs, steps, group_by=keys))
    wanted = (*CONFIG, MEASURED_MEMORY, *MEASURED_ACTIVATIONS)
    extra = [c for c in wanted if c in runs.columns and c not in per_run]
    per_run = per_run.merge(runs[["run_id", *extra]].drop_duplicates("run_id"), on="run_id")
    given = None if network is None else network_fit(network, steps, runs)  # type: ignore[arg-type]
    nets = CurveNetworks(given, runs, steps)
    rows = []
    for key, curve in per_run.groupby(keys or (lambda _: "all"), dropna=False, sort=True):
        src = source_curve(curve.reset_index(drop=True), steps, layouts)
        for row in _curve_rows(src, strategies, nets, runs, steps, sizes):
            key = key if isinstance(key, tuple) else (key,)
            rows.append({**dict(zip(keys, key, strict=False)), **row})
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["relative_error"] = out["samples_per_s"] / out["measured_samples_per_s"] - 1
    out = _with_interval(out, runs, steps, keys, per_run)
    limit = device_memory_bytes
    fits = [
        None if limit is None or not np.isfinite(t) else bool(t <= limit)
        for t in out["total_bytes"]
    ]
    out["fits"] = pd.Series(fits, index=out.index, dtype=object)
    return out


def _with_interval(
    out: pd.DataFrame,
    runs: pd.DataFrame,
    steps: pd.DataFrame | StoredSteps,
    keys: list[str],
    per_run: pd.DataFrame,
) -> pd.DataFrame:
    """``out`` with each row's 95 % interval (``half_width``, ``low``, ``high``: as
    :func:`~workbench.analysis.model.predict.predict`'s; a strategy the source curve never ran
    at least :data:`CROSS_STRATEGY_FLOOR` of model error)."""
    curve = [k for k in keys if k in out.columns]
    out = per_curve(out, model_error(runs, steps, keys), curve, "model_error")
    out = per_curve(out, runs_half_width(per_run, keys), curve, "runs_half_width")
    own = half_width(out["model_error"], out["runs_half_width"])
    other = half_width(out["model_error"], out["runs_half_width"], CROSS_STRATEGY_FLOOR)
    out["half_width"] = own.where(out["strategy"] == out["from_strategy"], other)
    out["low"] = out["samples_per_s"] * (1 - out["half_width"])
    out["high"] = out["samples_per_s"] * (1 + out["half_width"])
    return out.drop(columns="runs_half_width")
