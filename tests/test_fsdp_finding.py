"""The analysis, the finding and the terminal speak FSDP's terms: exposed all-gather, exposed
reduce-scatter and memory per rank, never "allreduce" or "comm n/a" for an FSDP run.

A hand-built study, worked on paper: FSDP at 1 rank (it gathers and reduces nothing) and at 2
ranks, 8 samples a rank a step, the same compute (data 0.1 s, forward 0.2 s, backward 0.5 s,
optimizer 0.1 s) plus, at 2 ranks, all-gathers of 0.2 s a step of which 0.15 s exposed (0.1 s
inside forward, 0.05 s inside backward) and reduce-scatters of 0.1 s, all exposed (inside
backward). The 2-rank step is 1.25 s: 12.8 samples/s against 8, a speedup of 1.6 (80 % of
ideal); the 20 % lost is 12 % exposed all-gather (0.15 / 1.25) and 8 % exposed reduce-scatter
(0.1 / 1.25), compute unchanged (0.3 + 0.65 + 0.1 less 0.25 exposed = 0.8 s, as at 1 rank).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.analysis.advice.candidates import (
    candidates_for,
    diagnose,
    predicted_gain,
)
from workbench.analysis.advice.finding import findings
from workbench.analysis.advice.fsdp_words import DDP_KNOBS
from workbench.analysis.advice.losses import efficiency_loss, run_parts
from workbench.analysis.advice.ranked_advice import ranked_changes
from workbench.analysis.run_digests import open_steps
from workbench.analysis.throughput.breakdown import phase_breakdown
from workbench.analysis.throughput.comm import communication
from workbench.analysis.throughput.scaling import run_table
from workbench.analysis.throughput.summary import run_summary
from workbench.cli.tables import fsdp_text, memory_text
from workbench.schema import EVAL_COLUMNS, RUN_FILE
from workbench.store.files import read_json, write_json
from workbench.store.load import iter_run_dirs, load_runs, load_traces
from workbench.ui.plots.timing import EXPOSED_COMM, FSDP_INSIDE, phase_breakdown_figure
from workbench.ui.report import build_figures, report_from_store

from .frames import FSDP_KINDS, FSDP_PARTS, make_runs, make_steps, write_run

AG = {"all_gather_bytes": 18_768, "all_gather_s": 0.2, "all_gather_exposed_s": 0.15,
      "all_gather_calls": 5}  # fmt: skip
RS = {"reduce_scatter_bytes": 9_656, "reduce_scatter_s": 0.1, "reduce_scatter_exposed_s": 0.1,
      "reduce_scatter_calls": 3}  # fmt: skip
FSDP = {"strategy": "fsdp", "reshard_after_forward": True}
NO_EVALS = pd.DataFrame(columns=list(EVAL_COLUMNS))


def fsdp_steps(run_id: str, world_size: int) -> pd.DataFrame:
    """One FSDP run's rows: no allreduce (DDP's columns null), FSDP's as planted."""
    if world_size == 1:
        steps = make_steps(run_id, world_size=1, step_s=1.0)
        for column in (*AG, *RS):
            steps[column] = 0  # one rank: nothing to gather or reduce, known
    else:
        steps = make_steps(run_id, world_size=2, step_s=1.25, forward_s=0.3, backward_s=0.65)
        for column, value in {**AG, **RS}.items():
            steps[column] = value
    steps[["comm_s", "comm_exposed_s", "backward_compute_s"]] = np.nan
    for column in ("comm_bytes", "comm_buckets"):
        steps[column] = pd.array([pd.NA] * len(steps), dtype="Int64")
    return steps


def ddp_steps(run_id: str, world_size: int) -> pd.DataFrame:
    """A DDP run's rows as a real DDP trace has them: FSDP's columns null."""
    steps = make_steps(run_id, world_size=world_size, step_s=1.0 if world_size == 1 else 1.1)
    for kind in FSDP_KINDS:
        for what in FSDP_PARTS:
            steps[f"{kind}_{what}"] = pd.array([None] * len(steps), dtype=null(what))
    return steps


def null(what: str) -> str:
    """The nullable dtype a trace reads an FSDP column with: counts whole, times float."""
    return "Int64" if what in ("bytes", "calls") else "Float64"


@pytest.fixture(scope="module")
def study() -> tuple[pd.DataFrame, pd.DataFrame]:
    """runs and steps: the FSDP study of the module's docstring beside a DDP one (1, 2 ranks)."""
    runs = make_runs(
        [
            {"run_id": "f1", "world_size": 1, **FSDP},
            {"run_id": "f2", "world_size": 2, **FSDP},
            {"run_id": "d1", "world_size": 1, "strategy": "ddp", "reshard_after_forward": True},
            {"run_id": "d2", "world_size": 2, "strategy": "ddp", "reshard_after_forward": True},
        ]
    )
    steps = pd.concat(
        [fsdp_steps("f1", 1), fsdp_steps("f2", 2), ddp_steps("d1", 1), ddp_steps("d2", 2)],
        ignore_index=True,
    )
    # each run's summary as the launcher writes it into run.json, flattened into the runs frame
    summaries = [run_summary(steps[steps["run_id"] == r], NO_EVALS) for r in runs["run_id"]]
    return pd.concat([runs, pd.DataFrame(summaries)], axis=1), steps


def test_communication_reads_fsdps_collectives_as_worked_by_hand(study) -> None:
    runs, steps = study
    comm = communication(steps, runs).set_index(["run_id", "rank"])
    two = comm.loc[("f2", 1)]
    assert two["all_gather_exposed_s"] == pytest.approx(0.15)
    assert two["all_gather_hidden_s"] == pytest.approx(0.05)
    assert two["all_gather_share"] == pytest.approx(0.2 / 1.25)
    assert two["all_gather_exposed_share"] == pytest.approx(0.12)
    assert two["reduce_scatter_exposed_share"] == pytest.approx(0.08)
    assert two["reduce_scatter_hidden_s"] == pytest.approx(0.0)
    assert two["fsdp_exposed_s"] == pytest.approx(0.25)
    assert (two["all_gather_bytes"], two["all_gather_calls"]) == (18_768, 5)
    assert (two["reduce_scatter_bytes"], two["reduce_scatter_calls"]) == (9_656, 3)
    assert math.isnan(two["exposed_comm_s"]), "no allreduce in an FSDP run"
    assert runs.loc[runs["run_id"] == "f2", "mean_all_gather_exposed_s"].item() == 0.15
    assert comm.loc[("f1", 0), "fsdp_exposed_s"] == 0.0, "one rank: none, known (not NaN)"
    ddp = comm.loc[("d2", 0)]
    assert math.isnan(ddp["all_gather_exposed_s"]) and math.isnan(ddp["fsdp_exposed_s"])
    assert ddp["comm_s"] == pytest.approx(0.3), "DDP's columns as before"


def test_schema_1_frames_without_fsdp_columns_still_read(study) -> None:
    runs, steps = study
    old = steps[steps["run_id"].isin(["d1", "d2"])]
    old = old.drop(columns=[f"{k}_{w}" for k in FSDP_KINDS for w in FSDP_PARTS])
    comm = communication(old, runs[runs["run_id"].isin(["d1", "d2"])])
    assert comm["all_gather_exposed_s"].isna().all()
    assert comm.loc[comm["run_id"] == "d2", "comm_s"].tolist() == [0.3, 0.3]
    assert "mean_all_gather_s" not in run_summary(old, NO_EVALS), "nothing traced: no key"
    assert communication(steps)["all_gather_s"].isna().all(), "no runs, no summary: unknown"


def test_the_loss_splits_into_exposed_all_gather_and_reduce_scatter(study) -> None:
    runs, steps = study
    per_run = run_table(runs, steps)
    per_run = per_run[per_run["run_id"].isin(["f1", "f2"])].drop_duplicates("run_id")
    parts = run_parts(steps, communication(steps, runs), per_run)
    assert parts.loc["f2", "compute"] == pytest.approx(0.8), "the exposed parts taken out"
    assert parts.loc["f2", "exposed_all_gather"] == pytest.approx(0.15)
    assert parts.loc["f2", "exposed_reduce_scatter"] == pytest.approx(0.1)
    causes = efficiency_loss(parts, ["f1"], ["f2"], 1, 2, 8.0, 12.8).set_index("cause")
    assert causes["loss"].iloc[0] == pytest.approx(0.2)
    assert causes.loc["exposed_all_gather", "share"] == pytest.approx(0.12)
    assert causes.loc["exposed_reduce_scatter", "share"] == pytest.approx(0.08)
    assert causes.loc["compute", "share"] == pytest.approx(0.0, abs=1e-12)
    assert causes.loc["unexplained", "share"] == pytest.approx(0.0, abs=1e-12)
    assert diagnose(parts.loc["f2"].to_dict()) == ("exposed_all_gather", pytest.approx(0.12))


def test_the_finding_speaks_fsdps_terms(study) -> None:
    runs, steps = study
    runs = runs.assign(
        memory_param_bytes_max=[26_392, 13_324, 26_388, 26_388],
        memory_grad_bytes_max=[26_392, 13_324, 26_388, 26_388],
        memory_optimizer_bytes_max=[52_808, 26_908, 52_800, 52_800],
        memory_total_bytes_max=[105_592, 53_556, 105_576, 105_576],
        memory_gathered_param_bytes_max=[26_392, 26_648, None, None],
    )
    said = findings(runs, steps)
    fsdp = next(line for line in said if line.startswith("FSDP: 2 ranks"))
    assert "1.60x the throughput of 1 rank (80 % of ideal)" in fsdp
    assert "largest cause: exposed all-gather, 12 % of the 2-rank step" in fsdp
    assert "most promising: reshard_after_forward true -> false" in fsdp
    assert "allreduce" not in fsdp and "bucket" not in fsdp
    losses = {cause: (share, detail) for cause, share, detail in fsdp.losses}
    assert losses["exposed all-gather"] == ("12 %", "0 -> 150 ms per step")
    assert losses["exposed reduce-scatter"] == ("8 %", "0 -> 100 ms per step")
    memory = next(line for line in said if line.startswith("FSDP: memory per rank"))
    assert memory == (
        "FSDP: memory per rank at 2 ranks: 52.3 KiB (parameters 13 KiB, gradients "
        "13 KiB, optimizer state 26.3 KiB); parameters gathered: 26 KiB"
    )
    ddp = next(line for line in said if line.startswith("DDP: 2 ranks"))
    assert "all-gather" not in ddp and "reduce-scatter" not in ddp


def test_an_fsdp_run_gets_fsdps_changes_and_never_ddps_knobs() -> None:
    config = {**FSDP, "per_device_batch_size": 8, "gradient_accumulation_steps": 1}
    (keep,) = candidates_for("exposed_all_gather", config)
    assert keep.change == {"reshard_after_forward": False}
    assert math.isnan(predicted_gain(keep.change, None)[0]), "measured, not predicted"  # type: ignore[arg-type]
    kept = {**config, "reshard_after_forward": False}
    assert candidates_for("exposed_all_gather", kept) == []
    (said,) = ranked_changes("exposed_all_gather", 0.2, kept, None)
    assert said.bound and said.gain == pytest.approx(0.25)  # 0.2 / (1 - 0.2)
    assert "larger per-device batch" in said.label
    (rs,) = ranked_changes("exposed_reduce_scatter", 0.2, config, None)
    assert "gradient accumulation" in rs.label
    offered = candidates_for("exposed_transfer", config)
    assert offered and not [c for c in offered if DDP_KNOBS & set(c.change)]
    ddp = candidates_for("exposed_transfer", {"per_device_batch_size": 8})
    assert {"bucket_cap_mb", "comm_hook", "static_graph"} <= {k for c in ddp for k in c.change}
    assert candidates_for("exposed_all_gather", {**config, "strategy": "ddp"}) == []


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, study) -> Path:
    """The study's runs as the launcher leaves them, run.json's summary included: the store."""
    runs, steps = study
    root = tmp_path_factory.mktemp("fsdp-finding")
    for run in runs.itertuples():
        rows = steps[steps["run_id"] == run.run_id]
        path = write_run(root, "s", str(run.run_id), rows, NO_EVALS, world_size=run.world_size,
                         per_device_batch_size=8, strategy=run.strategy)  # fmt: skip
        record = read_json(path / RUN_FILE)
        record["summary"] = run_summary(rows, NO_EVALS)
        write_json(path / RUN_FILE, record)
    return root


def test_the_store_and_its_digests_read_the_same(store: Path) -> None:
    runs = load_runs(store, ["s"])
    record = read_json(store / "s" / "f2" / RUN_FILE)["summary"]
    assert record["mean_all_gather_exposed_s"] == pytest.approx(0.15)
    dirs = list(iter_run_dirs(store, ["s"]))
    frames = load_traces(dirs, "steps")
    with open_steps(dirs) as stored:
        from_store = communication(stored, runs).set_index(["run_id", "rank"]).sort_index()
        said = findings(runs, stored)
    from_rows = communication(frames, runs).set_index(["run_id", "rank"]).sort_index()
    for column in ("all_gather_exposed_s", "reduce_scatter_exposed_share", "all_gather_bytes"):
        left, right = from_store[column].tolist(), from_rows[column].tolist()
        assert left == pytest.approx(right, nan_ok=True), column
    fsdp = next(line for line in said if line.startswith("FSDP: 2 ranks"))
    assert "largest cause: exposed all-gather, 12 % of the 2-rank step" in fsdp


def test_the_report_draws_one_speedup_curve_per_strategy(store: Path) -> None:
    runs = load_runs(store, ["s"])
    figures, tables = build_figures(runs, load_traces(runs["path"], "steps"), None)
    speedup = next(fig for heading, fig in figures if heading.startswith("Speedup"))
    assert [trace["name"] for trace in speedup.data] == ["DDP", "FSDP", "ideal"]
    comm = tables["communication"]
    assert comm.loc["f2", "all_gather_exposed_share"] == pytest.approx(0.12)
    assert comm.loc["f2", "reduce_scatter_exposed_s"] == pytest.approx(0.1)
    assert math.isnan(comm.loc["d2", "all_gather_exposed_s"])
    steps = load_traces(runs["path"], "steps")
    bars = phase_breakdown_figure(phase_breakdown(steps), by="run", comm=communication(steps, runs))
    exposed = next(t for t in bars.data if t["name"] == EXPOSED_COMM)
    methods = dict(zip(exposed["x"], [row[1] for row in exposed["customdata"]], strict=True))
    assert methods["f2"] == FSDP_INSIDE and methods["d2"] != FSDP_INSIDE
    out = report_from_store("s", store / "report.html", output_dir=store, plotly_js="directory")
    page = out.read_text()
    assert "largest cause: exposed all-gather" in page and "reduce_scatter_exposed_share" in page


def test_the_terminal_names_fsdps_collectives_and_memory_parts() -> None:
    summary = {
        "mean_step_s": 1.25,
        "mean_all_gather_s": 0.2,
        "mean_all_gather_exposed_s": 0.15,
        "mean_all_gather_bytes": 18_768.0,
        "mean_all_gather_calls": 5.0,
        "mean_reduce_scatter_s": 0.1,
        "mean_reduce_scatter_exposed_s": 0.1,
        "mean_reduce_scatter_bytes": 9_656.0,
        "mean_reduce_scatter_calls": 3.0,
    }
    assert fsdp_text(summary) == (
        "FSDP communication a step: exposed all-gather 150 ms (12 %; hidden 50 ms), exposed "
        "reduce-scatter 100 ms (8 %; hidden 0); 18.3 KiB gathered in 5 calls, "
        "9.43 KiB reduce-scattered in 3 calls (each call's whole buffer)"
    )
    one = {k: 0.0 for k in summary} | {"mean_step_s": 1.0}
    none = "FSDP communication a step: none (one rank gathers and reduces nothing)"
    assert fsdp_text(one) == none
    assert fsdp_text({"mean_step_s": 1.0, "mean_comm_s": 0.3}) is None
    parts = {
        "0": {"param_bytes": 13_324, "grad_bytes": 13_324, "optimizer_bytes": 26_908,
              "total_bytes": 53_556, "gathered_param_bytes": 26_648},
        "1": {"param_bytes": 13_324, "grad_bytes": 13_324, "optimizer_bytes": 26_388,
              "total_bytes": 53_036, "gathered_param_bytes": 26_648},
    }  # fmt: skip
    assert memory_text(parts) == (
        "memory per rank (counted): rank 0: 52.3 KiB (parameters 13 KiB, gradients 13 KiB, "
        "optimizer state 26.3 KiB), parameters gathered 26 KiB; rank 1: 51.8 KiB (parameters "
        "13 KiB, gradients 13 KiB, optimizer state 25.8 KiB), parameters gathered 26 KiB"
    )
    assert memory_text({}) is None
