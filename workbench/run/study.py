"""A scaling study from Python or the terminal: one config at several world sizes, one after
another (ranks of different runs must not share the cores they are measured on), each laid out
over nodes of ``tasks_per_node`` ranks: a node is filled first, then whole nodes are added."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from workbench.config.run_config import RunConfig
from workbench.errors import ConfigError, PreflightError, Problem
from workbench.run.backends import backend
from workbench.run.handle import RunHandle
from workbench.run.rounds import StudyRuns, run_rounds


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
    budget_device_s: float | None = None,
    again: bool = True,
    **executor_options: Any,
) -> StudyRuns:
    """Launch each config and wait for it, then, round after round, again the points whose
    launches disagree (measuring until known: :mod:`workbench.run.rounds`), within
    ``budget_device_s`` device-seconds where given; ``again=False``: each point once. A failed
    run is reported, the study goes on. What the executor cannot run of any config is refused
    before the first (:func:`check_study`). The handles come point by point; the result says
    what the budget left undone (:meth:`StudyRuns.budget_note`)."""
    from tqdm.auto import tqdm

    check_study(configs, executor, **executor_options)
    with tqdm(total=len(configs), desc="runs", unit="run", disable=not progress) as bar:

        def wait(handle: RunHandle, label: str) -> None:
            bar.total = max(bar.total, bar.n + 1)  # a launch again: one more than planned
            bar.set_postfix_str(f"{label}: {handle.config.model} x{handle.config.world_size}")
            try:
                handle.wait()
            finally:
                bar.update(1)

        return run_rounds(
            [(c, []) for c in configs],
            executor,
            wait,
            budget_device_s=budget_device_s,
            again=again,
            say=bar.write,
            **executor_options,
        )
