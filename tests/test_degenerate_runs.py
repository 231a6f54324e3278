"""Never crash on a degenerate run: generated trace frames (one step, all warm-up, zero or NaN
compute, zero samples, a rank missing, every run failed, no evaluation, a sampled column
entirely NaN) through every analysis entry point, the finding and the report. Each returns a
result; where something could not be measured the result says so (NaN, an empty table, a
sentence), never an exception."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench import analysis
from workbench.analysis.advice.finding import findings
from workbench.analysis.model.network import NetworkModel
from workbench.analysis.model.scaling_model import predicted_vs_measured
from workbench.analysis.throughput.summary import per_rank_table, run_summary
from workbench.schema import EVAL_COLUMNS
from workbench.ui.report import write_report

from .frames import make_evals, make_runs, make_steps

NET = NetworkModel(name="n", bandwidth_bytes_per_s=1e9, latency_s=1e-5)

run_shape = st.fixed_dictionaries(
    {
        "world_size": st.integers(1, 4),
        "n_steps": st.integers(1, 6),
        "warmup_steps": st.integers(0, 6),
        "step_s": st.sampled_from([0.0, 1e-4, 0.5, 1.0]),
        "compute": st.sampled_from(["normal", "zero", "nan"]),
        "samples": st.sampled_from([0, 8]),
        "missing_rank": st.booleans(),
        "status": st.sampled_from(["completed", "completed", "failed"]),
        "sampled": st.sampled_from(["every", "none", "nan"]),
        "evals": st.booleans(),
    }
)


def _run(run_id: str, shape: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """One run's steps, evals and runs row from a generated shape."""
    n = shape["world_size"]
    steps = make_steps(
        run_id,
        world_size=n,
        n_steps=shape["n_steps"],
        warmup_steps=min(shape["warmup_steps"], shape["n_steps"]),
        step_s=shape["step_s"],
        samples=shape["samples"],
    )
    phases = ["data_s", "forward_s", "backward_s", "optimizer_s"]
    if shape["compute"] == "zero":
        steps[phases] = 0.0
    elif shape["compute"] == "nan":
        steps[phases] = np.nan
    if shape["sampled"] == "every":
        steps["backward_compute_s"] = steps["backward_s"] * 0.8
        steps["comm_exposed_s"] = steps["comm_s"] * 0.2
    elif shape["sampled"] == "nan":  # DDP's sampled timers never read: every value null
        steps[["comm_s", "backward_compute_s", "comm_exposed_s"]] = np.nan
    if shape["missing_rank"] and n > 1:
        steps = steps[steps["rank"] != n - 1]
    evals = pd.DataFrame(columns=list(EVAL_COLUMNS)).astype(EVAL_COLUMNS)
    if shape["evals"] and shape["n_steps"] >= 1:
        evals = make_evals(
            run_id, world_size=n, eval_steps=(shape["n_steps"],), metric_values=(0.5,)
        )
    row = {"run_id": run_id, "world_size": n, "status": shape["status"]}
    return steps, evals, row


def _study(shapes: list[dict[str, Any]]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    parts = [_run(f"r{i}", shape) for i, shape in enumerate(shapes)]
    steps = pd.concat([p[0] for p in parts], ignore_index=True)
    evals = pd.concat([p[1] for p in parts], ignore_index=True).astype(EVAL_COLUMNS)
    return make_runs([p[2] for p in parts]), steps, evals


study = st.lists(run_shape, min_size=1, max_size=3)
#: 20 examples a run (was 40): each clean clone draws new ones (it has no example database), so
#: the examples tried add up across runs instead of costing the suite 25 s more each time.
FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(study)
def test_every_analysis_entry_point_returns_a_result(shapes: list[dict[str, Any]]) -> None:
    runs, steps, evals = _study(shapes)
    window = analysis.measured_window(steps, evals)
    assert set(window["run_id"]) == set(steps["run_id"])
    analysis.scaling_table(runs, steps, evals)
    analysis.scaling_table(runs, steps, evals, statuses=None)
    analysis.communication(steps, runs)
    analysis.stragglers(steps, min_steps=2)
    analysis.phase_breakdown(steps, evals)
    if len(evals):
        analysis.eval_breakdown(evals)
    analysis.memory_by_rank(steps)
    predicted_vs_measured(runs, steps, NET, world_sizes=[8])
    predicted_vs_measured(runs, steps)
    said = findings(runs, steps, evals=evals)
    assert all(isinstance(line, str) and line for line in said)
    for run_id, rows in steps.groupby("run_id"):
        summary = run_summary(rows, evals[evals["run_id"] == run_id])
        assert summary["traced_steps"] >= 1
        per_rank_table(rows)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(study)
def test_the_report_always_renders(shapes: list[dict[str, Any]]) -> None:
    runs, steps, evals = _study(shapes)
    with tempfile.TemporaryDirectory() as folder:
        path = write_report(runs, steps, evals, Path(folder) / "r.html")
        page = path.read_text()
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page


def test_all_warm_up_and_all_failed_say_so() -> None:
    runs, steps, evals = _study(
        [
            {
                "world_size": 2,
                "n_steps": 2,
                "warmup_steps": 2,
                "step_s": 1.0,
                "compute": "normal",
                "samples": 8,
                "missing_rank": False,
                "status": "failed",
                "sampled": "every",
                "evals": False,
            }
        ]
    )
    assert findings(runs, steps, evals=evals) == ["no completed run with measured steps yet"]
    window = analysis.measured_window(steps).iloc[0]
    assert window["steps"] == 0 and np.isnan(window["samples_per_s"])
