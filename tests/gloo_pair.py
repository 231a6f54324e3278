"""Two fresh processes joined by a gloo group, for the tests that time bare collectives beside
the workbench's own (``test_comm_measured.py``, ``test_fsdp_trace.py``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workbench.ports import free_port


def _gloo_rank(
    rank: int, port: int, target: Callable[..., dict[str, Any]], args: tuple, out: Any
) -> None:
    """One of two gloo ranks on one thread each: ``target(*args)`` between the process group's
    start and end; rank 0's returned dict goes to ``out``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    result = target(*args)
    if rank == 0:
        out.update(result)
    dist.barrier()
    dist.destroy_process_group()


def in_two_ranks(target: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``target(*args)`` in two fresh processes joined by a gloo group; rank 0's result."""
    with mp.Manager() as manager:
        out = manager.dict()
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.spawn(_gloo_rank, args=(free_port(), target, args, out), nprocs=2, join=True)
        return dict(out)
