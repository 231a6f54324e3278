"""What every executor back end provides, and the option check they share.

A back end knows its name and options, what it cannot run, how to make its submitit executor (via
:mod:`workbench.jobs`), how long a queue may hold its jobs, and whether its ranks run on this
machine (then ports and CUDA are checked here). A :class:`JobWatch` follows one of its jobs:
whether it still runs, and how to stop it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from workbench.config.run_config import RunConfig
from workbench.errors import PreflightError, Problem

RankStates = Mapping[int, Mapping[str, Any]]


class JobWatch(ABC):
    """One job of a back end: submitit's job object when this session submitted it, else only
    its id (a handle re-attached from the store)."""

    def __init__(self, job: Any, job_id: str | None, poll_s: float = 30.0) -> None:
        self.job = job
        self.job_id = job_id
        self.poll_s = poll_s

    @abstractmethod
    def running(self, states: RankStates, processes: int) -> bool:
        """Whether the job still runs, given its ranks' records (dead processes marked
        ``died``) and the number of rank processes expected."""

    def cancel(self) -> None:
        """Ask the executor to stop the job (the caller then kills what is left here)."""
        if self.job is not None:
            from workbench import jobs

            jobs.cancel_job(self.job)

    def ended(self) -> tuple[bool, str]:
        """Whether the executor says, asked now, that the job is over; and what it said."""
        if self.job is None:
            return True, "no job object here (re-attached): its processes tell"
        done = bool(self.job.done())
        return done, "done" if done else "still running"

    def settle(self) -> None:  # noqa: B027  (an optional hook: most jobs need nothing)
        """Before waiting on the job: run an in-process job to its end (nothing to do unless
        the job runs in this process)."""


class LocalWatch(JobWatch):
    """A job whose ranks run on this machine (local processes, pool workers): it runs until
    its submitit job is done; re-attached (no job object), while any rank's process is
    alive."""

    def running(self, states: RankStates, processes: int) -> bool:
        """Whether the job (or, re-attached, any rank) still runs."""
        if self.job is not None:
            return not self.job.done()
        return any(s.get("status") == "running" for s in states.values())


class Backend(ABC):
    """An executor: where and how a run's ranks are started."""

    name: ClassVar[str]
    """what ``launch(config, executor=...)`` calls it"""
    options: ClassVar[Mapping[str, str]]
    """its options (``launch(..., **options)``), each with what it does"""
    on_this_machine: ClassVar[bool]
    """whether the ranks run on this machine (ports and CUDA are then checked here)"""
    queue_s: ClassVar[float] = 0.0
    """how long a queue may hold a job before it starts (a sweep's cells wait that much more)"""
    warm_workers: ClassVar[bool] = False
    """whether its rank processes start before a launch (a warm pool): a launch hands them the
    caller's environment, and a study or a tune keeps one set warm across its runs"""
    several_ranks: ClassVar[bool] = True
    """whether it runs more than one rank (a study's or a tune's runs need several)"""
    job_script: ClassVar[bool] = False
    """whether a launch submits a job script (``--dry-run`` prints it)"""
    submits_at_once: ClassVar[bool] = False
    """whether a study submits a round's runs together (job arrays: the scheduler gives each
    its own devices) instead of one after another (ranks on this machine share its cores)"""

    def __repr__(self) -> str:
        return f"<{self.name} executor>"

    def option_problems(self, options: Mapping[str, Any]) -> list[Problem]:
        """Options this back end does not have, each naming the valid ones."""
        valid = ", ".join(self.options) or "(none)"
        return [
            Problem(
                str(name),
                options[name],
                f"not an option of the {self.name} executor; valid: {valid}",
            )
            for name in sorted(set(options) - set(self.options), key=str)
        ]

    def config_problems(self, config: RunConfig) -> list[Problem]:
        """What this back end cannot run in ``config`` (a layout, say); none by default."""
        return []

    def unreachable(self) -> PreflightError | None:
        """Why the scheduler behind this back end cannot be reached from here, asked last by
        preflight; None (the default) when it can, or when there is none to ask."""
        return None

    def refused(self, said: str) -> PreflightError | None:
        """A submission the scheduler refused (``said``: its words) as one clear error; None
        (the default) lets the submitter's own exception through."""
        return None

    def held_since(self, submitted_at: float, rank_starts: Sequence[float]) -> float:
        """When a run's devices became its own, for its device-seconds: at submission by
        default (nothing queues; the interpreters' start-up is the run's cost too)."""
        return submitted_at

    def check(self, config: RunConfig, options: Mapping[str, Any]) -> list[Problem]:
        """Every problem with these options and this config for this back end."""
        return self.option_problems(options) + self.config_problems(config)

    @abstractmethod
    def executor(self, config: RunConfig, folder: Path, options: Mapping[str, Any]) -> Any:
        """The submitit executor for a run of ``config``, its logs in ``folder``."""

    @abstractmethod
    def watch(self, job: Any, job_id: str | None, poll_s: float = 30.0) -> JobWatch:
        """A watch on one job (``job`` None: re-attached, known by ``job_id`` only)."""
