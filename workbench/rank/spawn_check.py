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
#: The module that starts them.
MODULE = "torch.multiprocessing"


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


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` of a chain of names and attributes (None for anything else)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _is_spawn(func: ast.expr, torch_names: set[str], modules: set[str]) -> bool:
    """``mp.spawn`` with ``mp`` torch.multiprocessing (however imported), or a ``spawn``
    imported from it: never another library's ``spawn`` (pexpect's, gevent's)."""
    if isinstance(func, ast.Attribute) and func.attr in SPAWNS:
        return _dotted(func.value) in modules
    return isinstance(func, ast.Name) and func.id in torch_names


def _mp_modules(tree: ast.AST) -> set[str]:
    """The names torch.multiprocessing goes by in the script (``torch.multiprocessing`` after
    ``import torch``, ``mp`` after ``import torch.multiprocessing as mp``, ...)."""
    names = {"torch.multiprocessing"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname for a in node.names if a.name == MODULE and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            names |= {a.asname or a.name for a in node.names if a.name == "multiprocessing"}
    return names


def _conditional_calls(tree: ast.AST) -> set[int]:
    """The ids of calls inside an ``if``, a loop or a ``try``: whether they run at all is the
    script's to decide at run time (the call itself is checked then, on every rank)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_guard(node.test):
            continue  # ``if __name__ == "__main__":`` runs: the script is run as a program
        if isinstance(node, ast.If | ast.For | ast.While | ast.Try | ast.IfExp):
            for branch in ast.iter_child_nodes(node):
                if branch is not getattr(node, "test", None):
                    inside |= {id(n) for n in ast.walk(branch) if isinstance(n, ast.Call)}
    return inside


def _is_main_guard(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    sides = {_dotted(test.left), _dotted(test.comparators[0])}
    values = {getattr(n, "value", None) for n in (test.left, test.comparators[0])}
    return isinstance(test.ops[0], ast.Eq) and "__name__" in sides and "__main__" in values


def _rebound(tree: ast.AST) -> set[str]:
    """Names given a value other than by one plain assignment (``n *= 2``, a loop variable, a
    function's argument, ``:=``): their value at the call is not known here."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.AugAssign | ast.For) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.NamedExpr):
            names.add(node.target.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


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
    modules, skip = _mp_modules(tree), _conditional_calls(tree)
    numbers = {k: v for k, v in _numbers(tree).items() if k not in _rebound(tree)}
    counts = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _is_spawn(node.func, imported, modules)):
            continue
        if id(node) in skip:
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
