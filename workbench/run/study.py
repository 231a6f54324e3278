"""A scaling study from Python or the terminal: one config at several world sizes, one after
another (ranks of different runs must not share the cores they are measured on)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from workbench.config.run_config import RunConfig
from workbench.errors import RunFailedError
from workbench.run.handle import RunHandle
from workbench.run.launch import launch


def scaling_configs(config: RunConfig, world_sizes: Iterable[int]) -> list[RunConfig]:
    """The config at each world size, keeping the per-device batch (weak scaling, as the seed
    studies do) unless the config fixed the global batch."""
    out = []
    for n in world_sizes:
        changes: dict[str, Any] = {
            "world_size": n,
            "tasks_per_node": None,
            "nodes": 1,
            "run_name": None,
        }
        if "global_batch_size" in config.derived:
            changes["global_batch_size"] = None
        else:
            changes["per_device_batch_size"] = None
        out.append(config.replace(**changes))
    return out


def run_study(
    configs: Sequence[RunConfig],
    executor: str = "local",
    progress: bool = True,
    **executor_options: Any,
) -> list[RunHandle]:
    """Launch each config in turn and wait for it; a failed run is reported, the study goes on."""
    from tqdm.auto import tqdm

    handles = []
    bar = tqdm(configs, desc="runs", unit="run", disable=not progress)
    for config in bar:
        bar.set_postfix_str(f"{config.model} x{config.world_size}")
        handle = launch(config, executor, **executor_options)
        try:
            handle.wait()
        except RunFailedError as exc:
            bar.write(f"run {handle.run_id} failed: {exc}")
        handles.append(handle)
    return handles
