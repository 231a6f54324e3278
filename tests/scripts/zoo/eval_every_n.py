"""DDP training that evaluates every ``--eval-every`` steps inside its loop: the model in eval
mode, a held-out set sharded across ranks under ``torch.no_grad``, the loss and accuracy summed
over ranks with ``all_reduce``, then back to training.

    torchrun --standalone --nproc-per-node 2 tests/scripts/zoo/eval_every_n.py --steps 30

It imports nothing of the workbench. At the end rank 0 prints its own throughput in one line:
``own_samples_per_s=...``: the training samples of every rank in the steps after the first
``--warmup`` ones, over rank 0's ``time.perf_counter`` from the end of the last warm-up step
(its evaluation, if one falls there, included) to the end of the last step's optimizer step: the
evaluations in between are in, one after the last step is not (a window from one step's start
to another's end, as a tracer of steps sees it); ``eval_s=`` is rank 0's time in them, so
``samples / (seconds - eval_s)`` is training alone. No barrier: DDP's allreduce keeps the ranks
within a step.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the own figure")
    p.add_argument("--batch-size", type=int, default=128, help="per rank")
    p.add_argument("--eval-every", type=int, default=10, help="steps between evaluations")
    p.add_argument("--eval-batches", type=int, default=4, help="held-out batches per rank")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    if not 0 < args.warmup < args.steps:
        p.error(f"--warmup must be between 1 and --steps - 1, got {args.warmup}")
    return args


def labelled(n: int, width: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, width, generator=g)
    return TensorDataset(x, x[:, :10].argmax(dim=1))


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader) -> tuple[float, float]:
    """Mean loss and accuracy over the held-out set of every rank."""
    model.eval()
    totals = torch.zeros(3)
    for x, y in loader:
        logits = model(x)
        totals += torch.tensor(
            [
                nn.functional.cross_entropy(logits, y, reduction="sum").item(),
                (logits.argmax(dim=1) == y).sum().item(),
                len(y),
            ]
        )
    dist.all_reduce(totals)
    model.train()
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, 10),
    )
    ddp = nn.parallel.DistributedDataParallel(model)

    train = labelled(args.batch_size * world_size * args.steps, args.width, 0)
    held_out = labelled(args.batch_size * world_size * args.eval_batches, args.width, 1)
    loader = DataLoader(
        train, batch_size=args.batch_size, sampler=DistributedSampler(train, seed=0), drop_last=True
    )
    eval_loader = DataLoader(
        held_out, batch_size=args.batch_size, sampler=DistributedSampler(held_out, shuffle=False)
    )
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    step, samples, started, eval_s = 0, 0, 0.0, 0.0
    for x, y in loader:
        loss = nn.functional.cross_entropy(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        if step > args.warmup:
            samples += len(x) * world_size
        if step == args.steps:
            elapsed = time.perf_counter() - started
        if step % args.eval_every == 0:
            began = time.perf_counter()
            eval_loss, accuracy = evaluate(ddp, eval_loader)
            if args.warmup < step < args.steps:
                eval_s += time.perf_counter() - began
            if rank == 0:
                print(f"step {step}: eval loss {eval_loss:.4f}, accuracy {accuracy:.1%}")
        if step == args.warmup:  # after its evaluation, if one falls there
            started = time.perf_counter()
        if step == args.steps:
            break
    if rank == 0:
        print(f"loss {loss.item():.4f} after {step} steps", flush=True)
        print(
            f"own_samples_per_s={samples / elapsed:.1f} samples={samples} seconds={elapsed:.4f} "
            f"eval_s={eval_s:.4f} steps={step - args.warmup} world_size={world_size}",
            flush=True,
        )
    del ddp, model
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
