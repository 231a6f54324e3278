"""A plain DDP training script for ``torchrun``: the baseline the workbench is compared against.

The same model (``workbench.models.build_model``), the same synthetic dataset
(``workbench.data.build_datasets``), the same sharding, batch, optimizer, seed and threads as a
workbench run of the same ``RunConfig``, with nothing else: no comm hook, no tracer, no
checkpoints, no evaluation. It records, per rank, what the benchmarks compare:

- ``first_step_unix``: wall clock at the start of the first step (launch latency);
- per step ``t_start_s`` (from a t0 taken right after a barrier, as the workbench's tracer does)
  and ``step_s``, so throughput uses the workbench's own definition: samples of the measured
  steps over the window from the first measured step start to the last step end, across ranks.

Usage: ``torchrun --standalone --nproc-per-node 2 benchmarks/plain_ddp.py --model transformer
--batch 32 --steps 100 --warmup 5 --out /tmp/plain``; writes ``<out>/rank-N.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.config.run_config import RunConfig  # noqa: E402
from workbench.rank.data import build_datasets, fetch_batch, train_batches  # noqa: E402
from workbench.rank.models import build_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--batch", type=int, default=32, help="per-device batch size")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of throughput")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    parser.add_argument("--train-samples", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="folder for rank-N.json")
    a = parser.parse_args()

    torch.set_num_threads(a.threads)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    # The config is only used to build the same dataset the workbench builds.
    config = RunConfig(
        model=a.model,
        world_size=world_size,
        per_device_batch_size=a.batch,
        train_samples=a.train_samples,
        seed=a.seed,
        device="cpu",
    )
    torch.manual_seed(a.seed)
    model = DDP(build_model(a.model, {}))
    train_set, _ = build_datasets(config)
    # Same optimizer and hyper-parameters as RunConfig's defaults (SGD, lr 0.05, momentum 0.9).
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=config.learning_rate,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )
    loss_fn = torch.nn.functional.cross_entropy

    dist.barrier()
    t0, t0_unix = time.perf_counter(), time.time()
    first_step_unix = None
    rows = []
    epoch, step = 0, 0
    while step < a.steps:
        for indices in train_batches(train_set, rank, world_size, a.batch, a.seed, epoch):
            if step >= a.steps:
                break
            start = time.perf_counter()
            if first_step_unix is None:
                first_step_unix = time.time()
            inputs, targets = fetch_batch(train_set, indices)
            loss = loss_fn(model(inputs).float(), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            float(loss)  # the workbench reads the loss every step: the same sync here
            step += 1
            rows.append([start - t0, time.perf_counter() - start, len(indices), step <= a.warmup])
        epoch += 1
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{rank}.json").write_text(
        json.dumps(
            {
                "rank": rank,
                "world_size": world_size,
                "t0_unix": t0_unix,
                "first_step_unix": first_step_unix,
                "steps": rows,
                "end_unix": time.time(),
            }
        )
    )
    del model, optimizer  # free the DDP model before the group goes (FACTS: gloo deadlock)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
