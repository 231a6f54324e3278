"""DuckDB against Polars (lazy) on the same query over a store's step files: the one the straggler
ranking starts from (each run's measured rows, only the phase columns, a per-rank median of the
compute on DDP's sampled steps) and each run's throughput window. Each engine runs in a fresh
process; prints wall time and peak RSS. ``--smoke``: a small sweep (seconds). Usage:
``python benchmarks/engine_compare.py [--smoke] [--store DIR --max-ranks 512 --steps 10000]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _scale_store import SWEEP, write_sweep  # noqa: E402

_HEAD = """
import json, resource, sys, time
from pathlib import Path
files = sorted(str(p) for p in Path(sys.argv[1]).glob("*/*/traces/steps-rank*.parquet"))
start = time.perf_counter()
"""
_TAIL = """
print(json.dumps({"seconds": time.perf_counter() - start, "rows": len(per_rank),
                  "runs": len(window),
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
ENGINES = {
    "duckdb": """
import duckdb
con = duckdb.connect(); con.execute("SET memory_limit = '256MB'"); con.execute("SET threads = 2")
src = "read_parquet(" + repr(files) + ")"
per_rank = con.execute(f'''SELECT run_id, rank, median(data_s + forward_s + optimizer_s
    + backward_compute_s) AS compute_s FROM {src} WHERE NOT warmup
    AND backward_compute_s IS NOT NULL GROUP BY ALL''').df()
window = con.execute(f'''SELECT run_id, max(t_start_s + step_s) - min(t_start_s) AS wall_s,
    sum(samples) AS samples FROM {src} WHERE NOT warmup GROUP BY ALL''').df()
""",
    "polars": """
import polars as pl
lf = pl.scan_parquet(files).filter(~pl.col("warmup"))
per_rank = (lf.filter(pl.col("backward_compute_s").is_not_null())
    .group_by("run_id", "rank").agg((pl.col("data_s") + pl.col("forward_s")
    + pl.col("optimizer_s") + pl.col("backward_compute_s")).median().alias("compute_s"))
    .collect())
window = (lf.group_by("run_id").agg(((pl.col("t_start_s") + pl.col("step_s")).max()
    - pl.col("t_start_s").min()).alias("wall_s"), pl.col("samples").sum()).collect())
""",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--max-ranks", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--store", type=Path)
    parser.add_argument("--repeat", type=int, default=3, help="rounds, the engines alternating")
    args = parser.parse_args()
    if args.smoke:
        args.max_ranks, args.steps, args.repeat = 8, 300, 1
    counts = [2**i for i in range(args.max_ranks.bit_length())]
    with tempfile.TemporaryDirectory() as tmp:
        root = args.store or Path(tmp)
        if not (root / SWEEP).exists():
            write_sweep(root, counts, args.steps)
        for round_ in range(max(1, args.repeat)):
            order = list(ENGINES) if round_ % 2 == 0 else list(ENGINES)[::-1]
            for name in order:
                done = subprocess.run(
                    [sys.executable, "-c", _HEAD + ENGINES[name] + _TAIL, str(root)],
                    capture_output=True,
                    text=True,
                )
                if done.returncode:
                    print(f"{name}: failed ({done.stderr.strip().splitlines()[-1]})")
                    continue
                got = json.loads(done.stdout)
                print(
                    f"round {round_ + 1}: {name:<7} {got['seconds']:7.2f} s  peak RSS "
                    f"{got['peak_rss_mib']:6.0f} MiB  ({got['rows']} rank rows, {got['runs']} runs)"
                )


if __name__ == "__main__":
    main()
