"""A plain DDP training script for ``torchrun``: the baseline the workbench is compared against.

The same model (``workbench.models.build_model``), the same synthetic dataset
(``workbench.data.build_datasets``), the same sharding, batch, optimizer, seed and threads as a
workbench run of the same ``RunConfig``, with nothing else: no comm hook, no tracer, no
checkpoints, no evaluation. It records, per rank, what the benchmarks compare:

- ``first_step_unix``: wall clock at the start of the first step (launch latency);
- per step ``t_start_s`` (from a t0 taken right after a barrier, as the workbench's tracer does)
  and ``step_s``, so throughput uses the workbench's own definition: samples of the measured
  steps over the window from the first measured step start to the last step end, across ranks.

On a GPU (``--device cuda``) each rank takes its local rank's GPU and NCCL, and the step's
``float(loss)`` waits for the GPU, so ``step_s`` is the step's whole time. ``--model-size`` picks a
size preset (``distilbert``), ``--precision`` autocast (fp16 with a GradScaler), as a workbench
run of the same config does.

Usage: ``torchrun --standalone --nproc-per-node 2 benchmarks/plain_ddp.py --model transformer
--batch 32 --steps 100 --warmup 5 --out /tmp/plain [--device cuda --model-size distilbert
--precision fp16]``; writes ``<out>/rank-N.json``. ``python benchmarks/plain_ddp.py --smoke``
(outside torchrun) launches itself under torchrun at 2 ranks for 8 mlp steps and prints the
throughput and latencies the benchmarks read: a check of the harness.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.config.run_config import RunConfig  # noqa: E402
from workbench.rank.data import build_datasets, fetch_batch, train_batches  # noqa: E402
from workbench.rank.models import build_model  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="transformer")
    parser.add_argument(
        "--model-size", help="a size preset of the model (distilbert, bert-base, gpt2-small)"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--precision",
        choices=("fp32", "fp16", "bf16"),
        default="fp32",
        help="autocast dtype; fp16 with a GradScaler (CUDA), as the workbench does",
    )
    parser.add_argument("--batch", type=int, default=32, help="per-device batch size")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of throughput")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    parser.add_argument("--train-samples", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="folder for rank-N.json (required under torchrun)")
    parser.add_argument(
        "--smoke", action="store_true", help="launch itself under torchrun: 2 ranks, 8 mlp steps"
    )
    a = parser.parse_args(argv)
    if not a.smoke and a.out is None:
        parser.error("--out is required (a folder for rank-N.json), or pass --smoke")
    return a


def smoke() -> None:
    """2 ranks x 8 mlp steps under torchrun, the way the benchmarks launch this script."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _jobs import run_torchrun

    out = run_torchrun("mlp", 2, batch=32, steps=8, warmup=2, train_samples=4096)
    print(
        f"plain DDP under torchrun, 2 ranks x 8 mlp steps: {out['samples_per_s']:,.0f} samples/s, "
        f"first step on all ranks {out['to_first_step_all_s']:.2f} s, "
        f"result {out['to_result_s']:.2f} s"
    )


def setup(a: argparse.Namespace, rank: int, world_size: int) -> tuple[torch.device, RunConfig]:
    """The device (CUDA: the local rank's GPU, NCCL; CPU: gloo) and the config, which is only
    used to build the same dataset and model the workbench builds."""
    if a.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=300))
    config = RunConfig(
        model=a.model,
        model_options={"size": a.model_size} if a.model_size else {},
        world_size=world_size,
        per_device_batch_size=a.batch,
        train_samples=a.train_samples,
        seed=a.seed,
        device=a.device,
        precision=a.precision,
    )
    return device, config


def train(a: argparse.Namespace, rank: int, world_size: int) -> dict[str, Any]:
    """The plain loop: DDP, SGD, autocast (and a GradScaler in fp16); per-step timings."""
    device, config = setup(a, rank, world_size)
    torch.manual_seed(a.seed)
    module = build_model(config.model, dict(config.model_options)).to(device)
    model = DDP(module, device_ids=[device.index] if device.type == "cuda" else None)
    train_set, _ = build_datasets(config)
    # Same optimizer and hyper-parameters as RunConfig's defaults (SGD, lr 0.05, momentum 0.9).
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=config.learning_rate,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )
    scaler = torch.amp.GradScaler(device.type, enabled=a.precision == "fp16")
    amp = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(a.precision)

    def autocast() -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext() if amp is None else torch.autocast(device.type, amp)

    loss_fn = torch.nn.functional.cross_entropy

    dist.barrier()
    t0, t0_unix = time.perf_counter(), time.time()
    first_step_unix = None
    rows = []
    epoch, step = 0, 0
    while step < a.steps:
        for indices in train_batches(train_set, rank, world_size, a.batch, a.seed, epoch):
            if step >= a.steps:
                break
            start = time.perf_counter()
            if first_step_unix is None:
                first_step_unix = time.time()
            inputs, targets = fetch_batch(train_set, indices)
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            with autocast():  # per token for a language model, per sample otherwise
                loss = loss_fn(model(inputs).flatten(0, -2).float(), targets.flatten())
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            float(loss.detach())  # the workbench reads the loss every step: the same sync
            step += 1
            rows.append([start - t0, time.perf_counter() - start, len(indices), step <= a.warmup])
        epoch += 1
    del model, module, optimizer  # free the DDP model before the group goes (FACTS: gloo deadlock)
    return {"t0_unix": t0_unix, "first_step_unix": first_step_unix, "steps": rows}


def main() -> None:
    a = parse_args()
    if a.smoke:
        smoke()
        return
    torch.set_num_threads(a.threads)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    result = train(a, rank, world_size)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "world_size": world_size, **result, "end_unix": time.time()}
    (out / f"rank-{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
