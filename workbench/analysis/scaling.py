"""Throughput and scaling: one row per run (:func:`run_table`) and one per scaling group and world
size (:func:`scaling_table`), with speedup, efficiency, epoch time, final loss and metric and time
to quality.

Inputs: ``runs`` (one row per run: ``run_id``, ``sweep``, ``status`` and the flattened config
columns), ``steps`` and ``evals`` (the store's trace frames). Tables report a mean under the plain
column name and the standard deviation under ``<name>_std``. Pass the grouping explicitly (see
:func:`workbench.analysis.groups.resolve_group_by`); ``None`` means the default grouping.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from workbench.analysis.groups import resolve_group_by
from workbench.analysis.windows import (
    check_columns,
    eval_rows,
    lower_is_better,
    measured_steps,
    measured_window,
)

#: Per-run figures a scaling point averages (mean and ``_std``), when present.
POINT_METRICS = (
    "samples_per_s",
    "samples_per_s_per_device",
    "step_s",
    "epoch_s",
    "final_loss",
    "final_eval_loss",
    "final_metric",
    "time_to_quality_s",
)


def _final_loss(steps: pd.DataFrame) -> pd.Series:
    """Training loss at each run's last measured step, averaged over ranks."""
    m = measured_steps(steps, ["loss"])
    if "loss" not in m.columns or m.empty:
        return pd.Series(dtype="float64", name="final_loss")
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
    """One row per run with traces: group columns, world size, throughput and final quality.

    Columns: ``run_id``, the group columns, ``world_size`` (from the traces), ``nodes`` and
    ``train_samples`` when ``runs`` has them, the :func:`measured_window` figures,
    ``samples_per_s_per_device``, ``epoch_s`` (train_samples / samples_per_s), ``final_loss``
    (training loss at the last step), and from ``evals``: ``metric_name``, ``final_metric`` and
    ``final_eval_loss`` (rank 0's last evaluation). ``statuses=None`` keeps every status.
    """
    check_columns(runs, ("run_id",), "runs")
    group_by = resolve_group_by(runs, group_by)
    if statuses is not None and "status" in runs.columns:
        runs = runs[runs["status"].isin(list(statuses))]
    extra = [c for c in ("nodes", "train_samples") if c in runs.columns and c not in group_by]
    table = runs[["run_id", *group_by, *extra]].merge(measured_window(steps), on="run_id")
    table["samples_per_s_per_device"] = table["samples_per_s"] / table["world_size"]
    if "train_samples" in table.columns:
        table["epoch_s"] = table["train_samples"] / table["samples_per_s"]
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
    keys: list[str],
    target: float | None,
    higher_is_better: bool | None,
) -> pd.DataFrame:
    """Add ``target_metric`` and ``time_to_quality_s`` (first evaluation end reaching it)."""
    names = table["metric_name"].dropna()
    higher = not lower_is_better(names.iloc[0] if len(names) else None)
    if higher_is_better is not None:
        higher = higher_is_better
    if target is None:
        # The quality every run of the group reached: comparable across its world sizes.
        finals = table.groupby(keys, dropna=False)["final_metric"]
        table["target_metric"] = finals.transform("min" if higher else "max")
    else:
        table["target_metric"] = float(target)
    rows = eval_rows(evals).merge(table[["run_id", "target_metric"]], on="run_id")
    value, goal = rows["metric_value"], rows["target_metric"]
    reached = rows[value >= goal] if higher else rows[value <= goal]
    first = reached.groupby("run_id")["time_s"].min().rename("time_to_quality_s")
    return table.merge(first, left_on="run_id", right_index=True, how="left")


def _points(per_run: pd.DataFrame, point: list[str]) -> pd.DataFrame:
    """One row per scaling point: run count, mean and std of each per-run figure."""
    aggs: dict[str, tuple[str, str]] = {"runs": ("run_id", "count")}
    for c in POINT_METRICS:
        if c in per_run.columns:
            aggs[c] = (c, "mean")
            aggs[f"{c}_std"] = (c, "std")
    for c in ("metric_name", "target_metric", "train_samples"):
        if c in per_run.columns and c not in point:
            aggs[c] = (c, "first")
    table = per_run.groupby(point, dropna=False, sort=True).agg(**aggs).reset_index()
    return table.sort_values(point, kind="stable").reset_index(drop=True)


def _with_speedup(table: pd.DataFrame, keys: list[str], point: list[str]) -> pd.DataFrame:
    """Speedup and efficiency over each group's first (smallest) point; columns reordered."""
    grouped = table.groupby(keys, dropna=False, sort=False)
    base_thr = grouped["samples_per_s"].transform("first")
    table["base_world_size"] = grouped["world_size"].transform("first")
    table["ideal_speedup"] = table["world_size"] / table["base_world_size"]
    table["speedup"] = table["samples_per_s"] / base_thr
    table["speedup_std"] = table["samples_per_s_std"] / base_thr
    table["efficiency"] = table["speedup"] / table["ideal_speedup"]
    table["efficiency_std"] = table["speedup_std"] / table["ideal_speedup"]
    first = point + ["runs", "samples_per_s", "samples_per_s_std", "samples_per_s_per_device"]
    first += ["samples_per_s_per_device_std", "speedup", "speedup_std", "ideal_speedup"]
    first += ["efficiency", "efficiency_std", "base_world_size"]
    return table[first + [c for c in table.columns if c not in first]]


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

    A point is ``group_by`` + ``world_size`` (+ ``nodes`` when ``runs`` has it); repeated runs of
    a point give the mean (plain name), the standard deviation (``_std``) and ``runs``.
    ``samples_per_s`` is samples over the measured window's wall time. ``speedup`` is the
    point's mean throughput over that of the group's smallest world size (``base_world_size``;
    fewest nodes on a tie); ``ideal_speedup = world_size / base_world_size`` and ``efficiency =
    speedup / ideal_speedup``. ``speedup_std`` spreads the point's runs over the base mean.
    ``time_to_quality_s``: seconds from t0 to the end of the first evaluation whose metric
    reaches ``target_metric``; by default the group's worst final metric, the quality every
    point reached (direction from the metric name unless ``higher_is_better`` is given).
    """
    group_by = resolve_group_by(runs, group_by)
    per_run = run_table(runs, steps, evals, group_by, statuses)
    keys = list(group_by) or ["_group"]
    if not group_by:
        per_run["_group"] = "all"
    has_metric = "final_metric" in per_run.columns and per_run["final_metric"].notna().any()
    if has_metric and evals is not None:
        per_run = _time_to_quality(per_run, evals, keys, target_metric, higher_is_better)
    point = keys + ["world_size"] + (["nodes"] if "nodes" in per_run.columns else [])
    table = _with_speedup(_points(per_run, point), keys, point)
    return table.drop(columns="_group") if not group_by else table
