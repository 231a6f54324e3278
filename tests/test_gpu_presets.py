"""The size presets at their full size on CUDA (``pytest -m gpu``); skipped, and so not verified,
where no CUDA device is visible. A CPU builds them too (test_models_data.py counts their
parameters), but trains them too slowly to be worth a test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import base_config
from workbench import launch, load_traces
from workbench.rank.models import build_model, gradient_bytes

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_distilbert_size_trains_on_one_gpu(tmp_path: Path, precision: str) -> None:
    """Seed 002's model at its size: the run completes, and DDP's buckets hold the preset's
    66,072,582 fp32 gradients (autocast leaves the parameters, so the gradients, in fp32)."""
    config = base_config(
        tmp_path,
        model="transformer",
        model_options={"size": "distilbert"},
        device="cuda",
        world_size=1,
        global_batch_size=None,
        per_device_batch_size=64,
        train_samples=1024,
        eval_samples=256,
        epochs=None,
        max_steps=8,
        checkpoint_every_steps=0,
        precision=precision,
        run_name=f"distilbert-{precision}",
    )
    handle = launch(config)
    assert handle.wait(timeout_s=600) == "completed"
    steps = load_traces(handle.path)
    full = gradient_bytes(build_model("transformer", {"size": "distilbert"}))
    assert full == 4 * 66_072_582
    assert (steps["comm_bytes"] == full).all()
    assert steps["loss"].notna().all()
