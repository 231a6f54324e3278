"""A compiled DDP model under bf16 autocast on the CPU: ``torch.compile`` of the
DistributedDataParallel module (DDP's optimizer splits the graph at its buckets), the forward and
the loss under ``torch.autocast("cpu", dtype=torch.bfloat16)``, as compiled training scripts do.

    torchrun --standalone --nproc-per-node 2 tests/scripts/zoo/compiled_bf16.py --steps 30

It imports nothing of the workbench. The first steps compile (inductor: 20-40 s on a loaded
2-core host the first time, less with its cache warm; ``--backend aot_eager`` traces the same
graphs, breaks included, in a few seconds): keep ``--warmup`` past them. At the end rank 0 prints
its own throughput in one line: ``own_samples_per_s=...``: the samples of every rank in the
steps after the first ``--warmup`` ones, over rank 0's ``time.perf_counter`` from the end of the
last warm-up step's optimizer step to the end of the last step's (no barrier: DDP's allreduce
keeps the ranks within a step). With ``--graph-breaks`` it also prints dynamo's count of graph
breaks (``graph_breaks=N``, from ``torch._dynamo.utils.counters``), and each break's reason.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Block(nn.Module):
    """A residual MLP block with a LayerNorm."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the own figure")
    p.add_argument("--batch-size", type=int, default=128, help="per rank")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--backend", default="inductor", help="torch.compile's backend")
    p.add_argument("--graph-breaks", action="store_true", help="print dynamo's graph breaks")
    args = p.parse_args()
    if not 0 < args.warmup < args.steps:
        p.error(f"--warmup must be between 1 and --steps - 1, got {args.warmup}")
    return args


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = nn.Sequential(
        *[Block(args.width) for _ in range(args.blocks)], nn.Linear(args.width, 10)
    )
    ddp = nn.parallel.DistributedDataParallel(model)
    compiled = torch.compile(ddp, backend=args.backend)

    n = args.batch_size * world_size * args.steps
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, args.width, generator=g), torch.randint(0, 10, (n,)))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr)

    step, samples, started = 0, 0, 0.0
    for x, y in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(compiled(x), y)
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
        if args.graph_breaks:
            from torch._dynamo.utils import counters

            for reason, count in counters["graph_break"].items():
                print(f"graph break x{count}: {reason}", flush=True)
            print(f"graph_breaks={sum(counters['graph_break'].values())}", flush=True)
        print(
            f"own_samples_per_s={samples / elapsed:.1f} samples={samples} seconds={elapsed:.4f} "
            f"steps={step - args.warmup} world_size={world_size}",
            flush=True,
        )
    del compiled, ddp, model
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
