"""What tracing a user's script costs: the same plain DDP script under torchrun, untraced and
traced by the workbench's hooks (``workbench.trace.torch_hooks``), in interleaved pairs.

Two figures per size, each the median of the pairwise traced/untraced ratios with its bootstrap
95 % interval (``_common.ratio_stats``):

- ``in_loop``: the script's own time per step over its steady window (it times itself, after
  its warm-up steps, between two barriers): what tracing adds to training;
- ``end_to_end``: the whole torchrun command's wall time (start-up, training, exit).

Usage: ``python benchmarks/script_overhead.py [--pairs 8] [--steps 300] [--smoke] [--out F]``.
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

from _common import ROOT, fmt_ratio, machine, ratio_stats, write_result

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
    started = time.perf_counter()
    subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", *workload, *args],
        check=True,
        capture_output=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    wall = time.perf_counter() - started
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--sizes", default="small,medium")
    parser.add_argument("--smoke", action="store_true", help="one pair of 20 steps (seconds)")
    parser.add_argument("--out", help="write the result as JSON here")
    a = parser.parse_args()
    pairs, steps = (1, 20) if a.smoke else (a.pairs, a.steps)
    sizes = ["small"] if a.smoke else a.sizes.split(",")
    results = measure(pairs, steps, sizes)
    print("script tracing: traced / untraced under torchrun, 2 ranks (median of pair ratios)")
    for size, r in results.items():
        print(
            f"  {size} (untraced step {r['untraced_step_ms']:.2f} ms): "
            f"in loop {fmt_ratio(r['in_loop'])}; end to end {fmt_ratio(r['end_to_end'])}"
        )
    write_result(a.out, "script_overhead", {"machine": machine(), "results": results})


if __name__ == "__main__":
    main()
