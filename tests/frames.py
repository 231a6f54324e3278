"""Hand-built trace frames with answers that can be worked out on paper.

Every rank runs the same back-to-back steps: step k (from 1) starts at ``(k - 1) * step_s`` on all
ranks, so a run's measured window is ``measured steps * step_s`` seconds. :func:`write_run` puts
such frames into a store folder, as the launcher and the ranks leave it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import schema
from workbench.config.run_config import RunConfig
from workbench.schema import EVAL_COLUMNS, STEP_COLUMNS
from workbench.store.files import write_json

#: FSDP2's columns (trace schema 2), per kind and part
FSDP_KINDS, FSDP_PARTS = ("all_gather", "reduce_scatter"), ("bytes", "s", "exposed_s", "calls")


def make_steps(
    run_id: str = "r1",
    world_size: int = 2,
    n_steps: int = 10,
    warmup_steps: int = 2,
    step_s: float = 1.0,
    data_s: float = 0.1,
    forward_s: float = 0.2,
    backward_s: float = 0.5,
    optimizer_s: float = 0.1,
    comm_s: float = 0.3,
    comm_bytes: int = 1_000_000,
    comm_buckets: int = 1,
    samples: int = 8,
    loss0: float = 2.0,
    loss_drop: float = 0.1,
    rss_bytes: int = 1 << 30,
    cuda: bool = False,
    attempt: int = 0,
) -> pd.DataFrame:
    """One run's step rows for every rank, in the schema's columns and dtypes."""
    ranks = np.repeat(np.arange(world_size), n_steps)
    step = np.tile(np.arange(1, n_steps + 1), world_size)
    n = len(step)
    frame = pd.DataFrame(
        {
            "run_id": run_id,
            "rank": ranks,
            "local_rank": ranks % 8,
            "host": [f"node{r // 8}" for r in ranks],
            "world_size": world_size,
            "attempt": attempt,
            "epoch": 0,
            "step": step,
            "warmup": step <= warmup_steps,
            "t_start_s": (step - 1) * step_s,
            "data_s": data_s,
            "forward_s": forward_s,
            "backward_s": backward_s,
            "optimizer_s": optimizer_s,
            "step_s": step_s,
            "gap_s": np.where(step < n_steps, 0.0, np.nan),  # back to back; none after the last
            "save_s": np.nan,
            "comm_s": comm_s if world_size > 1 else 0.0,
            "comm_bytes": comm_bytes if world_size > 1 else 0,
            "comm_buckets": comm_buckets,
            "backward_compute_s": np.nan,
            "comm_exposed_s": np.nan,
            # no FSDP here: its columns (trace schema 2) are 0, which the int64 cast takes; a
            # real DDP trace has them null
            **{f"{kind}_{what}": 0 for kind in FSDP_KINDS for what in FSDP_PARTS},
            "samples": samples,
            "tokens": samples * 8,  # as if each sample held 8 token ids
            "loss": loss0 - loss_drop * (step - 1),
            "lr": 0.1,
            "mem_alloc_bytes": np.full(n, 2e9) if cuda else np.nan,
            "mem_reserved_bytes": np.full(n, 3e9) if cuda else np.nan,
            "mem_peak_bytes": (2.5e9 + 1e6 * ranks) if cuda else np.nan,
            "mem_device_bytes": np.full(n, 4e9) if cuda else np.nan,
            "rss_bytes": rss_bytes + (1 << 20) * ranks,
        }
    )
    missing = [c for c in STEP_COLUMNS if c not in frame.columns]
    assert not missing, f"frames.make_steps does not fill the schema's new columns {missing}"
    return frame[list(STEP_COLUMNS)].astype(STEP_COLUMNS)


def make_evals(
    run_id: str = "r1",
    world_size: int = 2,
    eval_steps: Sequence[int] = (5, 10),
    metric_values: Sequence[float] = (0.5, 0.8),
    step_s: float = 1.0,
    predict_s: float = 0.4,
    gather_s: float = 0.1,
    metric_s: float = 0.2,
    broadcast_s: float = 0.05,
    samples: int = 16,
    metric_name: str = "accuracy",
    wait_s: float = 0.0,
) -> pd.DataFrame:
    """Evaluation rows after the given steps; rank 0 computes the metric, rank r gathers longer.

    Evaluation after step k starts at ``k * step_s`` and lasts ``predict + wait + gather +
    metric + broadcast`` on rank 0 (the other ranks have no metric time and
    ``gather_s * (1 + r)``).
    """
    rows = []
    for k, value in zip(eval_steps, metric_values, strict=True):
        for rank in range(world_size):
            gather = gather_s * (1 + rank)
            metric = metric_s if rank == 0 else 0.0
            rows.append(
                {
                    "run_id": run_id,
                    "rank": rank,
                    "world_size": world_size,
                    "attempt": 0,
                    "epoch": 0,
                    "step": k,
                    "t_start_s": k * step_s,
                    "predict_s": predict_s,
                    "wait_s": wait_s,
                    "gather_s": gather,
                    "metric_s": metric,
                    "broadcast_s": broadcast_s,
                    "eval_s": predict_s + wait_s + gather + metric + broadcast_s,
                    "samples": samples,
                    "metric_name": metric_name,
                    "metric_value": value,
                    "loss": 1.0 - value,
                }
            )
    return pd.DataFrame(rows).astype(EVAL_COLUMNS)


def make_runs(rows: Sequence[dict[str, object]]) -> pd.DataFrame:
    """The runs frame: one row per run, config columns flattened, with defaults filled in."""
    defaults: dict[str, object] = {
        "sweep": "test",
        "status": "completed",
        "model": "mlp",
        "precision": "fp32",
        "per_device_batch_size": 8,
        "optimizer": "sgd",
        "learning_rate": 0.1,
        "train_samples": 640,
        "nodes": 1,
    }
    out = pd.DataFrame([{**defaults, **row} for row in rows])
    if "global_batch_size" not in out.columns:
        out["global_batch_size"] = out["per_device_batch_size"] * out["world_size"]
    return out


#: Step time (s) of the standard sweep at each world size: 8 samples per rank per step.
SWEEP_STEP_S = {1: 1.0, 2: 1.25, 4: 1.6}


def scaling_sweep(
    step_s: dict[int, float] | None = None, evals: bool = True
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """runs, steps, evals of a weak-scaling sweep over world sizes 1, 2, 4 (10 steps, 2 warm-up).

    Training throughput = 8 samples * N ranks / step_s: 8, 12.8 and 20 samples/s; speedup 1.6
    and 2.5; efficiency 0.8 and 0.625. With ``evals`` the evaluation after step 5 (the slowest
    rank's: 0.75 s at N = 1 and 2, 0.85 s at N = 4) sits inside the measured window: steps 6 on
    start that much later, and the window is 8 step_s plus it end to end. Backward is 0.5 s at
    N=1 and grows with N (exposed allreduce).
    """
    step_s = step_s or SWEEP_STEP_S
    runs, steps, ev = [], [], []
    for n, s in step_s.items():
        run_id = f"ws{n}"
        runs.append({"run_id": run_id, "world_size": n})
        extra = s - step_s[min(step_s)]
        steps.append(make_steps(run_id, world_size=n, step_s=s, backward_s=0.5 + extra))
        run_ev = make_evals(run_id, world_size=n, step_s=s, metric_values=(0.5, 0.9 - 0.05 * n))
        if evals:  # the evaluations take their time between the steps
            steps[-1], run_ev = room_for_evals(steps[-1], run_ev)
        ev.append(run_ev)
    return (
        make_runs(runs),
        pd.concat(steps, ignore_index=True),
        pd.concat(ev, ignore_index=True) if evals else pd.DataFrame(columns=list(EVAL_COLUMNS)),
    )


def room_for_evals(steps: pd.DataFrame, evals: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``steps`` and ``evals`` of one run with each evaluation given its time: every step and
    evaluation after the evaluation of step k starts later by that evaluation's slowest rank's
    ``eval_s`` (the ranks wait for each other before the next step)."""
    longest = evals.groupby("step")["eval_s"].max().sort_index()
    steps, evals = steps.copy(), evals.copy()
    for k, seconds in longest.items():
        steps.loc[steps["step"] > k, "t_start_s"] += seconds
        evals.loc[evals["step"] > k, "t_start_s"] += seconds
    return steps, evals


def ddp_steps(
    world_size: int = 8,
    n_steps: int = 100,
    slow_rank: int | None = None,
    slow_from: int = 40,
    slow_until: int | None = None,
    factor: float = 1.5,
    noise: float = 0.0,
) -> pd.DataFrame:
    """DDP-like steps: every rank's step ends when the slowest rank's compute plus 0.1 s of
    transfer is done; each rank's comm_s is its wait plus the transfer. A rank's compute is
    data 0.1 + forward 0.2 + optimizer 0.1 s and its backward compute (DDP's timer on every
    step, 0.2 s; a slow rank's extra is all in it); its backward_s holds the wait too."""
    steps = make_steps("d", world_size=world_size, n_steps=n_steps, step_s=1.0)
    rng = np.random.default_rng(0)
    compute = 0.6 * (1 + noise * rng.uniform(-1, 1, len(steps)))
    if slow_rank is not None:
        until = slow_until or n_steps
        hit = (steps["rank"] == slow_rank) & steps["step"].between(slow_from, until)
        compute = np.where(hit, compute * factor, compute)
    steps["_c"] = compute
    step_s = steps.groupby("step")["_c"].transform("max") + 0.1
    steps["step_s"] = step_s
    steps["comm_s"] = step_s - steps["_c"]
    steps["backward_compute_s"] = steps["_c"] - 0.4
    steps["backward_s"] = step_s - 0.4
    return steps.drop(columns="_c")


def write_scaling_sweep(store: Path, sweep: str = "weak", **config: object) -> Path:
    """:func:`scaling_sweep` (with its evaluations) written as sweep ``sweep`` of ``store``, a run
    folder per world size at 8 samples per device; ``config``: the runs' other settings. Returns
    the sweep's folder."""
    runs, steps, evals = scaling_sweep()
    for run in runs.itertuples():
        write_run(
            store,
            sweep,
            str(run.run_id),
            steps[steps["run_id"] == run.run_id],
            evals[evals["run_id"] == run.run_id],
            world_size=run.world_size,
            per_device_batch_size=8,
            **config,
        )
    return store / sweep


def write_run(
    store: Path,
    sweep: str,
    run_id: str,
    steps: pd.DataFrame,
    evals: pd.DataFrame,
    status: str = "completed",
    network: dict[str, object] | None = None,
    **config: object,
) -> Path:
    """A run folder as the launcher and the ranks leave it, from hand-built frames;
    ``network``: run.json's allreduce micro-benchmark record, where the run measured one."""
    cfg = RunConfig(output_dir=str(store), sweep=sweep, run_name=run_id, **config)  # type: ignore[arg-type]
    path = store / sweep / run_id
    write_json(path / schema.CONFIG_FILE, cfg.to_dict())
    write_json(
        path / schema.RUN_FILE,
        {
            "run_id": run_id,
            "sweep": sweep,
            "status": status,
            "config": cfg.to_dict(),
            "ended_at": 1.0,
            "network": network,
        },
    )
    traces = path / schema.TRACES_DIR
    traces.mkdir(parents=True)
    for rank, rows in steps.groupby("rank"):
        rows.to_parquet(traces / schema.steps_file(int(rank)))
    for rank, rows in evals.groupby("rank"):
        rows.to_parquet(traces / schema.eval_file(int(rank)))
    return path
