"""What tracing a user's script costs: the same plain DDP script under torchrun, untraced and
traced by the workbench's hooks (``workbench.trace.torch_hooks``), in interleaved pairs.

Two figures per size, each the median of the pairwise traced/untraced ratios with its bootstrap
95 % interval (``_common.ratio_stats``):

- ``in_loop``: the script's own time per step over its steady window (it times itself, after
  its warm-up steps, between two barriers): what tracing adds to training;
- ``end_to_end``: the whole torchrun command's wall time (start-up, training, exit).

and, measured directly in one process (``--direct``: alternating blocks of steps of the same
loop, one DDP module built under the hooks and one without, the hooks installed for the traced
blocks only), what the hooks add to each step in microseconds: the loads that move a torchrun's
whole wall time by several per cent from one run to the next do not move a block of a few
hundred steps in one process.

Usage: ``python benchmarks/script_overhead.py [--pairs 8] [--steps 300] [--direct] [--blocks
2000] [--block-steps 10] [--smoke] [--out F]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import ROOT, fmt_ratio, machine, mean_stats, ratio_stats, write_result

HERE = Path(__file__).resolve().parent
#: Sizes of the workload (hidden width, per-device batch): a ~1 ms step and a ~10 ms one.
SIZES = {"small": (256, 64), "medium": (1024, 256)}


def one_run(traced: bool, width: int, batch: int, steps: int, tmp: Path) -> dict[str, float]:
    """One torchrun of the workload (2 ranks); its in-loop step time and its wall time."""
    out = tmp / f"out-{time.monotonic_ns()}.json"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    workload = [str(HERE / "_workload_script.py")]
    if traced:
        workload = [str(HERE / "_traced_script.py"), str(tmp / f"traces-{out.stem}"), *workload]
    args = ["--steps", str(steps), "--warmup", str(max(steps // 10, 5))]
    args += ["--width", str(width), "--batch", str(batch), "--out", str(out)]
    # torchrun gives the workers their rendezvous: none of this process's (``direct``'s).
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    command = [torchrun, "--standalone", "--nproc-per-node", "2", *workload, *args]
    for attempt in (1, 2):  # a launch that fails twice is the benchmark's failure
        started = time.perf_counter()
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**env, "PYTHONPATH": str(ROOT)},
            timeout=600,
        )
        wall = time.perf_counter() - started
        if done.returncode == 0:
            break
        print(f"torchrun failed (exit {done.returncode}, try {attempt} of 2):", file=sys.stderr)
        print(done.stderr[-3000:], file=sys.stderr)
    else:
        raise SystemExit(f"the {'traced' if traced else 'untraced'} workload failed twice")
    return {"step_s": json.loads(out.read_text())["step_s"], "wall_s": wall}


def measure(pairs: int, steps: int, sizes: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        for size in sizes:
            width, batch = SIZES[size]
            in_loop, end_to_end, untraced_ms = [], [], []
            for i in range(pairs):
                order = (False, True) if i % 2 == 0 else (True, False)
                got = {t: one_run(t, width, batch, steps, tmp) for t in order}
                in_loop.append(got[True]["step_s"] / got[False]["step_s"])
                end_to_end.append(got[True]["wall_s"] / got[False]["wall_s"])
                untraced_ms.append(got[False]["step_s"] * 1000)
                print(
                    f"  {size} pair {i + 1}/{pairs}: in loop {in_loop[-1]:.3f}, "
                    f"end to end {end_to_end[-1]:.3f}",
                    flush=True,
                )
            results[size] = {
                "untraced_step_ms": sorted(untraced_ms)[len(untraced_ms) // 2],
                "in_loop": ratio_stats(in_loop),
                "end_to_end": ratio_stats(end_to_end),
            }
    return results


def direct(blocks: int, steps: int, width: int, batch: int) -> dict[str, Any]:
    """Per-step cost of the hooks, in one process (world size 1, gloo): blocks of ``steps``
    steps alternate between a DDP module built without hooks and one built under them (the
    global hooks installed for its blocks only), each timed as the thread's CPU time. Returns
    both medians, the pairs' differences (their median, and their mean: the cost of the
    flushes, every ``flush_s`` seconds, counted at its weight) and ratios."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from workbench.ports import free_port
    from workbench.trace.torch_hooks import ScriptHooks
    from workbench.trace.tracer import Tracer

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))

    n = batch * steps
    loader = DataLoader(TensorDataset(torch.randn(n, width), torch.randint(0, 10, (n,))), batch)
    with tempfile.TemporaryDirectory() as folder:
        tracer = Tracer(
            Path(folder),
            run_id="direct",
            rank=0,
            local_rank=0,
            host="h",
            world_size=1,
            attempt=0,
            flush_s=2.0,
            device=torch.device("cpu"),
        )
        hooks = ScriptHooks(
            tracer,
            script="direct",
            rank=0,
            world_size=1,
            warmup_steps=0,
            comm_every_steps=50,
            collective_timeout_s=60,
        )
        plain = nn.parallel.DistributedDataParallel(model())
        hooks.install()
        traced = nn.parallel.DistributedDataParallel(model())
        hooks.remove()

        def block(ddp: nn.Module, opt: torch.optim.Optimizer) -> float:
            # The thread's CPU time, not the wall clock: the hooks run on this thread, and the
            # time a loaded host takes the core away from it (tens of us a step on a shared
            # VM, at random) would drown them.
            started = time.thread_time()
            for x, y in loader:
                loss = nn.functional.cross_entropy(ddp(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            return (time.thread_time() - started) / steps

        optimizers = {d: torch.optim.SGD(d.parameters(), lr=0.01) for d in (plain, traced)}
        block(plain, optimizers[plain])
        hooks.install()
        block(traced, optimizers[traced])  # warm both
        hooks.remove()
        untraced_s, traced_s = [], []
        # Short blocks, many pairs: a pair's two blocks run a few milliseconds apart, so what
        # drifts on a shared host (a neighbour's load, the clock) is the same for both. The
        # hooks are removed between blocks, not closed: the log, and the flushes every
        # ``flush_s`` seconds, carry on as in a run, and count at their weight in the mean.
        for i in range(blocks):
            for kind in (0, 1) if i % 2 == 0 else (1, 0):
                if kind:
                    hooks.install()
                    traced_s.append(block(traced, optimizers[traced]))
                    hooks.remove()
                else:
                    untraced_s.append(block(plain, optimizers[plain]))
        hooks.close()
        tracer.close()
    dist.destroy_process_group()
    u, t = float(np.median(untraced_s)), float(np.median(traced_s))
    ratios = [b / a for a, b in zip(untraced_s, traced_s, strict=True)]
    added_us = [(b - a) * 1e6 for a, b in zip(untraced_s, traced_s, strict=True)]
    return {
        "untraced_step_us": u * 1e6,
        "traced_step_us": t * 1e6,
        "hooks_us_per_step": (t - u) * 1e6,
        "added_us": ratio_stats(added_us),  # per pair of blocks: traced minus untraced, a step
        # The mean over pairs counts the flushes (one block in tens holds one) at their weight.
        "added_us_mean": mean_stats(added_us),
        "ratio": ratio_stats(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--sizes", default="small,medium")
    parser.add_argument("--smoke", action="store_true", help="one pair of 20 steps (seconds)")
    parser.add_argument("--direct", action="store_true", help="only the in-process measurement")
    parser.add_argument("--blocks", type=int, default=2000, help="direct: pairs of blocks")
    parser.add_argument("--block-steps", type=int, default=10, help="direct: steps a block")
    parser.add_argument("--out", help="write the result as JSON here")
    a = parser.parse_args()
    pairs, steps = (1, 20) if a.smoke else (a.pairs, a.steps)
    sizes = ["small"] if a.smoke else a.sizes.split(",")
    width, batch = SIZES["small"]
    hooks = direct(2 if a.smoke else a.blocks, 20 if a.smoke else a.block_steps, width, batch)
    mean = hooks["added_us_mean"]
    print(
        f"hooks, measured directly (1 process, {width}-wide mlp, batch {batch}): "
        f"{hooks['untraced_step_us']:.0f} us untraced; traced adds "
        f"{mean['mean']:.1f} us a step [CI95 {mean['ci95_lo']:.1f}-{mean['ci95_hi']:.1f}] "
        f"(mean of pair differences, flushes included), median "
        f"{fmt_ratio(hooks['added_us'], 1)}; ratio {fmt_ratio(hooks['ratio'])}",
        flush=True,
    )
    if a.direct:
        write_result(a.out, "script_overhead", {"machine": machine(), "direct": hooks})
        return
    results = measure(pairs, steps, sizes)
    print("script tracing: traced / untraced under torchrun, 2 ranks (median of pair ratios)")
    for size, r in results.items():
        print(
            f"  {size} (untraced step {r['untraced_step_ms']:.2f} ms): "
            f"in loop {fmt_ratio(r['in_loop'])}; end to end {fmt_ratio(r['end_to_end'])}"
        )
    result = {"machine": machine(), "direct": hooks, "results": results}
    write_result(a.out, "script_overhead", result)


if __name__ == "__main__":
    main()
