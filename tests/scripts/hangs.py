"""A plain DDP training script with one planted fault on one rank, for the workbench's tests of
how a hang is explained. It imports nothing from the workbench.

    torchrun --nproc-per-node 2 tests/scripts/hangs.py --fault data --rank 1 --step 8

Faults, at step ``--step`` on rank ``--rank``: ``data`` (its batch never comes: a read that
never returns, in the collate function), ``forward`` (stuck in the model's forward),
``optimizer`` (stuck just before the optimizer step), ``lone`` (it all-reduces a metric its
peers do not), ``different`` (every rank gathers its loss every step; at this one, this rank
all-reduces it instead), ``exit`` (it leaves the training: ``sys.exit(0)``), ``abort`` (its
process aborts, as a C++ library's ``abort()`` does: no Python clean-up), ``none`` (clean).
``--step-sleep-ms`` makes every step that much longer (a sleep in the forward).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

ARGS = argparse.Namespace()
RANK = int(os.environ.get("RANK", "0"))


def stuck(where: str) -> None:
    """A read that never returns (a dead file system, a lost connection)."""
    while True:
        time.sleep(3600)


def planted(fault: str) -> bool:
    return ARGS.fault == fault and RANK == ARGS.rank and STEP[0] == ARGS.step


STEP = [0]


def collate(items):
    if planted("data"):
        stuck("data")
    if planted("abort"):
        os.abort()
    return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        if planted("forward"):
            stuck("forward")
        time.sleep(ARGS.step_sleep_ms / 1000)
        return self.body(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fault", default="none")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--step", type=int, default=8)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--step-sleep-ms", type=float, default=0.0)
    p.parse_args(namespace=ARGS)
    dist.init_process_group("gloo")
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(2048, 32, generator=g), torch.randint(0, 4, (2048,)))
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data), collate_fn=collate)
    model = nn.parallel.DistributedDataParallel(Model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(loader)
    for step in range(1, ARGS.steps + 1):
        STEP[0] = step
        x, y = next(batches)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if planted("optimizer"):
            stuck("optimizer")
        opt.step()
        opt.zero_grad()
        if planted("lone"):
            dist.all_reduce(loss.detach())
        # every rank gathers its loss every step; at the planted step one all-reduces it
        if planted("different"):
            dist.all_reduce(loss.detach()[None])
        else:
            dist.all_gather_into_tensor(torch.zeros(dist.get_world_size()), loss.detach()[None])
        if planted("exit"):
            sys.exit(0)
    print(f"rank {RANK}: trained {ARGS.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
