"""A PyTorch Lightning 2.x script: a ``LightningModule`` (an MLP), a ``Trainer`` with ``devices``
equal to the processes per node (``LOCAL_WORLD_SIZE``, as torchrun sets it) and
``strategy="ddp"`` on gloo, a DataLoader that Lightning shards with its own DistributedSampler.

    python tests/scripts/zoo/lightning_ddp.py --steps 30
    torchrun --standalone --nproc-per-node 2 tests/scripts/zoo/lightning_ddp.py --steps 30

It imports nothing of the workbench. At the end rank 0 prints its own throughput in one line:
``own_samples_per_s=...``: the samples of every rank in the steps after the first ``--warmup``
ones, over rank 0's ``time.perf_counter`` from the end of the last warm-up step's optimizer step
to the end of the last step's (a callback's ``on_train_batch_end``).
"""

from __future__ import annotations

import argparse
import os
import time

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class MLP(L.LightningModule):
    def __init__(self, width: int, lr: float) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, 10),
        )
        self.lr = lr

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class OwnClock(L.Callback):
    """Rank 0's clock from the end of the warm-up's last step to the end of the last step."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.started, self.ended, self.steps = warmup, 0.0, 0.0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        self.steps += 1
        now = time.perf_counter()
        if self.steps == self.warmup:
            self.started = now
        self.ended = now


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the own figure")
    p.add_argument("--batch-size", type=int, default=128, help="per process")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    if not 0 < args.warmup < args.steps:
        p.error(f"--warmup must be between 1 and --steps - 1, got {args.warmup}")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = world_size // devices

    n = args.batch_size * world_size * args.steps
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(n, args.width, generator=g), torch.randint(0, 10, (n,), generator=g)
    )
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=False)
    clock = OwnClock(args.warmup)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=nodes,
        strategy=DDPStrategy(process_group_backend="gloo") if world_size > 1 else "auto",
        max_steps=args.steps,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[clock],
    )
    torch.manual_seed(0)
    trainer.fit(MLP(args.width, args.lr), loader)
    if trainer.global_rank == 0:
        samples = (clock.steps - clock.warmup) * args.batch_size * world_size
        print(f"own_samples_per_s={samples / (clock.ended - clock.started):.2f}", flush=True)


if __name__ == "__main__":
    main()
