"""How long analysing a large sweep takes, against reading its Parquet files with pyarrow alone.

Builds synthetic step traces (default 8 runs x 64 ranks x 2,000 steps, about 1M rows, one file per
rank as the store writes them) in a temporary folder, then times:

1. pyarrow alone: read every file and concatenate (the floor for any loader);
2. the workbench path: the same read into one pandas frame, then scaling_table, phase_breakdown,
   stragglers and the figures (throughput, speedup, phase breakdown, a rank x step heatmap of one
   64-rank run, loss curves);

and prints each stage and the ratio of (2) to (1). One run carries a planted straggler, which the
analysis must find. Each stage is timed ``--repeat`` times and the best kept (timings on a shared
machine vary). Usage: ``python benchmarks/analysis_scale.py [--runs 8 --ranks 64 --steps 2000]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench import analysis
from workbench.schema import STEP_COLUMNS, steps_file
from workbench.ui import plots

ARROW_TYPES = {
    "string": pa.string(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
}
SCHEMA = pa.schema([(name, ARROW_TYPES[t]) for name, t in STEP_COLUMNS.items()])


def write_run(folder: Path, run_id: str, ranks: int, steps: int, straggler: int | None) -> None:
    """One run's per-rank step files: DDP-like times (all ranks wait for the slowest)."""
    rng = np.random.default_rng(abs(hash(run_id)) % 2**32)
    step = np.arange(1, steps + 1)
    compute = 0.05 * (1 + 0.05 * rng.standard_normal((ranks, steps)))
    if straggler is not None:
        compute[straggler, steps // 3 :] *= 1.4
    step_s = compute.max(axis=0) + 0.01
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        comm = step_s - compute[rank]
        cols = {
            "run_id": np.full(steps, run_id, dtype=object),
            "rank": np.full(steps, rank),
            "local_rank": np.full(steps, rank % 8),
            "host": np.full(steps, f"node{rank // 8}", dtype=object),
            "world_size": np.full(steps, ranks),
            "attempt": np.zeros(steps, dtype="int64"),
            "epoch": (step - 1) // 500,
            "step": step,
            "warmup": step <= 5,
            "t_start_s": np.concatenate([[0.0], np.cumsum(step_s)[:-1]]),
            "data_s": np.full(steps, 0.005),
            "forward_s": compute[rank] * 0.3,
            "backward_s": compute[rank] * 0.5 + comm,
            "optimizer_s": compute[rank] * 0.1,
            "step_s": step_s,
            "comm_s": comm,
            "comm_bytes": np.full(steps, 250_000_000),
            "comm_buckets": np.full(steps, 10),
            "samples": np.full(steps, 32),
            "loss": 2.0 * np.exp(-step / 800) + 0.01 * rng.standard_normal(steps),
            "lr": np.full(steps, 1e-3),
            "mem_alloc_bytes": np.full(steps, 2e9),
            "mem_reserved_bytes": np.full(steps, 3e9),
            "mem_peak_bytes": np.full(steps, 2.5e9),
            "mem_device_bytes": np.full(steps, 4e9),
            "rss_bytes": np.full(steps, 3 << 30),
        }
        table = pa.Table.from_pydict({c: cols.get(c) for c in SCHEMA.names}, schema=SCHEMA)
        pq.write_table(table, folder / steps_file(rank))


REPEAT = 3
T = TypeVar("T")


def timed(
    label: str, results: dict[str, float], fn: Callable[..., T], *args: Any, **kwargs: Any
) -> T:
    """Call ``fn`` REPEAT times; keep the best time and the last result."""
    best = float("inf")
    for _ in range(REPEAT):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - start)
    results[label] = best
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    global REPEAT
    REPEAT = max(1, args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        runs = []
        start = time.perf_counter()
        for i in range(args.runs):
            run_id = f"run{i}"
            write_run(root / run_id, run_id, args.ranks, args.steps, 7 if i == 0 else None)
            runs.append(
                {
                    "run_id": run_id,
                    "status": "completed",
                    "model": "transformer",
                    "precision": ("fp32", "fp16")[i % 2],
                    "per_device_batch_size": 32 * (1 + i // 2),
                    "world_size": args.ranks,
                    "train_samples": 1_000_000,
                }
            )
        files = sorted(root.glob("*/steps-rank*.parquet"))
        print(f"wrote {len(files)} files in {time.perf_counter() - start:.1f} s")
        runs_frame = pd.DataFrame(runs)

        pa.concat_tables([pq.read_table(f) for f in files])  # warm the page cache: untimed
        arrow: dict[str, float] = {}
        table = timed(
            "pyarrow read + concat",
            arrow,
            lambda: pa.concat_tables([pq.read_table(f) for f in files]),
        )
        rows = table.num_rows
        del table

        wb: dict[str, float] = {}
        table = timed(
            "pyarrow read + concat", wb, lambda: pa.concat_tables([pq.read_table(f) for f in files])
        )
        steps = timed("to pandas", wb, table.to_pandas)
        del table
        scaling = timed("scaling_table", wb, analysis.scaling_table, runs_frame, steps)
        phases = timed("phase_breakdown", wb, analysis.phase_breakdown, steps)
        found = timed("stragglers", wb, analysis.stragglers, steps)

        def figures() -> list[object]:
            return [
                plots.throughput_per_device_figure(scaling),
                plots.speedup_figure(scaling),
                plots.phase_breakdown_figure(phases, by="run"),
                plots.phase_breakdown_figure(phases, "run0"),
                plots.step_time_heatmap(steps, "run0", value="compute_s"),
                plots.loss_curves_figure(steps),
            ]

        timed("figures (6)", wb, figures)

    print(f"{rows:,} step rows ({args.runs} runs x {args.ranks} ranks x {args.steps} steps)")
    for label, seconds in wb.items():
        print(f"  {label:<24} {seconds:7.3f} s")
    total = sum(wb.values())
    print(
        f"pyarrow alone: {arrow['pyarrow read + concat']:.3f} s; workbench total: {total:.3f} s; "
        f"ratio {total / arrow['pyarrow read + concat']:.1f}x"
    )
    straggler = found[["run_id", "rank", "start_step", "ratio"]].to_dict("records")
    print(f"stragglers found: {straggler}")
    expected = {("run0", 7)}
    assert {(r["run_id"], r["rank"]) for r in straggler} == expected, "planted straggler not found"


if __name__ == "__main__":
    main()
