"""Launching never initialises CUDA in the calling process (a notebook kernel launches many runs;
a CUDA context there holds GPU memory and made the next launch refuse)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import base_config
from workbench import launch
from workbench.store.files import read_json

pytestmark = [pytest.mark.slow, pytest.mark.waits]


def _refuse_cuda(*args: object, **kwargs: object) -> None:
    raise AssertionError("the launching process initialised CUDA")


def test_three_launches_in_a_row_with_a_gpu_in_sight_never_touch_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This process believes a GPU is present, and any lazy CUDA initialisation here raises.
    The runs themselves use the CPU (their processes are fresh interpreters, unpatched)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "_lazy_init", _refuse_cuda)
    for i in range(3):
        config = base_config(
            tmp_path,
            device="cpu",
            world_size=1,
            run_name=f"in-a-row-{i}",
            epochs=None,
            max_steps=3,
            checkpoint_every_steps=0,
            eval_at_end=False,
            eval_every_epochs=0,
        )
        handle = launch(config)
        assert handle.wait(timeout_s=180) == "completed"
        # The environment was recorded with torch in sight (the pretend device counted).
        assert read_json(handle.path / "run.json")["environment"]["cuda_devices"] == 1
