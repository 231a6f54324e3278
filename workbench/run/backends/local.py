"""The local back end: one subprocess per rank on this machine, under submitit's local controller
in a session of its own (a notebook kernel's interrupt or restart does not reach the ranks)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.config.run_config import RunConfig
from workbench.environment import cuda_device_count
from workbench.errors import Problem
from workbench.run.backends.base import Backend, JobWatch, LocalWatch


def uses_cuda_here(config: RunConfig) -> bool:
    """Whether the ranks of ``config`` use this machine's GPUs (``auto``: when it has some)."""
    if config.device == "cpu":
        return False
    return cuda_device_count() > 0


class LocalBackend(Backend):
    """One subprocess per rank on this machine."""

    name = "local"
    options = {
        "setup": "shell lines run before the ranks start, e.g. ['conda activate wb']",
    }
    on_this_machine = True

    def config_problems(self, config: RunConfig) -> list[Problem]:
        """One node only."""
        if config.nodes == 1:
            return []
        return [
            Problem(
                "nodes",
                config.nodes,
                "the local executor runs on one node; use nodes=1 "
                "(or a Slurm executor for several nodes)",
            )
        ]

    def executor(self, config: RunConfig, folder: Path, options: Mapping[str, Any]) -> Any:
        """submitit's local executor (detached), one task per rank process."""
        from workbench import jobs

        extra = {"setup": options["setup"]} if "setup" in options else {}
        return jobs.local_executor(
            folder,
            tasks_per_node=config.processes,
            nodes=1,
            timeout_min=config.timeout_min,
            gpus_per_node=config.tasks_per_node if uses_cuda_here(config) else 0,
            signal_delay_s=config.signal_delay_s,
            **extra,
        )

    def watch(self, job: Any, job_id: str | None, poll_s: float = 30.0) -> JobWatch:
        """A watch on a local job."""
        return LocalWatch(job, job_id, poll_s)
