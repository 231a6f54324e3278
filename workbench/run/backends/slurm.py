"""The Slurm back end: its options, the executor (and so the sbatch script), job arrays, and
gentle status polling.

The workbench never depends on ``sacct`` (plenty of clusters run without accounting): it reads
progress from the store and asks ``squeue`` at most every ``poll_s`` seconds whether the job is
still there.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.config.run_config import RunConfig
from workbench.errors import Problem, SlurmError
from workbench.run.backends import slurm_reach
from workbench.run.backends.base import Backend, JobWatch, RankStates
from workbench.run.failure import all_completed

#: Slurm options of ``launch(config, executor="slurm", ...)``, with what each one does.
SLURM_OPTIONS: dict[str, str] = {
    "partition": "partition (queue) to submit to",
    "account": "account to charge",
    "qos": "quality of service",
    "gpus_per_node": "GPUs per node (default: tasks_per_node when device is cuda, else 0)",
    "cpus_per_task": "CPUs per rank (default: threads_per_rank)",
    "mem_gb": "memory per node in GB",
    "constraint": "node features, e.g. 'a100'",
    "job_name": "job name (default: the run id)",
    "sbatch_args": "extra #SBATCH options as a dict, e.g. {'exclusive': True, 'reservation': 'r1'}",
    "srun_args": "extra srun arguments as a list, e.g. ['--cpu-bind=cores']",
    "setup": "shell lines run before srun, e.g. ['module load cuda/12.4', 'conda activate wb']",
    "env": "environment variables exported to every rank, e.g. {'NCCL_DEBUG': 'INFO'}",
    "array_parallelism": "for job arrays: how many array tasks may run at once",
    "poll_s": "seconds between squeue checks while waiting (default 30: be gentle)",
}
#: Options that must be of a given type.
OPTION_TYPES: dict[str, type] = {"sbatch_args": dict, "env": dict, "srun_args": list, "setup": list}
#: Ask srun to kill every task when one exits badly, so a hung rank dies with its peers.
DEFAULT_SRUN_ARGS = ("--kill-on-bad-exit=1",)
#: How long a job may wait in the queue (a sweep's notebook cells get that much longer).
QUEUE_S = 24 * 3600.0
ACTIVE_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RESIZING",
    "SUSPENDED",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
}


@dataclass
class SqueuePoller:
    """Whether a job is still known to the scheduler, asked at most every ``poll_s`` seconds."""

    job_id: str
    poll_s: float = 30.0
    _last: float = field(default=-float("inf"))
    _active: bool = True
    state: str | None = None

    def active(self, fresh: bool = False) -> bool:
        """The job's last known presence in ``squeue`` (asked again once ``poll_s`` passed, or
        now when ``fresh``)."""
        now = time.monotonic()
        if not fresh and now - self._last < self.poll_s:
            return self._active
        self._last = now
        try:
            out = subprocess.run(
                ["squeue", "-h", "-j", self.job_id, "-o", "%T"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return self._active  # the scheduler is busy or away: keep the last answer
        if out.returncode != 0 and "Invalid job id" not in out.stderr:
            return self._active
        states = {s.strip() for s in out.stdout.split()}
        self.state = ",".join(sorted(states)) or None
        self._active = bool(states & ACTIVE_STATES)
        return self._active


def scancel(job_id: str) -> None:
    """scancel a job (for handles re-attached from the store, which hold no submitit job)."""
    try:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass


class SlurmWatch(JobWatch):
    """A Slurm job: over once every rank reported completed, else while ``squeue`` lists it."""

    def __init__(self, job: Any, job_id: str | None, poll_s: float = 30.0) -> None:
        super().__init__(job, job_id, poll_s)
        self.squeue = SqueuePoller(str(job_id), poll_s)

    def running(self, states: RankStates, processes: int) -> bool:
        """Whether the scheduler still holds the job (not asked once every rank completed)."""
        if all_completed(states, processes):
            return False
        return self.squeue.active()

    def ended(self) -> tuple[bool, str]:
        """Whether ``squeue``, asked now, no longer lists the job as active; and its state."""
        active = self.squeue.active(fresh=True)
        return not active, self.squeue.state or "not in squeue"

    def cancel(self) -> None:
        """Cancel through submitit, or with scancel when re-attached."""
        if self.job is not None:
            super().cancel()
        elif self.job_id:
            scancel(self.job_id)


class SlurmBackend(Backend):
    """Ranks on a Slurm cluster's nodes, one srun task each."""

    name = "slurm"
    options = SLURM_OPTIONS
    on_this_machine = False
    queue_s = QUEUE_S
    submits_at_once = True
    job_script = True

    def held_since(self, submitted_at: float, rank_starts: Sequence[float]) -> float:
        """The first rank's start (the queue's wait is not the run's): the job's own start-up
        before it, a second or so, is left out."""
        return min(rank_starts, default=submitted_at)

    def option_problems(self, options: Mapping[str, Any]) -> list[Problem]:
        """Unknown options, and options of the wrong type."""
        problems = super().option_problems(options)
        for name, kind in OPTION_TYPES.items():
            if name in options and not isinstance(options[name], kind):
                problems.append(Problem(name, options[name], f"must be a {kind.__name__}"))
        return problems

    def unreachable(self) -> SlurmError | None:
        """Why no Slurm controller can be reached from here (sbatch's words and what to
        check), or None; asked by preflight once everything else is in order."""
        return slurm_reach.probe()

    def refused(self, said: str) -> SlurmError:
        """A submission sbatch refused (``said``: its output), as a one-line error."""
        return slurm_reach.refused(said)

    def executor(self, config: RunConfig, folder: Path, options: Mapping[str, Any]) -> Any:
        """A SlurmExecutor with the run's layout, time limit and the user's options."""
        from workbench import jobs

        return jobs.slurm_executor(folder, **self.parameters(config, options))

    @staticmethod
    def parameters(config: RunConfig, options: Mapping[str, Any]) -> dict[str, Any]:
        """submitit's Slurm parameters for ``config`` and the user's options."""
        uses_cuda = config.device == "cuda"  # a Slurm node: this machine tells nothing about it
        setup = list(options.get("setup", []))
        setup += [f"export {k}={shlex.quote(str(v))}" for k, v in options.get("env", {}).items()]
        params: dict[str, Any] = {
            "nodes": config.nodes,
            "ntasks_per_node": config.processes // config.nodes,  # DataParallel: one per node
            "cpus_per_task": options.get("cpus_per_task", config.threads_per_rank),
            "gpus_per_node": options.get(
                "gpus_per_node", config.tasks_per_node if uses_cuda else 0
            ),
            "time": max(1, int(round(config.timeout_min))),
            "signal_delay_s": int(config.signal_delay_s),
            "job_name": options.get("job_name", config.run_name or "workbench"),
            "srun_args": list(DEFAULT_SRUN_ARGS) + list(options.get("srun_args", [])),
            "setup": setup,
            "additional_parameters": dict(options.get("sbatch_args", {})),
        }
        for name in ("partition", "account", "qos", "constraint", "array_parallelism"):
            if name in options:
                params[name] = options[name]
        if "mem_gb" in options:
            params["mem"] = f"{options['mem_gb']}GB"
        if not params["gpus_per_node"]:
            del params["gpus_per_node"]
        return params

    def sbatch_script(self, config: RunConfig, folder: Path, options: Mapping[str, Any]) -> str:
        """The sbatch script a run of ``config`` would be submitted with (job folder: %j)."""
        from workbench import jobs

        return jobs.sbatch_text(self.executor(config, folder, options))

    def submit_array(
        self, config: RunConfig, folder: Path, options: Mapping[str, Any], tasks: Sequence[Any]
    ) -> list[Any]:
        """Submit ``tasks`` as one job array with ``config``'s layout; their submitit jobs."""
        from workbench import jobs

        executor = self.executor(config, folder, options)
        try:
            return jobs.submit_all(executor, tasks)
        except jobs.SUBMIT_FAILED as exc:
            raise self.refused(str(exc)) from None

    def watch(self, job: Any, job_id: str | None, poll_s: float = 30.0) -> JobWatch:
        """A watch on a Slurm job."""
        return SlurmWatch(job, job_id, poll_s)


#: The Slurm back end (``launch_array`` and ``sbatch_script`` use it by name).
SLURM = SlurmBackend()
