"""The seed studies' knobs with real 2-process gloo runs: gradient accumulation, communication
hooks, Parquet row-group sharding, evaluation placement, learning-rate rules, strategies."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from workbench import schema
from workbench.config.choices import MODEL_OPTIONS
from workbench.errors import PreflightError
from workbench.rank.data import synthetic_dataset
from workbench.rank.models import build_model, gradient_bytes
from workbench.run.launch import launch
from workbench.store import row_groups as parquet_data

from .conftest import base_config
from .launch_batches import launch_all

pytestmark = pytest.mark.slow

FULL = gradient_bytes(build_model("mlp", {}))


def _final_params(handle) -> dict[str, torch.Tensor]:
    folder = max((handle.path / "checkpoints").glob("step-*"))
    return torch.load(folder / "train.pt", weights_only=True)["model"]


@pytest.fixture(scope="module")
def parquet_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("parquet")
    train = parquet_data.make_parquet_dataset(folder / "train.parquet", 512, rows_per_group=128)
    evals = parquet_data.make_parquet_dataset(
        folder / "eval.parquet", 200, seed=1, rows_per_group=100
    )
    return train, evals


@pytest.fixture(scope="module")
def runs(store, parquet_files):
    """Several real runs, a few at a time (they share the cores; only correctness is checked)."""
    train, evals = parquet_files
    configs = {
        "accum": base_config(store, world_size=2, run_name="accum", gradient_accumulation_steps=2),
        # ddp2's run but for the hook, so their losses compare.
        "fp16": base_config(store, world_size=2, run_name="hook-fp16", comm_hook="fp16"),
        "bf16": base_config(
            store, world_size=2, run_name="hook-bf16", comm_hook="bf16", lr_scaling="sqrt"
        ),
        "powersgd": base_config(
            store,
            world_size=2,
            run_name="hook-powersgd",
            comm_hook="powersgd",
            powersgd_rank=2,
            lr_scaling="linear",
            lr_warmup_steps=4,
        ),
        "rank0": base_config(
            store, world_size=2, run_name="eval-rank0", eval_on="rank0", trace_comm="hook"
        ),
        "parquet": base_config(
            store,
            world_size=2,
            run_name="parquet",
            dataset="parquet",
            dataset_options={"train": str(train), "eval": str(evals)},
            learning_rate=0.2,
            epochs=4,
            trace_sample_ids=True,
        ),
        "single": base_config(store, world_size=1, run_name="single", strategy="single"),
    }
    # At most four ranks at once share the two cores (all thirteen at once thrash).
    return launch_all(configs)


def test_gradient_accumulation_equals_the_larger_batch(runs, ddp2) -> None:
    accumulated, larger = _final_params(runs["accum"]), _final_params(ddp2)
    for name in larger:
        torch.testing.assert_close(accumulated[name], larger[name], rtol=1e-5, atol=1e-6)
    steps = runs["accum"].traces()
    assert (steps["samples"] == 32).all() and (steps["comm_bytes"] == FULL).all()
    # DDP counts synchronised steps only, so the sampled comm timer still lands on steps 1-10.
    timed = steps[steps["comm_s"].notna()]
    assert timed.groupby("rank")["step"].apply(list).tolist() == [list(range(1, 11))] * 2


def test_comm_hook_tracing_times_every_step(runs) -> None:
    steps = runs["rank0"].traces()  # trace_comm="hook"
    assert len(steps) == 32 and (steps["comm_s"] > 0).all()
    assert (steps["comm_bytes"] == FULL).all()


def test_a_compression_hook_is_timed_by_ddp_and_counted_by_the_hook(runs) -> None:
    """trace_comm="sampled" with a compression hook: DDP's reducer timer spans the hook's work
    (steps 1-10 of 16 at the default sampling), the hook counts what it really sent."""
    for name in ("fp16", "bf16", "powersgd"):
        steps = runs[name].traces()
        timed = steps[steps["comm_exposed_s"].notna()]
        assert timed.groupby("rank")["step"].apply(list).tolist() == [list(range(1, 11))] * 2
        assert (timed["comm_exposed_s"] > 0).all() and (timed["comm_s"] > 0).all(), name
        assert (timed["comm_exposed_s"] <= timed["comm_s"]).all(), name
        assert timed["backward_compute_s"].notna().all(), name
        assert (steps["comm_buckets"] >= 1).all(), name


def test_each_comm_hook_runs_and_changes_traced_bytes(runs) -> None:
    assert (runs["fp16"].traces()["comm_bytes"] == FULL // 2).all(), "fp16 halves the bytes"
    assert (runs["bf16"].traces()["comm_bytes"] == FULL // 2).all()
    powersgd = runs["powersgd"].traces()
    assert (powersgd[powersgd["step"] == 1]["comm_bytes"] == FULL).all(), (
        "plain allreduce before it starts"
    )
    assert (powersgd[powersgd["step"] >= 3]["comm_bytes"] < FULL / 2).all(), (
        "low-rank factors after"
    )
    # The eval set's majority class alone scores 77 / 200 = 0.385: learning means clearly more.
    majority = _majority_class_accuracy()
    for name in ("fp16", "bf16", "powersgd"):
        final = runs[name].traces("eval")["metric_value"].iloc[-1]
        assert final > majority + 0.1, f"{name} does not learn: {final} vs majority {majority}"


def test_fp16_compression_changes_the_losses_by_a_bounded_amount(runs, ddp2) -> None:
    """The fp16 hook rounds the gradients to 11 significant bits (relative 2**-11 ~ 0.05 %) on
    the way: step 1's loss comes before any update and is exactly fp32's; later losses differ,
    by far less than a percent over 16 steps."""
    fp32 = ddp2.traces().groupby("step")["loss"].mean().to_numpy()
    fp16 = runs["fp16"].traces().groupby("step")["loss"].mean().to_numpy()
    assert len(fp32) == len(fp16) == 16
    assert fp16[0] == fp32[0], "the hook touches only gradients"
    relative = np.abs(fp16[1:] - fp32[1:]) / np.abs(fp32[1:])
    assert relative.max() > 0, "the losses are exactly fp32's: the hook compressed nothing"
    assert relative.max() < 0.01, relative.max()


def _majority_class_accuracy() -> float:
    """The accuracy of always answering the eval set's most frequent label (base_config's 200
    eval samples, seed 0), counted here from the labels."""
    eval_set = synthetic_dataset("mlp", dict(MODEL_OPTIONS["mlp"]), 200, 0, 1)
    labels = eval_set.tensors[1]
    assert len(labels) == 200
    return torch.bincount(labels).max().item() / len(labels)


def test_learning_rate_rules(runs) -> None:
    powersgd = runs["powersgd"].traces()  # linear: global 64 over one device's 32 -> x2, warm-up 4
    lr = powersgd[powersgd["rank"] == 0].set_index("step")["lr"]
    assert lr[1] == pytest.approx(0.05 * 2 * 1 / 4) and lr[2] == pytest.approx(0.05 * 2 * 2 / 4)
    assert lr[4] == pytest.approx(0.1) and lr[16] == pytest.approx(0.1)
    bf16 = runs["bf16"].traces()
    assert bf16["lr"].unique().tolist() == [pytest.approx(0.05 * math.sqrt(2))]


def test_rank0_evaluation_matches_gathered_evaluation(runs, ddp2) -> None:
    rank0, gathered = runs["rank0"].traces("eval"), ddp2.traces("eval")
    assert rank0["metric_value"].tolist() == gathered["metric_value"].tolist()
    assert rank0[rank0["rank"] == 0]["samples"].tolist() == [200, 200]
    # Rank 1 predicts nothing (its time is the wait for the broadcast; timings are too noisy
    # on a shared machine to compare here).
    assert rank0[rank0["rank"] == 1]["samples"].tolist() == [0, 0]


def test_parquet_row_groups_shard_the_data(runs, parquet_files) -> None:
    steps = runs["parquet"].traces()
    assert len(steps) == 32 * 2
    first = steps[steps["step"] == 1].set_index("rank")["loss"]
    assert first[0] != first[1], "each rank read its own row groups"
    # Each rank reads row groups rank, rank + 2, ... of the file (docs): the file's own
    # metadata says how many rows that is; every epoch the rank consumes each of them once.
    train, _ = parquet_files
    meta = pq.ParquetFile(train).metadata
    groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    mine = {rank: sum(groups[rank::2]) for rank in (0, 1)}
    assert mine[0] + mine[1] == meta.num_rows == 512, "the two shards cover the file"
    run = runs["parquet"].path / schema.TRACES_DIR
    for rank in (0, 1):
        per_epoch: dict[int, list[int]] = {}
        for line in (run / f"samples-rank{rank:05d}.jsonl").read_text().splitlines():
            row = json.loads(line)
            per_epoch.setdefault(row["epoch"], []).extend(row["indices"])
        assert sorted(per_epoch) == [0, 1, 2, 3]
        for epoch, seen in per_epoch.items():
            assert sorted(seen) == list(range(mine[rank])), (rank, epoch)
    by_step = steps.groupby("step")["loss"].mean()
    assert by_step.tail(8).mean() < by_step.head(8).mean(), "the Parquet data carries a signal"
    evals = runs["parquet"].traces("eval")
    assert (evals.groupby("step")["samples"].sum() == 200).all(), (
        "each evaluation covers the eval file"
    )


def test_single_strategy_has_no_communication(runs) -> None:
    steps = runs["single"].traces()
    assert (steps["comm_bytes"] == 0).all() and (steps["comm_buckets"] == 0).all()


def test_partition_check_rejects_3_groups_on_2_ranks_with_the_fix(tmp_path) -> None:
    train = parquet_data.make_parquet_dataset(tmp_path / "t.parquet", 300, rows_per_group=100)
    evals = parquet_data.make_parquet_dataset(tmp_path / "e.parquet", 100, seed=1)
    config = base_config(
        tmp_path,
        world_size=2,
        train_samples=256,
        dataset="parquet",
        dataset_options={"train": str(train), "eval": str(evals)},
    )
    with pytest.raises(PreflightError) as err:
        launch(config)
    assert "has 3 row groups, not a multiple of the 2 processes" in str(err.value)
    assert f"workbench repartition {train} --row-groups 4" in str(err.value)
    parquet_data.repartition(train, row_groups_count=4)
    assert parquet_data.row_groups(train) == 4
    assert parquet_data.partition_problem(train, 2) is None
