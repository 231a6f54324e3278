"""FSDP2 training with no DataLoader and no DDP: each block ``fully_shard``ed, then the model,
AdamW over the sharded parameters, batches made in the loop. A process group even at one rank
(FSDP needs one). It imports nothing of the workbench.

Each block is ``Linear(width, width)`` + ReLU: ``width * width + width`` parameters, each
parameter's first dimension (``width``) padded by FSDP2 to a multiple of the world size.
It prints its own throughput over the steps after ``--warmup`` (``own_samples_per_s=``: the
samples of every rank over rank 0's clock, after a barrier at both ends).

    torchrun --standalone --nproc-per-node 2 tests/scripts/fsdp_no_dataloader.py --steps 6
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1, help="steps left out of its own figure")
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument(
        "--keep-after-forward",
        action="store_true",
        help="reshard_after_forward=False on the blocks: no re-gather in backward",
    )
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(
        *[nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU()) for _ in range(args.blocks)]
    )
    for block in model:
        fully_shard(block, reshard_after_forward=not args.keep_after_forward)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    started = None
    for step in range(args.steps):
        if step == args.warmup:
            dist.barrier()
            started = time.perf_counter()
        x = torch.randn(args.batch_size, args.width, generator=g)
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()
    if started is not None and dist.get_rank() == 0:
        samples = (args.steps - args.warmup) * args.batch_size * dist.get_world_size()
        print(f"own_samples_per_s={samples / (time.perf_counter() - started):.2f}", flush=True)
    print(f"loss {loss.item():.4f}; the model's class: {type(model).__name__}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
