"""Submitting runs: ``launch`` one run on an executor's back end, ``launch_array`` many on Slurm,
``sbatch_script`` for a dry run.

Ranks are always fresh subprocesses (submitit's local executor locally), never forks of the
calling notebook kernel; submitit itself is reached only through the back ends and
:mod:`workbench.jobs`.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Sequence

from workbench import environment, schema
from workbench.config.run_config import RunConfig
from workbench.errors import PreflightError, SlurmError
from workbench.ports import free_port
from workbench.run.backends import backend
from workbench.run.backends.slurm import SLURM
from workbench.run.handle import RunHandle, attach
from workbench.run.preflight import preflight
from workbench.store.files import (
    read_json,
    release_space,
    reserve_space,
    run_dir,
    update_run,
    write_json,
)

#: How often a handle asks a scheduler about its job, unless ``poll_s`` is given.
DEFAULT_POLL_S = 30.0

__all__ = ["attach", "launch", "launch_array", "preflight", "sbatch_script"]


def _new_run_id(config: RunConfig) -> str:
    """A fresh run id: model (or script) name, world size, time stamp and a random suffix; the
    name made a folder name (``_train.py`` or ``my train.py`` would not be one as they are)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^A-Za-z0-9_.+-]+", "-", config.model.split(":")[-1]).lstrip("_.+-") or "run"
    return f"{name}-w{config.world_size}-{stamp}-{secrets.token_hex(2)}"


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
    from workbench import jobs

    config, run_path = _check(config, executor, executor_options, resume)
    before = read_json(run_path / schema.RUN_FILE) if resume else None
    task = _write(config, run_path, executor, resume)
    logs = run_path / schema.LOGS_DIR
    back_end = backend(executor)
    try:
        job = jobs.submit(back_end.executor(config, logs, executor_options), task)
    except jobs.SUBMIT_FAILED as exc:  # the scheduler refused it: nothing of the run is left
        error = back_end.refused(str(exc))
        if error is None:
            raise
        _undo([run_path], before)
        raise error from None
    shutil.rmtree(run_path / schema.RANKS_DIR / _BEFORE, ignore_errors=True)
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
    checked = [  # every config checked (the controller asked once) before a folder is written
        _check(c, SLURM.name, slurm_options, resume=False, probe=i == 0)
        for i, c in enumerate(configs)
    ]
    prepared = [(c, path, _write(c, path, SLURM.name, False)) for c, path in checked]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (config, _, _) in enumerate(prepared):
        groups.setdefault(_array_key(config), []).append(i)
    poll_s = slurm_options.get("poll_s", DEFAULT_POLL_S)
    handles: dict[int, RunHandle] = {}
    for n, members in enumerate(groups.values()):
        first_config, first_path, _ = prepared[members[0]]
        logs = first_path.parent / ".slurm-arrays"  # one folder per sweep for the array's logs
        options = {**slurm_options, "job_name": first_config.sweep}
        try:
            submitted = SLURM.submit_array(
                first_config, logs, options, [prepared[i][2] for i in members]
            )
        except SlurmError as refused:  # nothing of the study is left: no folder, no job
            _cancel_submitted(handles.values())
            _undo([path for _, path, _ in prepared], None)
            if handles:
                raise SlurmError(
                    f"{refused.args[0]}; the {n} job array(s) of the study submitted before it "
                    "were cancelled",
                    refused.said,
                ) from None
            raise
        for i, job in zip(members, submitted, strict=True):
            config, run_path, _ = prepared[i]
            update_run(run_path, job_id=str(job.job_id), log_dir=str(logs))
            handles[i] = RunHandle(run_path, config, job, SLURM.name, poll_s=poll_s)
    return [handles[i] for i in sorted(handles)]


def _cancel_submitted(handles: Iterable[RunHandle]) -> None:
    """Cancel the jobs of a study whose later submission was refused (best effort: a job
    that already ended, or a controller that went away, leaves nothing to cancel)."""
    for handle in handles:
        try:
            handle.job.cancel(check=False)
        except Exception:  # noqa: BLE001 - nothing to cancel is what we wanted
            pass


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
    config: RunConfig | Mapping[str, Any], executor: str, options: dict[str, Any], resume: bool
) -> tuple[RunConfig, Path, Any]:
    """Name the run, check it, write its config and pending record; the task submitit runs."""
    config, run_path = _check(config, executor, options, resume)
    return config, run_path, _write(config, run_path, executor, resume)


def _check(
    config: RunConfig | Mapping[str, Any],
    executor: str,
    options: dict[str, Any],
    resume: bool,
    probe: bool = True,
) -> tuple[RunConfig, Path]:
    """The config, named, and its run folder, once preflight found nothing wrong (``probe``:
    also ask the scheduler, where there is one, whether it can be reached)."""
    config = as_config(config)
    if config.run_name is None:
        config = config.replace(run_name=_new_run_id(config))
    return config, preflight(config, executor, options, resume, probe=probe)


#: Where a resumed run's last rank records wait until its submission is taken (``_undo``
#: puts them back if it is refused).
_BEFORE = ".before-resume"


def _undo(run_paths: Sequence[Path], before: dict[str, Any] | None) -> None:
    """Take back what was written for runs whose submission was refused: a new run's folder
    goes; a resumed run's record is put back as it was (``before``)."""
    for run_path in run_paths:
        if before is None:
            shutil.rmtree(run_path, ignore_errors=True)
        else:
            release_space(run_path)
            write_json(run_path / schema.RUN_FILE, before)
            kept = run_path / schema.RANKS_DIR / _BEFORE
            for path in kept.glob("rank-*.json"):  # the last attempt's rank records, back
                path.replace(kept.parent / path.name)
            shutil.rmtree(kept, ignore_errors=True)


def _write(config: RunConfig, run_path: Path, executor: str, resume: bool) -> Any:
    """Write the run's config and pending record (and its space reserve); the task submitit
    runs."""
    from workbench.rank.task import RankTask

    attempt = 0
    if resume:
        attempt = int(read_json(run_path / schema.RUN_FILE).get("attempt", 0)) + 1
        kept = run_path / schema.RANKS_DIR / _BEFORE
        kept.mkdir(exist_ok=True)
        for path in (run_path / schema.RANKS_DIR).glob("rank-*.json"):
            path.replace(kept / path.name)  # the new attempt's ranks report afresh
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
    reserve_space(run_path)  # room to record the run's end if the disk fills (handle._finalize)
    task = RankTask(
        config=config,
        run_dir=str(run_path),
        run_id=str(config.run_name),
        master_port=port,
        attempt=attempt,
        cwd=os.getcwd(),
        # Pool workers started before this launch: they get the caller's variables with the task.
        environ=dict(os.environ) if backend(executor).warm_workers else None,
    )
    return task


def array_sbatch_scripts(
    configs: Sequence[RunConfig], **slurm_options: Any
) -> list[tuple[list[RunConfig], str]]:
    """What :func:`launch_array` would submit (a dry run: nothing is written or submitted): per
    job array, in the order submitted, its runs and its sbatch script, with the sweep's name and
    the array's log folder (an array of several runs adds submitit's ``--array`` line)."""
    problems = SLURM.option_problems(slurm_options)
    if problems:
        raise PreflightError(problems)
    groups: dict[tuple[Any, ...], list[RunConfig]] = {}
    for config in configs:
        groups.setdefault(_array_key(config), []).append(config)
    scripts = []
    for members in groups.values():
        first = members[0]
        logs = run_dir(first.output_dir, first.sweep, "x").parent / ".slurm-arrays"
        options = {**slurm_options, "job_name": first.sweep}
        scripts.append((members, SLURM.sbatch_script(first, logs, options)))
    return scripts


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
