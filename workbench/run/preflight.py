"""Preflight: everything about a run that can be checked on this machine before a process starts
(executor options, devices, plug-ins, data files, ports, the output folder), reported at once."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from workbench import schema
from workbench.config.run_config import RunConfig
from workbench.errors import PreflightError, Problem
from workbench.ports import port_free
from workbench.run import slurm
from workbench.store.files import run_dir as _run_dir

EXECUTORS = ("local", "debug", "slurm")


EXECUTOR_OPTIONS: dict[str, tuple[str, ...]] = {
    "local": ("setup",),
    "debug": (),
    "slurm": tuple(slurm.SLURM_OPTIONS),
}


#: Free disk space below which a launch is refused (traces and checkpoints need room).
MIN_FREE_BYTES = 50 * 2**20


def _writable_dir(path: Path) -> str | None:
    """None when ``path`` (or its nearest existing parent) is a writable folder; else why not."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    free = shutil.disk_usage(probe).free
    if free < MIN_FREE_BYTES:
        return f"only {free // 2**20} MiB free on the disk holding {probe}"
    return None


def preflight(
    config: RunConfig, executor: str, options: dict[str, Any], resume: bool = False
) -> Path:
    """Everything that can be checked on this machine before a process starts; raises one
    PreflightError listing every problem. Returns the run folder."""
    problems: list[Problem] = []
    if executor not in EXECUTORS:
        raise PreflightError(
            [Problem("executor", executor, f"must be one of {', '.join(EXECUTORS)}")]
        )
    valid = EXECUTOR_OPTIONS[executor]
    if executor == "slurm":
        problems += slurm.check_options(options)
    else:
        for name in sorted(set(options) - set(valid)):
            problems.append(
                Problem(
                    name,
                    options[name],
                    f"not an option of the {executor} executor; "
                    f"valid: {', '.join(valid) or '(none)'}",
                )
            )
    if executor == "debug" and config.world_size != 1:
        problems.append(
            Problem(
                "world_size",
                config.world_size,
                "the debug executor runs one task in this process: use world_size=1, "
                "or executor='local' for more ranks",
            )
        )
    if executor == "local" and config.nodes != 1:
        problems.append(
            Problem(
                "nodes",
                config.nodes,
                "the local executor runs on one node; use nodes=1 "
                "(or a Slurm executor for several nodes)",
            )
        )
    if config.device != "cpu" and executor != "slurm":  # Slurm's nodes are not this machine
        import torch

        gpus = torch.cuda.device_count()
        wants_cuda = config.device == "cuda" or gpus > 0
        if config.device == "cuda" and gpus == 0:
            problems.append(
                Problem(
                    "device", config.device, "no CUDA device is visible here; use 'cpu' or 'auto'"
                )
            )
        elif wants_cuda and config.tasks_per_node > gpus:  # type: ignore[operator]
            problems.append(
                Problem(
                    "tasks_per_node",
                    config.tasks_per_node,
                    f"more devices per node than present: this node has {gpus} GPU(s)",
                )
            )
        if wants_cuda and torch.cuda.is_initialized():
            problems.append(
                Problem(
                    "device",
                    config.device,
                    "this kernel already created a CUDA context (it holds GPU memory and "
                    "skews the measurements); restart the kernel and launch before using CUDA",
                )
            )
        if not wants_cuda and config.precision == "fp16":
            problems.append(
                Problem(
                    "precision",
                    config.precision,
                    "fp16 needs CUDA and no GPU is visible; use fp32 or bf16 on CPU",
                )
            )
        if not wants_cuda and config.sync_batchnorm:
            problems.append(
                Problem(
                    "sync_batchnorm",
                    config.sync_batchnorm,
                    "SyncBatchNorm needs CUDA and no GPU is visible; leave it off on CPU",
                )
            )
        if not wants_cuda and config.backend == "nccl":
            problems.append(Problem("backend", config.backend, "nccl needs CUDA; use gloo or auto"))
    if config.strategy == "dp" and executor != "slurm":
        import torch

        gpus = torch.cuda.device_count()
        if gpus < 2 or gpus < config.world_size:  # type: ignore[operator]
            problems.append(
                Problem(
                    "strategy",
                    "dp",
                    f"DataParallel over world_size={config.world_size} "
                    f"GPUs needs that many CUDA devices; this machine has {gpus}. "
                    "Use strategy='ddp' (or 'single') here",
                )
            )
    if config.dataset == "parquet":
        problems += _parquet_problems(config)
    for field_name in ("model", "dataset"):
        spec = getattr(config, field_name)
        if ":" in spec:  # a plug-in: it must import here, not fail in every rank later
            from workbench.rank.models import load_plugin

            try:
                load_plugin(spec, field_name)
            except ValueError as exc:
                problems.append(Problem(field_name, spec, str(exc).split(": ", 1)[1]))
    if config.master_port is not None and executor == "local" and not port_free(config.master_port):
        problems.append(
            Problem(
                "master_port",
                config.master_port,
                "already in use on this machine; pick another or omit it to get a free one",
            )
        )
    run_path = _run_dir(config.output_dir, config.sweep, config.run_name or "x")
    why = _writable_dir(Path(config.output_dir))
    if why:
        problems.append(Problem("output_dir", config.output_dir, why))
    elif config.run_name is not None:
        exists = (run_path / schema.RUN_FILE).exists()
        if resume and not exists:
            problems.append(
                Problem("run_name", config.run_name, f"resume=True but no run at {run_path}")
            )
        if not resume and exists:
            problems.append(
                Problem(
                    "run_name",
                    config.run_name,
                    f"a run already exists at {run_path}; pick another name or resume=True",
                )
            )
    if problems:
        raise PreflightError(problems)
    return run_path


def _parquet_problems(config: RunConfig) -> list[Problem]:
    from workbench.store import row_groups

    problems = []
    for key in ("train", "eval"):
        path = Path(config.dataset_options[key])
        if not path.is_file():
            problems.append(Problem(f"dataset_options.{key}", str(path), "no such Parquet file"))
    if problems:
        return problems
    train = config.dataset_options["train"]
    why = row_groups.partition_problem(train, config.processes)
    if why:
        return [Problem("dataset_options.train", train, why)]
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(train).metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    per_rank = min(sum(sizes[r :: config.processes]) for r in range(config.processes))
    if config.train_samples > per_rank * config.processes:
        problems.append(
            Problem(
                "train_samples",
                config.train_samples,
                f"the Parquet shards hold {per_rank} rows per rank: use train_samples <= "
                f"{per_rank * config.processes}",
            )
        )
    return problems

