"""The headline figures of one run, written into run.json and printed by ``workbench run``.

Frames in, figures out: the caller loads the run's traces (``load_traces(path, "steps")`` and
``load_traces(path, "eval")`` from :mod:`workbench.store.load`) and passes them here.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from workbench.analysis.measured.windows import gap_filled, measured_steps, measured_window
from workbench.analysis.throughput.completeness import missing_ranks
from workbench.analysis.throughput.fsdp_comm import COLUMNS as FSDP_COLUMNS
from workbench.analysis.throughput.fsdp_comm import summary_key
from workbench.trace.known import estimate

PHASES = ("data_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "step_s")


def run_summary(
    steps: pd.DataFrame, evals: pd.DataFrame, writers: int | None = None
) -> dict[str, Any]:
    """Throughput over the measured window (first measured step start to last step end, across
    ranks; warm-up steps excluded): end to end (``samples_per_s``, its 95 % interval by
    :func:`rate_interval`) and training alone (``train_samples_per_s``: the window minus the
    evaluations and checkpoints inside it, ``window_eval_s`` and ``window_save_s``); mean phase
    times, ``mean_gap_s`` (between steps, checkpoints and evaluations included) and
    ``mean_save_s`` (over the steps with one), peak memory, final loss and metric, from one
    run's ``steps`` and ``evals`` trace frames.
    ``writers``: the processes that trace (the run's ``RunConfig.processes``); when some lack
    rows, ``incomplete`` says which and the throughput is left out (a window over the other
    ranks would under-count the samples)."""
    out: dict[str, Any] = {"traced_steps": int(steps["step"].nunique()) if len(steps) else 0}
    incomplete = missing_ranks(steps, writers) if writers and len(steps) else ""
    if incomplete:
        out["incomplete"] = incomplete
    measured = measured_steps(steps) if len(steps) else steps
    if len(measured):
        # The analysis's own window: a resumed run adds its attempts' windows, not the gap.
        window = measured_window(steps, evals).iloc[0]
        rate = float("nan") if incomplete else window["samples_per_s"]
        train_rate = float("nan") if incomplete else window["train_samples_per_s"]
        out.update(
            measured_steps=int(window["steps"]),
            measured_wall_s=float(window["measured_s"]),
            samples_per_s=None if pd.isna(rate) else float(rate),
            samples_per_s_per_device=None
            if pd.isna(rate)
            else float(rate) / int(window["world_size"]),
            train_wall_s=float(window["train_s"]),
            window_eval_s=float(window["eval_s"]),
            window_save_s=float(window["save_s"]),
            train_samples_per_s=None if pd.isna(train_rate) else float(train_rate),
            warmup_detected_steps=int(window["warmup_detected_steps"]),
        )
        out.update(rate_interval(measured, out["samples_per_s"]))
        out.update({f"mean_{phase}": float(measured[phase].mean()) for phase in PHASES})
        for column in FSDP_COLUMNS:  # FSDP's collectives, where traced (schema 2, FSDP found)
            values = measured[column].dropna() if column in measured.columns else []
            if len(values):
                out[summary_key(column)] = float(values.mean())
        gap = gap_filled(steps)[measured.index].dropna()
        saves = measured["save_s"].dropna() if "save_s" in measured.columns else []
        out["mean_gap_s"] = float(gap.mean()) if len(gap) else None
        out["mean_save_s"] = float(saves.mean()) if len(saves) else None
    if len(steps):
        last = steps[steps["step"] == steps["step"].max()]
        out["final_loss"] = float(last["loss"].mean())
        out["peak_rss_bytes"] = int(steps["rss_bytes"].max())
        peak = steps["mem_peak_bytes"].dropna()
        out["peak_cuda_bytes"] = int(peak.max()) if len(peak) else None
    if len(evals):
        last_eval = evals[evals["step"] == evals["step"].max()]
        out["final_metric_name"] = str(last_eval["metric_name"].iloc[0])
        out["final_metric"] = float(
            last_eval[last_eval["rank"] == last_eval["rank"].min()]["metric_value"].iloc[0]
        )
        out["final_eval_loss"] = float(last_eval["loss"].iloc[0])
    return out


def rate_interval(measured: pd.DataFrame, rate: float | None) -> dict[str, Any]:
    """The 95 % interval of the run's throughput ``rate`` (``samples_per_s_low`` and ``_high``,
    and ``samples_per_s_half_width``, a fraction of the rate) from its measured steps' times,
    each step's slowest rank's, by batch means (:func:`workbench.trace.known.estimate`, the
    rule a run measuring until known stops on); nothing under its fewest steps."""
    per_step = measured.groupby(["attempt", "step"], sort=True)["step_s"].max()
    found = estimate(per_step.to_numpy(dtype="float64"))
    if found is None or rate is None:
        return {}
    half = found.half_width
    return {
        "samples_per_s_half_width": half,
        "samples_per_s_low": rate / (1 + half),
        "samples_per_s_high": rate / (1 - half) if half < 1 else None,
    }


def per_rank_table(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per rank of one run's ``steps`` frame: mean phase times over measured steps
    (and FSDP's exposed all-gathers and reduce-scatters where traced), samples/s of that rank
    and peak RSS (MiB).

    A rank's samples/s is on the run's own time basis: its samples over its wall window (per
    attempt, its first measured step's start to its last step's end, summed), the time between
    steps included, as in the run's throughput; the ranks' rates add up to about the run's."""
    measured = measured_steps(steps)
    grouped = measured.groupby("rank")
    table = grouped[list(PHASES)].mean()
    for column in ("all_gather_exposed_s", "reduce_scatter_exposed_s"):  # FSDP's, where traced
        if column in measured.columns and measured[column].notna().any():
            table[column] = grouped[column].mean()
    ends = measured["t_start_s"] + measured["step_s"]
    per_attempt = measured.assign(_end=ends).groupby(["rank", "attempt"])
    wall = (per_attempt["_end"].max() - per_attempt["t_start_s"].min()).groupby("rank").sum()
    # min_count: a rank none of whose samples were counted has no rate (unknown, not 0)
    table["samples_per_s"] = grouped["samples"].sum(min_count=1) / wall.where(wall > 0)
    table["peak_rss_mib"] = steps.groupby("rank")["rss_bytes"].max() / 2**20
    return table
