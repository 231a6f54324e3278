"""What a script's own calls that start processes and process groups get under the hooks
(``torch_hooks.ScriptHooks``, the ``hooks`` below):

- ``init_process_group``: the run's collective timeout where the script gives none (a rank
  that never arrives is named within it instead of after gloo's 30 minutes), then a barrier
  on a gloo side group, after which every rank sets its trace clock's zero (as the built-in
  loop does after its barrier);
- ``destroy_process_group`` of the default group: the hooks' ``finish`` first, while the group
  still exists (the network measured at the script's buckets);
- ``torch.multiprocessing.spawn`` and ``start_processes``: a ``ScriptError`` that says why
  (the workbench starts one process per rank itself, as torchrun does).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from workbench.errors import ScriptError


def init_process_group(hooks: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = timedelta(seconds=hooks.collective_timeout_s)
        result = original(*args, **kwargs)
        # Every rank leaves this barrier together: their trace clocks agree from here.
        side = dist.new_group(backend="gloo")
        dist.barrier(group=side)
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


def refuse_spawn(script: str, rank: int, name: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ScriptError(
            script,
            rank,
            f"it calls torch.multiprocessing.{name}() to start its own processes; the "
            "workbench starts one process per rank itself, as torchrun does, and gives each "
            "the environment init_process_group() reads. Call the per-process function "
            "directly (rank from the RANK variable) and set world_size in the run",
        )

    return refuse
