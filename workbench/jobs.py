"""The only module that imports submitit: executors, the job environment a rank sees, requeue.

Callers above (``workbench.run`` on the launching side, ``workbench.rank`` inside each rank) ask
this module for plain values and executor objects, so submitit's names stay in one place.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
from submitit.helpers import DelayedSubmission, TorchDistributedEnvironment


@dataclass(frozen=True)
class JobFacts:
    """Who this process is in its job, as the scheduler (or submitit's local controller) says."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    job_id: str


def job_id() -> str:
    """This task's job id, as the scheduler (or submitit's local controller) gives it."""
    return str(submitit.JobEnvironment().job_id)


def job_facts(master_port: int | None = None) -> JobFacts:
    """This task's place in the job (local, debug or Slurm). ``master_port`` overrides the port
    submitit derives from the job id (the launcher picks a free one locally)."""
    if master_port is not None:
        os.environ["MASTER_PORT"] = str(master_port)
    job = submitit.JobEnvironment()
    tde = TorchDistributedEnvironment()
    return JobFacts(
        rank=tde.rank,
        local_rank=tde.local_rank,
        world_size=tde.world_size,
        local_world_size=tde.local_world_size,
        node_rank=job.node,
        num_nodes=job.num_nodes,
        master_addr=node_address(tde.master_addr) if job.num_nodes > 1 else tde.master_addr,
        master_port=tde.master_port,
        job_id=str(job.job_id),
    )


def node_address(node: str) -> str:
    """An address other nodes can reach ``node`` by: its name where the name resolves, else the
    ``NodeAddr`` Slurm has for it. Slurm lets a node's name differ from its address (the local
    cluster in ``scripts/slurm`` names its nodes ``wb-node-a``/``wb-node-b`` at 127.0.0.1), and
    the first node's name is what becomes ``MASTER_ADDR``."""
    try:
        socket.getaddrinfo(node, None)
        return node
    except socket.gaierror:
        pass
    try:
        out = subprocess.run(
            ["scontrol", "-o", "show", "node", node],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return node  # the rendezvous will then fail and name the address it tried
    found = re.search(r"\bNodeAddr=(\S+)", out)
    return found.group(1) if found else node


def preemption_signal() -> int:
    """The signal the scheduler (or the local controller) sends before a time limit."""
    return int(submitit.JobEnvironment._usr_sig())


def resubmission(task: Any) -> Any:
    """What a requeue hook returns: ``task`` submitted again as the job's next attempt."""
    return DelayedSubmission(task)


def debug_executor(folder: Path) -> Any:
    """Runs the one task in this process (for stepping through code)."""
    return submitit.DebugExecutor(folder=folder)


class DetachedLocalExecutor(submitit.LocalExecutor):  # type: ignore[misc]
    """submitit's LocalExecutor, but its controller (and so every rank) starts in a session of
    its own. Jupyter interrupts and restarts a kernel by signalling the kernel's whole process
    group: without this, "interrupt kernel" would SIGINT every rank, and a kernel restart would
    kill the job, which must carry on and be re-attached from the store.

    The controller is started as ``submitit.local.local.start_controller`` starts it, with
    ``start_new_session=True``."""

    def _submit_command(self, command: str) -> Any:
        """Start the local controller as submitit does, in a session of its own."""
        from submitit.local.local import LocalJob

        ntasks = self.parameters.get("tasks_per_node", 1)
        n_gpus = self.parameters.get("gpus_per_node", 0)
        visible = self.parameters.get("visible_gpus", ())
        gpus = range(n_gpus) if visible == () else visible[:n_gpus]
        setup = list(self.parameters.get("setup", ()))
        env = dict(os.environ)
        env.update(
            SUBMITIT_LOCAL_NTASKS=str(ntasks),
            SUBMITIT_LOCAL_COMMAND=command,
            SUBMITIT_LOCAL_TIMEOUT_S=str(int(60 * self.parameters.get("timeout_min", 2.0))),
            SUBMITIT_LOCAL_SIGNAL_DELAY_S=str(int(self.parameters.get("signal_delay_s", 30))),
            SUBMITIT_LOCAL_NODEID="0",
            SUBMITIT_LOCAL_JOB_NUM_NODES="1",
            SUBMITIT_STDERR_TO_STDOUT="1" if self.parameters.get("stderr_to_stdout") else "",
            SUBMITIT_EXECUTOR="local",
            CUDA_VISIBLE_DEVICES=",".join(str(k) for k in gpus),
            SUBMITIT_LOCAL_WITH_SHELL="1" if setup else "",
        )
        cmd: Any = [sys.executable, "-m", "submitit.local._local", str(self.folder)]
        if setup:
            cmd = " && ".join([*setup, shlex.join(cmd)])
        process = subprocess.Popen(cmd, shell=bool(setup), env=env, start_new_session=True)
        return LocalJob(
            folder=self.folder, job_id=str(process.pid), process=process, tasks=list(range(ntasks))
        )


def local_executor(folder: Path, **parameters: Any) -> Any:
    """One subprocess per task on this machine, detached from the caller's process group."""
    executor = DetachedLocalExecutor(folder=folder)
    executor.update_parameters(**parameters)
    return executor


def slurm_executor(folder: Path, **parameters: Any) -> Any:
    """A Slurm executor with submitit's Slurm parameters (``nodes``, ``ntasks_per_node``, ...)."""
    executor = submitit.SlurmExecutor(folder=folder)
    executor.update_parameters(**parameters)
    return executor


#: What an executor's ``submit`` raises when the scheduler's submit command fails (its message:
#: the command's output, e.g. sbatch's).
SUBMIT_FAILED: type[Exception] = submitit.core.utils.FailedJobError


def _quiet(executor: Any) -> Any:
    """Around a Slurm submission: submitit prints a failed sbatch's output to stderr itself;
    the caller reports it (in one line), so it is kept off stderr here."""
    if isinstance(executor, submitit.SlurmExecutor):
        return contextlib.redirect_stderr(io.StringIO())
    return contextlib.nullcontext()


def submit(executor: Any, task: Any) -> Any:
    """``executor.submit(task)``; a failed submit command raises :data:`SUBMIT_FAILED` (its
    message: the command's output)."""
    with _quiet(executor):
        return executor.submit(task)


def submit_all(executor: Any, tasks: Sequence[Any]) -> list[Any]:
    """Every task in one submission (a Slurm job array); as :func:`submit` otherwise."""
    with _quiet(executor), executor.batch():
        jobs = [executor.submit(task) for task in tasks]
    return jobs


def sbatch_text(executor: Any) -> str:
    """The sbatch script a Slurm executor would submit (its job folder shown as ``%j``)."""
    return str(executor._make_submission_file_text(executor._submitit_command_str, "%j"))


def cancel_job(job: Any, grace_s: float = 5.0) -> None:
    """Ask a submitted job to stop (SIGTERM to a local controller, ``scancel`` on Slurm); a
    local controller gets ``grace_s`` to end its tasks, then is killed. Not submitit's own
    cancel for a local job: its SIGINT makes the controller print a ``KeyboardInterrupt``
    traceback into the user's terminal; SIGTERM it forwards to its tasks and waits quietly."""
    process = getattr(job, "_process", None)  # a LocalJob's controller process
    try:
        if process is not None:
            process.terminate()
        else:
            job.cancel()
    except Exception:  # already gone, or the scheduler is away: the caller kills what is left
        pass
    deadline = time.monotonic() + grace_s
    while process is not None and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if process is not None and process.poll() is None:
        process.kill()
