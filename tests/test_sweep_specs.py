"""The example sweep specs load and validate without running (the CPU ones also run, slowly, in
test_example_sweeps.py); the GPU-sized seed 002 spec is checked here only, since it needs CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.sweeps.spec import load_spec

SWEEPS = Path(__file__).resolve().parents[1] / "experiments" / "sweeps"


@pytest.mark.parametrize("path", sorted(SWEEPS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_spec_validates(path: Path) -> None:
    spec = load_spec(path)
    assert spec.points(), "every point's RunConfig is built and validated"


def test_seed002_gpu_spec_is_the_study_at_distilbert_size() -> None:
    spec = load_spec(SWEEPS / "seed002_batch_precision_gpu.yaml")
    points = spec.points()
    grid = sorted((p.config.precision, p.config.per_device_batch_size) for p in points)
    assert grid == [(pr, b) for pr in ("fp16", "fp32") for b in (64, 128, 256)]
    for point in points:
        c = point.config
        assert (c.model, c.device, c.train_samples, c.eval_samples) == (
            "transformer",
            "cuda",
            32768,
            131072,
        )
        assert c.model_options == {"size": "distilbert"}
        assert c.model_kwargs == dict(
            vocab_size=30522,
            seq_len=128,
            d_model=768,
            num_heads=12,
            num_layers=6,
            ffn_dim=3072,
            num_classes=6,
        )


def test_seed002_cpu_spec_keeps_its_run_ids() -> None:
    """The CPU spec runs in the tests and its points may already be in users' stores: their ids
    (a hash of the config) are the ones they had before the size presets existed."""
    spec = load_spec(SWEEPS / "seed002_batch_precision.yaml")
    assert [p.run_id for p in spec.points()] == [
        "w1_fp32-aa4eeb9c",
        "w1_bf16-225b8cbb",
        "w2_fp32-9090f58f",
        "w2_bf16-c87f5214",
    ]
    assert {p.config.model_kwargs["d_model"] for p in spec.points()} == {64}
