"""DDP training from an IterableDataset: a stream of synthetic records that shards itself (each
rank, and each DataLoader worker of it, keeps every n-th record), batched by a DataLoader with
no sampler, as streaming and WebDataset-style pipelines are.

    torchrun --standalone --nproc-per-node 2 tests/scripts/zoo/iterable_dataset.py --steps 30

It imports nothing of the workbench. At the end rank 0 prints its own throughput in one line:
``own_samples_per_s=...``: the samples of every rank in the steps after the first ``--warmup``
ones, over rank 0's ``time.perf_counter`` from the end of the last warm-up step's optimizer step
to the end of the last step's (no barrier: DDP's allreduce keeps the ranks within a step).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class RecordStream(IterableDataset):
    """An endless stream of (features, label) records; each shard (a rank, or a DataLoader
    worker of a rank) makes its own from a seed of its own, so no two read the same records."""

    def __init__(self, width: int, rank: int, world_size: int) -> None:
        self.width, self.rank, self.world_size = width, rank, world_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        worker = get_worker_info()
        workers, worker_id = (worker.num_workers, worker.id) if worker else (1, 0)
        shard = self.rank * workers + worker_id
        g = torch.Generator().manual_seed(1000 + shard)
        while True:
            x = torch.randn(self.width, generator=g)
            yield x, x[:10].argmax()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the own figure")
    p.add_argument("--batch-size", type=int, default=128, help="per rank")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    if not 0 < args.warmup < args.steps:
        p.error(f"--warmup must be between 1 and --steps - 1, got {args.warmup}")
    return args


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    loader = DataLoader(RecordStream(args.width, rank, world_size), batch_size=args.batch_size)

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
    del loader, ddp, model
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
