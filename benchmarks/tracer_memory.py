"""Tracer memory over a long run: a Tracer driven directly for 100,000 steps with realistic rows (no
model), RSS sampled every 10,000 steps. The tracer's buffer is bounded (rows leave memory at every
flush, appended to the rank's Arrow stream file: every ``flush_s`` seconds or 2,000 rows), so RSS
must stay flat.

Two passes, in a fresh process each: RSS from /proc (what the trace's ``rss_bytes`` column shows),
then ``tracemalloc`` (Python allocations only: exact, immune to allocator caching, but slower).
Growth is reported from the first sample (after 10,000 steps, once the buffer and Arrow's
allocations reached steady state) to the last, and from before the first step.

Usage: ``python benchmarks/tracer_memory.py [--steps 100000] [--every 10000] [--smoke]
[--json out.json]``; ``--smoke`` (alias ``--quick``): 2,000 steps sampled every 500.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402


def drive(steps: int, every: int, mode: str) -> dict[str, Any]:
    """Run the tracer for ``steps`` steps in this process; samples of memory (bytes)."""
    import torch

    from workbench.trace.tracer import Tracer, rss_bytes

    def measure() -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0] if mode == "tracemalloc" else rss_bytes()

    if mode == "tracemalloc":
        tracemalloc.start()
    samples = []
    with tempfile.TemporaryDirectory(prefix="wb-bench-mem-") as tmp:
        tracer = Tracer(
            Path(tmp),
            run_id="transformer-w2-20260101-000000-abcd",
            rank=1,
            local_rank=1,
            host="node-0001",
            world_size=2,
            attempt=0,
            flush_s=2.0,
            device=torch.device("cpu"),
        )
        tracer.set_t0()
        samples.append((0, measure()))
        start = time.process_time()  # CPU time: the wall clock of a loaded machine says little
        for step in range(1, steps + 1):
            x = 0.003 * (1 + (step % 13) / 50)
            t = step * 0.0031
            tracer.step(
                epoch=step // 128,
                step=step,
                warmup=step <= 2,
                t_start_s=t,
                # PhaseClock.stop()'s stamps: data, forward, backward, optimizer
                phases=(t, t + x / 10, t + 1.1 * x, t + 3.1 * x, t + 3.43 * x),
                comm_s=x / 2 if step % 10 == 0 else None,
                comm_bytes=417_808,
                comm_buckets=1,
                samples=32,
                loss=2.0 / (1 + step * 1e-4),
                lr=0.05,
            )
            if step % every == 0:
                samples.append((step, measure()))
        elapsed = time.process_time() - start
        # Samples at multiples of 10,000 steps fall right after a 2,000-row flush; the peak shows
        # the bound the buffer reaches between flushes.
        peak = tracemalloc.get_traced_memory()[1] if mode == "tracemalloc" else None
        tracer.close()
        file_bytes = sum(p.stat().st_size for p in Path(tmp).iterdir())
    return {
        "mode": mode,
        "samples": samples,
        "cpu_us_per_step": elapsed / steps * 1e6,
        "tracemalloc_peak_bytes": peak,
        "trace_file_bytes": file_bytes,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10_000)
    parser.add_argument(
        "--smoke", "--quick", dest="smoke", action="store_true", help="2,000 steps (seconds)"
    )
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--child", choices=("rss", "tracemalloc"), help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    steps, every = (2_000, 500) if a.smoke else (a.steps, a.every)
    if a.child:  # one pass in this fresh process
        print(json.dumps(drive(steps, every, a.child)))
        return {}
    result: dict[str, Any] = {"steps": steps, "every": every}
    for mode in ("rss", "tracemalloc"):
        cmd = [
            sys.executable,
            __file__,
            "--child",
            mode,
            "--steps",
            str(steps),
            "--every",
            str(every),
        ] + (["--smoke"] if a.smoke else [])
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        s = out["samples"]
        out["growth_from_first_sample_bytes"] = s[-1][1] - s[1][1]
        out["growth_from_start_bytes"] = s[-1][1] - s[0][1]
        out["max_minus_min_after_first_sample_bytes"] = max(v for _, v in s[1:]) - min(
            v for _, v in s[1:]
        )
        result[mode] = out
        print(f"{mode}: " + ", ".join(f"{k // 1000}k {v / 2**20:.2f}" for k, v in s) + " MiB")
        print(
            f"{mode}: growth {out['growth_from_first_sample_bytes'] / 1024:+.0f} KiB from step "
            f"{s[1][0]} to {s[-1][0]} ({out['growth_from_start_bytes'] / 1024:+.0f} KiB from "
            f"step 0); {out['cpu_us_per_step']:.1f} us CPU/step; trace file "
            f"{out['trace_file_bytes'] / 2**20:.1f} MiB"
        )
        if out["tracemalloc_peak_bytes"] is not None:
            print(
                f"tracemalloc: peak {out['tracemalloc_peak_bytes'] / 2**20:.2f} MiB over the run "
                "(the row buffer just before a flush)"
            )
    write_result(a.json, "tracer_memory", result)
    return result


if __name__ == "__main__":
    main()
