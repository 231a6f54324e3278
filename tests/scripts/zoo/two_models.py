"""A GAN: two DistributedDataParallel models (a generator and a discriminator) and two
optimizers, each stepped once per iteration, in the shape of the DCGAN example: first the
discriminator on a real batch and a generated one, then the generator through the discriminator.

    torchrun --standalone --nproc-per-node 2 tests/scripts/zoo/two_models.py --steps 30

It imports nothing of the workbench. The "images" are points of a fixed random 2-D manifold in
``--width`` dimensions (no download). At the end rank 0 prints its own throughput in one line:
``own_samples_per_s=...``: the real samples of every rank in the iterations after the first
``--warmup`` ones (one iteration: both optimizer steps; its samples: the real batch), over rank
0's ``time.perf_counter`` from the end of the last warm-up iteration's generator step to the end
of the last iteration's (no barrier: DDP's allreduce keeps the ranks within an iteration).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="iterations (each steps both models)")
    p.add_argument("--warmup", type=int, default=5, help="iterations left out of the own figure")
    p.add_argument("--batch-size", type=int, default=128, help="real samples per rank")
    p.add_argument("--width", type=int, default=256, help="size of a sample")
    p.add_argument("--latent", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-4)
    args = p.parse_args()
    if not 0 < args.warmup < args.steps:
        p.error(f"--warmup must be between 1 and --steps - 1, got {args.warmup}")
    return args


def real_batches(batch: int, width: int, rank: int):
    """Endless batches of real samples: points of a 2-D manifold embedded in ``width`` dims."""
    basis = torch.randn(2, width, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1 + rank)
    while True:
        angle = torch.rand(batch, 1, generator=g) * 6.2832
        yield torch.cat([angle.cos(), angle.sin()], dim=1) @ basis


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    generator = nn.Sequential(
        nn.Linear(args.latent, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.width),
    )
    discriminator = nn.Sequential(
        nn.Linear(args.width, args.hidden),
        nn.LeakyReLU(0.2),
        nn.Linear(args.hidden, args.hidden),
        nn.LeakyReLU(0.2),
        nn.Linear(args.hidden, 1),
    )
    net_g = nn.parallel.DistributedDataParallel(generator)
    net_d = nn.parallel.DistributedDataParallel(discriminator)
    opt_g = torch.optim.Adam(net_g.parameters(), lr=args.lr, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(net_d.parameters(), lr=args.lr, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()

    data = real_batches(args.batch_size, args.width, rank)
    samples, started = 0, 0.0
    for step in range(1, args.steps + 1):
        real = next(data)
        ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
        fake = net_g(torch.randn(len(real), args.latent))
        # the discriminator: real against generated (no gradient into the generator)
        opt_d.zero_grad(set_to_none=True)
        loss_d = bce(net_d(real), ones) + bce(net_d(fake.detach()), zeros)
        loss_d.backward()
        opt_d.step()
        # the generator: fool the discriminator
        opt_g.zero_grad(set_to_none=True)
        loss_g = bce(net_d(fake), ones)
        loss_g.backward()
        opt_g.step()
        if step == args.warmup:
            started = time.perf_counter()
        elif step > args.warmup:
            samples += len(real) * world_size
    elapsed = time.perf_counter() - started
    if rank == 0:
        print(f"loss D {loss_d.item():.4f}, G {loss_g.item():.4f} after {args.steps} steps")
        print(
            f"own_samples_per_s={samples / elapsed:.1f} samples={samples} seconds={elapsed:.4f} "
            f"steps={args.steps - args.warmup} world_size={world_size}",
            flush=True,
        )
    del net_g, net_d, generator, discriminator
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
