"""Training that goes distributed only when it is launched so: with ``WORLD_SIZE`` above 1 it
joins the process group, shards the data with DistributedSampler and wraps the model in
DistributedDataParallel; on one process it is a plain loop with no process group and no DDP.

    python tests/scripts/zoo/ddp_when_distributed.py --steps 30
    torchrun --standalone --nproc-per-node 2 tests/scripts/zoo/ddp_when_distributed.py --steps 30

It imports nothing of the workbench. At the end rank 0 prints its own throughput in one line:
``own_samples_per_s=...``: the samples of every rank in the steps after the first ``--warmup``
ones, over rank 0's ``time.perf_counter`` from the end of the last warm-up step's optimizer step
to the end of the last step's (no barrier: DDP's allreduce keeps the ranks within a step).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the own figure")
    p.add_argument("--batch-size", type=int, default=128, help="per process")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    if not 0 < args.warmup < args.steps:
        p.error(f"--warmup must be between 1 and --steps - 1, got {args.warmup}")
    return args


def main() -> None:
    args = parse_args()
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1

    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, 10),
    )
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)

    n = args.batch_size * world_size * args.steps
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, args.width, generator=g), torch.randint(0, 10, (n,)))
    sampler = DistributedSampler(data, seed=0) if distributed else None
    loader = DataLoader(
        data, batch_size=args.batch_size, sampler=sampler, shuffle=sampler is None, drop_last=True
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    step, samples, started = 0, 0, 0.0
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        if step == args.warmup:
            started = time.perf_counter()
        elif step > args.warmup:
            samples += len(x) * world_size
        if step == args.steps:
            break
    elapsed = time.perf_counter() - started
    if rank == 0:
        print(f"loss {loss.item():.4f} after {step} steps", flush=True)
        print(
            f"own_samples_per_s={samples / elapsed:.1f} samples={samples} seconds={elapsed:.4f} "
            f"steps={step - args.warmup} world_size={world_size}",
            flush=True,
        )
    del model
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
