"""Throughput and scaling: one row per run and group (:func:`run_table`) and one per scaling group
and world size (:func:`scaling_table`), with speedup, efficiency, epoch time, final loss and
metric and time to quality.

Inputs: ``runs`` (one row per run: ``run_id``, ``sweep``, ``status`` and the flattened config
columns), ``steps`` and ``evals`` (the store's trace frames). Tables report a mean under the plain
column name and the standard deviation of the runs (ddof 1; NaN from one run) under
``<name>_std``. Pass the grouping explicitly (see
:func:`workbench.analysis.throughput.groups.resolve_group_by`); ``None`` means the default grouping.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from workbench.analysis.measured.flops import add_flops_columns
from workbench.analysis.measured.links import point_link_class
from workbench.analysis.measured.stored import is_stored
from workbench.analysis.measured.windows import (
    check_columns,
    eval_rows,
    lower_is_better,
    measured_steps,
    measured_window,
)
from workbench.analysis.throughput.completeness import mark_incomplete
from workbench.analysis.throughput.groups import assign_groups, group_frame, resolve_group_by
from workbench.trace.known import pooled

#: Per-run figures a scaling point averages (mean and ``_std``), when present.
POINT_METRICS = (
    "samples_per_s",
    "end_to_end_samples_per_s",
    "samples_per_s_per_device",
    "wall_step_s",
    "epoch_s",
    "final_loss",
    "final_eval_loss",
    "final_metric",
    "time_to_quality_s",
    "tflops_per_device",
    "mfu",
)
#: What each run says about its FLOPs (``run.json``'s ``flops``, see
#: :mod:`workbench.analysis.measured.flops`), carried from ``runs`` into the run table.
FLOPS_FACTS = (
    "flops_per_sample",
    "flops_matmul_precision",
    "flops_cudnn_allow_tf32",
    "flops_conv_share",
    "flops_error",
    "device_name",
)
#: Per-run columns a point keeps when all its runs agree (NaN otherwise).
POINT_FACTS = ("scaling", "per_device_batch_size", "global_batch_size")


def _final_loss(steps: pd.DataFrame) -> pd.Series:
    """Training loss at each run's last measured step, averaged over ranks."""
    if is_stored(steps):
        return steps.final_loss.set_index("run_id")["final_loss"]
    m = measured_steps(steps, ["loss"])
    if "loss" not in m.columns or m.empty:  # the run ids' dtype: an empty merge still works
        none = pd.Index([], dtype=steps["run_id"].dtype, name="run_id")
        return pd.Series(dtype="float64", name="final_loss", index=none)
    last = m.groupby("run_id")[["attempt", "step"]].max().reset_index()
    # max attempt, then that attempt's last step
    last_attempt = m.merge(last[["run_id", "attempt"]], on=["run_id", "attempt"])
    last_step = last_attempt.groupby("run_id")["step"].transform("max")
    rows = last_attempt[last_attempt["step"] == last_step]
    return rows.groupby("run_id")["loss"].mean().rename("final_loss")


def run_table(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    evals: pd.DataFrame | None = None,
    group_by: Sequence[str] | None = None,
    statuses: Sequence[str] | None = ("completed",),
) -> pd.DataFrame:
    """One row per run with traces and scaling group: group columns, world size, throughput and
    final quality. A run at the crossing of a weak and a strong family has one row in each.

    Columns: ``run_id``, the group columns, ``scaling`` (see
    :func:`workbench.analysis.throughput.groups.assign_groups`), the batch columns, ``nodes`` and
    ``train_samples`` when ``runs`` has them, ``world_size`` (from the traces), the
    :func:`measured_window` figures with ``samples_per_s`` the training throughput (the window
    less the evaluations and checkpoints inside it: ``train_samples_per_s``) and
    ``end_to_end_samples_per_s`` (the whole window), ``samples_per_s_per_device``, ``epoch_s``
    (train_samples / end-to-end samples/s), ``final_loss`` (training loss at the last step),
    and from ``evals``: ``metric_name``, ``final_metric`` and ``final_eval_loss`` (rank 0's
    last evaluation).
    ``statuses=None`` keeps every status; other runs never reach a group. ``incomplete``
    names the ranks whose step rows are missing (see
    :mod:`workbench.analysis.throughput.completeness`); such a run's throughput columns are empty.
    """
    check_columns(runs, ("run_id",), "runs")
    group_by = resolve_group_by(runs, group_by)
    evals = evals if evals is not None and len(evals) else None  # none given, or none run: alike
    if not is_stored(steps):
        return _run_table(runs, steps, evals, group_by, statuses)
    # A report, a Dashboard's first screen and a prediction ask for it several times over
    # the same frames: computed once per runs, evaluations, grouping and statuses.
    states = None if statuses is None else tuple(statuses)
    key = ("run_table", id(runs), id(evals), tuple(group_by), states)
    table = steps.kept(
        key, (runs, evals), lambda: _run_table(runs, steps, evals, group_by, statuses)
    )
    return table.copy()


def _run_table(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    evals: pd.DataFrame | None,
    group_by: Sequence[str],
    statuses: Sequence[str] | None,
) -> pd.DataFrame:
    """:func:`run_table`, computed."""
    if statuses is not None and "status" in runs.columns:
        runs = runs[runs["status"].isin(list(statuses))]
    extra = (
        "nodes",
        "train_samples",
        "precision",
        "samples_per_s_half_width",
        "device_s",
        *FLOPS_FACTS,
    )
    frame = group_frame(runs, group_by, extra)
    window = measured_window(steps, evals)
    # Speedup, efficiency and MFU compare training: evaluations and checkpoints inside the
    # window are left out (they do not scale with the training step); end to end beside it.
    window = window.assign(
        end_to_end_samples_per_s=window["samples_per_s"],
        samples_per_s=window["train_samples_per_s"],
    )
    table = assign_groups(frame.merge(window, on="run_id"), group_by)
    table["samples_per_s_per_device"] = table["samples_per_s"] / table["world_size"]
    if "train_samples" in table.columns:  # an epoch on the wall clock: evaluations included
        table["epoch_s"] = table["train_samples"] / table["end_to_end_samples_per_s"]
    table = mark_incomplete(table, runs, steps)
    table = add_flops_columns(table)
    table = table.merge(_final_loss(steps), left_on="run_id", right_index=True, how="left")
    if evals is not None and len(evals):
        last = eval_rows(evals).groupby("run_id").last()
        finals = pd.DataFrame(
            {
                "metric_name": last.get("metric_name"),
                "final_metric": last["metric_value"],
                "final_eval_loss": last.get("loss"),
            }
        )
        table = table.merge(finals, left_on="run_id", right_index=True, how="left")
    return table


def _time_to_quality(
    table: pd.DataFrame,
    evals: pd.DataFrame,
    steps: pd.DataFrame,
    keys: list[str],
    target: float | None,
    higher_is_better: bool | None,
) -> pd.DataFrame:
    """Add ``target_metric`` and ``time_to_quality_s`` (first evaluation end reaching it)."""
    names = table["metric_name"].dropna()
    higher = not lower_is_better(names.iloc[0] if len(names) else None)
    if higher_is_better is not None:
        higher = higher_is_better
    table = table.reset_index(drop=True)
    if target is None:
        # The quality every run of the group reached: comparable across its world sizes.
        finals = table.groupby(keys, dropna=False)["final_metric"]
        table["target_metric"] = finals.transform("min" if higher else "max")
    else:
        table["target_metric"] = float(target)
    goals = table[["run_id", "target_metric"]].reset_index(names="_row")
    rows = eval_rows(evals, steps).merge(goals, on="run_id")  # a run in two groups: two goals
    value, goal = rows["metric_value"], rows["target_metric"]
    reached = rows[value >= goal] if higher else rows[value <= goal]
    first = reached.groupby("_row")["time_s"].min()
    table["time_to_quality_s"] = first.reindex(table.index).to_numpy()
    return table


def _only(values: pd.Series) -> object:
    """The one value of ``values``, or NaN when they differ."""
    return values.iloc[0] if values.nunique(dropna=False) == 1 else np.nan


def _distinct(notes: pd.Series) -> str:
    """The different notes of a point's runs, each once, joined."""
    return "; ".join(dict.fromkeys(n for n in notes if isinstance(n, str) and n))


def _points(per_run: pd.DataFrame, point: list[str]) -> pd.DataFrame:
    """One row per scaling point: run count, mean and std of each per-run figure."""
    aggs: dict[str, tuple[str, object]] = {"runs": ("run_id", "count")}
    for c in POINT_METRICS:
        if c in per_run.columns:
            aggs[c] = (c, "mean")
            aggs[f"{c}_std"] = (c, "std")
    for c in ("metric_name", "target_metric", "train_samples"):
        if c in per_run.columns and c not in point:
            aggs[c] = (c, "first")
    for c in POINT_FACTS:
        if c in per_run.columns and c not in point:
            aggs[c] = (c, _only)
    if "incomplete" in per_run.columns:
        per_run = per_run.assign(
            incomplete=per_run["run_id"]
            .astype(str)
            .str.cat(per_run["incomplete"], sep=": ")
            .where(per_run["incomplete"] != "", "")
        )
        aggs["incomplete"] = ("incomplete", lambda notes: "; ".join(n for n in notes if n))
    if "mfu_note" in per_run.columns:
        aggs["mfu_note"] = ("mfu_note", _distinct)
    if "device_s" in per_run.columns:  # what the point cost: all its launches
        aggs["device_s"] = ("device_s", lambda held: held.sum(min_count=1))
    table = per_run.groupby(point, dropna=False, sort=True).agg(**aggs).reset_index()
    if "samples_per_s_half_width" in per_run.columns:
        table["samples_per_s_half_width"] = _point_half_width(per_run, point).to_numpy()
    return table.sort_values(point, kind="stable").reset_index(drop=True)


def _point_half_width(per_run: pd.DataFrame, point: list[str]) -> pd.Series:
    """Each point's 95 % half-width (a fraction of its mean throughput), its launches pooled
    (:func:`workbench.trace.known.pooled`: their own intervals, or the spread between them
    where larger), in the order of ``per_run.groupby(point)``."""
    return per_run.groupby(point, dropna=False, sort=True)[
        ["samples_per_s", "samples_per_s_half_width"]
    ].apply(lambda g: pooled(g["samples_per_s"], g["samples_per_s_half_width"])[1])


def _with_speedup(table: pd.DataFrame, keys: list[str], point: list[str]) -> pd.DataFrame:
    """Speedup and efficiency over each group's first (smallest) point, with the error of both
    ends propagated; columns reordered."""
    grouped = table.groupby(keys, dropna=False, sort=False)

    def base(col: str) -> pd.Series:  # the first row's value, NaN included ("first" skips NaN)
        return grouped[col].transform(lambda s: s.iloc[0])

    base_mean, base_std = base("samples_per_s"), base("samples_per_s_std")
    table["base_world_size"] = base("world_size")
    table["ideal_speedup"] = table["world_size"] / table["base_world_size"]
    table["speedup"] = table["samples_per_s"] / base_mean
    relative = np.sqrt(
        (table["samples_per_s_std"] / table["samples_per_s"]) ** 2 + (base_std / base_mean) ** 2
    )
    is_base = grouped.cumcount() == 0  # 1 by definition: no error bar
    table["speedup_std"] = (table["speedup"] * relative).where(~is_base)
    table["efficiency"] = table["speedup"] / table["ideal_speedup"]
    table["efficiency_std"] = table["speedup_std"] / table["ideal_speedup"]
    if "samples_per_s_half_width" in table.columns:  # 95 %: both ends' in quadrature
        half = np.hypot(table["samples_per_s_half_width"], base("samples_per_s_half_width"))
        table["speedup_low"] = (table["speedup"] * (1 - half)).where(~is_base)
        table["speedup_high"] = (table["speedup"] * (1 + half)).where(~is_base)
    first = point + [c for c in POINT_FACTS if c in table.columns and c not in point]
    first += ["runs", "samples_per_s", "samples_per_s_std", "samples_per_s_per_device"]
    first += ["samples_per_s_per_device_std", "speedup", "speedup_std", "ideal_speedup"]
    first += ["efficiency", "efficiency_std", "base_world_size"]
    return table[first + [c for c in table.columns if c not in first]]


def points_table(per_run: pd.DataFrame, group_by: Sequence[str]) -> pd.DataFrame:
    """The scaling table of a :func:`run_table` (made with the same ``group_by``): one row per
    group, world size and nodes (one curve per group, whatever its node counts; each point's
    ``link_class``: ``none`` at one rank, ``intra-node`` on one node, ``inter-node`` on more),
    with means, stds, speedup and efficiency."""
    keys = list(group_by) or ["_group"]
    if not group_by:
        per_run = per_run.assign(_group="all")
    point = keys + ["world_size"] + (["nodes"] if "nodes" in per_run.columns else [])
    table = _with_speedup(_points(per_run, point), keys, point)
    if "nodes" in table.columns:  # what each point's allreduce crossed
        where = zip(table["world_size"], table["nodes"], strict=True)
        links = [point_link_class(w, n) for w, n in where]
        table.insert(table.columns.get_loc("nodes") + 1, "link_class", links)
    return table.drop(columns="_group") if not group_by else table


def scaling_table(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    evals: pd.DataFrame | None = None,
    group_by: Sequence[str] | None = None,
    statuses: Sequence[str] | None = ("completed",),
    target_metric: float | None = None,
    higher_is_better: bool | None = None,
) -> pd.DataFrame:
    """Per scaling group and world size: throughput, speedup, efficiency, epoch time, quality.

    A point is ``group_by`` + ``world_size`` (+ ``nodes`` when ``runs`` has it, and then the
    point's ``link_class``: the node count is an axis, never a curve of its own); its runs give
    the mean (plain name), the standard deviation of the runs (``_std``, ddof 1: NaN from a
    single run) and ``runs``. ``scaling`` labels the group (weak / strong, see
    :mod:`workbench.analysis.throughput.groups`); ``per_device_batch_size`` and
    ``global_batch_size`` are the point's (NaN when its runs differ). ``samples_per_s`` is training
    throughput: samples over the measured window's wall time less the evaluations and checkpoints
    inside it; ``end_to_end_samples_per_s`` over the whole window. ``speedup`` is the point's mean
    throughput over the mean throughput of the group's smallest world size
    (``base_world_size``; fewest nodes on a tie);
    ``ideal_speedup = world_size / base_world_size``, ``efficiency = speedup / ideal_speedup``.
    ``speedup_std = speedup * sqrt((s_N / m_N)^2 + (s_B / m_B)^2)`` propagates, to first order,
    the runs' standard deviations ``s`` of both ends' throughputs (means ``m``): the spread of
    one run's speedup over one base run, not the standard error of the mean speedup. It is NaN
    when either end has a single run, and at the base (1 by definition);
    ``efficiency_std = speedup_std / ideal_speedup``. ``samples_per_s_half_width``: the
    point's 95 % interval as a fraction of its throughput (each run's from its step times,
    ``run.json``; or the spread between its launches where larger); ``speedup_low`` and
    ``speedup_high``: the speedup's 95 % interval, both ends' fractions in quadrature (NaN at
    the base, or where a run has none). ``time_to_quality_s``: seconds on the
    run's training clock (t0 to the end of the first evaluation whose metric reaches
    ``target_metric``; a resumed attempt starts where the previous one's last step ended) with
    the target by default the group's worst final metric, the quality every point reached
    (direction from the metric name unless ``higher_is_better`` is given).
    ``tflops_per_device``, ``mfu`` and ``mfu_note``: achieved TFLOP/s per device, model FLOPs
    utilisation and the peak it used or why there is none
    (:mod:`workbench.analysis.measured.flops`).
    """
    group_by = resolve_group_by(runs, group_by)
    per_run = run_table(runs, steps, evals, group_by, statuses)
    keys = list(group_by) or ["_group"]
    if not group_by:
        per_run["_group"] = "all"
    has_metric = "final_metric" in per_run.columns and per_run["final_metric"].notna().any()
    if has_metric and evals is not None:
        per_run = _time_to_quality(per_run, evals, steps, keys, target_metric, higher_is_better)
    return points_table(per_run.drop(columns="_group", errors="ignore"), group_by)
