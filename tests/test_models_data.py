"""Built-in models and synthetic data: shapes, a learnable signal, sharding, plug-ins."""

from __future__ import annotations

import pytest
import torch

from workbench.config.run_config import MODEL_OPTIONS, RunConfig
from workbench.rank.data import build_datasets, eval_shard, fetch_batch, train_batches
from workbench.rank.models import build_model, gradient_bytes, model_task

from .parquet_rows import expected_rows


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
    parquet_data.repartition(path, row_groups_count=16)  # ceil(225 / 16) = 15 rows: 15 groups
    meta = pq.ParquetFile(path).metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sizes == [15] + [14] * 15
    # Against the rows computed here, not against the file read back before rewriting it.
    assert pq.read_table(path).equals(expected_rows(225)), "same rows in the same order"


# Parameter counts of the size presets, by hand from the layer shapes (d = 768, ffn = 3072):
# one encoder layer (torch's TransformerEncoderLayer):
#   attention in-projection  3d x d + 3d = 1,769,472 + 2,304  = 1,771,776
#   attention out-projection  d x d + d  =   589,824 +   768  =   590,592
#   linear1                 d x ffn + ffn = 2,359,296 + 3,072 = 2,362,368
#   linear2                 ffn x d + d   = 2,359,296 +   768 = 2,360,064
#   two LayerNorms          2 x 2d                            =     3,072
#   = 7,087,872 per layer
# distilbert: tokens 30,522 x 768 = 23,440,896; positions 128 x 768 = 98,304;
#   6 layers = 42,527,232; final LayerNorm 1,536; head 768 x 6 + 6 = 4,614   -> 66,072,582
# bert-base: the same with 12 layers = 85,054,464                             -> 108,599,814
# gpt2-small: tokens 50,257 x 768 = 38,597,376; positions 1,024 x 768 = 786,432;
#   12 layers = 85,054,464; final LayerNorm 1,536                            -> 124,439,808
#   (GPT-2's own count, its output layer tied to the token embedding), plus the GPT here's
#   untied output layer 768 x 50,257 (no bias) = 38,597,376                   -> 163,037,184
PRESET_PARAMETERS = {
    ("transformer", "distilbert"): 66_072_582,
    ("transformer", "bert-base"): 108_599_814,
    ("gpt", "gpt2-small"): 163_037_184,
}


@pytest.mark.parametrize("model, size", list(PRESET_PARAMETERS))
def test_size_presets_build_models_of_the_counted_size(model: str, size: str) -> None:
    built = build_model(model, {"size": size})
    assert sum(p.numel() for p in built.parameters()) == PRESET_PARAMETERS[(model, size)]


def test_explicit_options_override_a_preset_and_data_follows() -> None:
    config = RunConfig(
        model="transformer",
        model_options={"size": "distilbert", "seq_len": 16},
        world_size=1,
        per_device_batch_size=4,
        train_samples=8,
        eval_samples=4,
    )
    model = build_model(config.model, dict(config.model_options))
    assert model.encoder.positions.num_embeddings == 16
    assert model.encoder.tokens.num_embeddings == 30522 and model.head.out_features == 6
    train, _ = build_datasets(config)
    inputs, targets = fetch_batch(train, [0, 1])
    assert inputs.shape == (2, 16) and int(inputs.max()) < 30522 and int(targets.max()) < 6
    with pytest.raises(ValueError, match="valid: distilbert, bert-base"):
        build_model("transformer", {"size": "gpt2-small"})
