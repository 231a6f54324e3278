"""Scaling fidelity: the throughput and the 2-over-1-rank speedup a workbench run reports, over
those of a plain ``torchrun`` DDP script (``plain_ddp.py``) running the same job.

Same model, same synthetic dataset (``workbench.data.build_datasets``), same per-device batch, one
thread per rank, same warm-up steps left out, same window definition (first measured step start
to last step end across ranks). The workbench figure is what a user reads:
``the run's `samples_per_s` summary (`run.json`)`` after ``launch()`` and ``wait()``.

Each repeat runs the four jobs (workbench and torchrun at 1 and 2 ranks) with the two variants
interleaved and their order alternating between repeats, so load hits both; the figures are the
medians of the per-repeat ratios.

On a GPU machine, ``--device cuda`` runs both on CUDA (NCCL, one GPU per rank; 2 ranks need 2
GPUs, ``--world-sizes 1`` is the 1-GPU form), with ``--model-size distilbert`` for seed 002's size
and ``--precision fp16``. Without them the jobs are the CPU ones (gloo, one thread per rank).

Usage: ``python benchmarks/scaling_fidelity.py [--models transformer] [--repeats 4] [--smoke]
[--device cuda] [--model-size distilbert] [--precision fp16] [--world-sizes 1,2]
[--json out.json]``; ``--smoke`` (alias ``--quick``): one repeat of 10 mlp steps at 1 rank, a
check of the harness.
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="transformer")
    parser.add_argument("--batch", type=int, default=32, help="per-device batch size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--smoke",
        "--quick",
        dest="smoke",
        action="store_true",
        help="one repeat of 10 mlp steps at 1 rank",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model-size", help="a size preset of the model, e.g. distilbert")
    parser.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp32")
    parser.add_argument(
        "--world-sizes", default="1,2", help="1,2 (throughput and speedup) or 1 (one GPU)"
    )
    parser.add_argument("--json", help="write the result here")
    return parser.parse_args(argv)


def job_options(a: argparse.Namespace) -> dict[str, Any]:
    """What the jobs get beyond the CPU defaults (nothing on CPU at the default size, so the CPU
    jobs are exactly the ones measured before these options existed)."""
    given = {"device": a.device, "model_size": a.model_size, "precision": a.precision}
    defaults = {"device": "cpu", "model_size": None, "precision": "fp32"}
    return {k: v for k, v in given.items() if v != defaults[k]}


def measure(
    a: argparse.Namespace, model: str, steps: int, world_sizes: list[int]
) -> dict[tuple[str, int], list[float]]:
    """samples/s per (variant, world size), one entry per repeat."""
    repeats = 1 if a.smoke else a.repeats
    # Enough samples that 2 ranks never cross an epoch boundary (none at 1 rank either).
    samples = max(4096, 2 * a.batch * (steps + 1))
    runs: dict[tuple[str, int], list[float]] = {}
    for r in range(repeats):
        # Alternate which variant goes first, so a load trend does not favour one.
        variants = ("workbench", "torchrun") if r % 2 == 0 else ("torchrun", "workbench")
        for world_size in world_sizes:
            for variant in variants:
                job = run_workbench if variant == "workbench" else run_torchrun
                out = job(model, world_size, a.batch, steps, a.warmup, samples, **job_options(a))
                runs.setdefault((variant, world_size), []).append(out["samples_per_s"])
                print(
                    f"  {model} repeat {r} {variant:<9} {world_size} rank(s): "
                    f"{out['samples_per_s']:8.1f} samples/s",
                    flush=True,
                )
    return runs


def ratios(runs: dict[tuple[str, int], list[float]]) -> dict[str, Any]:
    """Workbench over torchrun throughput per world size; with 1 and 2 ranks, the speedups."""
    out: dict[str, Any] = {}
    for (variant, world_size), wb in runs.items():
        if variant == "workbench":
            tr = runs[("torchrun", world_size)]
            out[f"throughput_{world_size}"] = ratio_stats(
                [w / t for w, t in zip(wb, tr, strict=True)]
            )
    if ("workbench", 2) in runs and ("workbench", 1) in runs:
        wb1, wb2 = runs[("workbench", 1)], runs[("workbench", 2)]
        tr1, tr2 = runs[("torchrun", 1)], runs[("torchrun", 2)]
        out["speedup_workbench"] = ratio_stats([b / a_ for a_, b in zip(wb1, wb2, strict=True)])
        out["speedup_torchrun"] = ratio_stats([b / a_ for a_, b in zip(tr1, tr2, strict=True)])
        out["speedup"] = ratio_stats(
            [(w2 / w1) / (t2 / t1) for w1, w2, t1, t2 in zip(wb1, wb2, tr1, tr2, strict=True)]
        )
    return out


def report(model: str, row: dict[str, Any], world_sizes: list[int]) -> None:
    for n in world_sizes:
        ranks = f"{n} rank" if n == 1 else f"{n} ranks"
        ratio = fmt_ratio(row[f"throughput_{n}"])
        print(f"{model}: workbench/torchrun throughput {ranks} {ratio}")
    if "speedup" in row:
        print(
            f"{model}: speedup workbench {row['speedup_workbench']['median']:.3f}, torchrun "
            f"{row['speedup_torchrun']['median']:.3f}, ratio {fmt_ratio(row['speedup'])}"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    world_sizes = [1] if a.smoke else [int(n) for n in a.world_sizes.split(",")]
    rows = []
    for model in ["mlp"] if a.smoke else a.models.split(","):
        steps = 10 if a.smoke else STEPS.get(model, 100)
        runs = measure(a, model, steps, world_sizes)
        row = {
            "model": model,
            "batch": a.batch,
            "steps": steps,
            "repeats": 1 if a.smoke else a.repeats,
            "device": a.device,
            "model_size": a.model_size,
            "precision": a.precision,
            "runs": {f"{v}_{w}": x for (v, w), x in runs.items()},
            **ratios(runs),
        }
        rows.append(row)
        report(model, row, world_sizes)
    result = {"rows": rows}
    write_result(a.json, "scaling_fidelity", result)
    return result


if __name__ == "__main__":
    main()
