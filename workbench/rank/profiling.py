"""Optional deep profiling of a window of steps with torch.profiler, one trace file per rank.

The files are Chrome/Kineto traces named ``rankNNNNN.<time>.pt.trace.json`` under
``<run>/profiles/``; each carries ``distributedInfo`` (rank, world size) and ``ProfilerStep#N``
markers, which is what Holistic Trace Analysis and TensorBoard's profiler plug-in read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


class NoProfiler:
    """What ``step_profiler`` yields outside its window: a ``step()`` that does nothing."""

    def step(self) -> None:
        """Nothing to record."""


@contextlib.contextmanager
def step_profiler(
    window: tuple[int, int] | None, done_steps: int, out_dir: Path, rank: int, device: torch.device
) -> Iterator[Any]:
    """A profiler whose ``step()`` the loop calls after every step; it records only the steps of
    ``window`` (global, from 1), so the rest of the run pays nothing."""
    if window is None or window[1] <= done_steps:
        yield NoProfiler()
        return
    first, last = max(window[0], done_steps + 1), window[1]
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    out_dir.mkdir(parents=True, exist_ok=True)
    # The schedule sees the profiler's step counter, which starts at the run's next step, so its
    # numbers (and the ProfilerStep#N markers) are the run's own. One warm-up step if there is room.
    warmup = 1 if first - 1 > done_steps else 0
    schedule = torch.profiler.schedule(
        skip_first=first - warmup, wait=0, warmup=warmup, active=last - first + 1, repeat=1
    )
    prof = torch.profiler.profile(
        activities=activities,
        schedule=schedule,
        on_trace_ready=torch.profiler.tensorboard_trace_handler(
            str(out_dir), worker_name=f"rank{rank:05d}"
        ),
    )
    prof.step_num = done_steps + 1
    with prof:
        yield prof
