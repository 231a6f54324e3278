"""Scaling fidelity: the throughput and the 2-over-1-rank speedup a workbench run reports, over
those of a plain ``torchrun`` DDP script (``plain_ddp.py``) running the same job.

Same model, same synthetic dataset (``workbench.data.build_datasets``), same per-device batch, one
thread per rank, same warm-up steps left out, same window definition (first measured step start
to last step end across ranks). The workbench figure is what a user reads:
``the run's `samples_per_s` summary (`run.json`)`` after ``launch()`` and ``wait()``.

Each repeat runs the four jobs (workbench and torchrun at 1 and 2 ranks) with the two variants
interleaved and their order alternating between repeats, so load hits both; the figures are the
medians of the per-repeat ratios.

Usage: ``python benchmarks/scaling_fidelity.py [--models transformer] [--repeats 4] [--quick]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_ratio, ratio_stats, write_result  # noqa: E402
from _jobs import run_torchrun, run_workbench  # noqa: E402

#: Steps per run: enough that the measured window is several seconds long on this machine.
STEPS = {"mlp": 400, "transformer": 100, "cnn": 100, "gpt": 100}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="transformer")
    parser.add_argument("--batch", type=int, default=32, help="per-device batch size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one repeat of short runs")
    parser.add_argument("--json", help="write the result here")
    a = parser.parse_args(argv)
    repeats = 1 if a.quick else a.repeats
    rows = []
    for model in a.models.split(","):
        steps = 20 if a.quick else STEPS.get(model, 100)
        # Enough samples that 2 ranks never cross an epoch boundary (none at 1 rank either).
        samples = max(4096, 2 * a.batch * (steps + 1))
        runs: dict[tuple[str, int], list[float]] = {}
        for r in range(repeats):
            # Alternate which variant goes first, so a load trend does not favour one.
            variants = ("workbench", "torchrun") if r % 2 == 0 else ("torchrun", "workbench")
            for world_size in (1, 2):
                for variant in variants:
                    job = run_workbench if variant == "workbench" else run_torchrun
                    out = job(model, world_size, a.batch, steps, a.warmup, samples)
                    runs.setdefault((variant, world_size), []).append(out["samples_per_s"])
                    print(
                        f"  {model} repeat {r} {variant:<9} {world_size} rank(s): "
                        f"{out['samples_per_s']:8.1f} samples/s",
                        flush=True,
                    )
        wb1, wb2 = runs[("workbench", 1)], runs[("workbench", 2)]
        tr1, tr2 = runs[("torchrun", 1)], runs[("torchrun", 2)]
        row = {
            "model": model,
            "batch": a.batch,
            "steps": steps,
            "repeats": repeats,
            "runs": {f"{v}_{w}": x for (v, w), x in runs.items()},
            "throughput_1": ratio_stats([w / t for w, t in zip(wb1, tr1, strict=True)]),
            "throughput_2": ratio_stats([w / t for w, t in zip(wb2, tr2, strict=True)]),
            "speedup_workbench": ratio_stats([b / a_ for a_, b in zip(wb1, wb2, strict=True)]),
            "speedup_torchrun": ratio_stats([b / a_ for a_, b in zip(tr1, tr2, strict=True)]),
            "speedup": ratio_stats(
                [(w2 / w1) / (t2 / t1) for w1, w2, t1, t2 in zip(wb1, wb2, tr1, tr2, strict=True)]
            ),
        }
        rows.append(row)
        print(f"{model}: workbench/torchrun throughput 1 rank {fmt_ratio(row['throughput_1'])}")
        print(f"{model}: workbench/torchrun throughput 2 ranks {fmt_ratio(row['throughput_2'])}")
        print(
            f"{model}: speedup workbench {row['speedup_workbench']['median']:.3f}, torchrun "
            f"{row['speedup_torchrun']['median']:.3f}, ratio {fmt_ratio(row['speedup'])}"
        )
    result = {"rows": rows}
    write_result(a.json, "scaling_fidelity", result)
    return result


if __name__ == "__main__":
    main()
