"""Submitting runs: ``launch`` one run on an executor's back end, ``launch_array`` many on Slurm,
``sbatch_script`` for a dry run.

Ranks are always fresh subprocesses (submitit's local executor locally), never forks of the
calling notebook kernel; submitit itself is reached only through the back ends and
:mod:`workbench.jobs`.
"""

from __future__ import annotations

import datetime as _dt
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Sequence

from workbench import environment, schema
from workbench.config.run_config import RunConfig
from workbench.errors import PreflightError
from workbench.ports import free_port
from workbench.run.backends import backend
from workbench.run.backends.slurm import SLURM
from workbench.run.handle import RunHandle, attach
from workbench.run.preflight import preflight
from workbench.store.files import read_json, run_dir, update_run, write_json

#: How often a handle asks a scheduler about its job, unless ``poll_s`` is given.
DEFAULT_POLL_S = 30.0

__all__ = ["attach", "launch", "launch_array", "preflight", "sbatch_script"]


def _new_run_id(config: RunConfig) -> str:
    """A fresh run id: model, world size, time stamp and a random suffix."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{config.model.split(':')[-1]}-w{config.world_size}-{stamp}-{secrets.token_hex(2)}"


def launch(
    config: RunConfig | Mapping[str, Any],
    executor: str = "local",
    *,
    resume: bool = False,
    **executor_options: Any,
) -> RunHandle:
    """Start a run of ``config`` (a RunConfig, or a mapping of its fields) and return its handle.

    ``executor``: ``"local"`` (one subprocess per rank on this machine), ``"pool"`` (one warm,
    single-use worker per rank on this machine; option ``pool``: a ``warm_pool()``), ``"debug"``
    (world size 1, in this process, for stepping through code) or ``"slurm"`` (options:
    ``workbench.run.backends.slurm.SLURM_OPTIONS``). ``resume=True`` continues the run named
    ``config.run_name`` from its latest checkpoint, appending to its traces."""
    config, run_path, task = _prepare(config, executor, executor_options, resume)
    logs = run_path / schema.LOGS_DIR
    job = backend(executor).executor(config, logs, executor_options).submit(task)
    update_run(run_path, job_id=str(job.job_id), log_dir=str(logs))
    poll_s = executor_options.get("poll_s", DEFAULT_POLL_S)
    return RunHandle(run_path, config, job, executor, poll_s=poll_s)


def _array_key(config: RunConfig) -> tuple[Any, ...]:
    """What runs of one job array share: their layout and time limit."""
    return (
        config.nodes,
        config.tasks_per_node,
        config.timeout_min,
        config.signal_delay_s,
        config.threads_per_rank,
        config.device,
    )


def launch_array(configs: Sequence[RunConfig], **slurm_options: Any) -> list[RunHandle]:
    """Submit many runs to Slurm as job arrays: one array per distinct layout (nodes, ranks per
    node, time limit), one array task per run, at most ``array_parallelism`` running at once. A
    sweep of 50 points is one or a few submissions instead of 50."""
    prepared = [_prepare(c, SLURM.name, slurm_options, resume=False) for c in configs]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (config, _, _) in enumerate(prepared):
        groups.setdefault(_array_key(config), []).append(i)
    poll_s = slurm_options.get("poll_s", DEFAULT_POLL_S)
    handles: dict[int, RunHandle] = {}
    for members in groups.values():
        first_config, first_path, _ = prepared[members[0]]
        logs = first_path.parent / ".slurm-arrays"  # one folder per sweep for the array's logs
        options = {**slurm_options, "job_name": first_config.sweep}
        jobs = SLURM.submit_array(first_config, logs, options, [prepared[i][2] for i in members])
        for i, job in zip(members, jobs, strict=True):
            config, run_path, _ = prepared[i]
            update_run(run_path, job_id=str(job.job_id), log_dir=str(logs))
            handles[i] = RunHandle(run_path, config, job, SLURM.name, poll_s=poll_s)
    return [handles[i] for i in sorted(handles)]


def as_config(config: RunConfig | Mapping[str, Any]) -> RunConfig:
    """``config`` as a RunConfig: a mapping of fields is built into one (its problems raised as
    one ConfigError); anything else is a TypeError saying what is expected."""
    if isinstance(config, RunConfig):
        return config
    if isinstance(config, Mapping):
        return RunConfig.from_dict(config)
    raise TypeError(
        f"config: expected a RunConfig or a mapping of its fields, got {type(config).__name__} "
        f"({config!r:.80})"
    )


def _prepare(
    config: RunConfig, executor: str, options: dict[str, Any], resume: bool
) -> tuple[RunConfig, Path, Any]:
    """Name the run, check it, write its config and pending record; the task submitit runs."""
    from workbench.rank.task import RankTask

    config = as_config(config)
    if config.run_name is None:
        config = config.replace(run_name=_new_run_id(config))
    run_path = preflight(config, executor, options, resume)
    attempt = 0
    if resume:
        attempt = int(read_json(run_path / schema.RUN_FILE).get("attempt", 0)) + 1
        for path in (run_path / schema.RANKS_DIR).glob("rank-*.json"):
            path.unlink()  # the new attempt's ranks report afresh
    # On this machine a free port is picked here; on Slurm submitit derives one from the job id.
    here = backend(executor).on_this_machine
    port = config.master_port or (free_port() if here else None)
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
        cwd=os.getcwd(),
        # Pool workers started before this launch: they get the caller's variables with the task.
        environ=dict(os.environ) if executor == "pool" else None,
    )
    return config, run_path, task


def sbatch_script(config: RunConfig, **slurm_options: Any) -> str:
    """The sbatch script ``launch(config, executor="slurm", **slurm_options)`` would submit (a dry
    run: nothing is written or submitted)."""
    problems = SLURM.option_problems(slurm_options)
    if problems:
        raise PreflightError(problems)
    if config.run_name is None:
        config = config.replace(run_name=_new_run_id(config))
    logs = run_dir(config.output_dir, config.sweep, str(config.run_name)) / schema.LOGS_DIR
    return SLURM.sbatch_script(config, logs, slurm_options)
