"""One back end per executor behind one small interface (:class:`Backend`): ``local``,
``debug``, ``slurm`` and ``pool``. ``backend(name)`` finds one; nothing else in ``workbench.run`` or
``workbench.sweeps`` branches on an executor's name."""

from __future__ import annotations

from workbench.errors import PreflightError, Problem
from workbench.run.backends.base import Backend, JobWatch
from workbench.run.backends.debug import DebugBackend
from workbench.run.backends.local import LocalBackend
from workbench.run.backends.pool import PoolBackend
from workbench.run.backends.slurm import SLURM, SLURM_OPTIONS

#: Every back end by name, in the order errors list them.
BACKENDS: dict[str, Backend] = {
    b.name: b for b in (LocalBackend(), DebugBackend(), SLURM, PoolBackend())
}


def study_executors() -> list[str]:
    """The executors a study or a tune can run on: those of more than one rank."""
    return [name for name, b in BACKENDS.items() if b.several_ranks]


def backend(name: str) -> Backend:
    """The back end called ``name``; a PreflightError listing the valid names otherwise."""
    found = BACKENDS.get(name) if isinstance(name, str) else None
    if found is None:
        valid = ", ".join(BACKENDS)
        raise PreflightError([Problem("executor", name, f"must be one of {valid}")])
    return found


__all__ = ["BACKENDS", "SLURM_OPTIONS", "Backend", "JobWatch", "backend", "study_executors"]
