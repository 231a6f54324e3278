"""DDP training with no DataLoader: the whole synthetic dataset is one tensor in memory, each rank
takes every ``world_size``-th row (its shard) and slices its batches by hand, reshuffling its
shard each epoch.

    torchrun --standalone --nproc-per-node 2 tests/scripts/zoo/no_dataloader.py --steps 30

It imports nothing of the workbench. At the end rank 0 prints its own throughput in one line:
``own_samples_per_s=...``: the samples of every rank in the steps after the first ``--warmup``
ones, over rank 0's ``time.perf_counter`` from the end of the last warm-up step's optimizer step
to the end of the last step's (no barrier: DDP's allreduce keeps the ranks within a step).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the own figure")
    p.add_argument("--batch-size", type=int, default=128, help="per rank")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--rows", type=int, default=4096, help="rows in the dataset")
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    if not 0 < args.warmup < args.steps:
        p.error(f"--warmup must be between 1 and --steps - 1, got {args.warmup}")
    return args


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    g = torch.Generator().manual_seed(0)
    features = torch.randn(args.rows, args.width, generator=g)
    labels = (features[:, :10].argmax(dim=1) + torch.randint(0, 2, (args.rows,), generator=g)) % 10
    shard_x, shard_y = features[rank::world_size], labels[rank::world_size]
    per_epoch = len(shard_x) // args.batch_size

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, 10),
    )
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    samples, started = 0, 0.0
    order = torch.arange(len(shard_x))
    for step in range(1, args.steps + 1):
        i = (step - 1) % per_epoch
        if i == 0:  # a new epoch: the same permutation on every rank, from the epoch's seed
            order = torch.randperm(len(shard_x), generator=torch.Generator().manual_seed(step))
        rows = order[i * args.batch_size : (i + 1) * args.batch_size]
        x, y = shard_x[rows], shard_y[rows]
        loss = nn.functional.cross_entropy(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == args.warmup:
            started = time.perf_counter()
        elif step > args.warmup:
            samples += len(x) * world_size
    elapsed = time.perf_counter() - started
    if rank == 0:
        print(f"loss {loss.item():.4f} after {args.steps} steps", flush=True)
        print(
            f"own_samples_per_s={samples / elapsed:.1f} samples={samples} seconds={elapsed:.4f} "
            f"steps={args.steps - args.warmup} world_size={world_size}",
            flush=True,
        )
    del ddp, model
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
