"""Tracing overhead: the traced training loop over the same loop untraced, and the tracer's own
cost per step measured directly.

End to end (per model, per world size, ranks started with ``torch.multiprocessing.spawn``, gloo, one
thread per rank): every rank builds two identical DDP models from the same seed and runs them in
interleaved blocks of steps on the same batches:

- ``untraced``: the workbench's step (fetch, forward, loss, backward, GradScaler calls, optimizer)
  on a DDP model without a comm hook and without any tracer call;
- ``traced``: exactly what ``workbench.rank.loop.train_step`` does with the default
  ``trace_comm="sampled"``: ``Trainer.step`` (PhaseClock marks, ``DDPCommSampler.take``, which
  reads DDP's own comm timer on the first 10 steps and every 10th) then ``Tracer.step`` (RSS
  read, JSONL writer);
- ``hook_only``: the untraced step with the ``trace_comm="hook"`` comm hook (CommMeter) and no
  tracer call: what timing every bucket of every step would cost;
- ``profiler``: the untraced step inside ``torch.profiler.profile`` recording CPU ops every step,
  for contrast.

The order of the variants rotates every round, so drift and load hit all of them. Each round gives
one ratio per variant (median step time of its block over the untraced block's); the figure is the
median of those ratios with its IQR and a bootstrap CI.

End-to-end noise here exceeds 1 %, so the tracer's calls are also timed in isolation, in
microseconds: PhaseClock marks per step, ``Tracer.step`` (and its RSS read), and the comm hook's
extra cost per gradient bucket against DDP's built-in allreduce (a DDP model with one bucket per
parameter, so the per-bucket cost stands out of the step), and one read of DDP's comm timer.
PhaseClock + ``Tracer.step`` + the timer read spread over its sampling interval, over the untraced
step time, is the direct overhead estimate of the default tracing.

Usage: ``python benchmarks/tracing_overhead.py [--models mlp,transformer] [--world-sizes 1,2]
[--quick] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
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
from workbench.rank.tracer import PhaseClock, Tracer, rss_bytes  # noqa: E402
from workbench.rank.trainer import (  # noqa: E402
    Trainer,
    make_optimizer,
    seed_everything,
    training_loss,
)

VARIANTS = ("untraced", "hook_only", "traced", "profiler")


def make_config(model: str, world_size: int, batch: int) -> RunConfig:
    """The run these loops stand for (its defaults: SGD, fp32, trace_flush_s=2)."""
    return RunConfig(
        model=model,
        world_size=world_size,
        per_device_batch_size=batch,
        device="cpu",
        backend="gloo",
        threads_per_rank=1,
        sweep="bench",
    )


class _PlainStep:
    """The workbench step with the instrumentation taken out: same model init, same batches, same
    GradScaler/autocast calls (they are not tracing), no PhaseClock, no comm hook."""

    def __init__(self, config: RunConfig, train_set: Any, hook: Any = None) -> None:
        seed_everything(config.seed)  # same initial weights as the traced trainer's
        self.module = build_model(config.model, dict(config.model_options))
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
        self.ddp = DDP(self.module, **knobs)
        if hook is not None:  # the hook_only variant: the comm hook's share of the overhead
            self.ddp.register_comm_hook(None, hook)
        self.optimizer = make_optimizer(config, self.ddp.parameters())
        self.scaler = torch.amp.GradScaler("cpu", enabled=False)
        self.train_set = train_set

    def __call__(self, micro_batches: list[list[int]]) -> float:
        accum = len(micro_batches)
        loss_sum = torch.zeros(())
        for m, indices in enumerate(micro_batches):
            inputs, targets = fetch_batch(self.train_set, indices)
            inputs = inputs.to("cpu", non_blocking=True)
            targets = targets.to("cpu", non_blocking=True)
            with self.ddp.no_sync() if m < accum - 1 else contextlib.nullcontext():
                with contextlib.nullcontext():
                    loss = training_loss(self.module, self.ddp(inputs), targets) / accum
                self.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss_sum)


def measure_end_to_end(
    model: str,
    env: distributed.RankEnv,
    batch: int,
    seconds: float,
    workdir: Path,
    quick: bool = False,
) -> dict[str, Any]:
    """Interleaved blocks of the three variants on this rank; per-round ratios to untraced.

    Steps per block and rounds follow from the step time measured in warm-up, so each model gets
    about ``seconds`` of measurement: blocks of about 0.3 s (a median over several steps), as many
    rounds as fit (more pairs, a tighter CI)."""
    device = torch.device("cpu")
    config = make_config(model, env.world_size, batch)
    trainer = Trainer(config, env, device, workdir, attempt=0)  # trace_comm="sampled"
    plain = _PlainStep(config, trainer.train_set)
    meter = distributed.CommMeter()
    meter.active = True  # registered by hand below, as Trainer does
    hooked = _PlainStep(config, trainer.train_set, hook=meter.hook)
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

    def traced_block() -> list[float]:
        times = []
        for _ in range(block):
            start = time.perf_counter()
            fields = trainer.step(micro(), clock)
            tracer.step(
                epoch=0,
                step=counter["step"],
                warmup=False,
                t_start_s=tracer.since_t0(clock.started_at),
                **fields,
            )
            noprof.step()
            times.append(time.perf_counter() - start)
            counter["buckets"] = fields["comm_buckets"]
        return times

    def untraced_block() -> list[float]:
        times = []
        for _ in range(block):
            start = time.perf_counter()
            plain(micro())
            times.append(time.perf_counter() - start)
        return times

    def hook_only_block() -> list[float]:
        times = []
        for _ in range(block):
            start = time.perf_counter()
            hooked(micro())
            meter.take()
            times.append(time.perf_counter() - start)
        return times

    profiler_exit: list[float] = []

    def profiler_block() -> list[float]:
        times = []
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        prof.__enter__()
        for _ in range(block):
            start = time.perf_counter()
            plain(micro())
            prof.step()
            times.append(time.perf_counter() - start)
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
    t = torch.tensor([statistics.median(untraced_block())], dtype=torch.float64)
    dist.broadcast(t, src=0)
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
    """What ``Trainer.step`` returns (values vary so JSON encoding is realistic)."""
    x = 0.001 * (1 + (step % 7) / 10)
    return dict(
        data_s=x / 10,
        forward_s=x,
        backward_s=2 * x,
        optimizer_s=x / 3,
        step_s=3.4 * x,
        comm_s=x / 2,
        comm_bytes=417_808,
        comm_buckets=1,
        samples=32,
        loss=1.386 - step * 1e-6,
        lr=0.05,
    )


def measure_direct_costs(calls: int, workdir: Path) -> dict[str, float]:
    """PhaseClock per step, Tracer.step and its parts, in microseconds (this process, no DDP)."""
    device = torch.device("cpu")
    clock = PhaseClock(device)

    def clock_step() -> float:  # what one step with one micro-batch stamps and reads
        clock.start()
        clock.mark()
        clock.mark()
        clock.mark()
        clock.mark()
        clock.durations()
        return clock.started_at

    tracer = Tracer(
        workdir / "direct",
        run_id="bench",
        rank=0,
        local_rank=0,
        host=socket.gethostname(),
        world_size=2,
        attempt=0,
        flush_s=2.0,
        device=device,
    )
    n = {"step": 0}

    def tracer_step() -> None:
        n["step"] += 1
        tracer.step(
            epoch=0,
            step=n["step"],
            warmup=False,
            t_start_s=n["step"] * 0.003,
            **_realistic_fields(n["step"]),
        )

    fields_cost = _per_call_us(lambda: _realistic_fields(5), calls)
    out = {
        "phaseclock_us_per_step": _per_call_us(clock_step, calls),
        "rss_read_us": _per_call_us(rss_bytes, calls),
        "tracer_memory_us": _per_call_us(tracer.memory, calls),
        # Includes JSON encoding and the file write of each flush, amortised over its rows.
        "tracer_step_us": _per_call_us(tracer_step, calls) - fields_cost,
    }
    tracer.close()
    return out


class _ManyBuckets(nn.Module):
    """Many small parameters, so that with a tiny bucket cap DDP makes one bucket per parameter."""

    def __init__(self, layers: int = 32, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def measure_hook_cost(rounds: int, block: int) -> dict[str, float]:
    """Extra time per bucket of the CommMeter hook and of torch's Python ``allreduce_hook`` over
    DDP's built-in (C++) allreduce, from interleaved blocks on a 1-rank gloo group."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def build(hook: Any) -> DDP:
        torch.manual_seed(0)
        ddp = DDP(_ManyBuckets(), bucket_cap_mb=0.0001)  # ~100 bytes: one bucket per parameter
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
    x = torch.randn(8, 32)

    def block_of(ddp: DDP) -> tuple[float, float]:
        """(median wall time of a step, mean process CPU time of a step): CPU time counts the
        gloo threads' work for the hook's callbacks too, and ignores other processes' load."""
        times = []
        cpu = time.process_time()
        for _ in range(block):
            start = time.perf_counter()
            ddp(x).sum().backward()
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
    sampler = distributed.DDPCommSampler(models["builtin"], every_steps=1)
    reads = []
    for _ in range(rounds):
        models["builtin"](x).sum().backward()
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
    distributed.init_process_group(env, "gloo", torch.device("cpu"), 300.0)
    results: dict[str, Any] = {"end_to_end": []}
    with tempfile.TemporaryDirectory(prefix=f"wb-bench-r{rank}-") as tmp:
        for model in args["models"]:
            results["end_to_end"].append(
                measure_end_to_end(
                    model, env, args["batch"], args["seconds"], Path(tmp) / model, args["quick"]
                )
            )
            gc.collect()  # free the DDP models (their cycles too) before the next collective
            dist.barrier()
        if world_size == 1:
            results["direct"] = measure_direct_costs(args["calls"], Path(tmp))
            results["hook"] = measure_hook_cost(args["hook_rounds"], 20)
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
    us = (
        direct["phaseclock_us_per_step"]
        + direct["tracer_step_us"]
        + hook["sampler_read_us"] / row["comm_every_steps"]
    )
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
    parser.add_argument("--quick", action="store_true", help="a smoke run (few rounds)")
    parser.add_argument("--json", help="write the result here")
    a = parser.parse_args(argv)
    args = {
        "models": a.models.split(","),
        "batch": a.batch,
        "seconds": a.seconds,
        "calls": 20_000,
        "hook_rounds": 40,
        "quick": a.quick,
    }
    if a.quick:
        args.update(calls=2000, hook_rounds=4)
    rows: list[dict[str, Any]] = []
    direct: dict[str, float] = {}
    hook: dict[str, float] = {}
    for w in (int(x) for x in a.world_sizes.split(",")):
        res = run_world(w, args)
        rows += res["end_to_end"]
        direct = res.get("direct", direct)
        hook = res.get("hook", hook)
    if not direct:  # world size 1 not asked: the direct costs still need measuring
        direct, hook = (lambda r: (r["direct"], r["hook"]))(run_world(1, {**args, "models": []}))
    print(f"direct costs (us): {json.dumps({**direct, **hook})}")
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
    write_result(a.json, "tracing_overhead", result)
    return result


if __name__ == "__main__":
    main()
