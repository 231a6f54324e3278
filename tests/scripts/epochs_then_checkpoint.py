"""A torchrun-style training script: DDP over a DataLoader with a DistributedSampler, a loop over
epochs, and after the loop a checkpoint saved and a line printed by rank 0. It imports nothing of
the workbench.

    torchrun --standalone --nproc-per-node 2 tests/scripts/epochs_then_checkpoint.py --epochs 3

Rank 0 prints ``own_samples_per_s=...`` (every rank's samples in the steps after the first
``--warmup``, over rank 0's clock from the end of the last warm-up step's optimizer step to the
end of the last step's), ``steps=N`` (the optimizer steps it made) and, once the checkpoint is
written, ``checkpoint saved: PATH``; with ``--step-ends F``, each step's end on its clock.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the own figure")
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument("--checkpoint", default="checkpoint.pt")
    p.add_argument("--step-ends", help="rank 0 writes each step's end (perf_counter) here, JSON")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(
        torch.randn(args.samples, args.width), torch.randint(0, 4, (args.samples,))
    )
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 4))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    steps, started, ended, ends = 0, None, None, []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            if steps == args.warmup:
                started = time.perf_counter()
            ended = time.perf_counter()
            ends.append(ended)
    if dist.get_rank() == 0:
        if started is not None and ended is not None and steps > args.warmup:
            samples = (steps - args.warmup) * args.batch_size * dist.get_world_size()
            print(f"own_samples_per_s={samples / (ended - started):.2f}", flush=True)
        print(f"steps={steps}", flush=True)
        if args.step_ends:
            with open(args.step_ends, "w") as f:
                json.dump(ends, f)
        torch.save(model.module.state_dict(), args.checkpoint)
        print(f"checkpoint saved: {args.checkpoint}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
