"""RunConfig: defaults derived, JSON round trip, and one clear error per bad field."""

from __future__ import annotations

import pytest

from workbench.config.run_config import FaultInjection, RunConfig, field_help
from workbench.errors import ConfigError

GOOD = dict(model="mlp", world_size=2, per_device_batch_size=8)


def test_derived_fields_are_filled_and_recorded() -> None:
    c = RunConfig(**GOOD, gradient_accumulation_steps=2)
    assert (c.world_size, c.tasks_per_node, c.global_batch_size, c.epochs) == (2, 2, 32, 1)
    assert set(c.derived) == {"tasks_per_node", "global_batch_size", "epochs"}
    g = RunConfig(model="mlp", nodes=2, tasks_per_node=3, global_batch_size=60)
    assert (g.world_size, g.per_device_batch_size) == (6, 10)


def test_steps_follow_epochs_and_max_steps() -> None:
    c = RunConfig(**GOOD, train_samples=1000, epochs=3)
    assert c.steps_per_epoch == 1000 // 16 and c.total_steps == 3 * 62
    assert RunConfig(**GOOD, train_samples=1000, epochs=3, max_steps=10).total_steps == 10


def test_json_round_trip_is_exact() -> None:
    c = RunConfig(
        **GOOD,
        model_options={"hidden_dim": 16},
        precision="bf16",
        fault=FaultInjection(rank=1, step=3, kind="raise"),
    )
    again = RunConfig.from_json(c.to_json())
    assert again == c
    assert again.to_dict() == c.to_dict()


def test_from_dict_rejects_unknown_fields_listing_valid_names() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({**GOOD, "wrold_size": 2})
    assert err.value.fields == ["wrold_size"]
    assert "world_size" in str(err.value)


def test_replace_derives_again() -> None:
    c = RunConfig(**GOOD)
    assert c.replace(world_size=4).global_batch_size == 32


BAD = [
    # (changes, field named in the error, words in the message)
    ({"model": "resnet9000"}, "model", "built-in model"),
    ({"model_options": {"hiden_dim": 3}}, "model_options.hiden_dim", "valid: input_dim"),
    ({"model_options": {"hidden_dim": 0}}, "model_options.hidden_dim", ">= 1"),
    # size presets: a size the model has, else the valid ones (and the other options still checked)
    (
        {"model": "transformer", "model_options": {"size": "distilbret"}},
        "model_options.size",
        "did you mean 'distilbert'? valid: distilbert, bert-base",
    ),
    ({"model": "gpt", "model_options": {"size": "distilbert"}}, "model_options.size", "gpt2-small"),
    ({"model": "gpt", "model_options": {"size": ["gpt2-small"]}}, "model_options.size", "valid:"),
    ({"model_options": {"size": "distilbert"}}, "model_options.size", "'mlp' has no size presets"),
    (
        {"model": "transformer", "model_options": {"size": "distilbert", "num_heads": 5}},
        "model_options.d_model",
        "divisible by num_heads=5",
    ),
    (
        {"model": "transformer", "model_options": {"size": "bert-base", "seq_len": 0}},
        "model_options.seq_len",
        ">= 1",
    ),
    (
        {"model": "transformer", "model_options": {"sise": "bert-base"}},
        "model_options.sise",
        "did you mean 'size'?",
    ),
    (
        {"model": "transformer", "model_options": {"d_model": 30, "num_heads": 4}},
        "model_options.d_model",
        "divisible by num_heads",
    ),
    ({"dataset": "imagenet"}, "dataset", "synthetic"),
    ({"train_samples": 0}, "train_samples", ">= 1"),
    ({"eval_samples": -5}, "eval_samples", ">= 1"),
    ({"world_size": 0}, "world_size", ">= 1"),
    ({"world_size": 3, "nodes": 2}, "world_size", "multiple of nodes"),
    ({"world_size": 4, "nodes": 2, "tasks_per_node": 3}, "world_size", "nodes x tasks_per_node"),
    ({"strategy": "single", "nodes": 2}, "world_size", "strategy='single' runs on one device"),
    ({"dataset": "imagenet"}, "dataset", "'synthetic', 'parquet' or 'package.module:factory'"),
    ({"sync_batchnorm": True, "device": "cpu"}, "sync_batchnorm", "needs CUDA"),
    ({"per_device_batch_size": None}, "per_device_batch_size", "exactly one"),
    ({"global_batch_size": 16}, "global_batch_size", "exactly one"),
    ({"per_device_batch_size": None, "global_batch_size": 15}, "global_batch_size", "divisible by"),
    ({"per_device_batch_size": 0}, "per_device_batch_size", ">= 1"),
    ({"train_samples": 10}, "train_samples", "smaller than one global batch"),
    ({"precision": "fp8"}, "precision", "fp32, fp16, bf16"),
    ({"precision": "fp16", "device": "cpu"}, "precision", "needs CUDA"),
    ({"device": "tpu"}, "device", "auto, cpu, cuda"),
    ({"backend": "nccl", "device": "cpu"}, "backend", "gloo"),
    ({"optimizer": "lamb"}, "optimizer", "sgd, adamw"),
    ({"learning_rate": 0}, "learning_rate", "> 0"),
    ({"epochs": 0}, "epochs", ">= 1"),
    ({"max_steps": -1}, "max_steps", ">= 1"),
    ({"warmup_steps": -1}, "warmup_steps", ">= 0"),
    ({"threads_per_rank": 0}, "threads_per_rank", ">= 1"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps", ">= 1"),
    ({"eval_batch_size": 0}, "eval_batch_size", ">= 1"),
    ({"master_port": 80}, "master_port", "1024..65535"),
    ({"sweep": "a/b"}, "sweep", "folder name"),
    ({"fault": {"rank": 5, "step": 1, "kind": "raise"}}, "fault.rank", "0..1"),
    ({"fault": {"rank": 0, "step": 1, "kind": "explode"}}, "fault.kind", "raise, exit, hang, kill"),
    # unknown keywords: a ConfigError naming the field, the closest valid one and all valid ones
    ({"wrold_size": 2}, "wrold_size", "did you mean 'world_size'?"),
    ({"wrold_size": 2}, "wrold_size", "valid: sweep, run_name"),
    ({"learning_rat": 0.1}, "learning_rat", "did you mean 'learning_rate'?"),
    ({"fault": {"rank": 0, "kidn": "raise"}}, "fault.kidn", "did you mean 'kind'?"),
    ({"fault": 3}, "fault", "a FaultInjection or a dict"),
    ({"fault": {"rank": 0, "step": 0}}, "fault.step", ">= 1"),
    # values of the wrong shape: a Problem, not a TypeError from deep inside
    ({"model_options": "big"}, "model_options", "a mapping of option -> value"),
    ({"dataset_options": [1]}, "dataset_options", "a mapping of option -> value"),
    ({"model": "gpt", "model_options": {"num_heads": 0}}, "model_options.num_heads", ">= 1"),
    ({"world_size": "2"}, "world_size", "must be an integer >= 1"),
    ({"static_graph": "yes"}, "static_graph", "true or false"),
    ({"profile_steps": [3, 1]}, "profile_steps", "1 <= first <= last"),
    # numbers must be finite
    ({"learning_rate": float("inf")}, "learning_rate", "must be a finite number > 0"),
    ({"learning_rate": float("nan")}, "learning_rate", "must be a finite number > 0"),
    ({"momentum": float("inf")}, "momentum", "must be a finite number >= 0"),
    ({"timeout_min": float("-inf")}, "timeout_min", "> 0"),
    # folder names are whole matches: a trailing newline is refused
    ({"run_name": "ok\n"}, "run_name", "folder name"),
    ({"sweep": "ok\n"}, "sweep", "folder name"),
    ({"run_name": "-x"}, "run_name", "starting with a letter or digit"),
    ({"output_dir": ""}, "output_dir", "a folder path"),
    ({"model": "pkg.mod:factory\n"}, "model", "'package.module:factory'"),
]


@pytest.mark.parametrize(
    "changes, field, words", BAD, ids=[b[1] + ":" + str(i) for i, b in enumerate(BAD)]
)
def test_bad_config_names_the_field(changes: dict, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig(**{**GOOD, **changes})
    assert field in err.value.fields, str(err.value)
    assert words in str(err.value)
    assert isinstance(err.value, ValueError)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig(
            model="nope", world_size=0, per_device_batch_size=8, precision="fp8", learning_rate=-1
        )
    assert set(err.value.fields) >= {"model", "world_size", "precision", "learning_rate"}


def test_unknown_keyword_is_reported_with_the_other_problems() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig(**GOOD, wrold_size=2, precision="fp8")
    assert err.value.fields == ["wrold_size", "precision"]
    assert not isinstance(err.value, TypeError)


def test_fault_injection_checks_itself() -> None:
    with pytest.raises(ConfigError) as err:
        FaultInjection(rnak=1, kind="boom")
    assert err.value.fields == ["rnak", "kind"]
    assert "did you mean 'rank'?" in str(err.value)


def test_every_field_has_help_and_plugins_are_accepted() -> None:
    assert all(field_help().values())
    c = RunConfig(**{**GOOD, "model": "tests.plugins:tiny", "dataset": "tests.plugins:data"})
    assert c.model_kwargs == {}


def test_size_presets_fill_every_option_and_explicit_options_override() -> None:
    c = RunConfig(**{**GOOD, "model": "transformer"}, model_options={"size": "distilbert"})
    assert c.model_kwargs == dict(
        vocab_size=30522,
        seq_len=128,
        d_model=768,
        num_heads=12,
        num_layers=6,
        ffn_dim=3072,
        num_classes=6,
    )
    short = c.replace(model_options={"size": "distilbert", "seq_len": 64})
    assert short.model_kwargs == {**c.model_kwargs, "seq_len": 64}
    assert RunConfig.from_json(short.to_json()) == short
    assert short.model_options == {"size": "distilbert", "seq_len": 64}, "kept as given"
    bert = c.replace(model_options={"size": "bert-base"}).model_kwargs
    assert {k: v for k, v in bert.items() if bert[k] != c.model_kwargs[k]} == {"num_layers": 12}
    gpt = RunConfig(**{**GOOD, "model": "gpt"}, model_options={"size": "gpt2-small"}).model_kwargs
    assert gpt == dict(vocab_size=50257, seq_len=1024, d_model=768, num_heads=12, num_layers=12)


def test_every_preset_names_every_option_of_its_model() -> None:
    from workbench.config import MODEL_OPTIONS, MODEL_SIZES

    for model, sizes in MODEL_SIZES.items():
        for size, options in sizes.items():
            assert set(options) == set(MODEL_OPTIONS[model]), (model, size)


def test_configs_without_a_size_hash_as_before() -> None:
    """Run ids hash the fields that differ from their defaults: the presets change no id of a
    config that names none (the hashes were taken before the presets existed)."""
    from workbench.sweeps.run_ids import config_hash

    base = dict(model="transformer", world_size=2, per_device_batch_size=32)
    assert config_hash(RunConfig(**base, precision="bf16", max_steps=16)) == "72225ae4"
    sized = RunConfig(
        **{**base, "world_size": 1, "per_device_batch_size": 64},
        model_options={"d_model": 128, "num_heads": 4},
    )
    assert config_hash(sized) == "b57be7c8"
    gpt = RunConfig(model="gpt", world_size=1, per_device_batch_size=8, train_samples=64)
    assert config_hash(gpt) == "295a789c"
    preset = RunConfig(**base, model_options={"size": "distilbert"})
    assert config_hash(preset) != config_hash(RunConfig(**base))
