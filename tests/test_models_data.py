"""Built-in models and synthetic data: shapes, a learnable signal, sharding, plug-ins."""

from __future__ import annotations

import pytest
import torch

from workbench.config.run_config import MODEL_OPTIONS, RunConfig
from workbench.rank.data import build_datasets, eval_shard, fetch_batch, train_batches
from workbench.rank.models import build_model, gradient_bytes, model_task


@pytest.mark.parametrize("name", list(MODEL_OPTIONS))
def test_builtin_model_trains_on_its_synthetic_data(name: str) -> None:
    torch.manual_seed(0)
    config = RunConfig(
        model=name, world_size=1, per_device_batch_size=32, train_samples=256, eval_samples=64
    )
    train, _ = build_datasets(config)
    model = build_model(name, {})
    inputs, targets = fetch_batch(train, list(range(32)))
    logits = model(inputs)
    if model_task(model) == "lm":
        assert logits.shape == (
            32,
            MODEL_OPTIONS[name]["seq_len"],
            MODEL_OPTIONS[name]["vocab_size"],
        )

        def loss_fn() -> torch.Tensor:
            return torch.nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())

    else:
        assert logits.shape == (32, MODEL_OPTIONS[name]["num_classes"])

        def loss_fn() -> torch.Tensor:
            return torch.nn.functional.cross_entropy(model(inputs), targets)

    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = loss_fn().item()
    for _ in range(30):
        opt.zero_grad()
        loss_fn().backward()
        opt.step()
    assert loss_fn().item() < 0.8 * first, "the synthetic data carries a signal the model can fit"


def test_model_sizes_are_configurable() -> None:
    small = build_model("transformer", {})
    big = build_model("transformer", {"d_model": 128, "num_layers": 3, "ffn_dim": 256})
    assert gradient_bytes(big) > 3 * gradient_bytes(small)
    assert gradient_bytes(small) == 4 * sum(p.numel() for p in small.parameters())


def test_synthetic_data_is_deterministic_per_seed_and_split() -> None:
    c = RunConfig(
        model="mlp", world_size=1, per_device_batch_size=8, train_samples=64, eval_samples=32
    )
    a_train, a_eval = build_datasets(c)
    b_train, _ = build_datasets(c)
    other, _ = build_datasets(c.replace(seed=1))
    assert torch.equal(a_train.tensors[0], b_train.tensors[0])
    assert not torch.equal(a_train.tensors[0], other.tensors[0])
    assert not torch.equal(a_train.tensors[0][:32], a_eval.tensors[0])
    labels = a_train.tensors[1]
    assert len(labels.unique()) > 1, "labels are not constant"


def test_train_batches_shard_disjointly_and_reshuffle() -> None:
    data = list(range(100))
    e0 = [train_batches(data, r, 3, 8, seed=0, epoch=0) for r in range(3)]
    flat = [i for rank in e0 for batch in rank for i in batch]
    assert all(len(rank) == 4 for rank in e0)  # 33 per rank -> 4 full batches of 8
    assert len(flat) == len(set(flat)) == 96
    assert train_batches(data, 0, 3, 8, seed=0, epoch=1) != e0[0]


def test_eval_shard_pads_to_equal_lengths() -> None:
    shards = [sum(eval_shard(list(range(7)), r, 2, 3), []) for r in range(2)]
    assert [len(s) for s in shards] == [4, 4]
    assert set(shards[0]) | set(shards[1]) == set(range(7))


def test_plugin_model_and_dataset() -> None:
    c = RunConfig(
        model="tests.plugins:tiny_linear",
        dataset="tests.plugins:two_features",
        model_options={"classes": 3},
        world_size=1,
        per_device_batch_size=4,
        train_samples=20,
    )
    train, evals = build_datasets(c)
    assert len(train) == 20 and len(evals) == c.eval_samples
    x, y = fetch_batch(train, [0, 1, 2])
    assert x.shape == (3, 6) and y.shape == (3,)
    assert build_model(c.model, dict(c.model_options)).out_features == 3


@pytest.mark.parametrize(
    "spec, words",
    [
        ("tests.nosuchmodule:f", "cannot import module 'tests.nosuchmodule'"),
        ("tests.plugins:missing", "has no callable 'missing'"),
        ("tests.plugins:not_a_module", "has no callable"),
    ],
)
def test_plugin_errors_name_the_field(spec: str, words: str) -> None:
    with pytest.raises(ValueError, match="model=") as err:
        build_model(spec, {})
    assert words in str(err.value)


def test_repartition_gives_exactly_the_row_groups_asked_for(tmp_path) -> None:
    import pyarrow.parquet as pq

    from workbench.store import row_groups as parquet_data

    path = parquet_data.make_parquet_dataset(tmp_path / "d.parquet", 225, rows_per_group=50)
    before = pq.read_table(path)
    parquet_data.repartition(path, row_groups_count=16)  # ceil(225 / 16) = 15 rows: 15 groups
    meta = pq.ParquetFile(path).metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sizes == [15] + [14] * 15
    assert pq.read_table(path).equals(before), "same rows in the same order"
