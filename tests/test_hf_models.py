"""Hugging Face models by name (``model="hf:distilbert"``): built offline from their config
class, fed synthetic dict batches, trained by the built-in loop like any model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from workbench import RunConfig, launch
from workbench.errors import ConfigError, PreflightError
from workbench.rank.data import build_datasets, fetch_batch
from workbench.rank.hf_models import ARCHITECTURES, build_hf_model
from workbench.rank.models import build_model, takes_dict_batch
from workbench.rank.trainer import step_loss

from .helpers import WARM

pytest.importorskip("transformers")


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_each_architecture_trains_on_its_synthetic_dict_batches(arch: str) -> None:
    config = RunConfig(
        model=f"hf:{arch}",
        per_device_batch_size=4,
        train_samples=16,
        eval_samples=8,
        model_options={"seq_len": 12},
    )
    model = build_model(config.model, dict(config.model_options))
    assert takes_dict_batch(model) and not any(p.grad is not None for p in model.parameters())
    train, _ = build_datasets(config)
    inputs, targets = fetch_batch(train, [0, 1, 2, 3])
    assert inputs.shape == (4, 12) and inputs.dtype == torch.long
    loss = step_loss(model, model, inputs, targets)
    # random weights over 4 classes (or a 1000-token vocabulary): about ln(classes)
    classes = 1000 if arch == "gpt2" else 4
    assert loss.ndim == 0 and loss.item() == pytest.approx(math.log(classes), rel=0.2)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_model_options_override_the_config_and_an_unknown_one_is_named() -> None:
    model = build_hf_model("hf:distilbert", {"dim": 32, "n_layers": 1, "seq_len": 8})
    assert model.config.dim == 32 and model.config.n_layers == 1
    with pytest.raises(ValueError, match=r"\['n_layerz'\].*not fields of DistilBertConfig"):
        build_hf_model("hf:distilbert", {"n_layerz": 1})


def test_bad_hf_names_and_options_are_refused_before_launch(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="valid: hf:distilbert, hf:bert, hf:gpt2"):
        RunConfig(model="hf:distilbrt", per_device_batch_size=4)
    config = RunConfig(
        model="hf:gpt2",
        per_device_batch_size=4,
        model_options={"n_lyr": 2},
        output_dir=str(tmp_path),
    )
    with pytest.raises(PreflightError, match="n_lyr"):
        launch(config)


@pytest.mark.slow
def test_a_two_rank_run_of_distilbert_traces_like_a_built_in_model(tmp_path: Path) -> None:
    config = RunConfig(
        model="hf:distilbert",
        world_size=2,
        per_device_batch_size=8,
        max_steps=6,
        train_samples=256,
        eval_samples=64,
        output_dir=str(tmp_path),
    )
    handle = launch(config, WARM)
    assert handle.wait(timeout_s=300) == "completed"
    steps, evals = handle.traces(), handle.traces("eval")
    assert len(steps) == 2 * 6 and (steps["samples"] == 8).all()
    assert steps["loss"].notna().all() and (steps["loss"] < 2.0).all()  # about ln 4 = 1.39
    assert steps["comm_bytes"].gt(0).all()
    assert (evals["metric_name"] == "accuracy").all() and evals["metric_value"].between(0, 1).all()
    summaries = handle.result()
    assert summaries[0]["param_sha256"] == summaries[1]["param_sha256"]
