"""A plain DistributedDataParallel training script with mixed precision, as people write them by
hand: torchrun starts one process per device, each joins the process group from the environment
torchrun sets, shards a dataset with DistributedSampler and trains a small classifier.

    torchrun --standalone --nproc-per-node 2 examples/scripts/ddp_amp.py --steps 40
    workbench run --script examples/scripts/ddp_amp.py --world-size 2 -- --steps 40

It knows nothing of the workbench. Mixed precision: bf16 autocast on CPU, fp16 autocast with a
GradScaler on CUDA. ``--data-sleep-ms`` and ``--forward-sleep-ms`` plant a known cost (a sleep per
batch in the collate function, a sleep in a forward pre-hook of the model), to check a profiler's
figures against.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class SyntheticImages(Dataset):
    """Random 'images' (flattened) with random labels, made from a seed: no download."""

    def __init__(self, samples: int, features: int, classes: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(samples, features, generator=g)
        self.y = torch.randint(0, classes, (samples,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="optimizer steps")
    p.add_argument("--per-device-batch-size", type=int, default=64)
    p.add_argument("--features", type=int, default=512)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--data-sleep-ms", type=float, default=0.0, help="planted cost per batch")
    p.add_argument("--forward-sleep-ms", type=float, default=0.0, help="planted cost per forward")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")

    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(
        nn.Linear(args.features, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.classes),
    ).to(device)
    if args.forward_sleep_ms:
        model.register_forward_pre_hook(
            lambda module, inputs: time.sleep(args.forward_sleep_ms / 1e3)
        )
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)

    samples = args.per_device_batch_size * world_size * args.steps
    dataset = SyntheticImages(samples, args.features, args.classes)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)

    def collate(items: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
        if args.data_sleep_ms:
            time.sleep(args.data_sleep_ms / 1e3)
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    loader = DataLoader(
        dataset,
        batch_size=args.per_device_batch_size,
        sampler=sampler,
        collate_fn=collate,
        drop_last=True,
    )
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    amp_dtype = torch.float16 if cuda else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=cuda)

    step = 0
    started = time.perf_counter()
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype):
            loss = nn.functional.cross_entropy(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        step += 1
        if rank == 0 and step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
        if step == args.steps:
            break
    if rank == 0:
        elapsed = time.perf_counter() - started
        print(f"{step} steps in {elapsed:.2f} s on {world_size} rank(s)", flush=True)
    del ddp, model  # free DDP's buffers before the process group goes
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
