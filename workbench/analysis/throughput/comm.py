"""Communication per run and rank: the allreduce's share of the step, how much of it is exposed
(not hidden behind backward compute) and the bus bandwidth it reached; beside it, FSDP's
all-gathers and reduce-scatters (:mod:`workbench.analysis.throughput.fsdp_comm`).

(The module is not named ``communication``: the package exports :func:`communication`, and a
function of the submodule's own name would shadow the submodule.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from workbench.analysis.measured import comm_samples
from workbench.analysis.measured.stored import StoredSteps, is_stored
from workbench.analysis.measured.windows import check_columns, measured_steps
from workbench.analysis.throughput.fsdp_comm import fsdp_communication
from workbench.analysis.throughput.groups import (
    BATCH_COLUMNS,
    FAMILY_COLUMNS,
    group_frame,
    resolve_group_by,
)


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
      ``runs``; the group is ``group_by`` (default :func:`default_group_by`) with the family
      and batch columns replaced by the per-device batch, and only completed runs are
      references. A 1-rank reference has no communication, so
      this is the exposed time itself; a multi-rank reference gives the exposed time beyond
      the reference's own (a lower bound). A 1-rank run is its own reference (exposed 0).
    * ``method="no_overlap_bound"`` (no reference, or a multi-rank run at the smallest world
      size): ``exposed_comm_s = min(comm_s, backward_s)``, the upper bound that assumes no
      overlap at all.
    * ``method="measured"`` wins over both where the trace has ``comm_exposed_s`` (DDP's own
      timer, on sampled steps: its span less its overlap with backward compute, see
      :mod:`workbench.schema`): its mean over the sampled steps, at most ``comm_s``.

    Also ``overlapped_comm_s = hidden_comm_s = comm_s - exposed_comm_s``, ``exposed_share``,
    the exposed part split (:func:`_with_parts`) into ``wait_s`` (for the slowest rank: not
    communication) and ``exposed_transfer_s`` with their shares, and
    ``bus_bandwidth_bytes_per_s`` from the collective's own time (:func:`_with_bus_bandwidth`);
    and FSDP's all-gathers and reduce-scatters, exposed and hidden, with their shares, bytes
    and calls a step (:func:`workbench.analysis.throughput.fsdp_comm.fsdp_communication`; NaN
    for a run without FSDP, whose allreduce columns are in turn NaN for an FSDP run).
    """
    if is_stored(steps):
        out, per_run_times = _stored_means(steps)
        p = steps.measured_per_rank  # a rank's backward timer's mean: its rows hold values
        parts, timed_runs = steps.comm_ranks, set(p.loc[p["backward_compute_s"].notna(), "run_id"])
    else:
        out, per_run_times, m = _frame_means(steps)
        parts, timed_runs = comm_samples.per_rank(m), set(comm_samples.backward_rows(m)["run_id"])
    out["comm_share"] = out["comm_s"] / out["step_s"].where(out["step_s"] > 0)
    out["reference_world_size"] = np.nan
    out["ref_backward_s"] = np.nan
    if runs is not None:
        out = _with_reference(out, per_run_times, runs, group_by)
    out = _with_exposed(out)
    out = _with_parts(out, parts)
    out = _with_bus_bandwidth(out, timed_runs, runs)
    return out.merge(fsdp_communication(steps, runs), on=["run_id", "rank"], how="left")


def _frame_means(steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Per run and rank, the means over measured steps communication starts from; per run the
    largest world size and mean backward time; and the measured rows themselves (those where a
    timer ran are what :func:`_with_parts` reads)."""
    check_columns(steps, ("world_size", "backward_s", "step_s", "comm_s", "comm_bytes"), "steps")
    needed = ["world_size", "backward_s", "step_s", "comm_s", "comm_bytes", "comm_buckets"]
    m = measured_steps(steps, [*needed, "comm_exposed_s", "backward_compute_s"])
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
    if "comm_exposed_s" in m.columns:
        aggs["traced_exposed_s"] = ("comm_exposed_s", "mean")
    out = m.groupby(["run_id", "rank"], sort=True).agg(**aggs).reset_index()
    per_run = m.groupby("run_id").agg(
        world_size=("world_size", "max"), backward_s=("backward_s", "mean")
    )
    return out, per_run, m


def _stored_means(steps: StoredSteps) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`_frame_means` from the engine: the per-rank means and the per-run backward mean
    weighted by each rank's timed steps."""
    p = steps.measured_per_rank
    cols = ["run_id", "rank", "world_size", "measured_steps", "step_s", "backward_s", "comm_s"]
    out = p[[*cols, "comm_bytes", "comm_buckets", "comm_exposed_s"]].rename(
        columns={"measured_steps": "steps", "comm_exposed_s": "traced_exposed_s"}
    )
    out = out.astype({"world_size": "int64", "steps": "int64"})
    weighted = (p["backward_s"] * p["backward_s_n"]).groupby(p["run_id"]).sum(min_count=1)
    per_run = pd.DataFrame(
        {
            "world_size": p.groupby("run_id")["world_size"].max().astype("int64"),
            "backward_s": weighted / p.groupby("run_id")["backward_s_n"].sum().replace(0, np.nan),
        }
    )
    return out.reset_index(drop=True), per_run


def _with_parts(out: pd.DataFrame, parts: pd.DataFrame) -> pd.DataFrame:
    """Split the exposed communication into the wait for the slowest rank and the transfer.

    ``parts`` (:func:`workbench.analysis.measured.comm_samples.per_rank`): per rank, ``wait_s`` on
    its sampled steps (``comm_s`` timed; never carried to the steps between) and the exposed
    transfer, what even the last rank to the allreduce could not hide, where DDP's exposed
    timer ran; else the rank's exposed estimate less its wait. ``hidden_comm_s`` is the
    overlapped part."""
    out = out.merge(parts, on=["run_id", "rank"], how="left")
    out["wait_s"] = out["wait_s"].where(out["world_size"] > 1, 0.0)
    estimate = (out["exposed_comm_s"] - out["wait_s"]).clip(lower=0)
    tail = out.pop("exposed_transfer_s")
    estimate = tail.where(tail.notna(), estimate)
    out["exposed_transfer_s"] = estimate
    out["hidden_comm_s"] = out["overlapped_comm_s"]
    step = out["step_s"].where(out["step_s"] > 0)
    out["exposed_transfer_share"] = out["exposed_transfer_s"] / step
    out["wait_share"] = out["wait_s"] / step
    return out


def _with_bus_bandwidth(
    out: pd.DataFrame, span_runs: set[object], runs: pd.DataFrame | None
) -> pd.DataFrame:
    """Bus bandwidth from the collective's own time, never from a span that holds waiting and
    backward compute: the run's allreduce micro-benchmark (``network_busbw_bytes_per_s`` of
    ``runs``) where it has one; else, for a run whose ``comm_s`` times the collectives
    themselves (a comm hook: no DDP backward timer in its rows; ``span_runs`` are those with
    one), ``2 (N-1)/N x comm_bytes / comm_s``; NaN for a run with only DDP's span.
    ``bus_bandwidth_source`` says which."""
    n = out["world_size"].astype("float64")
    ring = 2 * (n - 1) / n * out["comm_bytes"]
    timed = ring / out["comm_s"].where(out["comm_s"] > 0)
    span = out["run_id"].isin(span_runs)
    out["bus_bandwidth_bytes_per_s"] = timed.where(~span & (n > 1))
    out["bus_bandwidth_source"] = np.where(
        n <= 1, "", np.where(span, "none: DDP's span only", "collective timed")
    )
    if runs is not None and "network_busbw_bytes_per_s" in runs.columns:
        bench = pd.to_numeric(runs.set_index("run_id")["network_busbw_bytes_per_s"], "coerce")
        measured = out["run_id"].map(bench)
        has = measured.notna() & (measured > 0) & (n > 1)
        out["bus_bandwidth_bytes_per_s"] = measured.where(has, out["bus_bandwidth_bytes_per_s"])
        out["bus_bandwidth_source"] = np.where(has, "benchmark", out["bus_bandwidth_source"])
    return out


def _with_exposed(out: pd.DataFrame) -> pd.DataFrame:
    """Add the exposed and overlapped communication, its share and the bus bandwidth."""
    bound = np.minimum(out["comm_s"], out["backward_s"])
    from_ref = (out["backward_s"] - out["ref_backward_s"]).clip(lower=0)
    from_ref = np.minimum(from_ref, out["comm_s"])
    has_ref = out["ref_backward_s"].notna() & (
        (out["world_size"] > out["reference_world_size"]) | (out["reference_world_size"] == 1)
    )
    out["exposed_comm_s"] = from_ref.where(has_ref, bound)
    out["method"] = np.where(has_ref, "reference", "no_overlap_bound")
    if "traced_exposed_s" in out.columns:  # DDP's own timer: what no compute hid, measured
        traced = out["traced_exposed_s"].notna()
        measured = np.minimum(out["traced_exposed_s"].clip(lower=0), out["comm_s"])
        out["exposed_comm_s"] = measured.where(traced, out["exposed_comm_s"])
        out["method"] = np.where(traced, "measured", out["method"])
        out = out.drop(columns="traced_exposed_s")
    out["overlapped_comm_s"] = out["comm_s"] - out["exposed_comm_s"]
    out["exposed_share"] = out["exposed_comm_s"] / out["step_s"].where(out["step_s"] > 0)
    return out


def _with_reference(
    out: pd.DataFrame,
    per_run_times: pd.DataFrame,
    runs: pd.DataFrame,
    group_by: Sequence[str] | None,
) -> pd.DataFrame:
    """Attach each run's reference world size and reference mean backward time
    (``per_run_times``: per run, the largest world size and the mean backward time)."""
    check_columns(runs, ("run_id",), "runs")
    drop = (*FAMILY_COLUMNS, *BATCH_COLUMNS)
    keys = [c for c in resolve_group_by(runs, group_by) if c not in drop]
    if "per_device_batch_size" in runs.columns:
        keys.append("per_device_batch_size")  # backward compute depends on the per-device batch
    per_run = group_frame(runs, keys)[["run_id", *keys]]
    per_run = per_run.merge(per_run_times, left_on="run_id", right_index=True)
    # A group id, not a merge on the key columns (None and NaN keys do not merge reliably).
    group = per_run.groupby(keys, dropna=False, sort=False).ngroup() if keys else 0
    per_run = per_run.assign(_group=group)
    done = runs["run_id"][runs["status"] == "completed"] if "status" in runs else runs["run_id"]
    candidates = per_run[per_run["run_id"].isin(done)]  # a failed run is no reference
    smallest = candidates.groupby("_group")["world_size"].transform("min")
    ref = candidates[candidates["world_size"] == smallest].groupby("_group")
    per_run["reference_world_size"] = per_run["_group"].map(ref["world_size"].first())
    per_run["ref_backward_s"] = per_run["_group"].map(ref["backward_s"].mean())
    mapping = per_run.set_index("run_id")[["reference_world_size", "ref_backward_s"]]
    out = out.drop(columns=["reference_world_size", "ref_backward_s"])
    return out.merge(mapping, left_on="run_id", right_index=True, how="left")
