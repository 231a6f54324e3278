"""A plain DDP training script with planted costs, for the workbench's tests. It imports nothing
from the workbench: the workbench must trace it as it is.

    torchrun --nproc-per-node 2 tests/scripts/planted.py --steps 20 --data-sleep-ms 40

Options plant a cost (a sleep per batch in the DataLoader's collate function, a sleep in a
forward pre-hook of the model) or a behaviour (gradient accumulation, no DDP, no process group,
an early ``sys.exit``, a rank that never joins, ``mp.spawn``).
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Synthetic(Dataset):
    def __init__(self, n: int, width: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, width, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--data-sleep-ms", type=float, default=0.0)
    p.add_argument("--forward-sleep-ms", type=float, default=0.0)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--no-ddp", action="store_true")
    p.add_argument("--no-init", action="store_true")
    p.add_argument("--exit-after", type=int, default=0, help="sys.exit(EXIT_CODE) after N steps")
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--hang-rank", type=int, default=-1, help="this rank never joins")
    p.add_argument("--spawn", action="store_true")
    p.add_argument("--no-optimizer", action="store_true", help="update the weights by hand")
    p.add_argument("--dump", help="write argv, cwd, sys.path[0], __name__ and os.environ here")
    p.add_argument("--clock", help="write the script's own seconds of each fetch and forward here")
    a = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    if a.dump:
        facts = {
            "argv": sys.argv,
            "cwd": os.getcwd(),
            "path0": sys.path[0],
            "name": __name__,
            "env": dict(os.environ),
            "threads": torch.get_num_threads(),
        }
        with open(f"{a.dump}.rank{rank}.json", "w") as f:
            json.dump(facts, f)
    if a.spawn:
        import torch.multiprocessing as mp

        mp.spawn(print, nprocs=2)
    if a.hang_rank == rank:
        time.sleep(3600)
    if not a.no_init:
        dist.init_process_group("gloo")
    model: nn.Module = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    if a.forward_sleep_ms:
        model.register_forward_pre_hook(lambda m, i: time.sleep(a.forward_sleep_ms / 1000))
    if not a.no_ddp:
        model = nn.parallel.DistributedDataParallel(model)
    data = Synthetic(a.batch * a.accum * (a.steps + 1) * int(os.environ.get("WORLD_SIZE", "1")), 32)
    sampler = DistributedSampler(data) if dist.is_initialized() else None

    def collate(items):
        if a.data_sleep_ms:
            time.sleep(a.data_sleep_ms / 1000)
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    loader = DataLoader(data, batch_size=a.batch, sampler=sampler, collate_fn=collate)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = iter(loader)
    # the script's own clock (the planted sleeps wake late, more so on a loaded host): the known
    # answer for the workbench's data and forward phases
    clock: dict[str, list[float]] = {"fetch": [], "forward": []}
    for step in range(1, a.steps + 1):
        for _ in range(a.accum):
            start = time.perf_counter()
            x, y = next(batches)
            fetched = time.perf_counter()
            loss = nn.functional.cross_entropy(model(x), y) / a.accum
            clock["fetch"].append(fetched - start)
            clock["forward"].append(time.perf_counter() - fetched)  # to the backward, the loss in
            loss.backward()
        if a.no_optimizer:
            with torch.no_grad():
                for param in model.parameters():
                    param -= 0.05 * param.grad
                    param.grad = None
        else:
            opt.step()
            opt.zero_grad()
        if a.exit_after and step == a.exit_after:
            sys.exit(a.exit_code)
    if a.clock:
        with open(f"{a.clock}.rank{rank}.json", "w") as f:
            json.dump(clock, f)
    del model
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
