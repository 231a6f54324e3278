"""A user's training script as one rank of a run: what ``torchrun`` would give its worker, and the
script run as ``python train.py ARGS`` (or ``python -m pkg.mod ARGS``) would run it, traced by
the hooks of ``workbench.trace.torch_hooks``.

The rank's environment is torchrun's (``torchrun_environment``), so ``init_process_group()``,
the HF Trainer, Accelerate and Lightning find the job with no flag; ``sys.argv``, ``__main__``,
the working directory and ``sys.path[0]`` are what the interpreter would set. The script's
``sys.exit(0)`` (or ``None``) is a completed rank; any other exit code, or an exception, fails
the rank with it. The workbench does not join a process group itself: the script does.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from workbench import schema
from workbench.config.run_config import RunConfig
from workbench.errors import ScriptExit
from workbench.rank import distributed, hook_cost, memory_parts, network
from workbench.store.trace_files import consolidate
from workbench.trace.script_until_known import ScriptUntilKnown
from workbench.trace.torch_hooks import ScriptHooks
from workbench.trace.tracer import Tracer

#: The DDP arguments a script run's config may set on the script's own DDP (others are its own).
SCRIPT_DDP_FIELDS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph")


def script_ddp_kwargs(config: RunConfig) -> dict[str, Any]:
    """The DDP arguments the run gives the script's DDP: those of :data:`SCRIPT_DDP_FIELDS` set
    to other than their defaults (left at their defaults, the script's own choice stands)."""
    default = RunConfig(script=config.script, script_module=config.script_module)
    return {
        name: getattr(config, name)
        for name in SCRIPT_DDP_FIELDS
        if getattr(config, name) != getattr(default, name)
    }


def script_comm_hook(config: RunConfig) -> Any:
    """What registers the run's ``comm_hook`` on each DDP the script builds (``None`` for the
    plain allreduce: the script's own hook, if any, stands)."""
    if config.comm_hook == "allreduce":
        return None

    def register(ddp: Any) -> None:
        meter = distributed.CommMeter(config.comm_hook, config.powersgd_rank, timed=False)
        ddp.register_comm_hook(None, meter.hook)
        meter.active = True

    return register


#: What torchrun calls the (only) role of its workers.
ROLE_NAME = "default"


def torchrun_environment(
    env: distributed.RankEnv, nodes: int, attempt: int, run_id: str, threads: int, error_file: str
) -> dict[str, str]:
    """The variables torchrun's agent sets for a worker (torch's ``local_elastic_agent``):
    ranks, sizes, the rendezvous address, the elastic bookkeeping (no agent store: rank 0
    hosts the rendezvous store, as with ``init_method='env://'``), and ``OMP_NUM_THREADS``
    (the caller's, else ``threads_per_rank``)."""
    return {
        "RANK": str(env.rank),
        "LOCAL_RANK": str(env.local_rank),
        "GROUP_RANK": str(env.node_rank),
        "ROLE_RANK": str(env.rank),
        "ROLE_NAME": ROLE_NAME,
        "LOCAL_WORLD_SIZE": str(env.local_world_size),
        "WORLD_SIZE": str(env.world_size),
        "GROUP_WORLD_SIZE": str(nodes),
        "ROLE_WORLD_SIZE": str(env.world_size),
        "MASTER_ADDR": env.master_addr,
        "MASTER_PORT": str(env.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(attempt),
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "TORCHELASTIC_ERROR_FILE": error_file,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads)),
    }


def script_label(config: RunConfig) -> str:
    """How messages name the script: its path as given, or ``-m pkg.mod``."""
    return config.script or f"-m {config.script_module}"


@contextmanager
def as_main_program(config: RunConfig, cwd: str) -> Iterator[None]:
    """``sys.argv``, the working directory and ``sys.path[0]`` as ``python train.py ARGS`` (or
    ``python -m pkg.mod ARGS``) run from ``cwd`` would set them; restored afterwards."""
    saved_argv, saved_path, saved_cwd = sys.argv, list(sys.path), os.getcwd()
    os.chdir(cwd)
    if config.script is not None:
        path = os.path.abspath(config.script)
        sys.argv = [config.script, *config.script_args]
        sys.path.insert(0, os.path.dirname(path))
    else:
        sys.argv = [str(config.script_module), *config.script_args]
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)


def run_main(config: RunConfig) -> None:
    """Run the script as ``__main__``; a ``sys.exit`` with a code other than 0 or None raises
    ``ScriptExit``."""
    try:
        if config.script is not None:
            # As given (relative to the working directory): run_path puts it in sys.argv[0].
            runpy.run_path(config.script, run_name="__main__")
        else:
            runpy.run_module(str(config.script_module), run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise ScriptExit(script_label(config), int(os.environ["RANK"]), exc.code) from exc


def run_script_rank(
    config: RunConfig,
    env: distributed.RankEnv,
    device: torch.device,
    run_dir: Path,
    run_id: str,
    attempt: int,
    cwd: str,
) -> dict[str, Any]:
    """Run the script as rank ``env.rank`` and return its summary; ``device`` (the rank's, by
    local rank) is the one whose memory the trace samples."""
    error_file = str(run_dir / schema.LOGS_DIR / f"error-rank{env.rank:05d}.json")
    variables = torchrun_environment(
        env, config.nodes, attempt, run_id, config.threads_per_rank, error_file
    )
    os.environ.update(variables)
    torch.set_num_threads(int(variables["OMP_NUM_THREADS"]))
    traces = run_dir / schema.TRACES_DIR
    traces.mkdir(parents=True, exist_ok=True)
    label = script_label(config)
    with Tracer(
        traces,
        run_id=run_id,
        rank=env.rank,
        local_rank=env.local_rank,
        host=env.host,
        world_size=env.world_size,
        attempt=attempt,
        flush_s=config.trace_flush_s,
        device=device,
        stop_on_nonfinite=False,
    ) as tracer:
        hooks = ScriptHooks(
            tracer,
            script=label,
            rank=env.rank,
            world_size=env.world_size,
            warmup_steps=config.warmup_steps,
            comm_every_steps=config.trace_comm_every_steps,
            collective_timeout_s=config.collective_timeout_s,
            ddp_kwargs=script_ddp_kwargs(config),
            on_ddp=script_comm_hook(config),
            at_end=network_at_buckets(config, env.world_size),
            at_end_fsdp=network.fsdp_at_end(config.network_benchmark, env.world_size),
            count_memory=count_memory,
            local_rank=env.local_rank,
            local_world_size=env.local_world_size,
            rendezvous=(env.master_addr, env.master_port),
            until_known=_until_known(config),
        ).install()
        if hooks.until_known is not None:
            hooks.until_known.agree = functools.partial(_agree, hooks)
        try:
            with as_main_program(config, cwd):
                run_main(config)
            hooks.finish()  # the script returned: every rank is here, its group still up
        finally:
            hooks.close()
    consolidate(traces, env.rank)
    return _summary(env, device, label, hooks, tracer)


def _until_known(config: RunConfig) -> ScriptUntilKnown | None:
    """The script's measuring until known, where the run asks for it."""
    if config.until_known is None:
        return None
    return ScriptUntilKnown(config.until_known, config.until_known_max_s, config.warmup_steps)


def _agree(hooks: ScriptHooks, flags: list[bool]) -> list[bool]:
    """A script's ranks agreeing on their stop until known: on the hooks' own gloo group once
    the script has a process group, alone before."""
    if hooks.side_group is None:
        return flags
    return distributed.any_rank_flags(flags, torch.device("cpu"), group=hooks.side_group)


def _summary(
    env: distributed.RankEnv,
    device: torch.device,
    label: str,
    hooks: ScriptHooks,
    tracer: Tracer,
) -> dict[str, Any]:
    """What a script's rank returns to the caller (as a built-in rank's summary, with what the
    hooks saw: DDP modules, whether it joined a process group, how communication was timed)."""
    return {
        "rank": env.rank,
        "host": env.host,
        "device": str(device),
        "steps": hooks.steps,
        "rss_bytes": tracer.memory(fresh=True)["rss_bytes"],
        "t0_unix": tracer.t0_unix,
        "preempted": False,
        "script": label,
        "ddp_modules": hooks.ddp_modules,
        "joined_process_group": hooks.joined_group,
        "comm_method": hooks.comm_method(),
        "strategy": hooks.strategy(),
        **({"memory_parts": hooks.memory_parts} if hooks.memory_parts is not None else {}),
        "measurement_warnings": list(dict.fromkeys(hooks.warnings)),
        **({"network": hooks.measured} if hooks.measured is not None else {}),
        "until_known": None if hooks.until_known is None else hooks.until_known.record(),
    }


def count_memory(model: Any, optimizer: Any, gather_dtype: str | None) -> dict[str, Any]:
    """The script's model's memory in its parts (``memory_parts.count``, as a built-in run counts
    its own), the FSDP all-gathers' dtype given by name (``bfloat16``)."""
    dtype = getattr(torch, gather_dtype) if gather_dtype else None
    return memory_parts.count(model, optimizer, dtype)


def network_at_buckets(
    config: RunConfig, world_size: int
) -> Callable[[DistributedDataParallel], dict[str, Any] | None] | None:
    """What the hooks call once the script's training is over: the network micro-benchmark at
    its first DDP's own buckets, on every rank of a multi-rank run unless
    ``network_benchmark`` is off. A built-in run and a script both measure it after the last
    step, outside every clock of the script's own (the HF Trainer's
    starts before it builds its DDP, so a measurement there would count in its throughput)."""
    if not (config.network_benchmark and world_size > 1):
        return None
    element = 2 if config.comm_hook in ("fp16", "bf16") else 4

    def measure(ddp: DistributedDataParallel) -> dict[str, Any] | None:
        sizes = network.ddp_bucket_sizes(ddp, element)
        device = next(ddp.module.parameters()).device
        params = network.bucket_params(ddp.module, network.ddp_cap_mb(ddp))
        return network.measure_allreduce(
            sizes,
            device,
            world_size,
            config.comm_hook,
            hook_buckets=hook_cost.bucket_shapes(params),
            powersgd_rank=config.powersgd_rank,
        )

    return measure
