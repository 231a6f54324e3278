"""DDP training with gradient accumulation written by hand: ``--accum`` micro-batches per
optimizer step, the gradients of all but the last kept local with DDP's ``no_sync`` (one
allreduce per optimizer step), the loss scaled by the number of micro-batches.

    torchrun --standalone --nproc-per-node 2 tests/scripts/zoo/grad_accum_no_sync.py --steps 30

It imports nothing of the workbench. At the end rank 0 prints its own throughput in one line:
``own_samples_per_s=...``: the samples of every rank in the optimizer steps after the first
``--warmup`` ones (a step's samples: its ``--accum`` micro-batches), over rank 0's
``time.perf_counter`` from the end of the last warm-up step's optimizer step to the end of the
last step's (no barrier: DDP's allreduce keeps the ranks within a step).
"""

from __future__ import annotations

import argparse
import contextlib
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
    p.add_argument("--batch-size", type=int, default=64, help="per rank and micro-batch")
    p.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    if not 0 < args.warmup < args.steps:
        p.error(f"--warmup must be between 1 and --steps - 1, got {args.warmup}")
    if args.accum < 1:
        p.error(f"--accum must be 1 or more, got {args.accum}")
    return args


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, 10),
    )
    ddp = nn.parallel.DistributedDataParallel(model)

    n = args.batch_size * args.accum * world_size * args.steps
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, args.width, generator=g), torch.randint(0, 10, (n,)))
    loader = DataLoader(
        data, batch_size=args.batch_size, sampler=DistributedSampler(data, seed=0), drop_last=True
    )
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    step, samples, started, micro = 0, 0, 0.0, 0
    for x, y in loader:
        micro += 1
        last = micro % args.accum == 0
        with contextlib.nullcontext() if last else ddp.no_sync():
            loss = nn.functional.cross_entropy(ddp(x), y) / args.accum
            loss.backward()
        if step >= args.warmup:
            samples += len(x) * world_size
        if not last:
            continue
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step == args.warmup:
            started = time.perf_counter()
        if step == args.steps:
            break
    elapsed = time.perf_counter() - started
    if rank == 0:
        print(f"loss {loss.item() * args.accum:.4f} after {step} steps", flush=True)
        print(
            f"own_samples_per_s={samples / elapsed:.1f} samples={samples} seconds={elapsed:.4f} "
            f"steps={step - args.warmup} world_size={world_size}",
            flush=True,
        )
    del ddp, model
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
