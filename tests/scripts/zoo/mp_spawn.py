"""DDP started with ``torch.multiprocessing.spawn``, as in PyTorch's DDP tutorial: run once with
plain ``python``, it sets ``MASTER_ADDR`` and ``MASTER_PORT`` itself, spawns ``--world-size``
processes, and each joins the process group with its rank and trains.

    python tests/scripts/zoo/mp_spawn.py --world-size 2 --steps 30

It imports nothing of the workbench, and is not a torchrun script: it starts its own processes.
``--port`` picks the rendezvous port (the tutorial's 12355 by default; two runs at once need two
ports). At the end rank 0 prints its own throughput in one line: ``own_samples_per_s=...``: the
samples of every rank in the steps after the first ``--warmup`` ones, over rank 0's
``time.perf_counter`` from the end of the last warm-up step's optimizer step to the end of the
last step's (no barrier: DDP's allreduce keeps the ranks within a step).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup(rank: int, world_size: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup() -> None:
    dist.barrier()
    dist.destroy_process_group()


def train(rank: int, world_size: int, args: argparse.Namespace) -> None:
    """One process of the job: rank ``rank`` of ``world_size``."""
    setup(rank, world_size, args.port)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, 10),
    )
    ddp = nn.parallel.DistributedDataParallel(model)

    n = args.batch_size * world_size * args.steps
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, args.width, generator=g), torch.randint(0, 10, (n,)))
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    step, samples, started = 0, 0, 0.0
    for x, y in loader:
        loss = nn.functional.cross_entropy(ddp(x), y)
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
    del ddp, model
    cleanup()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=2, help="processes to spawn")
    p.add_argument("--port", type=int, default=12355, help="MASTER_PORT of the rendezvous")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the own figure")
    p.add_argument("--batch-size", type=int, default=128, help="per process")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    if not 0 < args.warmup < args.steps:
        p.error(f"--warmup must be between 1 and --steps - 1, got {args.warmup}")
    if args.world_size < 1:
        p.error(f"--world-size must be 1 or more, got {args.world_size}")
    return args


if __name__ == "__main__":
    args = parse_args()
    mp.spawn(train, args=(args.world_size, args), nprocs=args.world_size, join=True)
