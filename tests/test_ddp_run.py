"""Real 2-process gloo DDP runs through submitit's LocalExecutor (shared per session)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from workbench import schema
from workbench.rank.models import build_model, gradient_bytes
from workbench.store.files import read_json
from workbench.store.load import load_runs

pytestmark = pytest.mark.slow


def test_parameters_identical_on_every_rank(ddp2) -> None:
    summaries = ddp2.result()
    assert [s["rank"] for s in summaries] == [0, 1]
    assert summaries[0]["steps"] == summaries[1]["steps"] == 16
    assert summaries[0]["param_sha256"] == summaries[1]["param_sha256"]


def test_each_rank_saw_a_disjoint_shard_covering_the_dataset(ddp2) -> None:
    seen: dict[tuple[int, int], list[int]] = {}
    for rank in (0, 1):
        path = ddp2.path / schema.TRACES_DIR / f"samples-rank{rank:05d}.jsonl"
        for line in path.read_text().splitlines():
            row = json.loads(line)
            seen.setdefault((row["epoch"], rank), []).extend(row["indices"])
    for epoch in (0, 1):
        a, b = seen[(epoch, 0)], seen[(epoch, 1)]
        assert len(a) == len(set(a)) == 256 and len(b) == 256
        assert not set(a) & set(b)
        assert set(a) | set(b) == set(range(512))
    assert seen[(0, 0)] != seen[(1, 0)], "the shard must be reshuffled every epoch"


@pytest.mark.timing
def test_trace_rows_columns_and_phase_times(ddp2) -> None:
    steps = ddp2.traces()
    assert len(steps) == 16 * 2
    assert list(steps.columns) == list(schema.STEP_COLUMNS)
    assert sorted(steps.groupby("rank")["step"].apply(list).tolist()) == [list(range(1, 17))] * 2
    required = [
        "data_s",
        "forward_s",
        "backward_s",
        "optimizer_s",
        "step_s",
        "loss",
        "rss_bytes",
        "t_start_s",
        "samples",
    ]
    assert steps[required].notna().all().all()
    phases = steps[["data_s", "forward_s", "backward_s", "optimizer_s"]]
    assert (phases >= 0).all().all()
    assert (phases.sum(axis=1) <= steps["step_s"] + 1e-9).all()
    # trace_comm="sampled" every 4 steps: DDP's own timer on steps 1-10, then on 12 and 16.
    timed = steps[steps["comm_s"].notna()]
    assert timed.groupby("rank")["step"].apply(list).tolist() == [[*range(1, 11), 12, 16]] * 2
    assert (timed["comm_s"] > 0).all()
    assert (timed["comm_s"] <= timed["backward_s"] + 1e-4).all(), "allreduce ends in backward"
    assert steps["warmup"].tolist().count(True) == 2 * 2
    assert (steps["samples"] == 32).all()
    assert steps["mem_peak_bytes"].isna().all(), "CUDA memory is null on CPU"
    # The ranks agree on t0: the same step starts at nearly the same time on both.
    spread = steps.groupby("step")["t_start_s"].agg(lambda t: t.max() - t.min())
    assert spread.median() < 0.05


def test_comm_bytes_equal_the_model_gradient_bytes(ddp2) -> None:
    steps = ddp2.traces()
    expected = gradient_bytes(build_model("mlp", {}))
    assert (steps["comm_bytes"] == expected).all()
    assert (steps["comm_buckets"] >= 1).all()


def test_metric_broadcast_reaches_every_rank(ddp2) -> None:
    evals = ddp2.traces("eval")
    assert sorted(evals["step"].unique()) == [8, 16]
    for _, group in evals.groupby("step"):
        assert len(group) == 2
        assert group["metric_value"].nunique() == 1
        assert 0.0 < group["metric_value"].iloc[0] <= 1.0
    rank0 = evals[evals["rank"] == 0]
    assert (rank0[["predict_s", "gather_s", "metric_s", "broadcast_s"]] >= 0).all().all()
    # 200 samples over 2 ranks: each predicts 100 (no padding needed).
    assert (evals["samples"] == 100).all()


def test_one_and_two_ranks_follow_the_same_loss_trajectory(ddp1, ddp2) -> None:
    one = ddp1.traces().groupby("step")["loss"].mean().to_numpy()
    two = ddp2.traces().groupby("step")["loss"].mean().to_numpy()
    assert len(one) == len(two) == 16
    np.testing.assert_allclose(one, two, rtol=1e-5, atol=1e-6)
    assert one[-1] < one[0], "the model learns the teacher's signal"
    m1 = ddp1.traces("eval")["metric_value"].iloc[-1]
    m2 = ddp2.traces("eval")["metric_value"].iloc[-1]
    assert abs(m1 - m2) < 1e-6


def test_run_record_has_status_environment_and_summary(ddp2) -> None:
    run = read_json(ddp2.path / schema.RUN_FILE)
    assert run["status"] == "completed"
    env = run["environment"]
    assert env["packages"]["torch"].startswith(torch.__version__.split("+")[0])
    assert env["python"] and env["cpu_model"] and env["host"]
    # Device facts come from the ranks themselves, one record per rank.
    assert sorted(run["devices"]) == ["0", "1"]
    for facts in run["devices"].values():
        assert facts["device"] == "cpu" and facts["torch"] == torch.__version__
    summary = run["summary"]
    # 14 after the traced warm-up, less any still warming up (detected, and counted)
    assert summary["measured_steps"] + summary["warmup_detected_steps"] == 14
    assert summary["samples_per_s"] > 0
    assert summary["final_metric"] == pytest.approx(ddp2.traces("eval")["metric_value"].iloc[-1])
    assert (ddp2.path / schema.CONFIG_FILE).exists()
    runs = load_runs(ddp2.path.parent.parent, ["it"])
    row = runs[runs["run_id"] == "ddp2"].iloc[0]
    assert (
        row["world_size"] == 2 and row["global_batch_size"] == 64 and row["status"] == "completed"
    )
    # Consolidated Parquet replaced the live Arrow streams.
    traces = sorted(p.name for p in (ddp2.path / schema.TRACES_DIR).iterdir())
    assert "steps-rank00000.parquet" in traces and "steps-rank00000.arrows" not in traces


def test_logs_are_per_rank(ddp2) -> None:
    assert "global_rank=0(2)" in ddp2.logs(0) and "global_rank=1(2)" not in ddp2.logs(0)
    assert "global_rank=1(2)" in ddp2.logs(1)
