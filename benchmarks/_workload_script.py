"""The training script the script-tracing benchmark runs under torchrun, traced and untraced: a
plain DDP loop over a DataLoader that times its own steady window (after its warm-up steps) on
rank 0 and writes it to ``--out``. It imports nothing from the workbench."""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(a.width, a.width), nn.ReLU(), nn.Linear(a.width, 10))
    )
    n = a.batch * (a.steps + 1) * dist.get_world_size()
    data = TensorDataset(torch.randn(n, a.width), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=a.batch, sampler=DistributedSampler(data))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(loader)
    started = time.perf_counter()
    for step in range(a.steps):
        if step == a.warmup:
            dist.barrier()
            started = time.perf_counter()
        x, y = next(batches)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.barrier()
    loop_s = time.perf_counter() - started
    if int(os.environ["RANK"]) == 0:
        with open(a.out, "w") as f:
            json.dump({"step_s": loop_s / (a.steps - a.warmup)}, f)
    del model
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
