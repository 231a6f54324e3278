"""Launch many small real runs without thrashing the two cores: a new run starts as soon as the
ranks already running leave room for it."""

from __future__ import annotations

import time

from workbench.config.run_config import RunConfig
from workbench.run.handle import RunHandle
from workbench.run.launch import launch

from .helpers import WARM

#: Ranks running at once: two cores, each rank one thread, gloo's threads on top.
MAX_RANKS = 4


def launch_all(
    configs: dict[str, RunConfig], timeout_s: float = 600, max_ranks: int = MAX_RANKS
) -> dict[str, RunHandle]:
    """Launch every config on the warm pool, at most ``max_ranks`` ranks at once, and wait for
    all; each run must complete (a failed one raises its RunFailedError naming the rank).
    Returns the handles by the configs' names, in their order."""
    pending = list(configs.items())
    running: dict[str, RunHandle] = {}
    done: dict[str, RunHandle] = {}
    deadline = time.monotonic() + timeout_s
    while pending or running:
        busy = sum(handle.config.processes for handle in running.values())
        while pending and (not running or busy + pending[0][1].processes <= max_ranks):
            name, config = pending.pop(0)
            running[name] = launch(config, WARM)
            busy += config.processes
        for name, handle in list(running.items()):
            try:
                status = handle.wait(timeout_s=0.2)
            except TimeoutError:
                continue
            assert status == "completed", f"run {name} ended {status}"
            done[name] = running.pop(name)
        if time.monotonic() > deadline:
            raise AssertionError(
                f"waited {timeout_s:g} s for runs {sorted(running)} (not started: "
                f"{[name for name, _ in pending]})"
            )
    return {name: done[name] for name in configs}
