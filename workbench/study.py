"""A scaling study from Python or the terminal: one config at several world sizes, one after
another (ranks of different runs must not share the cores they are measured on)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .config import RunConfig
from .errors import RunFailedError
from .launch import RunHandle, launch


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


def report_from_store(
    target: str | Path,
    output: str | Path,
    output_dir: str | Path = "experiments/results",
    title: str | None = None,
) -> Path:
    """Write the offline HTML report for a sweep name, a sweep folder or a run folder."""
    from .report import write_report
    from .store import iter_run_dirs, load_runs, load_traces

    target_path = Path(target)
    if (target_path / "run.json").exists():
        run_dirs = [target_path]
        sweep_root, sweeps = target_path.parent.parent, [target_path.parent.name]
    else:
        if target_path.is_dir():
            sweep_root, sweeps = target_path.parent, [target_path.name]
        else:
            sweep_root, sweeps = Path(output_dir), [str(target)]
        run_dirs = iter_run_dirs(sweep_root, sweeps)
    if not run_dirs:
        raise ValueError(
            f"target={str(target)!r}: no runs found (looked in {sweep_root} for sweep "
            f"{sweeps[0]!r}); `workbench ls` lists what the store holds"
        )
    runs = load_runs(sweep_root, sweeps)
    runs = runs[runs["path"].isin([str(p) for p in run_dirs])]
    return write_report(
        runs,
        load_traces(run_dirs, "steps"),
        load_traces(run_dirs, "eval"),
        output,
        title=title or f"Scaling report: {target_path.name}",
    )
