"""A hang explained on NCCL, where a CUDA device is visible (``pytest -m gpu``): the same
planted faults and the same explanation as on gloo, with PyTorch's own flight recorder (on by
default for NCCL here) read from what a failing rank dumped or what NCCL's watchdog wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import base_config
from workbench import launch
from workbench.store.flight_file import flight_path, read_flight

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
STUCK = {"rank": 1, "step": 10, "kind": "hang", "phase": "data"}


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def test_a_run_on_nccl_leaves_its_record_and_pytorchs_recorder_is_read(tmp_path: Path) -> None:
    """One rank on one GPU: its record says where it ended, and PyTorch's NCCL recorder, read
    through the same path as a failing rank's dump, names its collectives."""
    import torch.distributed as dist

    from workbench.trace.flight import torch_recorder_entries

    config = base_config(tmp_path, device="cuda", backend="nccl", world_size=1, epochs=None,
                         max_steps=6, checkpoint_every_steps=0, run_name="nccl-1")  # fmt: skip
    handle = launch(config)
    assert handle.wait(timeout_s=300) == "completed"
    record = read_flight(flight_path(handle.path / "flight", 0))
    assert record is not None and record["phase"] == "after training" and record["step"] == 6
    assert [e["op"] for e in record["collectives"]][:1] == ["barrier"], record["collectives"]
    # in this process: a one-rank NCCL group, two all-reduces, the recorder read back
    import os

    import torch

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", TORCH_NCCL_TRACE_BUFFER_SIZE="64"
    )
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    try:
        tensor = torch.ones(1024, device="cuda")
        dist.all_reduce(tensor)
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        entries = torch_recorder_entries()
    finally:
        dist.destroy_process_group()
    assert entries is not None and [e["op"] for e in entries][-2:] == ["all_reduce"] * 2, entries
    assert entries[-1]["bytes"] == 4096 and entries[-1]["seq"] == entries[-2]["seq"] + 1


@pytest.mark.skipif(_gpus() < 2, reason="a hang needs two ranks, one GPU each")
def test_a_rank_stuck_in_its_data_loading_is_named_on_nccl(tmp_path: Path) -> None:
    config = base_config(tmp_path, device="cuda", backend="nccl", world_size=2, epochs=None,
                         max_steps=20, checkpoint_every_steps=0, collective_timeout_s=20,
                         run_name="nccl-hang", fault=STUCK)  # fmt: skip
    handle = launch(config)
    assert handle.wait(timeout_s=300, raise_on_failure=False) == "failed"
    failure = json.loads((handle.path / "run.json").read_text())["failure"]
    hang = failure["hang"]
    assert (hang["rank"], hang["step"], hang["phase"]) == (1, 10, "data loading"), failure
    assert hang["op"] == "all_reduce" and hang["seq"] > 0, hang
