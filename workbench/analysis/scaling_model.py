"""A ring-allreduce model of DDP scaling: predict step time and speedup at other world sizes.

    step_s(N) = compute_s(N) + (1 - overlap) * ring_allreduce_time(gradient_bytes, N, bw, latency)

``compute_s`` comes from the measured base: its wall step time (the measured window over its
measured steps, the time basis of the scaling table) less its measured exposed communication
(DDP's ``comm_exposed_s`` on the sampled steps; the span ``comm_s`` only where the trace has no
exposed timer, the no-overlap bound). ``overlap`` is calibrated from the runs' own sampled
steps, ``1 - exposed / span``, unless given. A
weak-scaling curve keeps the per-device batch, hence ``compute_s``, as N grows; a strong-scaling
curve keeps the global batch, so the per-device batch, and with it ``compute_s``, shrinks as
``base N / N``. Gradient bytes and bucket count come from the traces (``comm_bytes``,
``comm_buckets``); the network from :data:`NETWORK_PRESETS` or :func:`fit_network`, or a
cluster of two link classes (:class:`workbench.analysis.cluster_network.ClusterNetwork`: the
allreduce inside a node, then across nodes). Pure pandas/numpy; no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analysis.cluster_network import ClusterNetwork, allreduce_time
from workbench.analysis.groups import resolve_group_by
from workbench.analysis.model_base import (
    CurveRows,
    backward_compute,
    calibrated_overlap,
    exposed_at_base,
    sampled_medians,
)
from workbench.analysis.network import (
    MIN_FIT_WORLD_SIZES,
    NETWORK_PRESETS,
    NetworkFit,
    NetworkModel,
    as_network,
    fit_network,
    link_class,
    measured_network,
    network_fit,
    ring_allreduce_time,
)
from workbench.analysis.scaling import run_table
from workbench.analysis.windows import check_columns, measured_steps, measured_window

__all__ = [
    "MIN_FIT_WORLD_SIZES",
    "NETWORK_PRESETS",
    "NetworkFit",
    "NetworkModel",
    "fit_network",
    "measured_network",
    "predict_scaling",
    "predicted_vs_measured",
    "ring_allreduce_time",
]


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


def _bytes_and_buckets(
    m: pd.DataFrame, gradient_bytes: float | None, buckets: int | None
) -> tuple[float, int]:
    """Medians over measured steps and ranks of gradient bytes and buckets (those given win)."""
    nbytes = gradient_bytes
    if nbytes is None:
        nbytes = float(np.median(m["comm_bytes"].fillna(0))) if len(m) else 0.0
    if buckets is None:
        has = "comm_buckets" in m.columns and m["comm_buckets"].notna().any()
        buckets = max(1, int(np.median(m["comm_buckets"].dropna()))) if has else 1
    return nbytes, buckets


def predict_scaling(
    steps: pd.DataFrame,
    network: str | NetworkModel,
    world_sizes: Sequence[int],
    overlap: float | None = None,
    gradient_bytes: float | None = None,
    buckets: int | None = None,
    scaling: str = "weak",
) -> pd.DataFrame:
    """Predicted step time, throughput and speedup of one run's config at ``world_sizes``.

    From the run's measured window: the wall step time (``measured_s / steps``), the samples per
    step, and on its sampled steps (those where DDP's timer ran; never carried to the steps
    between) the exposed communication ``comm_exposed_s`` and the span ``comm_s`` (medians over
    steps of the smallest over ranks), gradient bytes (``comm_bytes``) and ``comm_buckets``
    unless given (a 1-rank run without DDP traces no bytes: pass ``gradient_bytes``).
    ``compute_s = step_s - exposed`` (0 exposed for one rank; ``(1 - overlap) x span`` where the
    trace has no exposed timer). ``overlap`` in [0, 1] is the share of the allreduce hidden
    behind backward; ``None`` calibrates it from the run, ``1 - exposed / span`` (0 for one
    rank or without the exposed timer: the pessimistic no-overlap case). ``scaling="strong"``
    keeps the global batch (compute per step scales as the run's N / N). Columns: those of
    :func:`model_curve`, and the model's inputs on every row: ``network`` (its name),
    ``gradient_bytes``, ``buckets``, ``overlap``, ``scaling``.
    """
    if overlap is not None and not 0 <= overlap <= 1:
        raise ValueError(f"overlap must be within [0, 1], got {overlap}")
    net = as_network(network)
    check_columns(steps, ("step_s", "comm_s", "comm_bytes", "samples"), "steps")
    run_ids = pd.unique(steps["run_id"])
    if len(run_ids) != 1:
        raise ValueError(f"predict_scaling needs the steps of one run, got runs {list(run_ids)}")
    cols = ["world_size", "step_s", "comm_s", "comm_exposed_s", "comm_bytes", "comm_buckets"]
    m = measured_steps(steps, [*cols, "backward_s", "backward_compute_s"])
    if m.empty:
        raise ValueError(f"run {run_ids[0]!r} has no measured (non-warm-up) steps")
    window = measured_window(steps).iloc[0]
    exposed, span, measured = sampled_medians(m)
    if overlap is None:
        overlap = calibrated_overlap(exposed, span, measured)
    nbytes, buckets = _bytes_and_buckets(m, gradient_bytes, buckets)
    exposed_b = (
        exposed_at_base(exposed, span, measured, overlap) if window["world_size"] > 1 else 0.0
    )
    base = Base(
        world_size=int(window["world_size"]),
        step_s=float(window["wall_step_s"]),
        samples_per_step=float(window["samples"] / window["steps"]),
        exposed_comm_s=exposed_b,
        gradient_bytes=nbytes,
        buckets=buckets,
        scaling=scaling,
        backward_compute_s=backward_compute(m, exposed_b),
    )
    out = model_curve(base, net, world_sizes, overlap)
    return out.assign(
        network=net.name, gradient_bytes=nbytes, buckets=buckets, overlap=overlap, scaling=scaling
    )


def _curve_base(
    steps: pd.DataFrame, curve: pd.DataFrame, overlap: float | None
) -> tuple[Base | None, str, float]:
    """The base of one curve (its per-run rows): the mean of the smallest world size's repeats;
    bytes and buckets from the curve's multi-rank runs; the overlap (given, or calibrated from
    the base's sampled steps, or for a 1-rank base from the curve's smallest multi-rank world
    size). ``None`` and why when there is none."""
    scaling = curve["scaling"].iloc[0] if "scaling" in curve.columns else None
    unknown = not isinstance(scaling, str)
    if unknown:  # no batch columns in the runs: the model's classic (weak) assumption
        scaling = "weak"
    if scaling not in ("weak", "strong"):
        return None, f"scaling={scaling}: the curve mixes batches, no prediction", 0.0
    base_n = int(curve["world_size"].min())
    repeats = curve[curve["world_size"] == base_n]
    cols = ["world_size", "comm_s", "comm_exposed_s", "comm_bytes", "comm_buckets"]
    cols += ["backward_s", "backward_compute_s"]
    rows = CurveRows(steps, curve["run_id"], repeats["run_id"])
    if not rows.has_bytes():
        return None, "no gradient bytes: the curve has no multi-rank run, no prediction", 0.0
    exposed, span, measured = sampled_medians(rows.base_sampled if base_n > 1 else rows.smallest)
    if overlap is None:
        overlap = calibrated_overlap(exposed, span, measured)
    exposed_b = exposed_at_base(exposed, span, measured, overlap) if base_n > 1 else 0.0
    samples_per_step = float((repeats["samples"] / repeats["steps"]).mean())
    throughput = float(repeats["samples_per_s"].mean())
    if not (np.isfinite(throughput) and throughput > 0 and samples_per_step > 0):
        return None, "no prediction: the base measured no throughput (no samples or steps)", overlap
    # the step time of the repeats' mean throughput: the scaling table's speedup base
    step_s = samples_per_step / throughput
    if not (np.isfinite(step_s - exposed_b) and step_s - exposed_b > 0):
        return (
            None,
            f"no prediction: the base's compute could not be measured (wall step "
            f"{step_s:.3g} s less exposed communication {exposed_b:.3g} s); run more "
            "measured steps, with trace_comm sampling some of them",
            overlap,
        )
    buckets = rows.multi_median("comm_buckets")
    base = Base(
        world_size=base_n,
        step_s=step_s,
        samples_per_step=samples_per_step,
        exposed_comm_s=exposed_b,
        gradient_bytes=rows.multi_median("comm_bytes"),
        buckets=max(1, int(buckets)) if np.isfinite(buckets) else 1,
        scaling=scaling,
        backward_compute_s=rows.base_backward_compute(exposed_b),
    )
    note = f"{scaling} scaling from {len(repeats)} run(s) at N={base_n}"
    if unknown:
        note += " (no batch columns: assumed weak)"
    return base, note, overlap


def _predict_curve(
    steps: pd.DataFrame,
    curve: pd.DataFrame,
    fit: NetworkFit,
    world_sizes: Sequence[int],
    overlap: float | None,
) -> pd.DataFrame:
    """One curve's rows: its measured world sizes plus ``world_sizes``, predicted or not (why)."""
    sizes = sorted({int(w) for w in curve["world_size"]} | {int(w) for w in world_sizes})
    base, note, overlap = _curve_base(steps, curve, overlap)
    out = pd.DataFrame({"world_size": sizes})
    out["base_world_size"] = int(curve["world_size"].min())
    base_ids = curve.loc[curve["world_size"] == out["base_world_size"].iloc[0], "run_id"]
    out["base_run_id"] = ", ".join(sorted(map(str, pd.unique(base_ids))))
    cols = ("step_s", "comm_s", "samples_per_s", "speedup")
    out["network"] = fit.model.name if fit.model is not None else np.nan
    out["overlap"] = overlap
    if base is None or fit.model is None:
        for c in cols:
            out[f"predicted_{c}"] = np.nan
        out["note"] = note if base is None else fit.note
        return out
    pred = model_curve(base, fit.model, sizes, overlap)
    base_thr = pred.loc[pred["world_size"] == base.world_size, "samples_per_s"].iloc[0]
    out["predicted_step_s"] = pred["step_s"].to_numpy()
    out["predicted_comm_s"] = pred["exposed_comm_s"].to_numpy()
    out["predicted_samples_per_s"] = pred["samples_per_s"].to_numpy()
    out["predicted_speedup"] = (pred["samples_per_s"] / base_thr).to_numpy()
    if isinstance(fit.model, ClusterNetwork):
        out["bound_by"] = fit.model.bound_by(base.gradient_bytes, sizes, base.buckets)
    out["note"] = note
    return out


def _measured(curve: pd.DataFrame, sizes: pd.Series) -> pd.DataFrame:
    """The curve's measurements at ``sizes`` (means over repeats, NaN where not measured), the
    speedup over its base (mean throughputs, as in the scaling table)."""
    means = curve.groupby("world_size")[["train_step_s", "samples_per_s"]].mean()
    means = means.rename(columns={"train_step_s": "step_s"})
    out = means.reindex(sizes.to_numpy()).add_prefix("measured_")
    out["measured_speedup"] = out["measured_samples_per_s"] / means["samples_per_s"].iloc[0]
    return out.reset_index(drop=True)


def _curve_network(
    network: str | NetworkModel | NetworkFit | None,
    steps: pd.DataFrame,
    runs: pd.DataFrame,
    curve: pd.DataFrame,
) -> NetworkFit:
    """The network of one curve: ``network`` as given, or measured on the runs of the curve's
    link class (intra-node when its runs fit on one node, inter-node otherwise): the links
    differ by an order of magnitude, a median over both describes neither."""
    if network is not None:
        return network_fit(network, steps, runs)
    nodes = curve["nodes"].max() if "nodes" in curve.columns else None
    return network_fit(None, steps, runs, link=link_class(nodes))


def predicted_vs_measured(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    network: str | NetworkModel | NetworkFit | None = None,
    group_by: Sequence[str] | None = None,
    world_sizes: Sequence[int] = (),
    overlap: float | None = None,
) -> pd.DataFrame:
    """Per curve (scaling group and node count): the model fed by the curve's base next to the
    measurements.

    Only completed runs are used. The base is the curve's smallest world size, the mean of its
    repeats: the step time at which its samples per step give the repeats' mean throughput, so
    that prediction and measurement agree at the base (``relative_error`` 0) and the speedups
    share the scaling table's base. Weak and strong curves are modelled as such (see
    :func:`model_curve`); a ``mixed`` curve gets no prediction. ``network``: a preset name, a
    :class:`NetworkModel`, a :class:`NetworkFit`, or ``None`` to measure one per curve on the
    runs of its link class (intra-node for one node, inter-node otherwise; see
    :func:`network_fit`). ``overlap``: ``None`` calibrates it per curve from its sampled steps
    (``1 - exposed / span``; the ``overlap`` column says what was used). Rows cover the curve's
    measured world sizes plus ``world_sizes`` (extrapolations, NaN measured columns). Measured
    and predicted share one time basis: wall step time over the measured window, and
    throughput from it. Speedups are over the curve's base, both measured and predicted.
    ``relative_error = predicted_samples_per_s / measured_samples_per_s - 1``. ``network``
    names the model (NaN without one) and ``note`` says how the curve was modelled, or why it
    was not. Pass the ``group_by`` list on to the figure.
    """
    keys = resolve_group_by(runs, group_by)
    per_run = run_table(runs, steps, group_by=keys)
    curve_keys = [*keys, *(["nodes"] if "nodes" in per_run.columns else [])] or ["_group"]
    if curve_keys == ["_group"]:
        per_run["_group"] = "all"
    parts = []
    for key, curve in per_run.groupby(curve_keys, dropna=False, sort=True):
        fit = _curve_network(network, steps, runs, curve)
        part = _predict_curve(steps, curve, fit, world_sizes, overlap)
        part = pd.concat([part, _measured(curve, part["world_size"])], axis=1)
        key = key if isinstance(key, tuple) else (key,)
        for k, v in reversed(list(zip(curve_keys, key, strict=True))):
            part.insert(0, k, v)
        parts.append(part)
    if not parts:  # no completed run with measured steps
        return pd.DataFrame(columns=[*keys, "world_size", "predicted_speedup", "measured_speedup"])
    out = pd.concat(parts, ignore_index=True)
    out["relative_error"] = out["predicted_samples_per_s"] / out["measured_samples_per_s"] - 1
    out.insert(len(curve_keys) + 1, "network", out.pop("network"))
    return out.drop(columns="_group") if curve_keys == ["_group"] else out
