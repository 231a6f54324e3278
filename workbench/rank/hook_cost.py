"""What each DDP comm hook costs on a run's own gradient buckets: part of the network
micro-benchmark (``network.py``), so that a prediction for a hook the run did not use knows what
compressing, sending and decompressing take, not only the bytes it saves.

Every hook the workbench offers (:data:`~workbench.config.choices.COMM_HOOKS`: the plain
averaging allreduce, fp16 and bf16 compression, PowerSGD at the run's rank) is run as DDP runs
it (:class:`~workbench.rank.distributed.CommMeter`'s hook, waited for) on buckets of the run's
own gradient shapes, formed by DDP's rule: one bucket of each distinct set of shapes, weighted
by how many of the step's buckets have it. A hook's seconds per step: in each round, every
hook in turn over the step's buckets (interleaved, so that a slower moment of a shared host
falls on all of them), each rank timing its own calls; per hook, the :data:`QUANTILE` of its
rounds on each rank, the mean over the ranks. A low quantile, as the tune measures throughput
at its faster steps: a rank descheduled once spoils one round, not the figure. PowerSGD is timed
once it compresses (after its ``start_powerSGD_iter`` calls of plain allreduce) with its error
feedback and warm start, as in training from then on.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from workbench.config.choices import COMM_HOOKS
from workbench.rank import distributed

#: Wall-time budget of the timed rounds (seconds); the warm-up rounds come on top.
BUDGET_S = 0.4
#: Rounds before timing: PowerSGD sends plain allreduce on its first ``start_powerSGD_iter``
#: (2) calls and allocates its factors on the first that compresses.
WARMUP_ROUNDS = 3
#: Timed rounds, at least and at most.
MIN_ROUNDS, MAX_ROUNDS = 8, 200
#: The quantile of a hook's rounds taken (the tune's measured throughput: its faster steps).
QUANTILE = 0.25
DEFINITION = (
    "seconds per step of each DDP comm hook on the run's own buckets (compress, allreduce, "
    "decompress): the lower quartile of interleaved rounds on each rank, the mean over ranks"
)

Shapes = tuple[tuple[int, ...], ...]


class _Bucket:
    """What DDP hands a comm hook (``torch.distributed.GradBucket``), as far as the workbench's
    hooks read it: a flat buffer and its per-parameter views."""

    def __init__(self, index: int, shapes: Shapes, device: torch.device) -> None:
        numels = [int(torch.Size(s).numel()) for s in shapes]
        generator = torch.Generator().manual_seed(index)  # the same values on every rank
        self._buffer = torch.randn(sum(numels), generator=generator).to(device)
        self._gradients = [
            part.view(shape) for part, shape in zip(self._buffer.split(numels), shapes, strict=True)
        ]
        self._index = index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return True  # each call is a whole step to PowerSGD's counter

    def gradients(self) -> list[torch.Tensor]:
        return self._gradients


def bucket_shapes(buckets: Sequence[Sequence[torch.nn.Parameter]]) -> list[Shapes]:
    """Each bucket's gradient shapes (``network.bucket_params``' groups)."""
    return [tuple(tuple(p.shape) for p in bucket) for bucket in buckets]


def measure_hooks(
    buckets: Sequence[Shapes],
    device: torch.device,
    powersgd_rank: int = 1,
    budget_s: float = BUDGET_S,
) -> dict[str, Any]:
    """Time every hook of :data:`COMM_HOOKS` on one step's ``buckets`` (their gradient shapes);
    every rank must call it with the same buckets. Returns the record ``run.json`` keeps under
    ``network.hooks``: ``time_s`` per hook (seconds per step) and how it was measured."""
    started = time.perf_counter()
    counts = Counter(buckets)
    made = [(_Bucket(i, shapes, device), n) for i, (shapes, n) in enumerate(counts.items())]
    meters = {kind: distributed.CommMeter(kind, powersgd_rank, timed=False) for kind in COMM_HOOKS}

    def one_round() -> list[float]:
        """Each hook's seconds for one step's buckets, this rank's clock."""
        out = []
        for kind in COMM_HOOKS:
            total = 0.0
            for bucket, n in made:
                start = time.perf_counter()
                meters[kind].hook(None, bucket).wait()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                total += (time.perf_counter() - start) * n
            out.append(total)
        return out

    for _ in range(WARMUP_ROUNDS):
        first = one_round()
    # the same number of rounds on every rank: each call is a collective
    (round_s,) = distributed.over_ranks([sum(first)], device, how="max")
    rounds = int(min(max(budget_s / max(round_s, 1e-9), MIN_ROUNDS), MAX_ROUNDS))
    times = [one_round() for _ in range(rounds)]
    mine = torch.quantile(torch.tensor(times, dtype=torch.float64), QUANTILE, dim=0)
    seconds = distributed.over_ranks(mine.tolist(), device)
    return {
        "definition": DEFINITION,
        "time_s": dict(zip(COMM_HOOKS, seconds, strict=True)),
        "quantile": QUANTILE,
        "rounds": rounds,
        "powersgd_rank": powersgd_rank,
        "buckets": len(buckets),
        "distinct_buckets": len(made),
        "duration_s": time.perf_counter() - started,
    }
