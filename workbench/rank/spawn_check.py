"""Before any process starts: a script that starts its own processes with
``torch.multiprocessing.spawn`` (or ``start_processes``) and a number written in it as their
count (``nprocs=2``, or a name given a number once in the script) runs only where that count is
the run's ranks per node (each rank becomes one of those processes:
``workbench.trace.script_group``). Read from the script's syntax, never run; no torch.

A count the script computes (``args.gpus``, ``torch.cuda.device_count()``) cannot be known
here: it is checked at the call, on every rank (``script_group.adopt_spawn``)."""

from __future__ import annotations

import ast
from pathlib import Path

#: The calls that start processes, as their last name.
SPAWNS = ("spawn", "start_processes")


def _numbers(tree: ast.AST) -> dict[str, int | None]:
    """Names assigned an int literal exactly once in the script (None: assigned otherwise)."""
    found: dict[str, int | None] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                number = value.value if isinstance(value, ast.Constant) else None
                number = number if type(number) is int else None
                found[target.id] = None if target.id in found else number
    return found


def _nprocs(call: ast.Call) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == "nprocs":
            return keyword.value
    return call.args[2] if len(call.args) > 2 else None


def _is_spawn(func: ast.expr, torch_names: set[str]) -> bool:
    """``mp.spawn``, ``torch.multiprocessing.spawn``, or a ``spawn`` imported from it."""
    if isinstance(func, ast.Attribute) and func.attr in SPAWNS:
        return True
    return isinstance(func, ast.Name) and func.id in torch_names


def spawn_counts(source: str) -> list[tuple[int, int]]:
    """(line, nprocs) of each spawning call whose count is written in ``source`` as a number."""
    tree = ast.parse(source)
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.multipro")
        for alias in node.names
        if alias.name in SPAWNS
    }
    numbers = _numbers(tree)
    counts = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _is_spawn(node.func, imported)):
            continue
        given = _nprocs(node)
        if isinstance(given, ast.Constant) and type(given.value) is int:
            counts.append((node.lineno, given.value))
        elif isinstance(given, ast.Name) and numbers.get(given.id) is not None:
            counts.append((node.lineno, int(numbers[given.id])))  # type: ignore[arg-type]
    return counts


def spawn_problems(script: str | None, world_size: int, nodes: int) -> list[str]:
    """What is wrong with ``script``'s own process count for a run of ``world_size`` ranks on
    ``nodes`` nodes: one sentence per spawning call whose written count is not the ranks per
    node (nothing for a script that cannot be read: the script's own checks say why)."""
    if script is None:
        return []
    try:
        counts = spawn_counts(Path(script).read_text())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return []
    per_node = max(1, world_size // max(1, nodes))
    return [
        f"line {line} starts nprocs={nprocs} processes with torch.multiprocessing, one per "
        f"rank of a node, but the run has {per_node} rank(s) per node ({world_size} on "
        f"{nodes} node(s)): run it with world_size {nprocs * nodes}"
        for line, nprocs in counts
        if nprocs != per_node
    ]
