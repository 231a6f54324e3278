"""One rank's training state: model, strategy wrapper (DDP, FSDP2, DataParallel or none),
optimizer, scaler, comm meter, and one optimizer step over a list of micro-batches."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from workbench.config.run_config import RunConfig
from workbench.errors import UnusedParametersError
from workbench.rank import checkpoint, distributed, hook_cost, memory_parts, network
from workbench.rank.activations import saved_for_backward
from workbench.rank.data import build_datasets, dropped_per_epoch, fetch_batch
from workbench.rank.distributed import CommMeter
from workbench.rank.evaluation import EvalContext, evaluate
from workbench.rank.models import (
    build_model,
    dict_batch,
    gradient_bytes,
    model_task,
    output_loss,
    shard_blocks,
    takes_dict_batch,
)
from workbench.store.flight_file import BACKWARD, DATA, FORWARD, OPTIMIZER
from workbench.trace.comm_timing import DDPCommSampler, warn
from workbench.trace.fsdp_comm import FSDPCommMeter
from workbench.trace.phase_clock import PhaseClock
from workbench.trace.tracer import Tracer


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators (same initial weights on every rank)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def training_loss(model: nn.Module, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy in fp32, per token for a language model, per sample otherwise."""
    if model_task(model) == "lm":
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    return nn.functional.cross_entropy(logits.float(), targets)


def step_loss(
    call: Any, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """The training loss of one micro-batch through ``call`` (the model, its DDP wrapper, or a
    functional call of it): the model's own loss for a dict-batch model (``hf:`` models),
    else :func:`training_loss` of its logits."""
    if takes_dict_batch(model):
        return output_loss(call(**dict_batch(model, inputs, targets)))
    return training_loss(model, call(inputs), targets)


def make_optimizer(config: RunConfig, params: Any) -> torch.optim.Optimizer:
    """SGD with momentum or AdamW, at the config's base learning rate."""
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            params,
            lr=config.learning_rate,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
        )
    return torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)


#: The dtypes of ``fsdp_param_dtype`` and ``fsdp_reduce_dtype``.
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def fsdp_dtypes(config: RunConfig) -> tuple[torch.dtype | None, torch.dtype | None]:
    """FSDP's (param_dtype, reduce_dtype) for the config: None for a param dtype of fp32 (the
    parameters' own: no cast), None for a reduce dtype not given (FSDP then reduces in the param
    dtype); a reduce dtype given is passed as it is (fp32 with bf16 parameters must be said)."""
    param = None if config.fsdp_param_dtype == "fp32" else TORCH_DTYPES[config.fsdp_param_dtype]
    reduce = config.fsdp_reduce_dtype
    return param, None if reduce is None else TORCH_DTYPES[reduce]


def _nothing(phase: int) -> None:
    pass


class Trainer:
    """The state of one rank's training: model, strategy wrapper, optimizer, scaler, comm meter.

    On a resumed attempt (``attempt > 0``) the model, optimizer and scaler come from the latest
    checkpoint and ``done_steps`` is the step it was taken at. ``before_wrap`` runs on the bare
    model before the strategy wraps it (the FLOPs count: rank 0 alone could not run an FSDP
    module's forward, whose all-gathers need every rank); what it returns is ``step_flops``."""

    def __init__(
        self,
        config: RunConfig,
        env: distributed.RankEnv,
        device: torch.device,
        run_dir: Path,
        attempt: int,
        before_wrap: Callable[[Trainer], dict[str, Any] | None] | None = None,
    ) -> None:
        self.config, self.env, self.device, self.run_dir = config, env, device, run_dir
        self.warnings: list[str] = []
        seed_everything(config.seed)
        self.module = build_model(config.model, dict(config.model_options)).to(device)
        self.train_set, self.eval_set = build_datasets(config, env.rank, env.world_size)
        start = checkpoint.load_latest(run_dir, self.module, env.rank) if attempt > 0 else None
        self.done_steps = int(start["step"]) if start is not None else 0
        if config.sync_batchnorm:
            self.module = nn.SyncBatchNorm.convert_sync_batchnorm(self.module)
        self.scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")
        self.amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(config.precision)
        self.step_flops = before_wrap(self) if before_wrap is not None else None
        self.ddp, self.comm = self._wrap(self.module)
        self.eval_group = distributed.new_eval_group(
            max(config.eval_timeout_s, config.collective_timeout_s)
        )
        self.optimizer = make_optimizer(config, self.ddp.parameters())
        #: This rank's memory in its parts (``memory_parts.count``), from its first step on.
        self.memory: dict[str, Any] | None = None
        #: What the first step's forward saved for its backward (``activations``), per micro-batch.
        self.activations: dict[str, int] = {}
        #: Told each phase of a step as it begins (the flight recorder; a planted fault).
        self.phase: Callable[[int], None] = _nothing
        # DDP alone fails on parameters without gradients, and not with static_graph or
        # find_unused_parameters; a bare module or DataParallel never does.
        self.checked_unused = (
            not isinstance(self.ddp, DDP) or config.find_unused_parameters or config.static_graph
        )
        if start is not None:
            checkpoint.restore_training(start, self.optimizer, self.scaler, env.rank)

    @property
    def sharded(self) -> bool:
        """Whether FSDP2 shards the model (``strategy='fsdp'``)."""
        return self.config.strategy == "fsdp"

    def _wrap(
        self, module: nn.Module
    ) -> tuple[nn.Module, CommMeter | DDPCommSampler | FSDPCommMeter]:
        """The strategy (DDP with its knobs, DataParallel over this node's GPUs, or the bare
        module on one device) and what times its gradient communication."""
        config, device = self.config, self.device
        # On CUDA a Python hook's host clock sees the enqueue, not the transfer: bytes only.
        meter = CommMeter(config.comm_hook, config.powersgd_rank, timed=device.type != "cuda")
        if config.strategy == "single":
            meter.active = True  # nothing is communicated: zeros are the measurement
            return module, meter
        if config.strategy == "dp":
            dp = nn.DataParallel(module, device_ids=list(range(config.world_size)))  # type: ignore[arg-type]
            return dp, meter
        if config.strategy == "fsdp":
            return self._shard(module)
        ddp = DDP(
            module,
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=config.find_unused_parameters,
            bucket_cap_mb=config.bucket_cap_mb,
            gradient_as_bucket_view=config.gradient_as_bucket_view,
            static_graph=config.static_graph,
        )
        every, nbytes = config.trace_comm_every_steps, gradient_bytes(module)
        if config.trace_comm == "hook" or config.comm_hook != "allreduce":
            ddp.register_comm_hook(None, meter.hook)
            meter.active = True
        if config.trace_comm == "sampled":  # a compression hook: its bytes, DDP's times
            meter.timed = False
            hooked = meter if meter.active else None
            return ddp, DDPCommSampler(ddp, every, nbytes, hook_meter=hooked)
        if config.trace_comm == "hook" and not meter.timed:
            self.warnings.append(
                warn(
                    f"trace_comm='hook' records no comm_s on {device.type}: NCCL runs a comm "
                    "hook's callbacks when the work is queued, so a host clock would time the "
                    "enqueue, not the transfer; comm_bytes only. trace_comm='sampled' reads "
                    "DDP's own figures (timed with CUDA events)"
                )
            )
        return ddp, meter

    def _shard(self, module: nn.Module) -> tuple[nn.Module, CommMeter | FSDPCommMeter]:
        """FSDP2 in place: each of the model's blocks (``models.shard_blocks``), then the root,
        with the config's resharding and mixed precision; its all-gathers and reduce-scatters
        metered from outside, as a script's are (none with ``trace_comm='off'``)."""
        config = self.config
        param_dtype, reduce_dtype = fsdp_dtypes(config)
        sharded = distributed.fully_shard_model(
            module,
            shard_blocks(module),
            self.device,
            reshard_after_forward=config.reshard_after_forward,
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
        )
        if config.trace_comm == "off":
            return sharded, CommMeter()  # inactive: every communication column null
        meter = FSDPCommMeter.for_module(sharded)
        meter.attach(sharded)
        return sharded, meter

    def comm_method(self) -> str:
        """How this rank's communication columns were measured: ``ddp_timer`` (DDP's reducer
        timer, sampled), ``hook`` (a Python comm hook's host clock, every step), ``bytes_only``,
        ``off`` (trace_comm='off') or ``none`` (no DDP: nothing is communicated, or DataParallel);
        for the rank's summary and ``run.json``."""
        if isinstance(self.comm, DDPCommSampler | FSDPCommMeter):
            return self.comm.method
        if self.sharded:
            return "off"  # trace_comm='off'
        if not isinstance(self.ddp, DDP):
            return "none"
        if not self.comm.active:
            return "off"
        return "hook" if self.comm.timed else "bytes_only"

    def measurement_warnings(self) -> list[str]:
        """What this rank could not measure as configured (each said once in its log)."""
        comm = self.comm
        sampled = comm.warnings if isinstance(comm, DDPCommSampler | FSDPCommMeter) else []
        return list(dict.fromkeys(self.warnings + sampled))

    def dropped_per_epoch(self) -> int:
        """Training samples this rank accounts for and leaves out of every epoch, to keep every
        batch full (``data.dropped_per_epoch``; summed over ranks in ``run.json``)."""
        config = self.config
        return dropped_per_epoch(
            self.train_set,
            self.env.rank,
            self.env.world_size,
            config.per_process_batch_size,
            config.steps_per_epoch * config.gradient_accumulation_steps,
        )

    def measure_network(self) -> dict[str, Any] | None:
        """The allreduce micro-benchmark at this run's bucket sizes (``network.py``), on every
        rank of a multi-rank DDP run unless ``network_benchmark`` is off; None otherwise."""
        config = self.config
        if isinstance(self.comm, FSDPCommMeter):
            measure = network.fsdp_at_end(config.network_benchmark, self.env.world_size)
            return measure(self.comm) if measure is not None else None
        if not (config.network_benchmark and self.env.world_size > 1 and isinstance(self.ddp, DDP)):
            return None
        element = 2 if config.comm_hook in ("fp16", "bf16") else 4
        sizes = network.bucket_sizes(self.module, config.bucket_cap_mb, element)
        shapes = hook_cost.bucket_shapes(network.bucket_params(self.module, config.bucket_cap_mb))
        return network.measure_allreduce(
            sizes,
            self.device,
            self.env.world_size,
            config.comm_hook,
            hook_buckets=shapes,
            powersgd_rank=config.powersgd_rank,
        )

    def set_lr(self, step: int) -> None:
        """The learning rate for ``step``: scaled by the batch rule, ramped up over warm-up."""
        lr = self.config.learning_rate * self.config.lr_scale
        if self.config.lr_warmup_steps:
            lr *= min(1.0, step / self.config.lr_warmup_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Mixed precision for a forward pass (a no-op in fp32)."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def save(self, step: int, tracer: Tracer) -> None:
        """A checkpoint at ``step``; its time (this rank's files and the wait for the others')
        goes on the step's row as ``save_s``, and every row is on disk before the commit."""
        if self.sharded:  # the config refuses checkpoints; a preemption stop asks for one
            raise RuntimeError(
                f"strategy='fsdp' writes no checkpoint (a sharded model's are not written yet): "
                f"the run cannot stop at step {step} to resume later"
            )
        started = time.perf_counter()

        def before_commit() -> None:
            tracer.saved(time.perf_counter() - started)
            tracer.flush()  # a checkpoint never gets ahead of the trace rows on disk

        checkpoint.save(
            self.run_dir,
            step,
            self.module,
            self.optimizer,
            self.scaler,
            self.env.rank,
            before_commit=before_commit,
        )

    def step(self, micro_batches: list[list[int]], clock: PhaseClock) -> dict[str, Any]:
        """One optimizer step over ``micro_batches`` (gradient sync on the last one only); returns
        the step's trace fields."""
        accum = len(micro_batches)
        clock.start()
        loss_sum: torch.Tensor | None = None
        phase = self.phase
        for m, indices in enumerate(micro_batches):
            if m:
                phase(DATA)  # the step's first: the loop said so before the step began
            inputs, targets = fetch_batch(self.train_set, indices)
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            clock.mark()
            phase(FORWARD)
            no_sync = m < accum - 1 and isinstance(self.ddp, DDP)
            sync = self.ddp.no_sync() if no_sync else contextlib.nullcontext()  # type: ignore[operator]
            if self.sharded and accum > 1:  # FSDP's no_sync: reduce on the last micro-step only
                self.ddp.set_requires_gradient_sync(m == accum - 1)  # type: ignore[operator]
            counting = self.memory is None and m == 0  # the first step's activations, once
            saving = saved_for_backward(self.module) if counting else contextlib.nullcontext()
            with sync:
                with self.autocast(), saving as saved:
                    loss = step_loss(self.ddp, self.module, inputs, targets)
                    if accum > 1:  # on CUDA every op is a kernel launch: none for the usual case
                        loss = loss / accum
                clock.mark()
                phase(BACKWARD)
                self.scaler.scale(loss).backward()
                clock.mark()
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
            if saved is not None:
                self.activations = {
                    "activation_bytes": saved.bytes,
                    "activation_samples": len(indices),
                }
        if not self.checked_unused:
            self._check_unused_parameters()
        phase(OPTIMIZER)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.memory is None:  # once: the parts do not change from step to step
            self.memory = self.count_memory()
        self.optimizer.zero_grad(set_to_none=True)
        clock.mark()
        assert loss_sum is not None  # a step has at least one micro-batch
        return self._fields(micro_batches, clock, loss_sum)

    def _fields(
        self, micro_batches: list[list[int]], clock: PhaseClock, loss_sum: torch.Tensor
    ) -> dict[str, Any]:
        """A step's trace fields: its phase marks (per micro-step: data, forward, backward; then
        the optimizer; durations once the tracer flushes), the comm meter's totals and the loss:
        a float on CPU, the tensor itself on CUDA, where reading it would wait for the GPU (the
        tracer reads the losses of many steps at once, at its flush)."""
        return dict(
            phases=clock.stop(),
            **self.comm.take()._asdict(),
            samples=sum(len(b) for b in micro_batches),
            loss=loss_sum if self.device.type == "cuda" else float(loss_sum),
            lr=self.optimizer.param_groups[0]["lr"],
        )

    def count_memory(self) -> dict[str, Any]:
        """This rank's memory in its parts now (``memory_parts.count``; FSDP's gathered bytes at
        ``fsdp_param_dtype``)."""
        dtype = fsdp_dtypes(self.config)[0] if self.sharded else None
        return {**memory_parts.count(self.module, self.optimizer, dtype), **self.activations}

    def _check_unused_parameters(self) -> None:
        """After the first backward: DDP's own error about unused parameters comes one step
        later and names none; name them now, with the fix."""
        self.checked_unused = True
        unused = [
            n for n, p in self.module.named_parameters() if p.requires_grad and p.grad is None
        ]
        if unused:
            raise UnusedParametersError(unused)

    def evaluate(self, tracer: Tracer, epoch: int, step: int) -> float:
        """Evaluate the model on the eval set (see ``evaluation.evaluate``); the metric."""
        context = EvalContext(
            wrapped=self.ddp,
            module=self.module,
            dataset=self.eval_set,
            config=self.config,
            env=self.env,
            device=self.device,
            autocast=self.autocast,
            group=self.eval_group,
        )
        metric = evaluate(context, tracer, epoch, step)
        if self.sharded:  # a forward without grad leaves a group kept after forward gathered
            for module in self.module.modules():
                if memory_parts.is_sharded_root(module):
                    module.reshard()  # type: ignore[operator]
        return metric
