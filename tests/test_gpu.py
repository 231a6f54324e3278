"""The CUDA path, run for real wherever a CUDA device is visible (``pytest -m gpu``); skipped with
the reason elsewhere. Same public API and code as the CPU tests, another device and backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import base_config
from workbench import RunConfig, RunFailedError, launch, load_traces

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _cuda(tmp_path: Path, **changes: object) -> RunConfig:
    fields: dict[str, object] = dict(
        device="cuda", world_size=1, epochs=None, max_steps=12, checkpoint_every_steps=0
    )
    fields.update(changes)
    return base_config(tmp_path, **fields)


def _completed(config: RunConfig):  # type: ignore[no-untyped-def]
    handle = launch(config)
    assert handle.wait(timeout_s=300) == "completed"
    return handle


def test_three_cuda_launches_in_a_row_from_one_process(tmp_path: Path) -> None:
    import torch

    for i in range(3):
        _completed(_cuda(tmp_path, run_name=f"row-{i}"))
    assert not torch.cuda.is_initialized(), "launching created a CUDA context in the caller"


def test_mixed_precision_changes_the_numbers_by_a_bounded_amount(tmp_path: Path) -> None:
    losses = {}
    for precision in ("fp32", "fp16", "bf16"):
        handle = _completed(_cuda(tmp_path, precision=precision, run_name=f"p-{precision}"))
        losses[precision] = load_traces(handle.path)["loss"].to_numpy()
    for precision in ("fp16", "bf16"):
        diff = abs(losses[precision] - losses["fp32"])
        assert diff.max() > 0, f"{precision} gave exactly the fp32 losses: autocast did nothing"
        assert diff.max() < 0.05 * abs(losses["fp32"]).max(), (precision, diff.max())


def test_allocator_and_device_memory_columns_are_filled(tmp_path: Path) -> None:
    steps = load_traces(_completed(_cuda(tmp_path, run_name="mem")).path)
    for column in ("mem_alloc_bytes", "mem_reserved_bytes", "mem_peak_bytes"):
        assert steps[column].notna().any() and (steps[column].dropna() > 0).all(), column
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed: NVML column not checked")
    assert (steps["mem_device_bytes"].dropna() > 0).any()


def test_profiling_window_holds_cuda_kernels(tmp_path: Path) -> None:
    handle = _completed(_cuda(tmp_path, profile_steps=(3, 4), run_name="prof"))
    (trace,) = handle.path.glob("profiles/rank00000*.pt.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)


@pytest.mark.parametrize("hook", ["fp16", "bf16", "powersgd"])
def test_comm_hooks_run_on_cuda(tmp_path: Path, hook: str) -> None:
    steps = load_traces(_completed(_cuda(tmp_path, comm_hook=hook, run_name=f"hook-{hook}")).path)
    assert steps["comm_bytes"].notna().all()


def test_sync_batchnorm_on_the_cnn(tmp_path: Path) -> None:
    _completed(_cuda(tmp_path, model="cnn", sync_batchnorm=True, run_name="sbn"))


def test_a_failing_rank_on_cuda_is_named_with_its_step(tmp_path: Path) -> None:
    config = _cuda(tmp_path, run_name="fail", fault={"rank": 0, "step": 3, "kind": "raise"})
    handle = launch(config)
    with pytest.raises(RunFailedError) as err:
        handle.wait(timeout_s=300)
    assert err.value.rank == 0
    assert "at step 3" in str(err.value.exception)


@pytest.mark.skipif(_gpus() < 2, reason="needs two CUDA devices")
def test_two_ranks_on_two_gpus_with_nccl(tmp_path: Path) -> None:
    handle = _completed(_cuda(tmp_path, world_size=2, backend="nccl", run_name="nccl2"))
    summaries = handle.result()
    assert summaries[0]["param_sha256"] == summaries[1]["param_sha256"]


@pytest.mark.skipif(_gpus() < 2, reason="needs two CUDA devices")
def test_data_parallel_over_two_gpus(tmp_path: Path) -> None:
    _completed(_cuda(tmp_path, world_size=2, strategy="dp", run_name="dp2"))


def test_a_cuda_runs_steps_follow_one_clock(tmp_path: Path) -> None:
    """Starts, phases and gaps all on the device's clock: a step never starts before the
    previous one ended (no negative gap beyond the events' resolution), however far the host
    queued ahead."""
    steps = load_traces(_completed(_cuda(tmp_path, run_name="clock", max_steps=30)).path)
    steps = steps.sort_values("step")
    assert (steps["gap_s"].dropna() > -1e-4).all(), steps["gap_s"].describe()
    ends = (steps["t_start_s"] + steps["step_s"]).to_numpy()
    assert (steps["t_start_s"].to_numpy()[1:] >= ends[:-1] - 1e-4).all()


def test_a_scripts_hooks_never_synchronise_the_device(tmp_path: Path) -> None:
    """The hooks between two flushes (DDP's timer not due) under CUDA's sync debug mode set
    to raise: any call that waits for the device (a loss read, a copy to the host) fails."""
    import os

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from workbench.ports import free_port
    from workbench.trace.torch_hooks import ScriptHooks
    from workbench.trace.tracer import Tracer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    device = torch.device("cuda")
    tracer = Tracer(
        tmp_path, run_id="sync", rank=0, local_rank=0, host="h", world_size=1, attempt=0,
        flush_s=3600.0, device=device,
    )  # fmt: skip
    hooks = ScriptHooks(
        tracer, script="sync", rank=0, world_size=1, warmup_steps=0,
        comm_every_steps=10_000, collective_timeout_s=60,
    ).install()  # fmt: skip
    try:
        dist.init_process_group("nccl", rank=0, world_size=1)
        model = nn.parallel.DistributedDataParallel(nn.Linear(64, 8).to(device))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = TensorDataset(
            torch.randn(64 * 50, 64, device=device), torch.randint(0, 8, (64 * 50,), device=device)
        )
        for i, (x, y) in enumerate(DataLoader(data, batch_size=64)):
            if i == 12:  # DDP times its first 10 iterations itself
                torch.cuda.set_sync_debug_mode("error")
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
        hooks.close()
        tracer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    assert hooks.steps == 50


def _fsdp_record(handle) -> dict:  # type: ignore[no-untyped-def]
    from workbench import schema
    from workbench.store.files import read_json

    return read_json(handle.path / schema.RUN_FILE)


def test_fsdp_on_one_gpu_with_a_bf16_policy_counts_its_memory(tmp_path: Path) -> None:
    """The built-in FSDP2 path on CUDA: mixed precision (bf16 parameters in the step), the
    state counted per part from the tensors, the device's allocator columns filled; one rank
    sends nothing (known zeros)."""
    config = _cuda(tmp_path, strategy="fsdp", fsdp_param_dtype="bf16", run_name="fsdp1")
    handle = _completed(config)
    steps = load_traces(handle.path)
    assert (steps["all_gather_bytes"] == 0).all() and (steps["reduce_scatter_bytes"] == 0).all()
    assert (steps["mem_peak_bytes"].dropna() > 0).all()
    parts = _fsdp_record(handle)["memory_parts"]["0"]
    assert parts["param_bytes"] > 0 and parts["grad_bytes"] > 0
    assert (
        parts["total_bytes"]
        == parts["param_bytes"] + parts["grad_bytes"] + parts["optimizer_bytes"]
    )


@pytest.mark.skipif(_gpus() < 2, reason="needs two CUDA devices")
def test_fsdp_on_two_gpus_with_nccl_meters_bytes_and_benchmarks_its_calls(tmp_path: Path) -> None:
    """FSDP2 over NCCL: each step's all-gathers and reduce-scatters counted in bytes and calls
    (on CUDA a call only enqueues: no host-clock times, said so), the shards half the state,
    and the network benchmark's all-gather and reduce-scatter at the step's own sizes."""
    one = _completed(_cuda(tmp_path, strategy="fsdp", run_name="fsdp-one"))
    two = _completed(
        _cuda(tmp_path, strategy="fsdp", world_size=2, backend="nccl", run_name="fsdp-two")
    )
    steps = load_traces(two.path)
    for kind in ("all_gather", "reduce_scatter"):
        assert (steps[f"{kind}_bytes"] > 0).all() and (steps[f"{kind}_calls"] > 0).all()
        assert steps[f"{kind}_s"].isna().all()  # bytes only on CUDA
    run = _fsdp_record(two)
    assert run["comm_method"] == {"0": "bytes_only", "1": "bytes_only"}
    whole = _fsdp_record(one)["memory_parts"]["0"]["param_bytes"]
    # each rank holds half of every parameter, dim 0 padded to even: half, or a little over
    assert whole / 2 <= run["memory_parts"]["0"]["param_bytes"] <= whole / 2 + 4096
    net = run["network"]
    assert net["collective"] == "fsdp" and net["device"].startswith("cuda")
    assert net["bytes"] == steps["all_gather_bytes"].iloc[0] + steps["reduce_scatter_bytes"].iloc[0]
    assert net["busbw_bytes_per_s"] > 0
