"""Submitting a run through submitit and watching it: preflight checks, ``launch()``, ``RunHandle``.

Ranks are always fresh subprocesses (submitit's LocalExecutor locally), never forks of the calling
notebook kernel. The only module that imports submitit besides the rank's own environment lookup.
"""

from __future__ import annotations

import datetime as _dt
import secrets
import time
from pathlib import Path
from typing import Any, Sequence

from workbench import environment, schema
from workbench.config.run_config import RunConfig
from workbench.errors import PreflightError
from workbench.ports import free_port
from workbench.run import slurm
from workbench.run.handle import RunHandle, attach  # noqa: F401  (attach: re-exported)
from workbench.run.preflight import preflight
from workbench.store.files import read_json, update_run, write_json
from workbench.store.files import run_dir as _run_dir


def _new_run_id(config: RunConfig) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{config.model.split(':')[-1]}-w{config.world_size}-{stamp}-{secrets.token_hex(2)}"


def launch(
    config: RunConfig, executor: str = "local", *, resume: bool = False, **executor_options: Any
) -> RunHandle:
    """Start a run and return its handle.

    ``executor``: ``"local"`` (one subprocess per rank on this machine), ``"debug"`` (world size 1,
    in this process, for stepping through code) or ``"slurm"`` (options: ``SLURM_OPTIONS``).
    ``resume=True`` continues the run named ``config.run_name`` from its latest checkpoint,
    appending to its traces."""
    import submitit

    config, run_path, task = _prepare(config, executor, executor_options, resume)
    logs = run_path / schema.LOGS_DIR
    if executor == "debug":
        ex: Any = submitit.DebugExecutor(folder=logs)
    elif executor == "slurm":
        ex = slurm.executor(config, logs, executor_options, _uses_cuda(config, remote=True))
    else:
        ex = _detached_local_executor(logs)
        ex.update_parameters(
            tasks_per_node=config.processes,
            nodes=1,
            timeout_min=config.timeout_min,
            gpus_per_node=config.tasks_per_node if _uses_cuda(config) else 0,
            signal_delay_s=config.signal_delay_s,
            **({"setup": executor_options["setup"]} if "setup" in executor_options else {}),
        )
    job = ex.submit(task)
    update_run(run_path, job_id=str(job.job_id), log_dir=str(logs))
    return RunHandle(run_path, config, job, executor, poll_s=executor_options.get("poll_s", 30.0))


def _detached_local_executor(folder: Path) -> Any:
    """submitit's LocalExecutor, but its controller (and so every rank) starts in a session of
    its own. Jupyter interrupts and restarts a kernel by signalling the kernel's whole process
    group: without this, "interrupt kernel" would SIGINT every rank, and a kernel restart would
    kill the job, which must carry on and be re-attached from the store."""
    import subprocess

    import submitit
    from submitit.local import local

    class _Subprocess:  # submitit.local.local's view of `subprocess`, with detached Popen
        def __getattr__(self, name: str) -> Any:
            return getattr(subprocess, name)

        @staticmethod
        def Popen(*args: Any, **kwargs: Any) -> Any:  # noqa: N802
            return subprocess.Popen(*args, start_new_session=True, **kwargs)

    class DetachedLocalExecutor(submitit.LocalExecutor):
        def _submit_command(self, command: str) -> Any:
            local.subprocess = _Subprocess()  # type: ignore[assignment]
            try:
                return super()._submit_command(command)
            finally:
                local.subprocess = subprocess  # type: ignore[assignment]

    return DetachedLocalExecutor(folder=folder)


def launch_array(configs: Sequence[RunConfig], **slurm_options: Any) -> list[RunHandle]:
    """Submit many runs to Slurm as job arrays: one array per distinct layout (nodes, ranks per
    node, time limit), one array task per run, at most ``array_parallelism`` running at once. A
    sweep of 50 points is one or a few submissions instead of 50."""
    import submitit  # noqa: F401  (the executors below need it)

    prepared = [_prepare(c, "slurm", slurm_options, resume=False) for c in configs]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (c, _, _) in enumerate(prepared):
        key = (
            c.nodes,
            c.tasks_per_node,
            c.timeout_min,
            c.signal_delay_s,
            c.threads_per_rank,
            c.device,
        )
        groups.setdefault(key, []).append(i)
    handles: list[RunHandle | None] = [None] * len(prepared)
    for members in groups.values():
        first_config, first_path, _ = prepared[members[0]]
        logs = first_path.parent / ".slurm-arrays"  # one folder per sweep for the array's logs
        ex = slurm.executor(
            first_config,
            logs,
            {**slurm_options, "job_name": first_config.sweep},
            _uses_cuda(first_config, remote=True),
        )
        with ex.batch():
            jobs = [ex.submit(prepared[i][2]) for i in members]
        for i, job in zip(members, jobs, strict=True):
            config, run_path, _ = prepared[i]
            update_run(run_path, job_id=str(job.job_id), log_dir=str(logs))
            handles[i] = RunHandle(
                run_path, config, job, "slurm", poll_s=slurm_options.get("poll_s", 30.0)
            )
    return [h for h in handles if h is not None]


def _prepare(
    config: RunConfig, executor: str, options: dict[str, Any], resume: bool
) -> tuple[RunConfig, Path, Any]:
    """Name the run, check it, write its config and pending record; the task submitit runs."""
    from workbench.rank.loop import RankTask

    if config.run_name is None:
        config = config.replace(run_name=_new_run_id(config))
    run_path = preflight(config, executor, options, resume)
    attempt = 0
    if resume:
        attempt = int(read_json(run_path / schema.RUN_FILE).get("attempt", 0)) + 1
        for path in (run_path / schema.RANKS_DIR).glob("rank-*.json"):
            path.unlink()  # the new attempt's ranks report afresh
    # Locally a free port is picked here; on Slurm submitit derives one from the job id.
    port = config.master_port or (free_port() if executor in ("local", "debug") else None)
    write_json(run_path / schema.CONFIG_FILE, config.to_dict())
    update_run(
        run_path,
        run_id=config.run_name,
        sweep=config.sweep,
        status="pending",
        attempt=attempt,
        config=config.to_dict(),
        executor=executor,
        submitted_at=time.time(),
        environment=environment.collect(),
        trace_schema=schema.TRACE_SCHEMA_VERSION,
        failure=None,
        ended_at=None,
    )
    task = RankTask(
        config=config,
        run_dir=str(run_path),
        run_id=str(config.run_name),
        master_port=port,
        attempt=attempt,
    )
    return config, run_path, task


def sbatch_script(config: RunConfig, **slurm_options: Any) -> str:
    """The sbatch script ``launch(config, executor="slurm", **slurm_options)`` would submit (a dry
    run: nothing is written or submitted)."""
    problems = slurm.check_options(slurm_options)
    if problems:
        raise PreflightError(problems)
    if config.run_name is None:
        config = config.replace(run_name=_new_run_id(config))
    logs = _run_dir(config.output_dir, config.sweep, config.run_name) / schema.LOGS_DIR  # type: ignore[arg-type]
    import submitit  # noqa: F401  (the executor below needs it)

    return slurm.sbatch_script(
        slurm.executor(config, logs, slurm_options, _uses_cuda(config, remote=True))
    )


def _uses_cuda(config: RunConfig, remote: bool = False) -> bool:
    if config.device == "cpu":
        return False
    if remote:  # a Slurm node: trust the config, this machine tells nothing about it
        return config.device == "cuda"
    import torch

    return torch.cuda.device_count() > 0
