"""Tracing overhead: the traced training loop over the same loop untraced, and the tracer's own
cost per step measured directly.

End to end (per model, per world size, ranks started with ``torch.multiprocessing.spawn``, gloo, one
thread per rank; with ``--device cuda`` one GPU per rank and NCCL): every rank builds identical DDP
models from the same seed and runs them in interleaved blocks of steps on the same batches:

- ``untraced``: the workbench's step (fetch, forward, loss, backward, GradScaler calls, optimizer)
  on a DDP model without a comm hook and without any tracer call;
- ``traced``: exactly what ``workbench.rank.loop.train_step`` does with the default
  ``trace_comm="sampled"``: ``Trainer.step`` (PhaseClock marks, ``DDPCommSampler.take``, which
  reads DDP's own comm timer on the first 10 steps and every 10th) then ``Tracer.step`` (a tuple
  appended; memory sampled every 0.5 s; an Arrow record batch appended every ``trace_flush_s``);
- ``hook_only``: the untraced step with the ``trace_comm="hook"`` comm hook (CommMeter) and no
  tracer call: what timing every bucket of every step would cost;
- ``profiler``: the untraced step inside ``torch.profiler.profile`` recording CPU ops every step,
  for contrast.

The order of the variants rotates every round, so drift and load hit all of them. Each round gives
one ratio per variant (median step time of its block over the untraced block's); the figure is the
median of those ratios with its IQR and a bootstrap CI.

On CPU a block's figure is the median of its step times; on CUDA, where steps are queued, the
block's wall time between two synchronisations over its steps (the untraced step reads no loss, so
neither variant waits for the GPU inside the block).

End-to-end noise here exceeds 1 %, so the tracer's calls are also timed in isolation, in
microseconds of this thread's CPU time over many calls on the real classes: the tracer's host cost
per step (``tracer_host_us_per_step``: ``PhaseClock.start``, four marks, ``stop`` and
``Tracer.step``, its flushes amortised over their rows), and its parts: PhaseClock marks per step,
``Tracer.step`` alone, one flush per row, the memory sample (RSS read), and the comm hook's
extra cost per gradient bucket against DDP's built-in allreduce (a DDP model with one bucket per
parameter, so the per-bucket cost stands out of the step), and one read of DDP's comm timer.
PhaseClock + ``Tracer.step`` + the timer read spread over its sampling interval, over the untraced
step time, is the direct overhead estimate of the default tracing.

Usage: ``python benchmarks/tracing_overhead.py [--models mlp,transformer] [--world-sizes 1,2]
[--device cpu|cuda] [--smoke] [--json out.json]``; ``--smoke`` (alias ``--quick``): the mlp at
1 rank, few rounds and calls, a check of the harness.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from _common import fmt_ratio, ratio_stats, write_result  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from workbench.config.run_config import RunConfig  # noqa: E402
from workbench.ports import free_port  # noqa: E402
from workbench.rank import distributed
from workbench.rank.data import fetch_batch, train_batches  # noqa: E402
from workbench.rank.models import build_model  # noqa: E402
from workbench.rank.profiling import NoProfiler  # noqa: E402
from workbench.rank.trainer import (  # noqa: E402
    Trainer,
    make_optimizer,
    seed_everything,
    training_loss,
)
from workbench.trace.comm_timing import DDPCommSampler  # noqa: E402
from workbench.trace.phase_clock import PhaseClock  # noqa: E402
from workbench.trace.tracer import Tracer, rss_bytes  # noqa: E402

VARIANTS = ("untraced", "hook_only", "traced", "profiler")


def make_config(model: str, world_size: int, batch: int, device: str = "cpu") -> RunConfig:
    """The run these loops stand for (its defaults: SGD, fp32, trace_flush_s=2)."""
    return RunConfig(
        model=model,
        world_size=world_size,
        per_device_batch_size=batch,
        device=device,
        backend="nccl" if device == "cuda" else "gloo",
        threads_per_rank=1,
        sweep="bench",
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _block_times(device: torch.device, steps: int, one: Callable[[], Any]) -> list[float]:
    """Seconds per step of ``steps`` calls of ``one``: each step's own time on CPU; on CUDA the
    block's time between two synchronisations, per step (queued steps have no time of their
    own)."""
    if device.type == "cuda":
        _sync(device)
        start = time.perf_counter()
        for _ in range(steps):
            one()
        _sync(device)
        return [(time.perf_counter() - start) / steps]
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        one()
        times.append(time.perf_counter() - start)
    return times


class _PlainStep:
    """The workbench step with the instrumentation taken out: same model init, same batches, same
    GradScaler/autocast calls (they are not tracing), no PhaseClock, no comm hook."""

    def __init__(
        self, config: RunConfig, train_set: Any, device: torch.device, hook: Any = None
    ) -> None:
        seed_everything(config.seed)  # same initial weights as the traced trainer's
        self.device = device
        self.module = build_model(config.model, dict(config.model_options)).to(device)
        # The same DDP knobs the trainer passes (getattr: the package grows them over time).
        knobs = {
            k: getattr(config, k)
            for k in (
                "bucket_cap_mb",
                "gradient_as_bucket_view",
                "static_graph",
                "find_unused_parameters",
            )
            if hasattr(config, k)
        }
        ids = [device.index] if device.type == "cuda" else None
        self.ddp = DDP(self.module, device_ids=ids, **knobs)
        if hook is not None:  # the hook_only variant: the comm hook's share of the overhead
            self.ddp.register_comm_hook(None, hook)
        self.optimizer = make_optimizer(config, self.ddp.parameters())
        self.scaler = torch.amp.GradScaler(device.type, enabled=False)
        self.train_set = train_set

    def __call__(self, micro_batches: list[list[int]]) -> Any:
        accum = len(micro_batches)
        loss_sum = torch.zeros((), device=self.device)
        for m, indices in enumerate(micro_batches):
            inputs, targets = fetch_batch(self.train_set, indices)
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            with self.ddp.no_sync() if m < accum - 1 else contextlib.nullcontext():
                with contextlib.nullcontext():
                    loss = training_loss(self.module, self.ddp(inputs), targets) / accum
                self.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        # As Trainer.step: the loss as a float on CPU, left on the GPU on CUDA (no sync per step).
        return loss_sum if self.device.type == "cuda" else float(loss_sum)


def measure_end_to_end(
    model: str,
    env: distributed.RankEnv,
    batch: int,
    seconds: float,
    workdir: Path,
    quick: bool = False,
    device: torch.device = torch.device("cpu"),
) -> dict[str, Any]:
    """Interleaved blocks of the three variants on this rank; per-round ratios to untraced.

    Steps per block and rounds follow from the step time measured in warm-up, so each model gets
    about ``seconds`` of measurement: blocks of about 0.3 s (a median over several steps), as many
    rounds as fit (more pairs, a tighter CI)."""
    config = make_config(model, env.world_size, batch, device.type)
    trainer = Trainer(config, env, device, workdir, attempt=0)  # trace_comm="sampled"
    plain = _PlainStep(config, trainer.train_set, device)
    meter = distributed.CommMeter()
    meter.active = True  # registered by hand below, as Trainer does
    hooked = _PlainStep(config, trainer.train_set, device, hook=meter.hook)
    batches = train_batches(trainer.train_set, env.rank, env.world_size, batch, config.seed, 0)
    clock = PhaseClock(device)
    noprof = NoProfiler()
    counter = {"step": 0, "buckets": 0}
    tracer = Tracer(
        workdir / "traces",
        run_id="bench",
        rank=env.rank,
        local_rank=env.local_rank,
        host=env.host,
        world_size=env.world_size,
        attempt=0,
        flush_s=config.trace_flush_s,
        device=device,
    )

    block = 5  # warm-up blocks; the measured ones are sized below

    def micro() -> list[list[int]]:
        counter["step"] += 1
        return [batches[counter["step"] % len(batches)]]

    def traced_step() -> None:  # what workbench.rank.loop.train_step does around the model
        fields = trainer.step(micro(), clock)
        loss = fields["loss"]
        if isinstance(loss, float) and not math.isfinite(loss):
            raise FloatingPointError(loss)
        tracer.step(
            epoch=0,
            step=counter["step"],
            warmup=False,
            t_start_s=tracer.since_t0(clock.started_at),
            **fields,
        )
        noprof.step()
        counter["buckets"] = fields["comm_buckets"]

    def hooked_step() -> None:
        hooked(micro())
        meter.take()

    def traced_block() -> list[float]:
        return _block_times(device, block, traced_step)

    def untraced_block() -> list[float]:
        return _block_times(device, block, lambda: plain(micro()))

    def hook_only_block() -> list[float]:
        return _block_times(device, block, hooked_step)

    profiler_exit: list[float] = []

    def profiler_block() -> list[float]:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(activities=activities)
        prof.__enter__()

        def profiled_step() -> None:
            plain(micro())
            prof.step()

        times = _block_times(device, block, profiled_step)
        start = time.perf_counter()
        prof.__exit__(None, None, None)  # stops recording and collects the events
        profiler_exit.append((time.perf_counter() - start) / block)
        return times

    run: dict[str, Callable[[], list[float]]] = {
        "untraced": untraced_block,
        "hook_only": hook_only_block,
        "traced": traced_block,
        "profiler": profiler_block,
    }
    distributed.barrier()
    tracer.set_t0()
    for name in VARIANTS:  # warm-up: allocator, DDP bucket rebuild, profiler's first start
        run[name]()
        run[name]()
    profiler_exit.clear()
    # Rank 0 decides the block and round counts: every rank must run the same collectives.
    t = torch.tensor([statistics.median(untraced_block())], dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)  # on the step's device: NCCL broadcasts CUDA tensors only
    step_s = float(t[0])
    block = int(min(50, max(5, 0.3 / step_s)))
    rounds = int(min(150, max(8, seconds / (len(VARIANTS) * block * step_s))))
    if quick:
        block, rounds = 5, 4
    medians: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        k = r % len(VARIANTS)
        order = VARIANTS[k:] + VARIANTS[:k]  # rotate, so no variant always goes first
        for name in order:
            medians[name].append(statistics.median(run[name]()))
    tracer.close()
    base = np.array(medians["untraced"])
    out = {
        "model": model,
        "device": device.type,
        "world_size": env.world_size,
        "batch": batch,
        "block_steps": block,
        "rounds": rounds,
        "untraced_step_ms": float(np.median(base) * 1e3),
        "buckets_per_step": counter["buckets"],
        "comm_every_steps": config.trace_comm_every_steps,
        "traced": ratio_stats(np.array(medians["traced"]) / base),
        "hook_only": ratio_stats(np.array(medians["hook_only"]) / base),
        "profiler": ratio_stats(np.array(medians["profiler"]) / base),
        "profiler_exit_ms_per_step": float(np.median(profiler_exit) * 1e3),
    }
    return out  # the DDP models go with this frame, before the group does (FACTS: gloo)


# -- direct costs, in isolation


def _per_call_us(fn: Callable[[], Any], calls: int, repeats: int = 7) -> float:
    """Median over ``repeats`` of the mean CPU time per call of this thread (us). CPU time, not
    wall time: these calls are pure work in the calling thread (the RSS read and the trace
    flush's write are system time, counted too), and on a loaded machine the wall clock adds
    whatever time the scheduler gave other processes."""
    per = []
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        per.append((time.thread_time() - start) / calls * 1e6)
    return float(statistics.median(per))


def _realistic_fields(step: int) -> dict[str, Any]:
    """What ``Trainer.step`` returns besides the phases (values vary, as in a run)."""
    x = 0.001 * (1 + (step % 7) / 10)
    return dict(
        comm_s=x / 2 if step % 10 == 0 else None,  # trace_comm="sampled": every 10th step
        comm_bytes=417_808,
        comm_buckets=1,
        samples=32,
        loss=1.386 - step * 1e-6,
        lr=0.05,
    )


def _direct_tracer(workdir: Path, device: torch.device) -> Tracer:
    return Tracer(
        workdir,
        run_id="transformer-w2-20260101-000000-abcd",
        rank=0,
        local_rank=0,
        host=socket.gethostname(),
        world_size=2,
        attempt=0,
        flush_s=2.0,  # RunConfig's default trace_flush_s
        device=device,
    )


def measure_direct_costs(
    calls: int, workdir: Path, device: torch.device = torch.device("cpu")
) -> dict[str, float]:
    """The tracer's host cost per step and its parts, in microseconds of this thread's CPU time
    (this process, no DDP, the real PhaseClock and Tracer, ``calls`` steps per repeat)."""
    clock = PhaseClock(device)
    tracer = _direct_tracer(workdir / "direct", device)
    fields = [_realistic_fields(i) for i in range(70)]  # made beforehand: not the tracer's cost
    n = {"step": 0}

    def clock_step() -> None:  # what one step with one micro-batch stamps
        clock.start()
        clock.mark()
        clock.mark()
        clock.mark()
        clock.mark()
        clock.stop()

    def traced_step() -> None:  # the marks, then the row, as loop.train_step gives it
        n["step"] += 1
        clock_step()
        tracer.step(
            epoch=0,
            step=n["step"],
            warmup=False,
            t_start_s=tracer.since_t0(clock.started_at),
            phases=clock.stop(),
            **fields[n["step"] % 70],
        )

    stamps = (0.0, 0.0001, 0.0011, 0.0031, 0.0034)

    def tracer_step() -> None:
        n["step"] += 1
        tracer.step(
            epoch=0,
            step=n["step"],
            warmup=False,
            t_start_s=n["step"] * 0.003,
            phases=stamps,
            **fields[n["step"] % 70],
        )

    out = {
        "device": device.type,
        # The acceptance figure: everything the tracer adds to a step on the host, its flushes
        # (Arrow record batch) and memory samples amortised over their steps.
        "tracer_host_us_per_step": _per_call_us(traced_step, calls),
        "phaseclock_us_per_step": _per_call_us(clock_step, calls),
        "tracer_step_us": _per_call_us(tracer_step, calls),
        "flush_us_per_row": _flush_cost(tracer, tracer_step),
        "rss_read_us": _per_call_us(rss_bytes, calls),
        "memory_sample_us": _per_call_us(lambda: tracer.memory(fresh=True), calls // 10),
    }
    tracer.close()
    _sync(device)
    return out


def _flush_cost(tracer: Tracer, tracer_step: Callable[[], None], rows: int = 2000) -> float:
    """CPU time of one flush of ``rows`` buffered rows, per row (median of 5)."""
    per = []
    flush_s, tracer.flush_s = tracer.flush_s, 1e9
    for _ in range(5):
        tracer.flush()
        for _ in range(rows - 1):
            tracer_step()
        start = time.thread_time()
        tracer.flush()
        per.append((time.thread_time() - start) / rows * 1e6)
    tracer.flush_s = flush_s
    return float(statistics.median(per))


class _ManyBuckets(nn.Module):
    """Many small parameters, so that with a tiny bucket cap DDP makes one bucket per parameter."""

    def __init__(self, layers: int = 32, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def measure_hook_cost(
    rounds: int, block: int, device: torch.device = torch.device("cpu")
) -> dict[str, float]:
    """Extra time per bucket of the CommMeter hook and of torch's Python ``allreduce_hook`` over
    DDP's built-in (C++) allreduce, from interleaved blocks on a 1-rank group (on CUDA each step
    is waited for)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    ids = [device.index] if device.type == "cuda" else None

    def build(hook: Any) -> DDP:
        torch.manual_seed(0)
        # ~100 bytes per bucket: one bucket per parameter
        ddp = DDP(_ManyBuckets().to(device), device_ids=ids, bucket_cap_mb=0.0001)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        return ddp

    meter = distributed.CommMeter()
    meter.active = True  # registered by hand below, as Trainer does
    models = {
        "builtin": build(None),
        "python_default": build(default_hooks.allreduce_hook),
        "commmeter": build(meter.hook),
    }
    x = torch.randn(8, 32, device=device)

    def block_of(ddp: DDP) -> tuple[float, float]:
        """(median wall time of a step, mean process CPU time of a step): CPU time counts the
        gloo threads' work for the hook's callbacks too, and ignores other processes' load."""
        times = []
        cpu = time.process_time()
        for _ in range(block):
            start = time.perf_counter()
            ddp(x).sum().backward()
            _sync(device)
            times.append(time.perf_counter() - start)
        return statistics.median(times), (time.process_time() - cpu) / block

    for ddp in models.values():  # warm-up, bucket rebuild
        block_of(ddp)
    meter.take()
    models["commmeter"](x).sum().backward()
    buckets = meter.take()[2]
    diffs: dict[str, list[float]] = {"python_default": [], "commmeter": [], "commmeter_cpu": []}
    names = list(models)
    for r in range(rounds):
        order = names[r % 3 :] + names[: r % 3]
        t = {name: block_of(models[name]) for name in order}
        for name in ("python_default", "commmeter"):
            diffs[name].append((t[name][0] - t["builtin"][0]) / buckets * 1e6)
        diffs["commmeter_cpu"].append((t["commmeter"][1] - t["builtin"][1]) / buckets * 1e6)
    sampler = DDPCommSampler(models["builtin"], every_steps=1, gradient_bytes=0)
    reads = []
    for _ in range(rounds):
        models["builtin"](x).sum().backward()
        _sync(device)
        start = time.perf_counter()
        sampler.take()  # every_steps=1: every call reads DDP's timer and logging data
        reads.append((time.perf_counter() - start) * 1e6)
    del models, sampler
    dist.barrier()
    return {
        "sampler_read_us": float(np.median(reads)),
        "buckets": buckets,
        "commmeter_extra_us_per_bucket": float(np.median(diffs["commmeter"])),
        "commmeter_extra_us_iqr": [float(np.percentile(diffs["commmeter"], q)) for q in (25, 75)],
        "commmeter_extra_cpu_us_per_bucket": float(np.median(diffs["commmeter_cpu"])),
        "python_allreduce_hook_extra_us_per_bucket": float(np.median(diffs["python_default"])),
    }


# -- ranks


def _rank_main(rank: int, world_size: int, port: int, args: dict[str, Any], out: str) -> None:
    torch.set_num_threads(1)
    env = distributed.RankEnv(
        rank=rank,
        local_rank=rank,
        world_size=world_size,
        local_world_size=world_size,
        node_rank=0,
        host=socket.gethostname(),
        master_addr="127.0.0.1",
        master_port=port,
        job_id="bench",
    )
    device = distributed.pick_device(args["device"], rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    distributed.init_process_group(env, backend, device, 300.0)
    results: dict[str, Any] = {"end_to_end": []}
    with tempfile.TemporaryDirectory(prefix=f"wb-bench-r{rank}-") as tmp:
        for model in args["models"]:
            results["end_to_end"].append(
                measure_end_to_end(
                    model,
                    env,
                    args["batch"],
                    args["seconds"],
                    Path(tmp) / model,
                    args["quick"],
                    device,
                )
            )
            gc.collect()  # free the DDP models (their cycles too) before the next collective
            dist.barrier()
        if world_size == 1:
            results["direct"] = measure_direct_costs(args["calls"], Path(tmp), device)
            if device.type == "cuda":  # and the CPU figure beside it, from the same process
                results["direct_cpu"] = measure_direct_costs(args["calls"], Path(tmp) / "cpu")
            results["hook"] = measure_hook_cost(args["hook_rounds"], 20, device)
    distributed.teardown()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def run_world(world_size: int, args: dict[str, Any]) -> dict[str, Any]:
    """Spawn ``world_size`` fresh rank processes; rank 0's measurements."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    try:
        mp.spawn(
            _rank_main, args=(world_size, free_port(), args, out), nprocs=world_size, join=True
        )
        return json.loads(Path(out).read_text())
    finally:
        os.unlink(out)


def direct_ratio(row: dict[str, Any], direct: dict[str, float], hook: dict[str, float]) -> float:
    """1 + (the default tracing's calls per step) / untraced step time."""
    us = direct["tracer_host_us_per_step"] + hook["sampler_read_us"] / row["comm_every_steps"]
    return 1.0 + us / (row["untraced_step_ms"] * 1e3)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mlp,transformer")
    parser.add_argument("--world-sizes", default="1,2")
    parser.add_argument("--batch", type=int, default=32, help="per-device batch size")
    parser.add_argument(
        "--seconds",
        type=float,
        default=35.0,
        help="measuring time per model and world size (rounds follow from it)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--direct-only", action="store_true", help="only the tracer's own costs, no end to end"
    )
    parser.add_argument(
        "--smoke",
        "--quick",
        dest="smoke",
        action="store_true",
        help="the mlp at 1 rank, few rounds (seconds)",
    )
    parser.add_argument("--json", help="write the result here")
    a = parser.parse_args(argv)
    world_sizes = [] if a.direct_only else [int(x) for x in a.world_sizes.split(",")]
    if a.smoke:
        world_sizes, a.models = ([] if a.direct_only else [1]), "mlp"
    gpus, needed = torch.cuda.device_count(), max(world_sizes, default=1)
    if a.device == "cuda" and gpus < needed:
        parser.error(
            f"--device cuda at world size {needed} needs {needed} CUDA device(s), this machine "
            f"has {gpus} (--world-sizes 1 runs on one)"
        )
    args = {
        "device": a.device,
        "models": a.models.split(","),
        "batch": a.batch,
        "seconds": a.seconds,
        "calls": 20_000,
        "hook_rounds": 40,
        "quick": a.smoke,
    }
    if a.smoke:
        args.update(calls=2000, hook_rounds=4)
    rows: list[dict[str, Any]] = []
    direct: dict[str, float] = {}
    hook: dict[str, float] = {}
    direct_cpu: dict[str, float] = {}
    for w in world_sizes:
        res = run_world(w, args)
        rows += res["end_to_end"]
        direct, direct_cpu = res.get("direct", direct), res.get("direct_cpu", direct_cpu)
        hook = res.get("hook", hook)
    if not direct:  # world size 1 not asked: the direct costs still need measuring
        res = run_world(1, {**args, "models": []})
        direct, direct_cpu, hook = res["direct"], res.get("direct_cpu", {}), res["hook"]
    print(f"direct costs (us): {json.dumps({**direct, **hook})}")
    for d in (direct, direct_cpu) if direct_cpu else (direct,):
        print(
            f"tracer host cost per step ({d['device']}): {d['tracer_host_us_per_step']:.2f} us "
            f"(PhaseClock {d['phaseclock_us_per_step']:.2f}, Tracer.step "
            f"{d['tracer_step_us']:.2f} incl. its flush {d['flush_us_per_row']:.2f} per row)"
        )
    if rows:
        print(
            f"{'model':<12}{'ranks':>6}{'step ms':>9}{'buckets':>8}  "
            f"{'traced/untraced (end to end)':<58}{'direct':>8}  {'profiler/untraced':<22}"
        )
    for row in rows:
        row["direct_ratio"] = direct_ratio(row, direct, hook)
        print(
            f"{row['model']:<12}{row['world_size']:>6}{row['untraced_step_ms']:>9.2f}"
            f"{row['buckets_per_step']:>8}  {fmt_ratio(row['traced']):<58}"
            f"{row['direct_ratio']:>8.4f}"
            f"  {row['profiler']['median']:.3f} (+{row['profiler_exit_ms_per_step']:.2f} ms/step "
            "at exit)"
        )
        print(f"{'':<26}trace_comm='hook' only, no tracer calls: {fmt_ratio(row['hook_only'])}")
    result = {"rows": rows, "direct": direct, "hook": hook, "args": args}
    if direct_cpu:
        result["direct_cpu"] = direct_cpu
    write_result(a.json, "tracing_overhead", result)
    return result


if __name__ == "__main__":
    main()
