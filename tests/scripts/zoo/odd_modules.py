"""A model of the kinds the tracing must leave alone, never break: a weak proxy to the model kept
alive (Lightning keeps such proxies), a module subclass with odd attributes (a ``parameters``
that takes no ``recurse``, a ``__getattr__`` that raises its own error), and a TorchScript
submodule (a C++ module). No DataLoader; DDP when launched on several processes.

    python tests/scripts/zoo/odd_modules.py --steps 30
    torchrun --standalone --nproc-per-node 2 tests/scripts/zoo/odd_modules.py --steps 30

It imports nothing of the workbench. At the end rank 0 prints its own throughput in one line:
``own_samples_per_s=...`` (as ``ddp_when_distributed.py`` does).
"""

from __future__ import annotations

import argparse
import os
import time
import weakref
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn


class OddError(Exception):
    """What the odd module raises for a name it does not have (not AttributeError)."""


class Odd(nn.Module):
    """A block whose ``parameters`` takes no arguments and whose unknown attributes raise."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.scripted = torch.jit.script(nn.Linear(width, width))

    def parameters(self) -> Iterator[nn.Parameter]:  # type: ignore[override]
        return super().parameters()

    def __getattr__(self, name: str) -> object:
        if name.startswith("_") or name in ("linear", "scripted"):
            return super().__getattr__(name)
        raise OddError(name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.scripted(torch.relu(self.linear(x))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the own figure")
    p.add_argument("--batch-size", type=int, default=128, help="per process")
    p.add_argument("--width", type=int, default=512)
    args = p.parse_args()
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    world_size = dist.get_world_size() if distributed else 1

    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(Odd(args.width), nn.Linear(args.width, 10))
    proxy = weakref.proxy(model)  # alive for the whole run, among the collector's objects
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)

    samples, started = 0, 0.0
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch_size, args.width, generator=g)
        y = torch.randint(0, 10, (args.batch_size,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == args.warmup:
            started = time.perf_counter()
        elif step > args.warmup:
            samples += args.batch_size * world_size
    elapsed = time.perf_counter() - started
    if not distributed or dist.get_rank() == 0:
        print(f"loss {loss.item():.4f}; the proxy's class: {type(proxy).__name__}", flush=True)
        print(f"own_samples_per_s={samples / elapsed:.1f}", flush=True)
    del model
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
