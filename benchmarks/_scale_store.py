"""A large sweep written in the store's own layout, for the analysis benchmarks.

Runs at 1, 2, 4 ... ranks (on one node up to 8, then on whole nodes of 8: one scaling curve
across them), each rank's steps in ``traces/steps-rankNNNNN.parquet`` beside the run's
``run.json``, as the launcher and the ranks leave them. Times are DDP-like: every rank's step ends
when the slowest rank's compute and the transfer are done; DDP's reducer timers
(``comm_s``, ``backward_compute_s``, ``comm_exposed_s``) are on sampled steps only (every
``every``-th step, null in between), as the tracer writes them with ``trace_comm="sampled"``. One
rank of the largest run is slow (``slow_factor`` times the others' compute, in its forward and
backward compute) from a third of the steps on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench import schema  # noqa: E402
from workbench.config.run_config import RunConfig  # noqa: E402
from workbench.store.arrow_stream import arrow_schema  # noqa: E402
from workbench.store.files import write_json  # noqa: E402

SWEEP = "scale"
SLOW_RANK = 7
#: Ranks a node (``host`` is ``node<rank // 8>``): a run of more is on whole nodes of 8.
RANKS_PER_NODE = 8


def _rank_table(
    run_id: str,
    ranks: int,
    rank: int,
    steps: int,
    every: int,
    compute: np.ndarray,
    step_s: np.ndarray,
    warmup: int,
    rng: np.random.Generator,
) -> pa.Table:
    """One rank's step rows: compute split into data 10 %, forward 30 %, backward compute 50 %
    and optimizer 10 %; the step's rest is the wait plus the transfer."""
    step = np.arange(1, steps + 1)
    mine = compute[rank]
    sampled = (step % every == 0) & (ranks > 1)
    wait = step_s - mine
    nan = np.full(steps, np.nan)
    cols = {
        "run_id": pa.array([run_id] * steps, pa.string()),
        "rank": np.full(steps, rank),
        "local_rank": np.full(steps, rank % 8),
        "host": pa.array([f"node{rank // RANKS_PER_NODE:03d}"] * steps, pa.string()),
        "world_size": np.full(steps, ranks),
        "attempt": np.zeros(steps, dtype="int64"),
        "epoch": (step - 1) // 2000,
        "step": step,
        "warmup": step <= warmup,
        "t_start_s": np.concatenate([[0.0], np.cumsum(step_s + 0.001)[:-1]]),
        "data_s": mine * 0.1,
        "forward_s": mine * 0.3,
        "backward_s": mine * 0.5 + wait,
        "optimizer_s": mine * 0.1,
        "step_s": step_s,
        "gap_s": np.where(step < steps, 0.001, np.nan),
        "save_s": nan,
        "comm_s": np.where(sampled, wait + mine * 0.3, np.nan),
        "backward_compute_s": np.where(sampled, mine * 0.5, np.nan),
        "comm_exposed_s": np.where(sampled, wait, np.nan),
        "comm_bytes": np.full(steps, 250_000_000 if ranks > 1 else 0),
        "comm_buckets": np.full(steps, 10),
        "samples": np.full(steps, 32),
        "tokens": np.full(steps, 32 * 128),
        "loss": 2.0 * np.exp(-step / 3000) + 0.01 * rng.standard_normal(steps),
        "lr": np.full(steps, 1e-3),
        "mem_alloc_bytes": nan,
        "mem_reserved_bytes": nan,
        "mem_peak_bytes": nan,
        "mem_device_bytes": nan,
        "rss_bytes": np.full(steps, 3 << 30),
    }
    target = arrow_schema(schema.STEP_COLUMNS)
    arrays = []
    for f in target:
        if f.name not in cols:  # FSDP2's collectives (schema 2): null in a DDP run, as traced
            arrays.append(pa.nulls(steps, f.type))
            continue
        value = cols[f.name]
        if f.type == pa.float64():  # nulls where the tracer writes none, never NaN
            arr = np.asarray(value, dtype="float64")
            arrays.append(pa.array(arr, f.type, mask=np.isnan(arr)))
        else:
            arrays.append(pa.array(value, f.type))
    return pa.Table.from_arrays(arrays, schema=target)


def write_sweep(
    root: Path,
    rank_counts: list[int],
    steps: int,
    every: int = 50,
    slow_factor: float = 1.35,
    warmup: int = 5,
) -> list[Path]:
    """Write the sweep under ``root/scale/``; return the run folders. The largest run's rank
    ``SLOW_RANK`` (or its last rank, when it has fewer) is the planted straggler."""
    largest = max(rank_counts)
    folders = []
    for ranks in rank_counts:
        run_id = f"ws{ranks:04d}"
        rng = np.random.default_rng(ranks)
        compute = 0.05 * (1 + 0.03 * rng.standard_normal((ranks, steps)))
        if ranks == largest and ranks > 1:
            compute[min(SLOW_RANK, ranks - 1), steps // 3 :] *= slow_factor
        step_s = compute.max(axis=0) + (0.004 if ranks > 1 else 0.0)
        # laid out as the hosts say: one node up to RANKS_PER_NODE ranks, then whole nodes
        nodes = max(1, ranks // RANKS_PER_NODE)
        cfg = RunConfig(
            output_dir=str(root),
            sweep=SWEEP,
            run_name=run_id,
            world_size=ranks,
            nodes=nodes,
            tasks_per_node=RANKS_PER_NODE if nodes > 1 else None,
            per_device_batch_size=32,
            max_steps=steps,
            warmup_steps=warmup,
            trace_comm="sampled",
            trace_comm_every_steps=every,
            train_samples=10**9,
        )
        path = root / SWEEP / run_id
        traces = path / schema.TRACES_DIR
        traces.mkdir(parents=True, exist_ok=True)
        write_json(path / schema.CONFIG_FILE, cfg.to_dict())
        run = {
            "run_id": run_id,
            "sweep": SWEEP,
            "status": "completed",
            "config": cfg.to_dict(),
            "ended_at": 1.0,
        }
        write_json(path / schema.RUN_FILE, run)
        for rank in range(ranks):
            table = _rank_table(run_id, ranks, rank, steps, every, compute, step_s, warmup, rng)
            pq.write_table(table, traces / schema.steps_file(rank))
        folders.append(path)
    return folders


def planted(rank_counts: list[int]) -> tuple[str, int]:
    """The run and rank of the planted straggler."""
    largest = max(rank_counts)
    return f"ws{largest:04d}", min(SLOW_RANK, largest - 1)
