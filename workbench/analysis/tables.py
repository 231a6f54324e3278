"""Trace frames to tables: throughput and scaling, phase, communication and evaluation breakdowns,
memory per rank, stragglers.

Pure functions from pandas frames to pandas frames; no torch, no figures. The inputs are the store's
frames: ``runs`` (one row per run: ``run_id``, ``sweep``, ``status`` and the flattened config
columns), ``steps`` (:data:`workbench.schema.STEP_COLUMNS`, all runs concatenated) and ``evals``
(:data:`workbench.schema.EVAL_COLUMNS`). Tables report a mean under the plain column name and the
standard deviation under ``<name>_std``. Unknown column or group names raise ``ValueError`` with
the valid names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from workbench.schema import STEP_COLUMNS

#: Config columns that may define a scaling group (a curve over world sizes), in display order.
CONFIG_COLUMNS = (
    "model",
    "precision",
    "optimizer",
    "learning_rate",
    "train_samples",
    "per_device_batch_size",
    "global_batch_size",
)
BATCH_COLUMNS = ("per_device_batch_size", "global_batch_size")
#: Timed phases of a training step, in order; ``comm_s`` overlaps ``backward_s`` so is not a phase.
PHASES = ("data_s", "forward_s", "backward_s", "optimizer_s")
EVAL_PARTS = ("predict_s", "gather_s", "metric_s", "broadcast_s")
# Metric names for which lower is better; anything else (accuracy, f1, ...) counts as higher.
_LOWER_IS_BETTER = ("loss", "error", "perplexity", "mse", "mae", "rmse", "wer", "cer")


def check_columns(frame: pd.DataFrame, names: Iterable[str], what: str = "frame") -> None:
    """Raise ValueError naming the missing columns and listing the valid ones."""
    missing = [n for n in names if n not in frame.columns]
    if missing:
        valid = ", ".join(sorted(str(c) for c in frame.columns))
        raise ValueError(f"unknown {what} column(s) {missing}; valid names: {valid}")


def measured_steps(steps: pd.DataFrame, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """The measured (non-warm-up) step rows, with an ``attempt`` column (0 when absent).

    ``columns`` keeps only those (when present) besides the keys: filtering a wide frame of a
    million rows costs far more than filtering the few columns a table needs.
    """
    check_columns(steps, ("run_id", "rank", "step", "warmup"), "steps")
    if columns is not None:
        keep = ["run_id", "rank", "step", "warmup", "attempt", *columns]
        steps = steps[[c for c in dict.fromkeys(keep) if c in steps.columns]]
    out = steps[~steps["warmup"].fillna(False).astype(bool).to_numpy()]
    if "attempt" not in out.columns:
        out = out.assign(attempt=0)
    return out


def comm_filled(steps: pd.DataFrame) -> pd.Series:
    """``comm_s`` on every row. With ``trace_comm='sampled'`` communication is timed on sampled
    steps only; in between, each rank's latest sample stands for the steps after it (its first
    for the steps before). NaN for a rank with no sample at all."""
    if steps["comm_s"].notna().all():  # timed on every step: nothing to carry
        return steps["comm_s"]
    keys = [k for k in ("run_id", "attempt", "rank") if k in steps.columns]
    ordered = steps[[*keys, "step", "comm_s"]].reset_index(drop=True)
    ordered = ordered.sort_values([*keys, "step"], kind="stable")
    filled = ordered.groupby(keys, sort=False)["comm_s"].ffill()
    filled = filled.groupby([ordered[k] for k in keys], sort=False).bfill()
    return pd.Series(filled.sort_index().to_numpy(), index=steps.index, name="comm_s")


def lower_is_better(metric_name: str | None) -> bool:
    """Whether a smaller value of the named metric is better (loss, error, perplexity, ...)."""
    name = (metric_name or "").lower()
    return any(word in name for word in _LOWER_IS_BETTER)


def measured_window(steps: pd.DataFrame) -> pd.DataFrame:
    """Per run: the measured window and the samples in it.

    The window of one attempt runs from the first measured step's start to the last step's end
    (``t_start_s + step_s``), across ranks. A resumed run (several ``attempt`` values) adds its
    attempts' windows, since the time between them is not training; ``start_s`` is the first
    attempt's start and ``end_s`` the last attempt's end. Columns: ``run_id, world_size, ranks,
    attempts, steps`` (measured steps), ``start_s, end_s, measured_s, samples`` (all ranks),
    ``samples_per_s`` (samples / measured_s: never a sum of per-rank rates) and ``step_s``
    (measured_s / steps). A run with only warm-up steps gets NaN rates.
    """
    check_columns(steps, ("world_size", "t_start_s", "step_s", "samples"), "steps")
    m = measured_steps(steps, ["world_size", "t_start_s", "step_s", "samples"])
    m = m.assign(_end=m["t_start_s"] + m["step_s"])
    per_attempt = m.groupby(["run_id", "attempt"], sort=True).agg(
        world_size=("world_size", "max"),
        ranks=("rank", "nunique"),
        steps=("step", "nunique"),
        start_s=("t_start_s", "min"),
        end_s=("_end", "max"),
        samples=("samples", "sum"),
    )
    per_attempt["measured_s"] = per_attempt["end_s"] - per_attempt["start_s"]
    out = per_attempt.groupby(level="run_id").agg(
        world_size=("world_size", "max"),
        ranks=("ranks", "max"),
        attempts=("steps", "size"),
        steps=("steps", "sum"),
        start_s=("start_s", "first"),
        end_s=("end_s", "last"),
        measured_s=("measured_s", "sum"),
        samples=("samples", "sum"),
    )
    all_runs = pd.Index(pd.unique(steps["run_id"]), name="run_id")
    out = out.reindex(all_runs)
    if out["world_size"].isna().any():  # runs with warm-up steps only
        ws = steps.groupby("run_id")["world_size"].max()
        out["world_size"] = out["world_size"].fillna(ws)
        out[["ranks", "attempts", "steps", "samples"]] = out[
            ["ranks", "attempts", "steps", "samples"]
        ].fillna(0)
    out = out.astype({c: "int64" for c in ("world_size", "ranks", "attempts", "steps", "samples")})
    with np.errstate(divide="ignore", invalid="ignore"):
        out["samples_per_s"] = out["samples"] / out["measured_s"].where(out["measured_s"] > 0)
        out["step_s"] = out["measured_s"] / out["steps"].where(out["steps"] > 0)
    return out.reset_index()


def default_group_by(runs: pd.DataFrame) -> list[str]:
    """The config columns of ``runs`` that define a scaling group (everything but world size).

    Of the two batch columns only one can stay fixed while world size changes: the per-device
    batch (weak scaling, the DDP default) or the global batch (strong scaling, as in Horovod's
    split). When both are present, the one that forms fewer groups is the one held fixed.
    """
    cols = [c for c in CONFIG_COLUMNS if c in runs.columns and c not in BATCH_COLUMNS]
    batch = [c for c in BATCH_COLUMNS if c in runs.columns]
    if len(batch) == 2 and len(runs):
        groups = {c: runs.groupby(cols + [c], dropna=False).ngroups for c in batch}
        batch = [min(batch, key=lambda c: (groups[c], BATCH_COLUMNS.index(c)))]
    return cols + batch


def _check_group_by(runs: pd.DataFrame, group_by: Sequence[str] | None) -> list[str]:
    if group_by is None:
        return default_group_by(runs)
    if isinstance(group_by, str):
        group_by = [group_by]
    check_columns(runs, group_by, "runs group")
    if {"world_size", "nodes"} & set(group_by):
        raise ValueError("group_by must not contain world_size or nodes: they are the scaling axis")
    return list(group_by)


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


def _eval_rows(evals: pd.DataFrame) -> pd.DataFrame:
    """One row per run and evaluation: rank 0's (lowest rank's) values, with a run-wide clock.

    ``time_s`` is the evaluation's end in seconds since the run's first t0; a resumed attempt's
    times are shifted by the earlier attempts' last evaluation ends (an approximation: the
    attempt's training after its last evaluation is not known here).
    """
    check_columns(evals, ("run_id", "rank", "step", "t_start_s", "eval_s", "metric_value"), "evals")
    e = evals if "attempt" in evals.columns else evals.assign(attempt=0)
    first = e.groupby(["run_id", "attempt", "step"])["rank"].transform("min")
    e = e[e["rank"] == first].sort_values(["run_id", "attempt", "step"])
    end = e["t_start_s"] + e["eval_s"]
    attempt_end = end.groupby([e["run_id"], e["attempt"]]).max()
    offset = attempt_end.groupby(level="run_id").transform(lambda s: s.cumsum().shift(fill_value=0))
    shift = offset.reindex(pd.MultiIndex.from_arrays([e["run_id"], e["attempt"]])).to_numpy()
    return e.assign(time_s=end.to_numpy() + shift)


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
    group_by = _check_group_by(runs, group_by)
    if statuses is not None and "status" in runs.columns:
        runs = runs[runs["status"].isin(list(statuses))]
    extra = [c for c in ("nodes", "train_samples") if c in runs.columns and c not in group_by]
    table = runs[["run_id", *group_by, *extra]].merge(measured_window(steps), on="run_id")
    table["samples_per_s_per_device"] = table["samples_per_s"] / table["world_size"]
    if "train_samples" in table.columns:
        table["epoch_s"] = table["train_samples"] / table["samples_per_s"]
    table = table.merge(_final_loss(steps), left_on="run_id", right_index=True, how="left")
    if evals is not None and len(evals):
        last = _eval_rows(evals).groupby("run_id").last()
        finals = pd.DataFrame(
            {
                "metric_name": last.get("metric_name"),
                "final_metric": last["metric_value"],
                "final_eval_loss": last.get("loss"),
            }
        )
        table = table.merge(finals, left_on="run_id", right_index=True, how="left")
    table.attrs["group_by"] = group_by
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
    rows = _eval_rows(evals).merge(table[["run_id", "target_metric"]], on="run_id")
    value, goal = rows["metric_value"], rows["target_metric"]
    reached = rows[value >= goal] if higher else rows[value <= goal]
    first = reached.groupby("run_id")["time_s"].min().rename("time_to_quality_s")
    return table.merge(first, left_on="run_id", right_index=True, how="left")


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
    per_run = run_table(runs, steps, evals, group_by, statuses)
    group_by = per_run.attrs["group_by"]
    keys = list(group_by) or ["_group"]
    if not group_by:
        per_run["_group"] = "all"
    has_metric = "final_metric" in per_run.columns and per_run["final_metric"].notna().any()
    if has_metric and evals is not None:
        per_run = _time_to_quality(per_run, evals, keys, target_metric, higher_is_better)
    point = keys + ["world_size"] + (["nodes"] if "nodes" in per_run.columns else [])
    metrics = [
        c
        for c in (
            "samples_per_s",
            "samples_per_s_per_device",
            "step_s",
            "epoch_s",
            "final_loss",
            "final_eval_loss",
            "final_metric",
            "time_to_quality_s",
        )
        if c in per_run.columns
    ]
    aggs: dict[str, tuple[str, str]] = {"runs": ("run_id", "count")}
    for c in metrics:
        aggs[c] = (c, "mean")
        aggs[f"{c}_std"] = (c, "std")
    for c in ("metric_name", "target_metric", "train_samples"):
        if c in per_run.columns and c not in point:
            aggs[c] = (c, "first")
    table = per_run.groupby(point, dropna=False, sort=True).agg(**aggs).reset_index()
    table = table.sort_values(point, kind="stable").reset_index(drop=True)
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
    table = table[first + [c for c in table.columns if c not in first]]
    if not group_by:
        table = table.drop(columns="_group")
    table.attrs["group_by"] = list(group_by)
    return table


def phase_breakdown(steps: pd.DataFrame) -> pd.DataFrame:
    """Per run and rank, mean and std over measured steps of each phase, comm and step time.

    ``other_s = step_s - (data_s + forward_s + backward_s + optimizer_s)``, clipped at 0: the
    untimed rest (Python overhead, logging, the tracer). ``comm_s`` is reported but not
    subtracted, since DDP's allreduce runs inside ``backward_s``.
    """
    cols = [*PHASES, "comm_s", "step_s"]
    check_columns(steps, ["world_size", *cols], "steps")
    m = measured_steps(steps, ["world_size", "host", *cols])
    m = m.assign(other_s=(m["step_s"] - m[list(PHASES)].sum(axis=1)).clip(lower=0))
    aggs: dict[str, tuple[str, str]] = {
        "world_size": ("world_size", "max"),
        "steps": ("step", "count"),
    }
    if "host" in m.columns:
        aggs["host"] = ("host", "first")
    for c in [*cols, "other_s"]:
        aggs[c] = (c, "mean")
        aggs[f"{c}_std"] = (c, "std")
    return m.groupby(["run_id", "rank"], sort=True).agg(**aggs).reset_index()


def eval_breakdown(evals: pd.DataFrame) -> pd.DataFrame:
    """Per run, mean over evaluations of predict / gather / metric / broadcast / eval times.

    The plain names are rank 0's times (rank 0 gathers and computes the metric); ``<part>_max``
    is the mean over evaluations of the slowest rank's time. Also ``evaluations``, ``samples``
    (all ranks, per evaluation) and the last evaluation's ``metric_name`` / ``metric_value``.
    """
    parts = [*EVAL_PARTS, "eval_s"]
    check_columns(evals, ["run_id", "rank", "world_size", "step", "samples", *parts], "evals")
    e = evals if "attempt" in evals.columns else evals.assign(attempt=0)
    per_eval_keys = ["run_id", "attempt", "step"]
    slowest = e.groupby(per_eval_keys)[parts].max().add_suffix("_max")
    samples = e.groupby(per_eval_keys)["samples"].sum()
    rank0 = _eval_rows(e).set_index(per_eval_keys)
    per_eval = rank0[["world_size", *parts]].join(slowest).join(samples)
    if "metric_value" in rank0.columns:
        per_eval["metric_value"] = rank0["metric_value"]
    if "metric_name" in rank0.columns:
        per_eval["metric_name"] = rank0["metric_name"]
    aggs: dict[str, tuple[str, str]] = {
        "world_size": ("world_size", "max"),
        "evaluations": ("eval_s", "size"),
    }
    for c in [*parts, *(f"{p}_max" for p in parts), "samples"]:
        aggs[c] = (c, "mean")
    for c in ("metric_name", "metric_value"):
        if c in per_eval.columns:
            aggs[c] = (c, "last")
    return per_eval.groupby(level="run_id", sort=True).agg(**aggs).reset_index()


def memory_by_rank(steps: pd.DataFrame) -> pd.DataFrame:
    """Per run and rank, peak process RSS and CUDA peaks (bytes, all steps incl. warm-up).

    Columns ``rss_peak_bytes``, ``cuda_peak_bytes`` (``mem_peak_bytes``),
    ``cuda_reserved_peak_bytes`` and ``device_peak_bytes`` (``mem_device_bytes``, what NVML sees
    of this process on its GPU); the CUDA ones are NaN on CPU.
    """
    check_columns(steps, ("run_id", "rank", "world_size", "rss_bytes"), "steps")
    aggs: dict[str, tuple[str, str]] = {"world_size": ("world_size", "max")}
    if "host" in steps.columns:
        aggs["host"] = ("host", "first")
    aggs["rss_peak_bytes"] = ("rss_bytes", "max")
    cuda = {
        "mem_peak_bytes": "cuda_peak_bytes",
        "mem_reserved_bytes": "cuda_reserved_peak_bytes",
        "mem_device_bytes": "device_peak_bytes",  # NVML: allocator + context + NCCL buffers
    }
    for src, dst in cuda.items():
        if src in steps.columns:
            aggs[dst] = (src, "max")
    out = steps.groupby(["run_id", "rank"], sort=True).agg(**aggs).reset_index()
    for dst in cuda.values():
        if dst not in out.columns:
            out[dst] = np.nan
    return out


def communication(
    steps: pd.DataFrame,
    runs: pd.DataFrame | None = None,
    group_by: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Per run and rank: communication share and an estimate of exposed communication.

    ``comm_share = mean(comm_s) / mean(step_s)`` over measured steps (``comm_s`` over the steps
    where it was timed: with ``trace_comm="sampled"`` only some are): the allreduce's share of
    the step, overlapped or not. ``comm_s`` runs from the first bucket's launch to the last
    one's completion, so most of it may be hidden behind the rest of the backward pass.

    Exposed (not overlapped) communication per step. DDP's ``backward()`` returns only once
    every bucket's allreduce has finished, so a multi-rank ``backward_s`` is backward compute
    plus the communication left over after the last gradient is ready. Hence:

    * ``method="reference"``: ``exposed_comm_s = clip(backward_s - ref_backward_s, 0, comm_s)``
      where ``ref_backward_s`` is the mean backward time of the same config at the group's
      smallest world size (same per-device batch, so the same backward compute). It needs
      ``runs``; the group is ``group_by`` (default :func:`default_group_by`) with the global
      batch replaced by the per-device batch. A 1-rank reference has no communication, so
      this is the exposed time itself; a multi-rank reference gives the exposed time beyond
      the reference's own (a lower bound). A 1-rank run is its own reference (exposed 0).
    * ``method="no_overlap_bound"`` (no reference, or a multi-rank run at the smallest world
      size): ``exposed_comm_s = min(comm_s, backward_s)``, the upper bound that assumes no
      overlap at all.

    Also ``overlapped_comm_s = comm_s - exposed_comm_s``, ``exposed_share`` (of ``step_s``) and
    ``bus_bandwidth_bytes_per_s = 2 (N-1)/N * comm_bytes / comm_s`` (NaN for one rank).
    """
    check_columns(steps, ("world_size", "backward_s", "step_s", "comm_s", "comm_bytes"), "steps")
    needed = ["world_size", "backward_s", "step_s", "comm_s", "comm_bytes", "comm_buckets"]
    m = measured_steps(steps, needed)
    aggs: dict[str, tuple[str, str]] = {
        "world_size": ("world_size", "max"),
        "steps": ("step", "count"),
        "step_s": ("step_s", "mean"),
        "backward_s": ("backward_s", "mean"),
        "comm_s": ("comm_s", "mean"),
        "comm_bytes": ("comm_bytes", "mean"),
    }
    if "comm_buckets" in m.columns:
        aggs["comm_buckets"] = ("comm_buckets", "mean")
    out = m.groupby(["run_id", "rank"], sort=True).agg(**aggs).reset_index()
    out["comm_share"] = out["comm_s"] / out["step_s"].where(out["step_s"] > 0)
    out["reference_world_size"] = np.nan
    out["ref_backward_s"] = np.nan
    if runs is not None:
        out = _with_reference(out, m, runs, group_by)
    bound = np.minimum(out["comm_s"], out["backward_s"])
    from_ref = (out["backward_s"] - out["ref_backward_s"]).clip(lower=0)
    from_ref = np.minimum(from_ref, out["comm_s"])
    has_ref = out["ref_backward_s"].notna() & (
        (out["world_size"] > out["reference_world_size"]) | (out["reference_world_size"] == 1)
    )
    out["exposed_comm_s"] = from_ref.where(has_ref, bound)
    out["method"] = np.where(has_ref, "reference", "no_overlap_bound")
    out["overlapped_comm_s"] = out["comm_s"] - out["exposed_comm_s"]
    out["exposed_share"] = out["exposed_comm_s"] / out["step_s"].where(out["step_s"] > 0)
    n = out["world_size"].astype("float64")
    ring = 2 * (n - 1) / n * out["comm_bytes"]
    out["bus_bandwidth_bytes_per_s"] = (ring / out["comm_s"].where(out["comm_s"] > 0)).where(n > 1)
    return out


def _with_reference(
    out: pd.DataFrame,
    measured: pd.DataFrame,
    runs: pd.DataFrame,
    group_by: Sequence[str] | None,
) -> pd.DataFrame:
    """Attach each run's reference world size and reference mean backward time."""
    check_columns(runs, ("run_id",), "runs")
    keys = [c for c in _check_group_by(runs, group_by) if c != "global_batch_size"]
    if "per_device_batch_size" in runs.columns and "per_device_batch_size" not in keys:
        keys.append("per_device_batch_size")  # backward compute depends on the per-device batch
    per_run = measured.groupby("run_id").agg(
        world_size=("world_size", "max"), backward_s=("backward_s", "mean")
    )
    per_run = runs[["run_id", *keys]].merge(per_run, left_on="run_id", right_index=True)
    if not keys:
        per_run["_group"] = "all"
        keys = ["_group"]
    smallest = per_run.groupby(keys, dropna=False)["world_size"].transform("min")
    ref = per_run[per_run["world_size"] == smallest]
    ref = ref.groupby(keys, dropna=False).agg(
        reference_world_size=("world_size", "first"), ref_backward_s=("backward_s", "mean")
    )
    per_run = per_run.merge(ref, left_on=keys, right_index=True, how="left")
    mapping = per_run.set_index("run_id")[["reference_world_size", "ref_backward_s"]]
    out = out.drop(columns=["reference_world_size", "ref_backward_s"])
    return out.merge(mapping, left_on="run_id", right_index=True, how="left")


STRAGGLER_COLUMNS = [
    "run_id",
    "attempt",
    "rank",
    "host",
    "world_size",
    "start_step",
    "end_step",
    "slow_steps",
    "slow_fraction",
    "ratio",
    "value_s",
    "others_s",
    "extra_s",
]


def _median_of_others(a: np.ndarray) -> np.ndarray:
    """Row-wise median of the other columns for each cell of ``a`` (steps x ranks; NaN = absent).

    Sorting once per row and skipping the cell's own sorted position keeps this O(S n log n)
    instead of one median per rank.
    """
    rows, n = a.shape
    order = np.argsort(a, axis=1, kind="stable")  # NaN sorts last
    srt = np.take_along_axis(a, order, axis=1)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.broadcast_to(np.arange(n), (rows, n)), axis=1)
    others = np.sum(~np.isnan(a), axis=1, keepdims=True) - 1

    def pick(i: np.ndarray) -> np.ndarray:
        idx = np.clip(np.where(i < pos, i, i + 1), 0, n - 1)
        return np.take_along_axis(srt, idx, axis=1)

    med = (pick((others - 1) // 2) + pick(others // 2)) / 2
    med[np.broadcast_to(others < 1, med.shape) | np.isnan(a)] = np.nan
    return med


def stragglers(
    steps: pd.DataFrame,
    threshold: float = 0.1,
    min_steps: int = 10,
    persistence: float = 0.8,
    measure: str = "compute_s",
) -> pd.DataFrame:
    """Ranks persistently slower than the median of the other ranks; one row per straggler.

    In DDP every rank waits for the slowest at each allreduce, so ``step_s`` is nearly equal on
    all ranks: a slow rank's extra time shows in its own compute, while the fast ranks show it
    as a longer ``comm_s`` (their allreduce waits for the late gradients). The default measure
    is therefore ``compute_s = step_s - comm_s``; any float step column (``forward_s``,
    ``data_s``, ...) can be used instead. Per measured step, a rank's ratio is its measure over
    the median of the other ranks' (NaN when that median is not positive, as when comm_s
    exceeds step_s); it is *slow* when ``ratio > 1 + threshold``. A rank is a straggler from
    the first slow step that starts ``min_steps`` consecutive steps of which at least
    ``persistence`` are slow. Reported: ``start_step``, ``end_step`` (last slow step),
    ``slow_steps`` and ``slow_fraction`` from the start on, ``ratio`` (median over those slow
    steps), ``value_s`` / ``others_s`` (medians of its measure and the others' median) and
    ``extra_s`` (their difference: seconds per step the run loses to it).
    """
    if min_steps < 1 or not 0 < persistence <= 1 or threshold < 0:
        raise ValueError(
            f"need min_steps >= 1, 0 < persistence <= 1, threshold >= 0; got "
            f"min_steps={min_steps}, persistence={persistence}, threshold={threshold}"
        )
    float_cols = [c for c, t in STEP_COLUMNS.items() if t == "float64" and c in steps.columns]
    if measure != "compute_s" and measure not in float_cols:
        valid = ", ".join(["compute_s", *float_cols])
        raise ValueError(f"unknown straggler measure {measure!r}; valid names: {valid}")
    cols = ("step_s", "comm_s") if measure == "compute_s" else (measure,)
    check_columns(steps, ("world_size", *cols), "steps")
    m = measured_steps(steps, ["world_size", "host", *cols])
    if measure == "compute_s":
        value = m["step_s"] - comm_filled(m).fillna(0)
    else:
        value = m[measure]
    m = m.assign(_value=value.astype("float64"))
    found: list[dict[str, object]] = []
    for (run_id, attempt), g in m.groupby(["run_id", "attempt"], sort=True):
        mat = g.groupby(["step", "rank"])["_value"].mean().unstack("rank").sort_index()
        if mat.shape[1] < 2 or mat.shape[0] < min_steps:
            continue
        a = mat.to_numpy(dtype="float64")
        ref = _median_of_others(a)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(ref > 0, a / ref, np.nan)
        slow = np.nan_to_num(ratio, nan=0.0) > 1 + threshold
        csum = np.vstack([np.zeros((1, a.shape[1])), np.cumsum(slow, axis=0)])
        window = csum[min_steps:] - csum[:-min_steps]  # slow count in [i, i + min_steps)
        qualifies = slow[: window.shape[0]] & (window >= persistence * min_steps - 1e-9)
        hosts = g.groupby("rank")["host"].first() if "host" in g.columns else None
        for j in np.flatnonzero(qualifies.any(axis=0)):
            i = int(np.argmax(qualifies[:, j]))
            tail = slow[i:, j]
            idx = i + np.flatnonzero(tail)
            rank = int(mat.columns[j])
            found.append(
                {
                    "run_id": run_id,
                    "attempt": int(attempt),
                    "rank": rank,
                    "host": hosts.get(rank) if hosts is not None else None,
                    "world_size": int(g["world_size"].max()),
                    "start_step": int(mat.index[i]),
                    "end_step": int(mat.index[idx[-1]]),
                    "slow_steps": int(tail.sum()),
                    "slow_fraction": float(tail.mean()),
                    "ratio": float(np.median(ratio[idx, j])),
                    "value_s": float(np.median(a[idx, j])),
                    "others_s": float(np.median(ref[idx, j])),
                    "extra_s": float(np.median(a[idx, j] - ref[idx, j])),
                }
            )
    return pd.DataFrame(found, columns=STRAGGLER_COLUMNS)


def downsample_for_display(
    frame: pd.DataFrame,
    max_points: int,
    x: str = "step",
    by: Sequence[str] = (),
) -> pd.DataFrame:
    """Fewer rows for a figure: average consecutive ``x`` values into bins, per ``by`` group.

    Each group keeps at most ``max_points / groups`` bins (at least one); numeric columns are
    averaged, others keep their first value, and ``x`` becomes the bin's first value. For display
    only: tables must be computed on the full frame. Returns ``frame`` itself when small enough.
    """
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    by = [by] if isinstance(by, str) else list(by)
    check_columns(frame, [x, *by], "frame")
    if len(frame) <= max_points:
        return frame
    groups = frame.groupby(by, sort=False).ngroups if by else 1
    values = np.sort(pd.unique(frame[x].dropna()))
    bins = max(1, max_points // max(groups, 1))
    per_bin = int(np.ceil(len(values) / bins))
    if per_bin <= 1:
        return frame
    bin_id = np.searchsorted(values, frame[x].to_numpy()) // per_bin
    numeric = [c for c in frame.columns if c not in by and pd.api.types.is_numeric_dtype(frame[c])]
    numeric = [c for c in numeric if not pd.api.types.is_bool_dtype(frame[c])]
    aggs = {c: ("mean" if c in numeric else "first") for c in frame.columns if c not in by}
    aggs[x] = "min"
    keys = [*(frame[c] for c in by), pd.Series(bin_id, index=frame.index, name="_bin")]
    out = frame.groupby(keys, sort=True).agg(aggs).reset_index(level="_bin", drop=True)
    return out.reset_index()[list(frame.columns)] if by else out.reset_index(drop=True)
