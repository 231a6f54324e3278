"""A scaling study from Python or the terminal: one config at several world sizes, one after
another (ranks of different runs must not share the cores they are measured on), each laid out
over nodes of ``tasks_per_node`` ranks: a node is filled first, then whole nodes are added."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from workbench.config.run_config import RunConfig
from workbench.errors import ConfigError, PreflightError, Problem, RunFailedError
from workbench.run.backends import backend
from workbench.run.handle import RunHandle
from workbench.run.launch import launch
from workbench.run.launches import next_launch


def layout_problem(world_size: int, tasks_per_node: int | None) -> str | None:
    """Why ``world_size`` cannot be laid out on nodes of ``tasks_per_node`` ranks (None when it
    can): above one node, the ranks must fill whole nodes."""
    if tasks_per_node is None or world_size <= tasks_per_node or world_size % tasks_per_node == 0:
        return None
    t = tasks_per_node
    return (
        f"more ranks than one node of tasks_per_node={t} holds must fill whole nodes: "
        f"1 to {t} (one node) or a multiple of {t} ({2 * t}, {3 * t}, ...)"
    )


def layout_text(world_size: int | str | None, nodes: int, per_node: int | None) -> str:
    """A layout as people say it: ``world_size 4 (2 nodes x 2 ranks)`` (``world_size`` may be
    several, as text)."""
    return (
        f"world_size {world_size} ({nodes} node{'s' if nodes != 1 else ''} x "
        f"{per_node} rank{'s' if per_node != 1 else ''})"
    )


def layout(world_size: int, tasks_per_node: int | None) -> tuple[int, int]:
    """``(nodes, ranks per node)`` of ``world_size`` ranks on nodes of ``tasks_per_node``: up to
    one node's worth on one node (``world_size`` ranks there), above it whole nodes
    (``world_size / tasks_per_node`` of them). Without ``tasks_per_node``: one node. A world
    size above one node that is not a multiple of it is a ConfigError."""
    why = layout_problem(world_size, tasks_per_node)
    if why is not None:
        raise ConfigError([Problem("world_size", world_size, why)])
    if tasks_per_node is None or world_size <= tasks_per_node:
        return 1, world_size
    return world_size // tasks_per_node, tasks_per_node


def scaling_configs(
    config: RunConfig, world_sizes: Iterable[int], tasks_per_node: int | None = None
) -> list[RunConfig]:
    """The config at each world size, laid out by :func:`layout` (one node each without
    ``tasks_per_node``), keeping the per-device batch (weak scaling, as the seed studies do)
    unless the config fixed the global batch. Every problem of every world size is raised as
    one ConfigError, each naming its world size."""
    out, problems = [], []
    for n in world_sizes:
        why = layout_problem(n, tasks_per_node)
        if why is not None:
            problems.append(Problem("world_size", n, why))
            continue
        nodes, per_node = layout(n, tasks_per_node)
        changes: dict[str, Any] = {
            "world_size": n,
            # None: derived from the world size, as a config of one node derives it
            "tasks_per_node": None if tasks_per_node is None else per_node,
            "nodes": nodes,
            "run_name": None,
        }
        if "global_batch_size" in config.derived:
            changes["global_batch_size"] = None
        else:
            changes["per_device_batch_size"] = None
        try:
            out.append(config.replace(**changes))
        except ConfigError as exc:
            where = layout_text(n, nodes, per_node)
            problems += [Problem(f"{where}: {p.field}", p.value, p.allowed) for p in exc.problems]
    if problems:
        raise ConfigError(problems, what="the scaling study")
    return out


def check_study(configs: Sequence[RunConfig], executor: str, **executor_options: Any) -> None:
    """What the executor cannot run of any of ``configs`` (its options, a layout of several
    nodes on an executor of one machine), raised as one PreflightError naming each world size,
    before the first run starts."""
    back_end = backend(executor)
    problems = back_end.option_problems(executor_options)
    for config in configs:
        where = layout_text(config.world_size, config.nodes, config.tasks_per_node)
        problems += [
            Problem(f"{where}: {p.field}", p.value, p.allowed)
            for p in back_end.config_problems(config)
        ]
    if problems:
        raise PreflightError(problems)


def run_study(
    configs: Sequence[RunConfig],
    executor: str = "local",
    progress: bool = True,
    **executor_options: Any,
) -> list[RunHandle]:
    """Launch each config in turn and wait for it (again, measuring until known, while its
    launches disagree: :mod:`workbench.run.launches`); a failed run is reported, the study goes
    on. What the executor cannot run of any config is refused before the first
    (:func:`check_study`)."""
    from tqdm.auto import tqdm

    check_study(configs, executor, **executor_options)

    handles: list[RunHandle] = []
    bar = tqdm(configs, desc="runs", unit="run", disable=not progress)
    for config in bar:
        bar.set_postfix_str(f"{config.model} x{config.world_size}")
        done: list[RunHandle] = []
        this: RunConfig | None = config
        while this is not None:  # again while the point's launches disagree (launches.py)
            handle = launch(this, executor, **executor_options)
            try:
                handle.wait()
            except RunFailedError as exc:
                bar.write(f"run {handle.run_id} failed: {exc}")
            done.append(handle)
            this = next_launch(config, done)
        handles += done
    return handles
