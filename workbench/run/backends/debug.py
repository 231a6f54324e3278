"""The debug back end: the one task runs in this process (world size 1), for stepping through
the rank's code in a debugger."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.config.run_config import RunConfig
from workbench.errors import Problem
from workbench.run.backends.base import Backend, JobWatch, RankStates


class DebugWatch(JobWatch):
    """A debug job: it runs in this process when asked for its result, so once the handle
    waits, it is over."""

    def running(self, states: RankStates, processes: int) -> bool:
        """Never: ``settle`` ran it to its end."""
        return False

    def settle(self) -> None:
        """Run the task here, now; its failure is recorded by the rank itself."""
        if self.job is None:
            return
        try:
            self.job.result()
        except Exception:  # reported from the rank's own record
            pass


class DebugBackend(Backend):
    """World size 1, in this process."""

    name = "debug"
    options: Mapping[str, str] = {}
    on_this_machine = True
    several_ranks = False

    def config_problems(self, config: RunConfig) -> list[Problem]:
        """One rank only."""
        if config.world_size == 1:
            return []
        return [
            Problem(
                "world_size",
                config.world_size,
                "the debug executor runs one task in this process: use world_size=1, "
                "or executor='local' for more ranks",
            )
        ]

    def executor(self, config: RunConfig, folder: Path, options: Mapping[str, Any]) -> Any:
        """submitit's debug executor."""
        from workbench import jobs

        return jobs.debug_executor(folder)

    def watch(self, job: Any, job_id: str | None, poll_s: float = 30.0) -> JobWatch:
        """A watch on a debug job."""
        return DebugWatch(job, job_id, poll_s)
