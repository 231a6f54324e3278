"""A plain training script with planted costs, for the cluster-prediction benchmark: it goes
distributed only when launched so (``WORLD_SIZE`` above 1: a process group, DistributedSampler,
DistributedDataParallel), and on one process is a plain loop with no process group and no DDP
(``--ddp-always``: a process group and DDP at one rank too). ``--fsdp``: FSDP2 instead, a
user's FSDP script (each layer ``fully_shard``ed, then the root; a process group at every size,
as FSDP needs one). It imports nothing of the workbench.

Its compute does not depend on how many ranks share the machine's cores: ``--layers`` layers
each sleep their share of ``--forward-us`` in forward and of ``--backward-us`` in backward, so
DDP's buckets become ready one layer after another and overlap the backward as on a GPU;
``--gradient-kib`` KiB of gradients (zeros: what DDP sends is real bytes) spread over the layers.

    python benchmarks/scripts/planted_ddp.py --steps 20 --gradient-kib 8192
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class _Planted(torch.autograd.Function):
    """Identity on the activations; forward and backward each sleep their planted time, and the
    layer's ballast gets a gradient of its size."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ballast: torch.Tensor, fwd: float, bwd: float) -> Any:
        time.sleep(fwd)
        ctx.bwd, ctx.shape = bwd, ballast.shape
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        time.sleep(ctx.bwd)
        return grad, grad.new_zeros(ctx.shape), None, None


class PlantedLayer(nn.Module):
    """A layer of its own (FSDP gathers and reduces each on its own): its ballast, its sleeps."""

    def __init__(self, size: int, fwd_s: float, bwd_s: float) -> None:
        super().__init__()
        self.ballast = nn.Parameter(torch.zeros(size))
        self.sleeps = (fwd_s, bwd_s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Planted.apply(x, self.ballast, *self.sleeps)


class Planted(nn.Module):
    def __init__(self, layers: int, gradient_kib: int, fwd_us: float, bwd_us: float) -> None:
        super().__init__()
        per_layer = max(1, gradient_kib * 1024 // 4 // layers)
        sleeps = (fwd_us / layers / 1e6, bwd_us / layers / 1e6)
        self.layers = nn.ModuleList(PlantedLayer(per_layer, *sleeps) for _ in range(layers))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--batch-size", type=int, default=16, help="per process")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--gradient-kib", type=int, default=8192)
    p.add_argument("--forward-us", type=float, default=20000)
    p.add_argument("--backward-us", type=float, default=40000)
    p.add_argument("--ddp-always", action="store_true", help="a process group and DDP at 1 rank")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    a = p.parse_args()
    torch.set_num_threads(1)
    distributed = a.fsdp or a.ddp_always or int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    world_size = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)
    model: nn.Module = Planted(a.layers, a.gradient_kib, a.forward_us, a.backward_us)
    if a.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    elif distributed:
        model = nn.parallel.DistributedDataParallel(model)
    n = a.batch_size * world_size * a.steps
    data = TensorDataset(torch.randn(n, 16), torch.randint(0, 4, (n,)))
    sampler = DistributedSampler(data, seed=0) if distributed else None
    loader = DataLoader(data, batch_size=a.batch_size, sampler=sampler, drop_last=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    del model
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
