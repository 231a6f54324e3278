"""Launch latency: from ``launch()`` to the first step on every rank, and to the result
(``wait()`` returning), against ``torchrun`` launching the same 2-rank job (``plain_ddp.py``:
first step start on every rank, and the process's exit).

The job is tiny (mlp, 5 steps) so that the figures are the launch itself. The workbench's first
step on each rank is the rank's ``t0_unix`` (its summary) plus the first step's ``t_start_s`` (its
trace); the result includes what ``wait()`` does after the ranks end (the run summary). The two
launchers alternate, order swapped every repeat; figures are medians of per-repeat ratios.

Usage: ``python benchmarks/launch_latency.py [--repeats 6] [--smoke] [--json out.json]``;
``--smoke`` (alias ``--quick``): one repeat at 1 rank, a check of the harness.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_ratio, ratio_stats, write_result  # noqa: E402
from _jobs import run_torchrun, run_workbench  # noqa: E402


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument(
        "--smoke", "--quick", dest="smoke", action="store_true", help="one repeat at 1 rank"
    )
    parser.add_argument("--json", help="write the result here")
    a = parser.parse_args(argv)
    repeats = 1 if a.smoke else a.repeats
    world_size = 1 if a.smoke else a.world_size
    job = dict(model="mlp", world_size=world_size, batch=32, steps=5, warmup=2, train_samples=4096)
    got: dict[str, list[dict[str, Any]]] = {"workbench": [], "torchrun": []}
    for r in range(repeats):
        order = ("workbench", "torchrun") if r % 2 == 0 else ("torchrun", "workbench")
        for variant in order:
            out = (run_workbench if variant == "workbench" else run_torchrun)(**job)
            got[variant].append(out)
            print(
                f"  repeat {r} {variant:<9} first step on all ranks "
                f"{out['to_first_step_all_s']:5.2f} s, result {out['to_result_s']:5.2f} s",
                flush=True,
            )
    wb, tr = got["workbench"], got["torchrun"]
    result: dict[str, Any] = {"job": job, "repeats": repeats}
    for point in ("to_first_step_all_s", "to_result_s"):
        result[point] = {
            "workbench_median_s": statistics.median(x[point] for x in wb),
            "torchrun_median_s": statistics.median(x[point] for x in tr),
            "ratio": ratio_stats([w[point] / t[point] for w, t in zip(wb, tr, strict=True)]),
        }
        p = result[point]
        print(
            f"{point}: workbench {p['workbench_median_s']:.2f} s, torchrun "
            f"{p['torchrun_median_s']:.2f} s, ratio {fmt_ratio(p['ratio'])}"
        )
    result["workbench_to_submitted_s"] = statistics.median(x["to_submitted_s"] for x in wb)
    write_result(a.json, "launch_latency", result)
    return result


if __name__ == "__main__":
    main()
