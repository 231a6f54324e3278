"""What a script's own calls that start processes and process groups get under the hooks
(``torch_hooks.ScriptHooks``, the ``hooks`` below):

- ``init_process_group``: the run's rendezvous, whatever the script set (its own
  ``MASTER_ADDR``/``MASTER_PORT``, often ``localhost:12355`` in spawning scripts, or a
  ``tcp://`` ``init_method``, would collide with another run or point the ranks elsewhere: the
  rank meets the others at the run's address, and says so once on stderr); a ``rank`` or
  ``world_size`` the script passes must be the run's, else a ``ScriptError`` names both; the
  run's collective timeout where the script gives none (a rank that never arrives is named
  within it instead of after gloo's 30 minutes); then a barrier on a gloo side group, after
  which every rank sets its trace clock's zero (as the built-in loop does after its barrier);
- ``destroy_process_group`` of the default group: the hooks' ``finish`` first, while the group
  still exists (the network measured at the script's buckets);
- ``torch.multiprocessing.spawn`` and ``start_processes``: the rank *is* one of the processes
  the script asks for. Where ``nprocs`` is the run's ranks per node, the rank with local rank
  ``r`` calls ``fn(r, *args)`` itself and starts nothing; any other ``nprocs`` is a
  ``ScriptError`` naming both counts, on every rank at the same call, before any process group
  (the launcher's preflight refuses an ``nprocs`` written as a number in the script before any
  process starts: ``workbench.rank.spawn_check``).
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from workbench.errors import ScriptError

Patch = Callable[[Any, str, Any], None]


def install(hooks: Any, patch: Patch) -> None:
    """Patch the process-group and spawning calls of torch (``patch(owner, name, new)``)."""
    import torch.multiprocessing as mp
    from torch.distributed import distributed_c10d

    init = init_process_group(hooks, distributed_c10d.init_process_group)
    patch(distributed_c10d, "init_process_group", init)
    patch(dist, "init_process_group", init)
    destroy = destroy_process_group(hooks, distributed_c10d.destroy_process_group)
    patch(distributed_c10d, "destroy_process_group", destroy)
    patch(dist, "destroy_process_group", destroy)
    spawn_module = sys.modules["torch.multiprocessing.spawn"]
    for name in ("spawn", "start_processes"):
        adopted = adopt_spawn(hooks, name)
        patch(mp, name, adopted)
        patch(spawn_module, name, adopted)


def keep_the_runs(hooks: Any, bound: dict[str, Any]) -> None:
    """Check the script's ``rank`` and ``world_size`` against the run's; put the run's
    rendezvous in place of the script's."""
    for name, ours in (("rank", hooks.rank), ("world_size", hooks.world_size)):
        given = bound.get(name, -1)
        if given is not None and given != -1 and given != ours:
            raise ScriptError(
                hooks.script,
                hooks.rank,
                f"it passes {name}={given} to init_process_group(), but this process is rank "
                f"{hooks.rank} of the run's {hooks.world_size}: the script's own arithmetic "
                "(e.g. node rank x processes per node + local index) must give the run's ranks. "
                "Pass the run's (RANK and WORLD_SIZE are in the environment, as under "
                "torchrun) or set the run's world size and nodes to what the script computes",
            )
    if hooks.rendezvous is None:
        return
    addr, port = hooks.rendezvous
    theirs = bound.get("init_method")
    if theirs in (None, "env://"):
        theirs = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    if str(theirs).removeprefix("tcp://") != f"{addr}:{port}":
        print(
            f"workbench: {hooks.script} asked for the rendezvous {theirs}; rank {hooks.rank} "
            f"meets the run's other ranks at {addr}:{port}, the run's own",
            file=sys.stderr,
            flush=True,
        )
    bound["init_method"] = None  # env://, from the run's variables:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    bound["rank"], bound["world_size"] = hooks.rank, hooks.world_size


def init_process_group(hooks: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind_partial(*args, **kwargs).arguments
        if bound.get("store") is None:
            keep_the_runs(hooks, bound)
        if bound.get("timeout") is None:
            bound["timeout"] = timedelta(seconds=hooks.collective_timeout_s)
        result = original(**bound)
        # Every rank leaves this barrier together: their trace clocks agree from here.
        side = dist.new_group(backend="gloo")
        dist.barrier(group=side)
        hooks.side_group = side  # the group a script's stop until known is agreed on
        hooks.flush()  # steps before it (one process, no group yet) on the old zero
        hooks.tracer.set_t0()
        hooks.joined_group = True
        return result

    return init_process_group


def destroy_process_group(hooks: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        if not args and kwargs.get("group") is None:  # the default group: the run's
            hooks.finish()
        return original(*args, **kwargs)

    return destroy_process_group


class _Joined:
    """What ``spawn(..., join=False)`` returns here: its one process (this one) has ended."""

    def __init__(self) -> None:
        self.processes: list[Any] = []

    def pids(self) -> list[int]:
        return [os.getpid()]

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        return True


def adopt_spawn(hooks: Any, name: str) -> Callable[..., Any]:
    """``torch.multiprocessing.<name>`` in a rank: ``fn(local_rank, *args)`` in this process
    where ``nprocs`` is the run's ranks per node; else a ``ScriptError`` with both counts."""

    def spawn(
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        nprocs: int = 1,
        join: bool = True,
        daemon: bool = False,
        start_method: str = "spawn",
    ) -> Any:
        per_node = hooks.local_world_size or hooks.world_size
        if nprocs != per_node:
            nodes = max(1, hooks.world_size // per_node)
            raise ScriptError(
                hooks.script,
                hooks.rank,
                f"it calls torch.multiprocessing.{name}(nprocs={nprocs}), one process per rank "
                f"of a node, but the run has {per_node} rank(s) per node ({hooks.world_size} on "
                f"{nodes} node(s)): the run's ranks become the processes it starts only where "
                f"the two agree. Run it with world_size {nprocs * nodes}, or pass the script "
                f"what makes its nprocs {per_node}",
            )
        local_rank = hooks.rank if hooks.local_rank is None else hooks.local_rank
        fn(local_rank, *args)
        return None if join else _Joined()

    return spawn
