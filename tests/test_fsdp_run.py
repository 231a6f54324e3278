"""strategy="fsdp" for the built-in models, and each rank's memory in its parts (parameters,
gradients, optimizer state), for FSDP and DDP alike.

The real runs go through the command a user types: one `workbench scale --strategy fsdp` at 1 and
2 ranks, first and alone, then two `workbench run` at 2 ranks (FSDP with its knobs turned, and
DDP) together, on the warm pool, shared by every test below. Every memory figure is worked by
hand from the model's definition (an mlp: 32 inputs, two hidden layers of 64, 5 classes), not from
the code that counts it."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch

from workbench.config.run_config import RunConfig
from workbench.errors import ConfigError
from workbench.rank import memory_parts
from workbench.rank.models import build_model, shard_blocks
from workbench.store.files import read_rank_states
from workbench.store.load import load_runs
from workbench.sweeps.spec import SweepSpec

from .helpers import WARM, start_cli

MODEL = {"input_dim": 32, "hidden_dim": 64, "num_layers": 2, "num_classes": 5}
#: The mlp's parameters as nn.Linear makes them: (out, in) weights and (out,) biases, in order.
SHAPES = [(64, 32), (64,), (64, 64), (64,), (5, 64), (5,)]
#: The parameter groups FSDP makes of it: each hidden layer a block, the output layer the root's.
GROUPS = [SHAPES[0:2], SHAPES[2:4], SHAPES[4:6]]
P = sum(math.prod(s) for s in SHAPES)  # 6,597 parameters
STEP = 4  # AdamW's 0-d float32 ``step`` tensor, one per parameter
TINY = [
    "--model", "mlp", "--model-options", json.dumps(MODEL), "--optimizer", "adamw",
    "--train-samples", "256", "--eval-samples", "64", "--per-device-batch-size", "16",
    "--max-steps", "5", "--warmup-steps", "2", "--eval-batch-size", "64",
    "--no-network-benchmark", "--executor", WARM,
]  # fmt: skip


def padded(shape: tuple[int, ...], n: int) -> int:
    """Elements of one rank's shard as FSDP2 stores it: dim 0 padded to a multiple of n."""
    return math.ceil(shape[0] / n) * math.prod(shape[1:])


def chunk(shape: tuple[int, ...], n: int, rank: int) -> int:
    """Elements of rank ``rank``'s piece of dim 0 as torch.chunk cuts it (unpadded)."""
    rows = math.ceil(shape[0] / n)
    mine = max(0, min(rows, shape[0] - rank * rows))
    return mine * math.prod(shape[1:])


# ----------------------------------------------------------------------------- no processes


def test_fsdp_knobs_are_fields_and_bad_combinations_are_refused_before_launch() -> None:
    config = RunConfig(
        strategy="fsdp",
        world_size=2,
        per_device_batch_size=8,
        reshard_after_forward=False,
        fsdp_param_dtype="bf16",
    )
    assert RunConfig.from_json(config.to_json()) == config
    assert config.fsdp_reduce_dtype is None  # the param dtype, FSDP's own default
    with pytest.raises(ConfigError) as ddp_knobs:
        RunConfig(
            strategy="fsdp",
            world_size=2,
            per_device_batch_size=8,
            bucket_cap_mb=10,
            static_graph=True,
            find_unused_parameters=True,
            gradient_as_bucket_view=True,
            comm_hook="powersgd",
            eval_on="rank0",
            checkpoint_every_steps=2,
            trace_comm="hook",
        )
    said = {p.field: (p.value, p.allowed) for p in ddp_knobs.value.problems}
    assert set(said) == {
        "bucket_cap_mb",
        "static_graph",
        "find_unused_parameters",
        "gradient_as_bucket_view",
        "comm_hook",
        "eval_on",
        "checkpoint_every_steps",
        "trace_comm",
    }
    assert said["bucket_cap_mb"][0] == 10 and "not with strategy='fsdp'" in said["bucket_cap_mb"][1]
    assert "use 'all'" in said["eval_on"][1]
    for strategy in ("ddp", "single", "dp"):
        with pytest.raises(ConfigError) as fsdp_knobs:
            RunConfig(
                strategy=strategy,
                world_size=1,
                per_device_batch_size=8,
                device="cuda" if strategy == "dp" else "auto",
                reshard_after_forward=False,
                fsdp_param_dtype="bf16",
                fsdp_reduce_dtype="fp32",
            )
        fields = [p.field for p in fsdp_knobs.value.problems]
        assert fields == ["reshard_after_forward", "fsdp_param_dtype", "fsdp_reduce_dtype"]
        assert f"not {strategy!r}" in fsdp_knobs.value.problems[0].allowed
    with pytest.raises(ConfigError) as dtype:
        RunConfig(strategy="fsdp", world_size=1, per_device_batch_size=8, fsdp_param_dtype="fp8")
    assert dtype.value.problems[0].allowed == "must be one of fp32, bf16, fp16"
    with pytest.raises(ConfigError) as script:
        RunConfig(script="train.py", world_size=2, strategy="fsdp", fsdp_param_dtype="bf16")
    assert [p.field for p in script.value.problems] == ["strategy", "fsdp_param_dtype"]


def test_a_sweep_grids_the_strategy_and_its_knobs() -> None:
    spec = SweepSpec(
        name="strategies",
        fixed={"model": "mlp", "per_device_batch_size": 8, "max_steps": 4},
        grid={"world_size": [1, 2], "strategy": ["ddp", "fsdp"]},
        include=[{"world_size": 2, "strategy": "fsdp", "reshard_after_forward": False}],
    )
    points = [(p.config.world_size, p.config.strategy) for p in spec.points()]
    assert points == [(1, "ddp"), (1, "fsdp"), (2, "ddp"), (2, "fsdp"), (2, "fsdp")]
    assert spec.points()[-1].config.reshard_after_forward is False
    with pytest.raises(ConfigError) as bad:
        SweepSpec(
            name="bad",
            fixed={"model": "mlp", "per_device_batch_size": 8, "world_size": 2},
            grid={"fsdp_param_dtype": ["bf16"]},
        )
    assert "fsdp_param_dtype" in str(bad.value) and "not 'ddp'" in str(bad.value)


def test_each_built_in_model_has_blocks_to_shard() -> None:
    expected = {
        "mlp": ["Linear", "Linear"],
        "cnn": ["ResidualBlock", "ResidualBlock"],
        "transformer": ["TransformerEncoderLayer"] * 2,
        "gpt": ["TransformerEncoderLayer"] * 2,
        "planted": ["PlantedLayer"] * 4,
    }
    for name, blocks in expected.items():
        model = build_model(name, {})
        found = shard_blocks(model)
        assert [type(b).__name__ for b in found] == blocks, name
        # no block holds a parameter of another: each is one parameter group
        held = [id(p) for b in found for p in b.parameters()]
        assert len(held) == len(set(held)), name


def test_a_bare_module_holds_its_parameters_gradients_and_momentum_in_full() -> None:
    model = build_model("mlp", MODEL)
    # SGD: its momentum buffers, one a parameter (AdamW, whose first step imports torch's
    # compiler, is the real runs' optimizer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 32)).sum().backward()
    optimizer.step()
    parts = memory_parts.count(model, optimizer)
    assert parts["param_bytes"] == parts["grad_bytes"] == parts["optimizer_bytes"] == 4 * P
    assert parts["total_bytes"] == 12 * P == 79_164
    assert parts["sharded"] is False and parts["gathered_param_bytes"] is None
    tied = torch.nn.Linear(3, 3)
    view = tied.weight.detach()[:1]  # a view shares its storage: counted once
    assert memory_parts.held_bytes([tied.weight, view, None]) == 36


# ----------------------------------------------------------------------------- real runs


#: FSDP's knobs away from their defaults: ZeRO-2-like, gathered in bf16, reduced in fp32.
KNOBS = ["--no-reshard-after-forward", "--fsdp-param-dtype", "bf16", "--fsdp-reduce-dtype", "fp32"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An FSDP study at 1 and 2 ranks (`workbench scale`), FSDP at 2 ranks with its knobs turned
    (`workbench run`) and DDP at 2 ranks (`workbench run`), these two together, on the warm pool:
    name -> run folder."""
    store = tmp_path_factory.mktemp("fsdp-store")

    def finish(process: subprocess.Popen[str], name: str) -> None:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, (process.args, out[-3000:], err[-3000:])
        (store / f"{name}.out").write_text(out)  # what the terminal printed

    # the study alone: its 1-rank base, measured beside the other runs' start-up, once came out
    # at a quarter of its speed, and a 2-rank point at 100 % of ideal has no loss to name
    study = start_cli("scale", "--world-sizes", "1,2", "--strategy", "fsdp", "--sweep", "fsdp",
                      "--output-dir", str(store), *TINY)  # fmt: skip
    finish(study, "scale")
    started = [
        start_cli("run", "--world-size", "2", "--strategy", "fsdp", *KNOBS, "--sweep", "zero2",
                  "--output-dir", str(store), *TINY),
        start_cli("run", "--world-size", "2", "--sweep", "ddp", "--output-dir", str(store),
                  *TINY),
    ]  # fmt: skip
    for process, name in zip(started, ("zero2", "ddp"), strict=True):
        finish(process, name)
    found = {}
    for run in store.glob("*/*/run.json"):
        record = json.loads(run.read_text())
        found[f"{run.parent.parent.name}{record['config']['world_size']}"] = run.parent
        assert record["status"] == "completed", (run, record.get("failure"))
    assert set(found) == {"fsdp1", "fsdp2", "zero22", "ddp2"}, found
    return found


def steps(run: Path) -> pd.DataFrame:
    return pd.concat(pd.read_parquet(p) for p in (run / "traces").glob("steps-*.parquet"))


def memory(run: Path) -> dict[int, dict]:
    """Each rank's memory in its parts, from its own record."""
    return {r: s["summary"]["memory_parts"] for r, s in read_rank_states(run).items()}


@pytest.mark.slow
def test_fsdp_runs_train_with_samples_throughput_and_phases_as_ddp(runs) -> None:
    for name in ("fsdp1", "fsdp2"):
        run = runs[name]
        record = json.loads((run / "run.json").read_text())
        assert record["config"]["strategy"] == "fsdp"
        rows = steps(run)
        world = record["config"]["world_size"]
        assert sorted(rows["rank"].unique()) == list(range(world))
        assert (rows["samples"] == 16).all(), "each rank's batch, counted at FSDP's root"
        for phase in ("forward_s", "backward_s", "optimizer_s", "step_s"):
            assert (rows[phase] > 0).all(), (name, phase)
        assert rows["loss"].notna().all()
        assert record["summary"]["samples_per_s"] > 0, record["summary"]
        summaries = [s["summary"] for s in read_rank_states(run).values()]
        # the fingerprint is the whole model's (sharded parameters gathered), the same on all
        assert len({s["param_sha256"] for s in summaries}) == 1


@pytest.mark.slow
def test_memory_parts_equal_the_bytes_worked_by_hand(runs) -> None:
    fp32 = 4
    ddp = memory(runs["ddp2"])
    for rank in (0, 1):  # DDP: everything in full on every rank
        assert ddp[rank]["param_bytes"] == ddp[rank]["grad_bytes"] == fp32 * P
        assert ddp[rank]["optimizer_bytes"] == 2 * fp32 * P + STEP * len(SHAPES)
        assert ddp[rank]["sharded"] is False and ddp[rank]["gathered_param_bytes"] is None
        assert ddp[rank]["peak_bytes"] is None  # CPU: the allocator's peak is CUDA's
    one = memory(runs["fsdp1"])[0]  # FSDP at one rank: one shard, the whole model
    assert one["param_bytes"] == one["grad_bytes"] == one["gathered_param_bytes"] == fp32 * P
    assert one["optimizer_bytes"] == 2 * fp32 * P + STEP * len(SHAPES)
    assert one["largest_group_gathered_bytes"] == fp32 * (64 * 64 + 64)
    two = memory(runs["fsdp2"])
    shard = fp32 * sum(padded(s, 2) for s in SHAPES)  # the 5-row layer pads to 6: 3 rows each
    assert shard == fp32 * ((32 * 32 + 32) + (32 * 64 + 32) + (3 * 64 + 3)) == 13_324
    gathered = fp32 * sum(2 * padded(s, 2) for s in SHAPES)
    assert gathered == fp32 * (P + 64 + 1) == 26_648
    for rank in (0, 1):
        parts = two[rank]
        assert parts["sharded"] is True
        assert parts["param_bytes"] == parts["grad_bytes"] == shard
        moments = 2 * fp32 * sum(chunk(s, 2, rank) for s in SHAPES)  # 3 rows of 5, then 2
        assert parts["optimizer_bytes"] == moments + STEP * len(SHAPES)
        assert parts["gathered_param_bytes"] == gathered
        biggest = max(fp32 * sum(2 * padded(s, 2) for s in g) for g in GROUPS)
        assert parts["largest_group_gathered_bytes"] == biggest == fp32 * (64 * 64 + 64)
        # about half of what each DDP rank holds, part by part
        for part in ("param_bytes", "grad_bytes", "optimizer_bytes"):
            assert 0.49 < parts[part] / ddp[rank][part] < 0.51, (rank, part)
    assert two[0]["optimizer_bytes"] - two[1]["optimizer_bytes"] == 2 * fp32 * (64 + 1)
    # run.json keeps each rank's parts; the runs frame the largest rank's
    record = json.loads((runs["fsdp2"] / "run.json").read_text())
    assert record["memory_parts"]["1"]["optimizer_bytes"] == two[1]["optimizer_bytes"]
    frame = load_runs(runs["fsdp2"].parent.parent, [runs["fsdp2"].parent.name])
    frame = frame[frame["world_size"] == 2]
    assert frame["memory_optimizer_bytes_max"].tolist() == [two[0]["optimizer_bytes"]]
    assert frame["memory_gathered_param_bytes_max"].tolist() == [gathered]


@pytest.mark.slow
def test_the_knobs_reach_fsdp(runs) -> None:
    """Resharding and the dtypes, seen in what FSDP gathers and keeps: the knobs' run gathers
    once a step (forward only) in bf16, reduces in fp32, and keeps its shards in fp32."""
    gathered_fp32 = 4 * sum(2 * padded(s, 2) for s in SHAPES)  # 26,648 bytes
    root = 4 * sum(2 * padded(s, 2) for s in GROUPS[2])  # the output layer, never resharded
    default, knobs = steps(runs["fsdp2"]), steps(runs["zero22"])
    # every block gathered in forward, and again in backward but the root
    assert (default["all_gather_calls"] == 5).all()
    assert (default["all_gather_bytes"] == 2 * gathered_fp32 - root).all()
    assert (knobs["all_gather_calls"] == 3).all(), "no re-gather: kept until backward"
    assert (knobs["all_gather_bytes"] == gathered_fp32 // 2).all(), "bf16: 2 bytes an element"
    assert (knobs["reduce_scatter_bytes"] == gathered_fp32).all(), "reduced in fp32"
    for rank, parts in memory(runs["zero22"]).items():
        assert parts["gathered_param_bytes"] == gathered_fp32 // 2, rank
        assert parts["param_bytes"] == memory(runs["fsdp2"])[rank]["param_bytes"], "fp32 shards"


@pytest.mark.slow
def test_the_terminal_speaks_fsdps_terms(runs) -> None:
    """What ``workbench run`` and ``scale`` print for FSDP: its exposed collectives, never
    "comm n/a", and a finding that names one of them and the memory per rank."""
    store = runs["fsdp1"].parents[1]
    run, scale = (store / "zero2.out").read_text(), (store / "scale.out").read_text()
    assert "FSDP communication a step: exposed all-gather" in run, run
    assert "comm n/a" not in run and "comm n/a" not in scale, scale
    # one curve: its finding names a largest cause, and FSDP's collectives among the causes
    # (which of them, or the ranks' shared cores, is the largest is the host's to decide)
    assert "largest cause: " in scale, scale
    finding = scale[scale.index("finding:") :]
    for collective in ("exposed all-gather", "exposed reduce-scatter"):
        assert collective in finding, scale
    assert "memory per rank at 2 ranks" in finding, scale
