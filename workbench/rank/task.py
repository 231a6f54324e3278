"""The callable submitit runs once per rank: its config and where it runs, pickled by the
launcher. What the rank does is in :mod:`workbench.rank.run_rank`, imported where the rank runs:
the launcher imports only this module, and so no torch.

``RankTask`` is pickled by its module path: the launcher imports it from here."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench import jobs
from workbench.config.run_config import RunConfig
from workbench.ports import free_port

if TYPE_CHECKING:
    from workbench.rank.distributed import RankEnv


@dataclass(frozen=True)
class RankTask:
    """The callable submitit runs once per rank (pickled with its config)."""

    config: RunConfig
    run_dir: str
    run_id: str
    master_port: int | None
    attempt: int = 0
    #: A script run: the caller's working directory, where ``python train.py`` would run.
    cwd: str = "."
    #: A run on the warm pool: the caller's environment at launch (the workers started before
    #: it, from a template that may serve other processes); other executors' ranks inherit it.
    environ: Mapping[str, str] | None = None

    def __call__(self) -> dict[str, Any]:
        """Run this rank as the job's environment (submitit's) says who it is."""
        from workbench.rank.distributed import RankEnv

        env = RankEnv.from_job(
            self.master_port, Path(self.run_dir), self.attempt, self.config.collective_timeout_s
        )
        return self.run(env)

    def run(self, env: RankEnv) -> dict[str, Any]:
        """Run this rank as ``env`` says who it is, recording its status (running, then
        completed, preempted or failed with the traceback) in its rank file; returns its
        summary (:func:`workbench.rank.run_rank.run_task`)."""
        from workbench.rank.run_rank import run_task

        return run_task(self, env)

    def checkpoint(self) -> Any:
        """submitit's requeue hook: the same task, next attempt, at a fresh rendezvous port (a
        stale store from the previous attempt must never be joined): a scheduler job's rank 0
        publishes the next attempt's; a given port is replaced here (this runs on rank 0)."""
        port = None if self.master_port is None else free_port()
        return jobs.resubmission(
            dataclasses.replace(self, attempt=self.attempt + 1, master_port=port)
        )
