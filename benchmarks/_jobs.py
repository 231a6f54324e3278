"""One workbench run and one torchrun run of the same job, each with the same measurements:
throughput over the measured window, and wall-clock latencies from launch to the first step on
every rank and to the result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT  # noqa: E402

from workbench.ports import free_port  # noqa: E402

TORCHRUN = Path(sys.executable).with_name("torchrun")
PLAIN = Path(__file__).resolve().with_name("plain_ddp.py")


def workbench_config(
    model: str,
    world_size: int,
    batch: int,
    steps: int,
    warmup: int,
    train_samples: int,
    output_dir: str,
    device: str = "cpu",
    model_size: str | None = None,
    precision: str = "fp32",
) -> Any:
    """The RunConfig of the job: no evaluation or checkpoints (the plain script has none), every
    other field at its default (so the preemption check every 100 steps stays: it is part of what
    a workbench run costs). ``device='cuda'``: NCCL, one GPU per rank."""
    from workbench import RunConfig

    return RunConfig(
        model=model,
        model_options={"size": model_size} if model_size else {},
        world_size=world_size,
        per_device_batch_size=batch,
        max_steps=steps,
        warmup_steps=warmup,
        train_samples=train_samples,
        eval_every_epochs=0,
        eval_at_end=False,
        device=device,
        backend="gloo" if device == "cpu" else "nccl",
        threads_per_rank=1,
        precision=precision,
        output_dir=output_dir,
        sweep="bench",
    )


def run_workbench(
    model: str,
    world_size: int,
    batch: int,
    steps: int,
    warmup: int,
    train_samples: int,
    **options: Any,
) -> dict[str, Any]:
    """``launch()`` then ``wait()``; throughput from ``analysis.throughput.summary.run_summary``.
    ``options``: ``device``, ``model_size``, ``precision`` (see :func:`workbench_config`)."""
    from workbench import launch
    from workbench.analysis.throughput.summary import run_summary
    from workbench.store.load import load_traces

    with tempfile.TemporaryDirectory(prefix="wb-bench-") as tmp:
        config = workbench_config(
            model, world_size, batch, steps, warmup, train_samples, tmp, **options
        )
        t_launch = time.time()
        run = launch(config)
        status = run.wait(timeout_s=600)
        t_result = time.time()
        summaries = run.result()
        steps_frame = run.traces()
        summary = run_summary(load_traces(run.path, "steps"), load_traces(run.path, "eval"))
        submitted = json.loads((run.path / "run.json").read_text())["submitted_at"]
    first = steps_frame[steps_frame["step"] == steps_frame["step"].min()]
    first_step_unix = [
        summaries[int(r.rank)]["t0_unix"] + float(r.t_start_s) for r in first.itertuples()
    ]
    return {
        "status": status,
        "samples_per_s": summary["samples_per_s"],
        "measured_steps": summary["measured_steps"],
        "to_submitted_s": submitted - t_launch,
        "to_first_step_all_s": max(first_step_unix) - t_launch,
        "to_result_s": t_result - t_launch,
    }


def plain_throughput(ranks: list[dict[str, Any]]) -> float:
    """The workbench's definition: measured samples over first measured start to last end."""
    rows = [r for rank in ranks for r in rank["steps"] if not r[3]]
    start = min(r[0] for r in rows)
    end = max(r[0] + r[1] for r in rows)
    return sum(r[2] for r in rows) / (end - start)


def run_torchrun(
    model: str,
    world_size: int,
    batch: int,
    steps: int,
    warmup: int,
    train_samples: int,
    device: str = "cpu",
    model_size: str | None = None,
    precision: str = "fp32",
) -> dict[str, Any]:
    """``torchrun --standalone`` on plain_ddp.py; the result is the process's exit."""
    with tempfile.TemporaryDirectory(prefix="wb-bench-torchrun-") as tmp:
        cmd = [
            str(TORCHRUN),
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(world_size),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}",
            str(PLAIN),
            "--model",
            model,
            "--batch",
            str(batch),
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
            "--train-samples",
            str(train_samples),
            "--device",
            device,
            "--precision",
            precision,
            *(["--model-size", model_size] if model_size else []),
            "--out",
            tmp,
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # torchrun's own default for >1 rank
        t_launch = time.time()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        t_result = time.time()
        ranks = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank-*.json"))]
        # every rank wrote its result, then one died in torch's teardown (FACTS: about once in
        # 75 two-rank runs, "terminate called without an active exception"): complete, said so
        died_at_exit = proc.returncode != 0 and len(ranks) == world_size
        if proc.returncode != 0 and not died_at_exit:
            raise RuntimeError(f"torchrun failed ({proc.returncode}): {proc.stderr[-2000:]}")
    said = " (a rank died at exit, after its result)" if died_at_exit else ""
    return {
        "status": "completed" + said,
        "samples_per_s": plain_throughput(ranks),
        "to_first_step_all_s": max(r["first_step_unix"] for r in ranks) - t_launch,
        "to_result_s": t_result - t_launch,
    }
