"""What if: a sweep's throughput at world sizes it never ran, on a network it never saw.

:func:`predict` feeds the scaling model (:mod:`workbench.analysis.model.scaling_model`: each curve's
base, its compute less the measured exposed communication, its own calibrated overlap) with a
given network and reads off, per curve and world size, throughput, step time, compute, exposed
communication, speedup and efficiency. ``low`` and ``high`` are a 95 % interval of the
throughput (``half_width``, a fraction: :mod:`workbench.analysis.model.prediction_interval`):
the model's error on the runs themselves, ``model_error`` (the RMS of its relative errors at
the measured world sizes other than the base, with the runs' own network: their
micro-benchmark or a fit; at least a floor, the note says where it stands alone), and the
measured runs' own intervals. The model knows nothing of what the runs' own machine added with
N (ranks sharing cores): such growth shows as model error. Pure pandas; no torch.

On a cluster (:func:`target_cluster`: ranks per node, a link class within a node and one
across nodes) the allreduce is the two-level one of
:mod:`workbench.analysis.model.cluster_network`, and ``bound_by`` says which class bounds each
point; the intra-node class may be the one the runs measured on their own machine.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import pandas as pd

from workbench.analysis.measured.links import INTRA
from workbench.analysis.measured.stored import StoredSteps, is_stored
from workbench.analysis.measured.windows import check_columns
from workbench.analysis.model.cluster_network import ClusterNetwork, nodes_for
from workbench.analysis.model.network import NetworkModel, network_fit
from workbench.analysis.model.prediction_interval import (
    FLOOR,
    half_width,
    model_error,
    per_curve,
    runs_half_width,
)
from workbench.analysis.model.scaling_model import predicted_vs_measured
from workbench.analysis.throughput.groups import resolve_group_by
from workbench.analysis.throughput.scaling import run_table

#: The columns of :func:`predict`, after the curve's group columns.
PREDICT_COLUMNS = (
    "world_size",
    "samples_per_s",
    "low",
    "high",
    "step_s",
    "compute_s",
    "exposed_comm_s",
    "speedup",
    "efficiency",
    "base_world_size",
    "model_error",
    "half_width",
    "network",
    "bound_by",
    "note",
)
#: How ``--bandwidth`` (a link rate) becomes the ring's bus bandwidth: an ideal ring sends at the
#: link rate in each direction, so busbw = bits per second / 8 bytes per second. Sustained rings
#: reach about 75-90 % of it: measure (nccl-tests, or the run's own benchmark) and pass --busbw.
BANDWIDTH_RULE = "bus bandwidth = link rate / 8 (bits to bytes, an ideal ring; an upper bound)"

_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


class PredictionError(ValueError):
    """The runs cannot support a prediction; the message says what to run."""


def _number_and_unit(text: str, what: str) -> tuple[float, str]:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/]*)\s*", text)
    if not match:
        raise ValueError(f"{what} {text!r}: expected a number with an optional unit")
    return float(match.group(1)), match.group(2)


def parse_rate(text: str, bits: bool = False) -> float:
    """Bytes per second from ``9.5GB/s``, ``800MB/s`` or ``10Gbit/s``, ``25Gb/s``, ``400Mbps``
    (a lower-case ``b`` or ``bit`` is bits, divided by 8; ``B`` or ``byte`` bytes). Decimal
    prefixes k, M, G, T. A plain number is bytes per second, or bits per second with
    ``bits`` (a link rate)."""
    value, unit = _number_and_unit(text, "rate")
    match = re.fullmatch(r"([kKMGT]?)(bits?|b|B|bytes?)?(?:/s|ps)?", unit)
    if not match:
        raise ValueError(f"rate {text!r}: unknown unit {unit!r} (e.g. 9.5GB/s, 10Gbit/s)")
    prefix, base = match.groups()
    per_bit = bits if base is None else base in ("bit", "bits", "b")
    out = value * _UNITS[prefix.lower()] / (8 if per_bit else 1)
    if not out > 0:
        raise ValueError(f"rate {text!r} must be positive")
    return out


def parse_bytes(text: str) -> float:
    """Bytes from ``80GB``, ``141GiB``, ``512MB`` or a plain number (bytes): decimal prefixes
    k, M, G, T (``80GB`` is 80e9 bytes, as vendors state device memory), binary ones with
    ``i`` (``80GiB`` is 80 x 2^30)."""
    value, unit = _number_and_unit(text, "memory")
    match = re.fullmatch(r"([kKMGT]?)(i?)(B?)", unit)
    if not match or (match.group(2) and not match.group(1)):
        raise ValueError(f"memory {text!r}: unknown unit {unit!r} (e.g. 80GB, 141GiB, 512MB)")
    prefix, binary = match.group(1).lower(), bool(match.group(2))
    power = "kmgt".index(prefix) + 1 if prefix else 0
    out = value * ((2**10) ** power if binary else (1e3) ** power)
    if not out > 0:
        raise ValueError(f"memory {text!r} must be positive")
    return out


def parse_seconds(text: str) -> float:
    """Seconds from ``5us``, ``0.5ms``, ``2s`` or a plain number (seconds)."""
    value, unit = _number_and_unit(text, "latency")
    if unit and unit.lower() not in _TIME:
        raise ValueError(f"latency {text!r}: unknown unit {unit!r} (s, ms, us, ns)")
    out = value * _TIME.get(unit.lower(), 1.0)
    if out < 0:
        raise ValueError(f"latency {text!r} must not be negative")
    return out


def target_network(
    busbw_bytes_per_s: float | None = None,
    link_bits_per_s: float | None = None,
    latency_s: float = 0.0,
) -> NetworkModel:
    """The network to predict on: an allreduce bus bandwidth in nccl-tests' terms (the ring
    model's bandwidth, exactly), or a link rate converted by :data:`BANDWIDTH_RULE`."""
    if (busbw_bytes_per_s is None) == (link_bits_per_s is None):
        raise ValueError("give exactly one of a bus bandwidth and a link rate")
    if busbw_bytes_per_s is not None:
        bw, how = busbw_bytes_per_s, f"bus bandwidth {busbw_bytes_per_s / 1e9:.3g} GB/s"
    else:
        assert link_bits_per_s is not None
        bw = link_bits_per_s / 8
        how = f"link {link_bits_per_s / 1e9:.3g} Gbit/s ({BANDWIDTH_RULE})"
    return NetworkModel(
        name="given",
        bandwidth_bytes_per_s=bw,
        latency_s=latency_s,
        description=f"{how}, latency {latency_s * 1e6:.3g} us per hop and bucket",
    )


def target_cluster(
    inter: NetworkModel,
    per_node: int,
    intra: NetworkModel | None = None,
    runs: pd.DataFrame | None = None,
    steps: pd.DataFrame | StoredSteps | None = None,
) -> ClusterNetwork:
    """A cluster of ``per_node`` ranks a node: ``inter`` across nodes and ``intra`` within one,
    or, where ``intra`` is not given, the intra-node network the runs measured on their own
    machine (their micro-benchmark or a fit to their traces). With one rank a node no allreduce
    runs within a node: none is needed, and ``inter`` stands in for it."""
    if intra is None and per_node == 1:
        intra = inter
    if intra is None:
        if runs is None or steps is None:
            raise ValueError("no intra-node network given and no runs to measure it on")
        fit = network_fit(None, steps, runs, link=INTRA)  # type: ignore[arg-type]
        if fit.model is None:
            raise PredictionError(
                f"no intra-node network measured by the runs ({fit.note}); give the link "
                "within a node: --intra-busbw (e.g. 150GB/s for NVLink) or --intra-bandwidth"
            )
        measured = fit.model
        intra = NetworkModel(
            name="measured",
            bandwidth_bytes_per_s=measured.bandwidth_bytes_per_s,
            latency_s=measured.latency_s,
            description=f"as the runs measured it on their machine: bus bandwidth "
            f"{measured.bandwidth_bytes_per_s / 1e9:.3g} GB/s, latency "
            f"{measured.latency_s * 1e6:.3g} us",
        )
    return ClusterNetwork.of(intra, inter, per_node)


def sweep_ranks_per_node(runs: pd.DataFrame) -> int:
    """The ranks a node of the completed runs on more than one node (``world_size / nodes``),
    where they agree: the layout to predict more nodes on. :class:`PredictionError` naming
    what the runs have otherwise."""
    done = runs if "status" not in runs.columns else runs[runs["status"] == "completed"]
    if "nodes" not in done.columns:
        raise PredictionError("the runs record no node count: give --per-node")
    nodes = pd.to_numeric(done["nodes"], errors="coerce")
    wide = done[nodes > 1]
    layouts = zip(wide["world_size"], wide["nodes"], strict=True)
    per_node = sorted({int(w) // int(n) for w, n in layouts})
    if len(per_node) != 1:
        have = f"ranks a node {', '.join(map(str, per_node))}" if per_node else "none"
        raise PredictionError(
            f"--per-node not given and the sweep's completed runs on more than one node do not "
            f"say one layout ({have}); give --per-node"
        )
    return per_node[0]


def _gradient_traffic(steps: pd.DataFrame | StoredSteps, run_ids: pd.Series) -> bool:
    """Whether a multi-rank run of ``run_ids`` handed gradient bytes to allreduce."""
    if is_stored(steps):
        p = steps.per_rank
        return bool((p.loc[p["run_id"].isin(run_ids), "multi_rank_bytes"].fillna(0) > 0).any())
    multi = steps[steps["run_id"].isin(run_ids) & (steps["world_size"] > 1)]
    return not multi.empty and bool((multi["comm_bytes"].fillna(0) > 0).any())


def _asked(
    table: pd.DataFrame, sizes: list[int], network: NetworkModel | None, curve: list[str]
) -> pd.DataFrame:
    """One row per curve and asked world size: on a given cluster the point laid out on its
    nodes; on a plain network any (its prediction does not depend on the nodes a point was
    measured on)."""
    rows = table[table["world_size"].isin(sizes)]
    if isinstance(network, ClusterNetwork):
        rows = rows[rows["nodes"] == [nodes_for(n, network.per_node) for n in rows["world_size"]]]
    return rows.drop_duplicates([*curve, "world_size"]).reset_index(drop=True)


def predict(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    world_sizes: Sequence[int],
    network: NetworkModel | None,
    group_by: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Per scaling curve and each of ``world_sizes``: predicted ``samples_per_s`` (its
    ``low``-``high`` interval from ``model_error``, the model's RMS relative error on the
    runs), ``step_s`` = ``compute_s`` + ``exposed_comm_s``, ``speedup`` over the curve's
    base and ``efficiency`` (speedup / (N / base N)), on ``network`` (None: the network the
    runs measured, per link class: more ranks on the machine they ran on). Raises
    :class:`PredictionError` when no completed multi-rank run traced gradient bytes (the model
    needs them, and the overlap measured at 2 ranks or more), or when no curve could be
    predicted (the notes say why)."""
    sizes = sorted({int(n) for n in world_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"world sizes must be 1 or more, got {list(world_sizes)}")
    check_columns(steps, ("run_id", "world_size", "comm_bytes"), "steps")
    done = runs if "status" not in runs.columns else runs[runs["status"] == "completed"]
    if not _gradient_traffic(steps, done["run_id"]):
        raise PredictionError(
            "no completed multi-rank run with gradient traffic: the model needs the gradient "
            "bytes and the overlap measured at 2 ranks or more; run the config at 1 and 2 ranks "
            "first, e.g. workbench scale --world-sizes 1,2 --sweep NAME"
        )
    keys = resolve_group_by(runs, group_by)
    table = predicted_vs_measured(runs, steps, network, group_by=keys, world_sizes=sizes)
    curve = [c for c in keys if c in table.columns]
    rows = _asked(table, sizes, network, curve)
    if rows["predicted_samples_per_s"].isna().all():
        notes = "; ".join(dict.fromkeys(str(n) for n in rows["note"]))
        raise PredictionError(f"no curve could be predicted: {notes}")
    rows = per_curve(rows, model_error(runs, steps, keys), curve, "model_error")
    spread = runs_half_width(run_table(runs, steps, group_by=keys), keys)
    rows = per_curve(rows, spread, curve, "runs_half_width")
    half = half_width(rows["model_error"], rows["runs_half_width"])
    curve = [c for c in curve if rows[c].astype(str).nunique() > 1]  # those that tell apart
    out = rows[curve].copy() if curve else pd.DataFrame(index=rows.index)
    out["world_size"] = rows["world_size"].astype("int64")
    out["samples_per_s"] = rows["predicted_samples_per_s"]
    out["low"] = out["samples_per_s"] * (1 - half)
    out["high"] = out["samples_per_s"] * (1 + half)
    out["step_s"] = rows["predicted_step_s"]
    out["exposed_comm_s"] = rows["predicted_comm_s"]
    out["compute_s"] = rows["predicted_step_s"] - rows["predicted_comm_s"]
    out["speedup"] = rows["predicted_speedup"]
    out["efficiency"] = rows["predicted_speedup"] / (rows["world_size"] / rows["base_world_size"])
    out["base_world_size"] = rows["base_world_size"].astype("int64")
    out["model_error"] = rows["model_error"]
    out["half_width"] = half
    out["network"] = network.description or network.name if network else rows["network"]
    out["bound_by"] = rows["bound_by"] if "bound_by" in rows.columns else None
    out["note"] = [
        str(note)
        + ("" if math.isfinite(float(e)) else f"; no measured point besides the base: {FLOOR}")
        for note, e in zip(rows["note"], rows["model_error"], strict=True)
    ]
    return out[[*curve, *PREDICT_COLUMNS]].reset_index(drop=True)
