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
cluster of two link classes (:class:`workbench.analysis.model.cluster_network.ClusterNetwork`: the
allreduce inside a node, then across nodes). A curve is a config whatever its node counts: its
points are ``(world_size, nodes)``, each predicted on the network of the link class it crossed
(:mod:`workbench.analysis.model.curve_links`). The arithmetic from a base and a network is
:mod:`workbench.analysis.model.step_model`. Pure pandas/numpy; no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from workbench.analysis.measured.links import point_link_class
from workbench.analysis.measured.stored import StoredSteps
from workbench.analysis.measured.windows import check_columns, measured_steps, measured_window
from workbench.analysis.model.curve_links import (
    POINT_COLUMNS,
    CurveNetworks,
    base_point,
    bound_by,
    curve_points,
    ranks_per_node,
    with_links,
)
from workbench.analysis.model.model_base import (
    CurveRows,
    backward_compute,
    calibrated_overlap,
    exposed_at_base,
    sampled_medians,
)
from workbench.analysis.model.network import (
    MIN_FIT_WORLD_SIZES,
    NETWORK_PRESETS,
    NetworkFit,
    NetworkModel,
    as_network,
    fit_network,
    measured_network,
    network_fit,
    ring_allreduce_time,
)
from workbench.analysis.model.step_model import Base, model_arrays, model_curve
from workbench.analysis.throughput.groups import resolve_group_by
from workbench.analysis.throughput.scaling import run_table

__all__ = [
    "MIN_FIT_WORLD_SIZES",
    "Base",
    "NETWORK_PRESETS",
    "NetworkFit",
    "NetworkModel",
    "fit_network",
    "measured_network",
    "model_arrays",
    "model_curve",
    "predict_scaling",
    "predicted_vs_measured",
    "ring_allreduce_time",
]


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


#: What a curve's base depends on among its per-run rows (with the overlap asked for).
BASE_INPUTS = ("run_id", "world_size", "nodes", "samples", "steps", "samples_per_s", "scaling")


def _curve_base(
    steps: pd.DataFrame | StoredSteps, curve: pd.DataFrame, overlap: float | None
) -> tuple[Base | None, str, float]:
    """:func:`_curve_base_of`, kept on stored steps for the same curve and overlap: a what-if
    predicts on the network asked and again on the runs' own (its interval), from one base."""
    if not isinstance(steps, StoredSteps):
        return _curve_base_of(steps, curve, overlap)
    inputs = curve[[c for c in BASE_INPUTS if c in curve.columns]]
    rows = tuple(inputs.itertuples(index=False, name=None))
    key = ("curve_base", tuple(inputs.columns), rows, overlap)
    return steps.kept(key, (), lambda: _curve_base_of(steps, curve, overlap))


def _curve_base_of(
    steps: pd.DataFrame | StoredSteps, curve: pd.DataFrame, overlap: float | None
) -> tuple[Base | None, str, float]:
    """The base of one curve (its per-run rows): the mean of the repeats at its base point (the
    smallest world size, on the fewest nodes there); bytes and buckets from the curve's
    multi-rank runs, whatever their nodes; the overlap (given, or calibrated from the base's
    sampled steps, or for a 1-rank base from the curve's smallest multi-rank world size).
    ``None`` and why when there is none."""
    scaling = curve["scaling"].iloc[0] if "scaling" in curve.columns else None
    unknown = not isinstance(scaling, str)
    if unknown:  # no batch columns in the runs: the model's classic (weak) assumption
        scaling = "weak"
    if scaling not in ("weak", "strong"):
        return None, f"scaling={scaling}: the curve mixes batches, no prediction", 0.0
    base_n, base_nodes = base_point(curve)
    repeats = curve[(curve["world_size"] == base_n) & (curve["nodes"] == base_nodes)]
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
    where = f"{base_nodes} nodes" if base_nodes > 1 else "1 node"
    note = f"{scaling} scaling from {len(repeats)} run(s) at N={base_n}"
    note += f" ({where})" if (curve["nodes"] > 1).any() else ""
    if unknown:
        note += " (no batch columns: assumed weak)"
    return base, note, overlap


PREDICTED = ("step_s", "comm_s", "samples_per_s", "speedup")


def _predict_curve(
    steps: pd.DataFrame | StoredSteps,
    curve: pd.DataFrame,
    nets: CurveNetworks,
    world_sizes: Sequence[int],
    overlap: float | None,
) -> pd.DataFrame:
    """One curve's rows: its measured points plus ``world_sizes``, each predicted on the
    network of its link class, or not (the note says why)."""
    per_node = nets.per_node() or ranks_per_node(curve)
    out = curve_points(curve, world_sizes, per_node)
    base_n, base_nodes = base_point(curve)
    out["base_world_size"], out["base_nodes"] = base_n, base_nodes
    at_base = (curve["world_size"] == base_n) & (curve["nodes"] == base_nodes)
    out["base_run_id"] = ", ".join(sorted(map(str, pd.unique(curve.loc[at_base, "run_id"]))))
    base, note, overlap = _curve_base(steps, curve, overlap)
    classes = list(dict.fromkeys(curve.sort_values("world_size")["link_class"]))
    where = zip(out["link_class"], out["world_size"], out["nodes"], strict=True)
    fits = [nets.for_point(link, classes, int(n), int(m)) for link, n, m in where]
    out["network"] = [f.model.name if f.model is not None else np.nan for f in fits]
    out["overlap"] = overlap
    for c in PREDICTED:
        out[f"predicted_{c}"] = np.nan
    base_fit = nets.for_point(point_link_class(base_n, base_nodes), classes, base_n, base_nodes)
    if base is None or base_fit.model is None:
        out["note"] = note if base is None else base_fit.note
        return out
    out["note"] = [note if f.model is not None else f.note for f in fits]
    base_thr = model_arrays(base, base_fit.model, [base_n], overlap)["samples_per_s"][0]
    for i, fit in enumerate(fits):
        if fit.model is None:
            continue
        n = int(out.at[i, "world_size"])
        pred = model_arrays(base, fit.model, [n], overlap)
        out.loc[i, "predicted_step_s"] = pred["step_s"][0]
        out.loc[i, "predicted_comm_s"] = pred["exposed_comm_s"][0]
        out.loc[i, "predicted_samples_per_s"] = pred["samples_per_s"][0]
        out.loc[i, "predicted_speedup"] = pred["samples_per_s"][0] / base_thr
    if nets.per_node() is not None:  # a given cluster: the link class bounding each point
        out["bound_by"] = [
            bound_by(f.model, base.gradient_bytes, n, base.buckets) if f.model else np.nan
            for f, n in zip(fits, out["world_size"], strict=True)
        ]
    return out


def _measured(curve: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """The curve's measurements at ``points`` (means over the repeats of each world size and
    node count, NaN where not measured), the speedup over its base point (mean throughputs, as
    in the scaling table)."""
    point = ["world_size", "nodes"]
    means = curve.groupby(point)[["train_step_s", "samples_per_s"]].mean()
    means = means.rename(columns={"train_step_s": "step_s"})
    out = means.reindex(pd.MultiIndex.from_frame(points[point])).add_prefix("measured_")
    out["measured_speedup"] = out["measured_samples_per_s"] / means["samples_per_s"].iloc[0]
    return out.reset_index(drop=True)


def _given(
    network: str | NetworkModel | NetworkFit | None,
    steps: pd.DataFrame | StoredSteps,
    runs: pd.DataFrame,
) -> NetworkFit | None:
    return None if network is None else network_fit(network, steps, runs)  # type: ignore[arg-type]


def predicted_vs_measured(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    network: str | NetworkModel | NetworkFit | None = None,
    group_by: Sequence[str] | None = None,
    world_sizes: Sequence[int] = (),
    overlap: float | None = None,
) -> pd.DataFrame:
    """Per curve (scaling group: the node count is an axis, never a curve of its own) and
    point (``world_size``, ``nodes``, its ``link_class``): the model fed by the curve's base
    next to the measurements.

    Only completed runs are used. The base is the curve's smallest world size on the fewest
    nodes there (``base_world_size``, ``base_nodes``), the mean of its repeats: the step time at
    which its samples per step give the repeats' mean throughput, so that prediction and
    measurement agree at the base (``relative_error`` 0) and the speedups share the scaling
    table's base. Gradient bytes and the overlap come from the curve's multi-rank runs, whatever
    their nodes. Weak and strong curves are modelled as such (see :func:`model_curve`); a
    ``mixed`` curve gets no prediction. ``network``: a preset name, a :class:`NetworkModel` (a
    :class:`~workbench.analysis.model.cluster_network.ClusterNetwork` too), a :class:`NetworkFit`:
    every point on it; or ``None``: each point on the network of its link class, measured on
    the study's runs that crossed that class (within a node: runs on one node; across nodes:
    runs on several; see :mod:`workbench.analysis.model.curve_links`). ``overlap``: ``None``
    calibrates it per curve from its sampled steps (``1 - exposed / span``; the ``overlap``
    column says what was used). Rows cover the curve's measured points plus ``world_sizes``
    not measured (extrapolations, NaN measured columns, laid out on nodes of the curve's ranks
    per node, or the given cluster's). Measured and predicted share one time basis: wall step
    time over the measured window, and throughput from it. Speedups are over the curve's base,
    both measured and predicted. ``relative_error = predicted_samples_per_s /
    measured_samples_per_s - 1``. ``network`` names each point's model (NaN without one) and
    ``note`` says how the curve was modelled, or why a point was not. Pass the ``group_by``
    list on to the figure.
    """
    keys = resolve_group_by(runs, group_by)
    per_run = with_links(run_table(runs, steps, group_by=keys))
    curve_keys = keys or ["_group"]
    if not keys:
        per_run["_group"] = "all"
    nets = CurveNetworks(_given(network, steps, runs), runs, steps)
    parts = []
    for key, curve in per_run.groupby(curve_keys, dropna=False, sort=True):
        part = _predict_curve(steps, curve, nets, world_sizes, overlap)
        part = pd.concat([part, _measured(curve, part)], axis=1)
        key = key if isinstance(key, tuple) else (key,)
        for k, v in reversed(list(zip(curve_keys, key, strict=True))):
            part.insert(0, k, v)
        parts.append(part)
    if not parts:  # no completed run with measured steps
        return pd.DataFrame(
            columns=[*keys, "world_size", *POINT_COLUMNS, "predicted_speedup", "measured_speedup"]
        )
    out = pd.concat(parts, ignore_index=True)
    out["relative_error"] = out["predicted_samples_per_s"] / out["measured_samples_per_s"] - 1
    out.insert(len(curve_keys) + 3, "network", out.pop("network"))
    return out.drop(columns="_group") if not keys else out
