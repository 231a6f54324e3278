"""FSDP2 training with no DataLoader and no DDP: each block ``fully_shard``ed, then the model,
AdamW over the sharded parameters, batches made in the loop. A process group even at one rank
(FSDP needs one). It imports nothing of the workbench.

    torchrun --standalone --nproc-per-node 2 tests/scripts/fsdp_no_dataloader.py --steps 6
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1, help="unused: the zoo's common arguments")
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--width", type=int, default=32)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(
        *[nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU()) for _ in range(2)]
    )
    for block in model:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(args.steps):
        x = torch.randn(args.batch_size, args.width, generator=g)
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print(f"loss {loss.item():.4f}; the model's class: {type(model).__name__}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
