"""The headline figures of one run, written into run.json and printed by ``workbench run``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .store import load_traces

PHASES = ("data_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "step_s")


def run_summary(run_path: Path) -> dict[str, Any]:
    """Throughput over the measured window (first measured step start to last step end, across
    ranks; warm-up steps excluded), mean phase times, peak memory, final loss and metric."""
    steps = load_traces(run_path, "steps")
    evals = load_traces(run_path, "eval")
    out: dict[str, Any] = {"traced_steps": int(steps["step"].nunique()) if len(steps) else 0}
    measured = steps[~steps["warmup"].astype(bool)] if len(steps) else steps
    if len(measured):
        start = measured["t_start_s"].min()
        end = (measured["t_start_s"] + measured["step_s"]).max()
        wall = float(end - start)
        samples = int(measured["samples"].sum())
        out.update(
            measured_steps=int(measured["step"].nunique()),
            measured_wall_s=wall,
            samples_per_s=samples / wall if wall > 0 else None,
        )
        out["samples_per_s_per_device"] = (out["samples_per_s"] or 0) / int(
            measured["world_size"].iloc[0]
        )
        for phase in PHASES:
            out[f"mean_{phase}"] = float(measured[phase].mean())
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


def per_rank_table(run_path: Path) -> Any:
    """One row per rank: measured steps, samples/s of that rank, mean phase times, peak RSS."""
    steps = load_traces(run_path, "steps")
    measured = steps[~steps["warmup"].astype(bool)]
    grouped = measured.groupby("rank")
    table = grouped[list(PHASES)].mean()
    table["samples_per_s"] = grouped["samples"].sum() / grouped["step_s"].sum()
    table["peak_rss_mib"] = steps.groupby("rank")["rss_bytes"].max() / 2**20
    return table
