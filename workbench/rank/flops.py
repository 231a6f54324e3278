"""The FLOPs of one training step, counted once per run on rank 0 before the measured window.

``torch.utils.flop_counter.FlopCounterMode`` counts the theoretical FLOPs of the operators that
have a formula (matrix products, convolutions, attention), forward and backward, from their
shapes; element-wise work (activations, norms, the optimizer update) counts nothing. The count
runs the bare module (no DDP wrapper: no collective, so the other ranks need not take part) over
the micro-batches of the run's first optimizer step, in eval mode (no dropout draw, no BatchNorm
statistics update, no SyncBatchNorm collective; the counted operators are the same in both
modes), under the run's autocast; the gradients it leaves are dropped. The record says all this
under ``method``, for ``run.json``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from workbench.rank.data import fetch_batch, train_batches
from workbench.rank.trainer import Trainer, step_loss

METHOD = (
    "torch.utils.flop_counter.FlopCounterMode over forward + backward of the bare module "
    "(no DDP) on rank 0, over the micro-batches of one optimizer step, in eval mode, under the "
    "run's autocast, before the first traced step (outside the measured window)"
)


def _cpu_attention_forward(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
    return flop_counter.sdpa_flop_count(query.shape, key.shape, value.shape)


def _cpu_attention_backward(
    grad_out: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any
) -> int:
    return flop_counter.sdpa_backward_flop_count(
        grad_out.shape, query.shape, key.shape, value.shape
    )


_cpu_attention_forward._get_raw = True  # type: ignore[attr-defined]  # takes tensors, not shapes
_cpu_attention_backward._get_raw = True  # type: ignore[attr-defined]


def _cpu_attention_formulas() -> dict[Any, Any]:
    """FlopCounterMode (torch 2.13) has formulas for the CUDA attention kernels but not for the
    CPU's fused one, which it would count as zero: give the CPU kernel torch's own attention
    formulas (full T x T, causal or not, as for the CUDA kernels)."""
    aten = torch.ops.aten
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if forward is None or backward is None or not hasattr(flop_counter, "sdpa_flop_count"):
        return {}
    return {forward: _cpu_attention_forward, backward: _cpu_attention_backward}


def _unhooked(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters as new leaf tensors sharing their storage: DDP's reducer hooks
    sit on the parameters' own gradient accumulators, and a backward that reached them on rank
    0 alone would start a reduction the other ranks never join (with ``static_graph`` it
    hangs the run)."""
    return {
        name: p.detach().requires_grad_(p.requires_grad) for name, p in module.named_parameters()
    }


def count_flops(
    module: nn.Module,
    micro_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    by_op: dict[str, int] | None = None,
) -> int:
    """FLOPs of forward + backward of ``module`` over each ``(inputs, targets)`` micro-batch
    (the training loss of :func:`workbench.rank.trainer.step_loss`), counted by
    ``FlopCounterMode`` in eval mode; the module's mode, gradients and the random streams are
    left as they were (the gradients dropped)."""
    device = next(module.parameters()).device
    was_training = module.training
    module.eval()
    rng_devices = [device] if device.type == "cuda" else []
    try:
        # fork_rng: a plug-in drawing random numbers in forward leaves the run's streams as
        # they were
        with (
            torch.random.fork_rng(devices=rng_devices),
            FlopCounterMode(display=False, custom_mapping=_cpu_attention_formulas()) as counter,
        ):
            for inputs, targets in micro_batches:
                with autocast():
                    params = _unhooked(module)

                    def call(*args: Any, params: Any = params, **kwargs: Any) -> Any:
                        return torch.func.functional_call(module, params, args, kwargs)

                    loss = step_loss(call, module, inputs, targets)
                loss.backward()
    finally:
        module.train(was_training)
        for p in module.parameters():
            p.grad = None  # the first traced step starts from no gradient, as without counting
        if device.type == "cuda":  # the run's peak memory is its training steps', not this
            torch.cuda.reset_peak_memory_stats(device)
    if by_op is not None:  # which math ran: convolutions follow cuDNN's TF32 switch
        for op, flops in counter.get_flop_counts().get("Global", {}).items():
            by_op[str(op)] = by_op.get(str(op), 0) + int(flops)
    return int(counter.get_total_flops())


def count_step_flops(trainer: Trainer, micro_batches: list[list[int]]) -> dict[str, Any]:
    """FLOPs of one optimizer step of this rank over ``micro_batches`` (every gradient
    accumulation micro-batch, forward and backward). Returns the record ``run.json`` keeps:
    ``flops_per_step`` (this process's step), ``samples_per_step`` (the samples it covered),
    ``flops_per_sample``, ``micro_batches``, ``precision`` and ``matmul_precision`` (the
    float32 matmul setting: ``highest`` is true fp32, ``high``/``medium`` allow TF32 on CUDA),
    ``cudnn_allow_tf32`` (cuDNN's own switch, on by default, for convolutions) and
    ``conv_flops_share`` (the convolutions' share of the FLOPs),
    ``device_type``, ``count_s`` (what counting took) and ``method``."""
    device = trainer.device
    started = time.perf_counter()

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for indices in micro_batches:
            inputs, targets = fetch_batch(trainer.train_set, indices)
            yield inputs.to(device), targets.to(device)

    by_op: dict[str, int] = {}
    flops = count_flops(trainer.module, batches(), trainer.autocast, by_op)
    samples = sum(len(b) for b in micro_batches)
    conv = sum(n for op, n in by_op.items() if "convolution" in op)
    return {
        "flops_per_step": flops,
        "samples_per_step": samples,
        "flops_per_sample": flops / samples if samples else None,
        "micro_batches": len(micro_batches),
        "precision": trainer.config.precision,
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "conv_flops_share": conv / flops if flops else None,
        "device_type": device.type,
        "count_s": time.perf_counter() - started,
        "method": METHOD,
    }


def measure_step_flops(trainer: Trainer, rank: int, epoch: int) -> dict[str, Any] | None:
    """On rank 0, :func:`count_step_flops` over the first optimizer step of ``epoch`` (every
    step has the same full micro-batches); None on the other ranks. A model the counter cannot
    run leaves ``error`` in the record instead of failing the run."""
    if rank != 0:
        return None
    config, env = trainer.config, trainer.env
    accum = config.gradient_accumulation_steps
    batches = train_batches(
        trainer.train_set,
        env.rank,
        env.world_size,
        config.per_process_batch_size,
        config.seed,
        epoch,
    )
    try:
        return count_step_flops(trainer, batches[:accum])
    except Exception as exc:  # a count must never stop the run it describes
        return {"error": f"{type(exc).__name__}: {exc}", "method": METHOD}
