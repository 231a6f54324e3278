"""What one rank runs: process group, DDP model, precision, the traced loop, evaluation and
checkpoints."""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import hashlib
import json
import math
import os
import random
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from workbench import schema
from workbench.config.run_config import RunConfig
from workbench.errors import InjectedFault, NonFiniteLossError, UnusedParametersError
from workbench.ports import free_port
from workbench.rank import checkpoint, distributed
from workbench.rank.data import build_datasets, eval_shard, fetch_batch, train_batches
from workbench.rank.models import build_model, model_task
from workbench.rank.preemption import PreemptionSignal
from workbench.rank.profiling import step_profiler
from workbench.rank.tracer import PhaseClock, Tracer
from workbench.store.files import rank_file, write_json
from workbench.store.trace_files import consolidate, trim_for_resume


@dataclass(frozen=True)
class RankTask:
    """The callable submitit runs once per rank (pickled with its config)."""

    config: RunConfig
    run_dir: str
    run_id: str
    master_port: int | None
    attempt: int = 0

    def __call__(self) -> dict[str, Any]:
        stop = PreemptionSignal().install()
        # `kill -USR1 <pid>` (the launcher does it to a hung rank) prints every thread's stack.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        env = distributed.RankEnv.from_submitit(self.master_port)
        state_path = rank_file(Path(self.run_dir), env.rank)
        base = {
            "rank": env.rank,
            "local_rank": env.local_rank,
            "host": env.host,
            "pid": os.getpid(),
            "attempt": self.attempt,
            "job_id": env.job_id,
        }
        write_json(state_path, {**base, "status": "running", "started_at": time.time()})
        try:
            summary = run_rank(
                self.config, env, Path(self.run_dir), self.run_id, self.attempt, stop
            )
        except BaseException as exc:
            write_json(
                state_path,
                {
                    **base,
                    "status": "failed",
                    "ended_at": time.time(),
                    "exception": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(),
                },
            )
            raise
        status = "preempted" if summary["preempted"] else "completed"
        write_json(
            state_path, {**base, "status": status, "ended_at": time.time(), "summary": summary}
        )
        if summary["preempted"] and env.rank == 0:
            stop.requeue()  # submitit: checkpoint() below, requeue, exit
        return summary

    def checkpoint(self) -> Any:
        """submitit's requeue hook: the same task, next attempt, a fresh rendezvous port (a
        stale store from the previous attempt must never be joined)."""
        from submitit.helpers import DelayedSubmission

        # Runs on global rank 0, which is on the master host: a port free here is free there.
        return DelayedSubmission(
            dataclasses.replace(self, attempt=self.attempt + 1, master_port=free_port())
        )


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _loss(model: nn.Module, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if model_task(model) == "lm":
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    return nn.functional.cross_entropy(logits.float(), targets)


def _inject_fault(config: RunConfig, rank: int, step: int, attempt: int) -> None:
    f = config.fault
    if f is None or f.rank != rank or f.step != step or f.attempt != attempt:
        return
    if f.kind == "raise":
        raise InjectedFault(f"injected fault on rank {rank} at step {step}")
    if f.kind == "exit":
        os._exit(3)
    if f.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if f.kind == "preempt":
        from submitit import JobEnvironment

        os.kill(os.getpid(), JobEnvironment._usr_sig())
    if f.kind == "hang":
        while True:
            time.sleep(3600)


def run_rank(
    config: RunConfig,
    env: distributed.RankEnv,
    run_dir: Path,
    run_id: str,
    attempt: int,
    stop: PreemptionSignal | None = None,
) -> dict[str, Any]:
    """Train on this rank and return its summary. Runs in a fresh process per rank."""
    torch.set_num_threads(config.threads_per_rank)
    device = distributed.pick_device(config.device, env.local_rank)
    distributed.init_process_group(
        env,
        config.backend,
        device,
        config.collective_timeout_s,
        dump_dir=str(run_dir / schema.LOGS_DIR),
    )
    summary = _train(config, env, device, run_dir, run_id, attempt, stop or PreemptionSignal())
    # Only a rank that finished tears down with a barrier. A failing rank leaves without one: its
    # peers may be inside another collective, and its exit closes the sockets, which fails them
    # at once instead of after the collective timeout.
    distributed.teardown()
    return summary


def _make_optimizer(config: RunConfig, params: Any) -> torch.optim.Optimizer:
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            params,
            lr=config.learning_rate,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
        )
    return torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)


class _Trainer:
    """The state of one rank's training: model, DDP wrapper, optimizer, scaler, comm meter."""

    def __init__(
        self,
        config: RunConfig,
        env: distributed.RankEnv,
        device: torch.device,
        run_dir: Path,
        attempt: int,
    ) -> None:
        self.config, self.env, self.device, self.run_dir = config, env, device, run_dir
        _seed_everything(config.seed)
        self.module = build_model(config.model, dict(config.model_options)).to(device)
        self.train_set, self.eval_set = build_datasets(config, env.rank, env.world_size)
        start = checkpoint.load_latest(run_dir, self.module, env.rank) if attempt > 0 else None
        if config.sync_batchnorm:
            self.module = nn.SyncBatchNorm.convert_sync_batchnorm(self.module)
        self.ddp, self.comm = self._wrap(self.module)
        self.eval_group = distributed.new_eval_group(
            max(config.eval_timeout_s, config.collective_timeout_s)
        )
        self.optimizer = _make_optimizer(config, self.ddp.parameters())
        self.scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")
        self.amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(config.precision)
        self.done_steps = 0
        # DDP alone fails on parameters without gradients, and not with static_graph or
        # find_unused_parameters; a bare module or DataParallel never does.
        self.checked_unused = (
            not isinstance(self.ddp, DDP) or config.find_unused_parameters or config.static_graph
        )
        if start is not None:
            self.done_steps = checkpoint.restore_training(
                start, self.optimizer, self.scaler, env.rank
            )

    def _wrap(
        self, module: nn.Module
    ) -> tuple[nn.Module, distributed.CommMeter | distributed.DDPCommSampler]:
        """The strategy (DDP with its knobs, DataParallel over this node's GPUs, or the bare
        module on one device) and what times its gradient communication."""
        config, device = self.config, self.device
        meter = distributed.CommMeter(config.comm_hook, config.powersgd_rank)
        if config.strategy == "single":
            meter.active = True  # nothing is communicated: zeros are the measurement
            return module, meter
        if config.strategy == "dp":
            dp = nn.DataParallel(module, device_ids=list(range(config.world_size)))  # type: ignore[arg-type]
            return dp, meter
        ddp = DDP(
            module,
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=config.find_unused_parameters,
            bucket_cap_mb=config.bucket_cap_mb,
            gradient_as_bucket_view=config.gradient_as_bucket_view,
            static_graph=config.static_graph,
        )
        if config.trace_comm == "hook" or config.comm_hook != "allreduce":
            ddp.register_comm_hook(None, meter.hook)
            meter.active = True
        elif config.trace_comm == "sampled":
            return ddp, distributed.DDPCommSampler(ddp, config.trace_comm_every_steps)
        return ddp, meter

    def set_lr(self, step: int) -> None:
        """The learning rate for ``step``: scaled by the batch rule, ramped up over warm-up."""
        lr = self.config.learning_rate * self.config.lr_scale
        if self.config.lr_warmup_steps:
            lr *= min(1.0, step / self.config.lr_warmup_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def save(self, step: int, tracer: Tracer) -> None:
        tracer.steps.flush()  # a checkpoint never gets ahead of the trace rows on disk
        tracer.evals.flush()
        checkpoint.save(self.run_dir, step, self.module, self.optimizer, self.scaler, self.env.rank)

    def step(self, micro_batches: list[list[int]], clock: PhaseClock) -> dict[str, Any]:
        """One optimizer step over ``micro_batches`` (gradient sync on the last one only)."""
        accum = len(micro_batches)
        clock.start()
        loss_sum = torch.zeros((), device=self.device)
        for m, indices in enumerate(micro_batches):
            inputs, targets = fetch_batch(self.train_set, indices)
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            clock.mark()
            no_sync = m < accum - 1 and isinstance(self.ddp, DDP)
            sync = self.ddp.no_sync() if no_sync else contextlib.nullcontext()  # type: ignore[operator]
            with sync:
                with self.autocast():
                    loss = _loss(self.module, self.ddp(inputs), targets) / accum
                clock.mark()
                self.scaler.scale(loss).backward()
                clock.mark()
            loss_sum += loss.detach()
        if not self.checked_unused:
            self._check_unused_parameters()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        clock.mark()
        d = clock.durations()  # per micro-step: data, forward, backward; then the optimizer
        comm_s, comm_bytes, comm_buckets = self.comm.take()
        return dict(
            data_s=sum(d[0:-1:3]),
            forward_s=sum(d[1:-1:3]),
            backward_s=sum(d[2:-1:3]),
            optimizer_s=d[-1],
            step_s=sum(d),
            comm_s=comm_s,
            comm_bytes=comm_bytes,
            comm_buckets=comm_buckets,
            samples=sum(len(b) for b in micro_batches),
            loss=float(loss_sum),
            lr=self.optimizer.param_groups[0]["lr"],
        )

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
        return evaluate(
            self.ddp,
            self.module,
            self.eval_set,
            self.config,
            self.env,
            self.device,
            tracer,
            epoch,
            step,
            self.autocast,
            self.eval_group,
        )


def _train(
    config: RunConfig,
    env: distributed.RankEnv,
    device: torch.device,
    run_dir: Path,
    run_id: str,
    attempt: int,
    stop: PreemptionSignal,
) -> dict[str, Any]:
    t = _Trainer(config, env, device, run_dir, attempt)
    traces = run_dir / schema.TRACES_DIR
    traces.mkdir(parents=True, exist_ok=True)
    if t.done_steps:
        trim_for_resume(traces, env.rank, t.done_steps)
    spe, total, accum = (
        config.steps_per_epoch,
        config.total_steps,
        config.gradient_accumulation_steps,
    )
    ckpt_every = config.checkpoint_every_steps
    sample_log = (
        open(traces / f"samples-rank{env.rank:05d}.jsonl", "a") if config.trace_sample_ids else None
    )
    step = last_eval_step = t.done_steps
    preempted = False

    def agreed_stop() -> bool:
        """Every few steps, all ranks learn whether any of them got the preemption signal."""
        every = config.stop_check_every_steps
        return (
            bool(every)
            and step % every == 0
            and step < total
            and distributed.any_rank_flag(stop.requested, device)
        )

    with (
        Tracer(
            traces,
            run_id=run_id,
            rank=env.rank,
            local_rank=env.local_rank,
            host=env.host,
            world_size=int(config.world_size),  # type: ignore[arg-type]  # devices (DP: one process)
            attempt=attempt,
            flush_s=config.trace_flush_s,
            device=device,
        ) as tracer,
        step_profiler(
            config.profile_steps, t.done_steps, run_dir / schema.PROFILES_DIR, env.rank, device
        ) as profiler,
    ):
        clock = PhaseClock(device)
        distributed.barrier()
        tracer.set_t0()
        epoch = step // spe
        while step < total:
            batches = train_batches(
                t.train_set,
                env.rank,
                env.world_size,
                config.per_process_batch_size,
                config.seed,
                epoch,
            )
            t.ddp.train()
            for s in range(step % spe, spe):
                step += 1
                _inject_fault(config, env.rank, step, attempt)
                micro = batches[s * accum : (s + 1) * accum]
                if sample_log is not None:
                    sample_log.write(
                        json.dumps({"epoch": epoch, "step": step, "indices": sum(micro, [])}) + "\n"
                    )
                t.set_lr(step)
                fields = t.step(micro, clock)
                if not math.isfinite(fields["loss"]):
                    raise NonFiniteLossError(env.rank, step, fields["loss"])
                tracer.step(
                    epoch=epoch,
                    step=step,
                    warmup=step <= config.warmup_steps,
                    t_start_s=tracer.since_t0(clock.started_at),
                    **fields,
                )
                profiler.step()
                if step >= total:
                    break
                if s + 1 < spe and ckpt_every and step % ckpt_every == 0:
                    t.save(step, tracer)
                if s + 1 < spe and agreed_stop():
                    preempted = True
                    break
            if preempted:
                break
            # Epoch end: evaluate first, then checkpoint, so a checkpoint implies its evaluation.
            if step % spe == 0:
                if config.eval_every_epochs and (epoch + 1) % config.eval_every_epochs == 0:
                    t.evaluate(tracer, epoch, step)
                    last_eval_step = step
                if ckpt_every and step % ckpt_every == 0 and step < total:
                    t.save(step, tracer)
            epoch += 1
            if agreed_stop():
                preempted = True
                break
        if preempted:
            t.save(step, tracer)  # all ranks stop at the same step and checkpoint together
        else:
            if config.eval_at_end and last_eval_step != step:
                t.evaluate(tracer, max(epoch - 1, 0), step)
            if ckpt_every:  # the final state too, so a longer run can continue from here
                t.save(step, tracer)
    if sample_log is not None:
        sample_log.close()
    summary = {**_summary(t.module, env, device, step, tracer), "preempted": preempted}
    consolidate(traces, env.rank)
    del t  # free the DDP model before the process group goes (see distributed.teardown)
    return summary


@torch.no_grad()
def evaluate(
    wrapped: nn.Module,
    module: nn.Module,
    dataset: Any,
    config: RunConfig,
    env: distributed.RankEnv,
    device: torch.device,
    tracer: Tracer,
    epoch: int,
    step: int,
    autocast: Any,
    eval_group: Any,
) -> float:
    """Predict, gather on rank 0, metric on rank 0, broadcast it; each timed. With
    ``eval_on="all"`` every rank predicts its shard; with ``"rank0"`` rank 0 predicts everything
    and the others wait for the broadcast (on a side group whose timeout allows it).

    Rows gathered per sample: (index, correct, count, loss sum); ``count`` is 1 for a classifier
    and the number of tokens for a language model, so the metric is accuracy over samples or
    tokens. Returns the metric every rank received."""

    def now() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    wrapped.eval()
    t0 = now()
    rows = [torch.empty(0, 4, dtype=torch.float64, device=device)]
    everyone = config.eval_on == "all"
    if everyone:
        shard = eval_shard(dataset, env.rank, env.world_size, config.eval_batch_size)
    else:
        shard = eval_shard(dataset, 0, 1, config.eval_batch_size) if env.rank == 0 else iter(())
    for indices in shard:
        inputs, targets = fetch_batch(dataset, indices)
        inputs, targets = inputs.to(device), targets.to(device)
        with autocast():
            logits = module(inputs)
        logits = logits.float()
        if model_task(module) == "lm":
            loss = nn.functional.cross_entropy(
                logits.transpose(1, 2), targets, reduction="none"
            ).sum(1)
            correct = (logits.argmax(-1) == targets).sum(1).double()
            count = torch.full_like(correct, targets.shape[1])
        else:
            loss = nn.functional.cross_entropy(logits, targets, reduction="none")
            correct = (logits.argmax(-1) == targets).double()
            count = torch.ones_like(correct)
        idx = torch.as_tensor(indices, device=device, dtype=torch.float64)
        rows.append(torch.stack([idx, correct, count, loss.double()], dim=1))
    local = torch.cat(rows)
    t1 = now()
    if everyone:
        gathered = distributed.gather_rows(local, env.rank, env.world_size)
    else:
        gathered = local if env.rank == 0 else None
    t2 = now()
    metric = loss_mean = 0.0
    if gathered is not None:
        order = torch.argsort(gathered[:, 0], stable=True)
        ids = gathered[order, 0]
        keep = torch.ones_like(ids, dtype=torch.bool)
        keep[1:] = ids[1:] != ids[:-1]  # the sampler's padding repeats samples; count each once
        unique = gathered[order][keep]
        metric = float(unique[:, 1].sum() / unique[:, 2].sum())
        loss_mean = float(unique[:, 3].sum() / unique[:, 2].sum())
    t3 = now()
    metric, loss_mean = distributed.broadcast_floats([metric, loss_mean], eval_group)
    t4 = now()
    tracer.evaluation(
        epoch=epoch,
        step=step,
        t_start_s=tracer.since_t0(t0),
        predict_s=t1 - t0,
        gather_s=t2 - t1,
        metric_s=t3 - t2,
        broadcast_s=t4 - t3,
        eval_s=t4 - t0,
        samples=len(local),
        metric_name="accuracy",
        metric_value=metric,
        loss=loss_mean,
    )
    wrapped.train()
    return metric


def _summary(
    module: nn.Module, env: distributed.RankEnv, device: torch.device, step: int, tracer: Tracer
) -> dict[str, Any]:
    """What this rank returns to the caller: where it ended and a fingerprint of its parameters."""
    digest = hashlib.sha256()
    for p in module.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "rank": env.rank,
        "host": env.host,
        "device": str(device),
        "device_name": device_name,
        "steps": step,
        "param_sha256": digest.hexdigest(),
        "rss_bytes": tracer.memory(fresh=True)["rss_bytes"],
        "t0_unix": tracer.t0_unix,
    }
