"""The DDP and optimizer options of docs/configuration.md, launched for real at world size 2
(gloo, CPU), each checked by what it observably changes or guarantees: AdamW's first update, a small
``bucket_cap_mb``'s extra buckets, ``find_unused_parameters`` letting a model with an unused
head train, bf16 autocast moving the losses by a bounded amount, one profile per rank."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from workbench.rank.models import build_model

from .conftest import base_config
from .launch_batches import launch_all

pytestmark = pytest.mark.slow

#: Below the smallest gradient of the mlp and of the unused-head model (a 4-element bias, 16
#: bytes): one bucket per parameter tensor, whatever the order DDP forms them in.
TINY_BUCKET_MB = 8 / 2**20


def _checkpoint(handle, step: int) -> dict[str, torch.Tensor]:
    return torch.load(
        handle.path / "checkpoints" / f"step-{step:08d}" / "train.pt", weights_only=True
    )["model"]


def _initial(model: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """The initial weights every rank starts from: the model built right after seeding."""
    torch.manual_seed(seed)
    return {k: v.clone() for k, v in build_model(model, {}).state_dict().items()}


@pytest.fixture(scope="module")
def option_runs(store, ddp2):
    """Three tiny 2-rank runs, two at a time (four ranks on the two cores at most)."""
    configs = {
        # AdamW on the causal LM with DDP's static-graph and bucket-view modes.
        "gpt": base_config(
            store,
            world_size=2,
            run_name="opt-gpt-adamw",
            model="gpt",
            optimizer="adamw",
            learning_rate=1e-3,
            static_graph=True,
            gradient_as_bucket_view=True,
            max_steps=3,
            epochs=1,
            checkpoint_every_steps=1,
            eval_samples=64,
        ),
        # ddp2's run but for bf16 autocast, tiny buckets and a profiling window.
        "bf16": base_config(
            store,
            world_size=2,
            run_name="opt-bf16-buckets-profile",
            precision="bf16",
            bucket_cap_mb=TINY_BUCKET_MB,
            profile_steps=(3, 4),
        ),
        # A model with a head that gets no gradient, which DDP cannot reduce without the option.
        "unused": base_config(
            store,
            world_size=2,
            run_name="opt-find-unused",
            model="tests.plugins:with_unused_head",
            dataset="tests.plugins:synthetic_like_mlp",
            find_unused_parameters=True,
            bucket_cap_mb=TINY_BUCKET_MB,
            max_steps=4,
            epochs=1,
        ),
    }
    return launch_all(configs)


def test_every_option_run_ends_with_identical_parameters_on_both_ranks(option_runs) -> None:
    for name, handle in option_runs.items():
        summaries = handle.result()
        assert [s["rank"] for s in summaries] == [0, 1], name
        assert summaries[0]["param_sha256"] == summaries[1]["param_sha256"], name
        assert summaries[0]["steps"] == summaries[1]["steps"] > 0, name


def test_adamw_first_update_is_the_learning_rate_times_the_gradient_sign(option_runs) -> None:
    """AdamW with weight decay 0: after one step m/sqrt(v) = g/|g|, so every parameter whose
    gradient is not ~0 moves by exactly lr; SGD would move each by lr x |g|, all different."""
    lr = 1e-3
    before, after = _initial("gpt"), _checkpoint(option_runs["gpt"], 1)
    moved = torch.cat([(after[k] - before[k]).abs().flatten() for k in before])
    assert moved.max() <= lr * (1 + 1e-3), moved.max()
    changed = moved[moved > 0]
    # Embedding rows of tokens absent from the batch get no gradient: they do not move.
    assert len(changed) > 0.5 * len(moved)
    near_lr = ((changed - lr).abs() < 0.02 * lr).float().mean().item()
    assert near_lr > 0.9, f"only {near_lr:.0%} of the moved weights moved by lr"
    steps = option_runs["gpt"].traces()
    assert sorted(steps["step"].unique()) == [1, 2, 3]
    assert np.isfinite(steps["loss"]).all()


def test_a_small_bucket_cap_gives_one_bucket_per_gradient_tensor(option_runs, ddp2) -> None:
    tensors = len([p for p in build_model("mlp", {}).parameters() if p.requires_grad])
    assert tensors > 1
    small = option_runs["bf16"].traces()
    # DDP's first iteration: recent torch puts every parameter in one bucket unless
    # find_unused_parameters is on (older torch already applied the cap); DDP then rebuilds
    # its buckets at the cap in the order the gradients became ready.
    first = small[small["step"] == 1]["comm_buckets"]
    assert first.isin([1, tensors]).all(), first.tolist()
    later = small[small["step"] >= 2]["comm_buckets"]
    assert (later == tensors).all(), later.unique()
    assert (ddp2.traces()["comm_buckets"] == 1).all(), "the default 25 MiB holds the whole mlp"
    # With find_unused_parameters DDP buckets at the cap from the first step on: the unused-head
    # model's four tensors (the unused ones included) in four buckets.
    unused = option_runs["unused"].traces()
    assert (unused["comm_buckets"] == 4).all(), unused[["step", "comm_buckets"]]


def test_bf16_autocast_changes_the_losses_by_a_bounded_amount(option_runs, ddp2) -> None:
    """bf16 keeps 8 significant bits (relative rounding 2**-9 ~ 0.2 % per operation): the
    losses must differ from fp32's from the first step on, by well under a few percent."""
    fp32 = ddp2.traces().groupby("step")["loss"].mean().to_numpy()
    bf16 = option_runs["bf16"].traces().groupby("step")["loss"].mean().to_numpy()
    assert len(fp32) == len(bf16) == 16
    relative = np.abs(bf16 - fp32) / np.abs(fp32)
    assert relative[0] > 0, "the first step's loss is exactly fp32's: autocast did nothing"
    assert relative.max() < 0.03, relative.max()


def test_find_unused_parameters_trains_a_model_with_an_unused_head(option_runs) -> None:
    """Without the option the same model fails (test_faults); with it the run completes, the
    used layer learns and the unused head keeps its initial weights on every rank."""
    torch.manual_seed(0)
    from tests.plugins import with_unused_head

    initial = with_unused_head().state_dict()
    final = _checkpoint(option_runs["unused"], 4)
    for name in ("unused_head.weight", "unused_head.bias"):
        torch.testing.assert_close(final[name], initial[name], rtol=0, atol=0)
    assert not torch.equal(final["used.weight"], initial["used.weight"])


def test_one_profile_per_rank_at_world_size_two(option_runs) -> None:
    folder = option_runs["bf16"].path / "profiles"
    for rank in (0, 1):
        (path,) = folder.glob(f"rank{rank:05d}*.pt.trace.json")
        trace = json.loads(path.read_text())
        assert trace["distributedInfo"]["rank"] == rank
        assert trace["distributedInfo"]["world_size"] == 2
        steps = {
            e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")
        }
        assert steps == {"ProfilerStep#3", "ProfilerStep#4"}
    assert len(list(folder.glob("*.pt.trace.json"))) == 2
