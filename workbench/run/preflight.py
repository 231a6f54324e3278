"""Preflight: everything about a run that can be checked on this machine before a process starts
(executor options and layout, devices, plug-ins, data files, ports, the output folder), reported
at once."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from workbench import schema
from workbench.config.choices import HF_PREFIX
from workbench.config.run_config import RunConfig
from workbench.environment import cuda_device_count
from workbench.errors import PreflightError, Problem
from workbench.ports import port_free
from workbench.rank.spawn_check import spawn_problems
from workbench.run.backends import backend
from workbench.store.files import run_dir

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
    try:  # root passes os.access everywhere (even /proc): only creating a file tells
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        return f"cannot create files in {probe}: {exc.strerror or exc}"
    free = shutil.disk_usage(probe).free
    if free < MIN_FREE_BYTES:
        return f"only {free // 2**20} MiB free on the disk holding {probe}"
    return None


def preflight(
    config: RunConfig,
    executor: str,
    options: dict[str, Any],
    resume: bool = False,
    probe: bool = True,
) -> Path:
    """Everything that can be checked on this machine before a process starts; raises one
    PreflightError listing every problem. Then (``probe``), where the executor is a scheduler,
    whether it can be reached from here: a SlurmError (one line: sbatch's words, what to
    check) if not. Returns the run folder; writes nothing."""
    back_end = backend(executor)  # an unknown executor is the one problem worth reporting
    problems = back_end.check(config, options)
    if back_end.on_this_machine:  # a scheduler's nodes are not this machine
        problems += _device_problems(config)
        problems += _data_parallel_problems(config)
    if config.dataset == "parquet":
        problems += _parquet_problems(config)
    problems += _plugin_problems(config)
    problems += _script_problems(config)
    if back_end.on_this_machine:
        problems += _port_problems(config)
    run_path = run_dir(config.output_dir, config.sweep, config.run_name or "x")
    problems += _folder_problems(config, run_path, resume)
    if problems:
        raise PreflightError(problems)
    # Last: asking a scheduler that does not answer takes seconds (sbatch retries).
    error = back_end.unreachable() if probe else None
    if error is not None:
        raise error
    return run_path


def _device_problems(config: RunConfig) -> list[Problem]:
    """CUDA asked for and present; precision, SyncBatchNorm and backend that need it."""
    if config.device == "cpu":
        return []
    problems = []
    gpus = cuda_device_count()
    wants_cuda = config.device == "cuda" or gpus > 0
    if config.device == "cuda" and gpus == 0:
        problems.append(
            Problem("device", config.device, "no CUDA device is visible here; use 'cpu' or 'auto'")
        )
    elif wants_cuda and config.tasks_per_node > gpus:  # type: ignore[operator]
        problems.append(
            Problem(
                "tasks_per_node",
                config.tasks_per_node,
                f"more devices per node than present: this node has {gpus} GPU(s)",
            )
        )
    torch = sys.modules.get("torch")  # not imported here: no CUDA context either
    if wants_cuda and torch is not None and torch.cuda.is_initialized():
        problems.append(
            Problem(
                "device",
                config.device,
                "this kernel already created a CUDA context (it holds GPU memory and "
                "skews the measurements); restart the kernel and launch before using CUDA",
            )
        )
    if not wants_cuda:
        problems += _needs_cuda_problems(config)
    return problems


def _needs_cuda_problems(config: RunConfig) -> list[Problem]:
    """Settings that need CUDA, on a machine without a GPU."""
    problems = []
    if config.precision == "fp16":
        problems.append(
            Problem(
                "precision",
                config.precision,
                "fp16 needs CUDA and no GPU is visible; use fp32 or bf16 on CPU",
            )
        )
    if config.sync_batchnorm:
        problems.append(
            Problem(
                "sync_batchnorm",
                config.sync_batchnorm,
                "SyncBatchNorm needs CUDA and no GPU is visible; leave it off on CPU",
            )
        )
    if config.backend == "nccl":
        problems.append(Problem("backend", config.backend, "nccl needs CUDA; use gloo or auto"))
    return problems


def _data_parallel_problems(config: RunConfig) -> list[Problem]:
    """DataParallel needs as many CUDA devices here as its world size."""
    if config.strategy != "dp":
        return []
    gpus = cuda_device_count()
    if gpus >= 2 and gpus >= config.world_size:  # type: ignore[operator]
        return []
    return [
        Problem(
            "strategy",
            "dp",
            f"DataParallel over world_size={config.world_size} "
            f"GPUs needs that many CUDA devices; this machine has {gpus}. "
            "Use strategy='ddp' (or 'single') here",
        )
    ]


def _plugin_problems(config: RunConfig) -> list[Problem]:
    """A plug-in model or dataset must import here, not fail in every rank later."""
    problems = []
    for field_name in ("model", "dataset"):
        spec = getattr(config, field_name)
        if config.is_script:  # the model field names the script
            continue
        if spec.startswith(HF_PREFIX):
            problems += _hf_problems(config)
            continue
        if ":" in spec:
            from workbench.rank.models import load_plugin

            try:
                load_plugin(spec, field_name)
            except ValueError as exc:
                problems.append(Problem(field_name, spec, str(exc).split(": ", 1)[1]))
    return problems


def _hf_problems(config: RunConfig) -> list[Problem]:
    """An ``hf:`` model needs transformers here, and options its config class has."""
    from workbench.rank.hf_models import hf_config

    try:
        hf_config(config.model, dict(config.model_options))
    except ImportError as exc:
        return [Problem("model", config.model, str(exc))]
    except (ValueError, TypeError) as exc:
        return [Problem("model_options", dict(config.model_options), str(exc))]
    return []


def _script_problems(config: RunConfig) -> list[Problem]:
    """A script must exist here and compile; a script module must be found from here (the
    working directory, as ``python -m`` looks first)."""
    if config.script is not None:
        path = Path(config.script)
        if not path.is_file():
            where = f"no such file (looked in {Path.cwd()})" if not path.is_absolute() else ""
            return [Problem("script", config.script, where or "no such file")]
        try:
            compile(path.read_bytes(), str(path), "exec")
        except (SyntaxError, ValueError) as exc:
            return [Problem("script", config.script, f"does not compile: {exc}")]
        spawns = spawn_problems(config.script, int(config.world_size or 1), config.nodes)
        if spawns:  # its own process count, written in it, is not the ranks a node
            return [Problem("world_size", config.world_size, p) for p in spawns]
    if config.script_module is not None:
        import importlib.util
        import sys

        sys.path.insert(0, str(Path.cwd()))
        try:
            found = importlib.util.find_spec(config.script_module) is not None
        except (ImportError, ValueError) as exc:
            found, why = False, f": {exc}"
        else:
            why = ""
        finally:
            sys.path.pop(0)
        if not found:
            rule = f"no such module from {Path.cwd()} or the installed packages{why}"
            return [Problem("script_module", config.script_module, rule)]
    return []


def _port_problems(config: RunConfig) -> list[Problem]:
    """A master port given must be free on this machine."""
    if config.master_port is None or port_free(config.master_port):
        return []
    return [
        Problem(
            "master_port",
            config.master_port,
            "already in use on this machine; pick another or omit it to get a free one",
        )
    ]


def _folder_problems(config: RunConfig, run_path: Path, resume: bool) -> list[Problem]:
    """The store must be writable; a new run must not exist yet, a resumed one must."""
    why = _writable_dir(Path(config.output_dir))
    if why:
        return [Problem("output_dir", config.output_dir, why)]
    if config.run_name is None:
        return []
    exists = (run_path / schema.RUN_FILE).exists()
    if resume and not exists:
        return [Problem("run_name", config.run_name, f"resume=True but no run at {run_path}")]
    if not resume and exists:
        return [
            Problem(
                "run_name",
                config.run_name,
                f"a run already exists at {run_path}; pick another name, or resume it "
                "(resume=True; --resume in the CLI)",
            )
        ]
    return []


def _parquet_problems(config: RunConfig) -> list[Problem]:
    """The Parquet files exist and split into enough rows for every rank."""
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
