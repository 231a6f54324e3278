"""workbench: launch, trace and analyse PyTorch DDP scaling studies.

Importing the package does not import torch: dashboards and analysis open fast without it. The
names below are imported when first used, so a rank (``workbench.rank``) does not pay for pandas
and the analysis it never calls (about half a second of every rank's start-up).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.config.run_config import FaultInjection, RunConfig
    from workbench.errors import ConfigError, PreflightError, RunFailedError
    from workbench.run.backends.pool import WarmPool, warm_pool
    from workbench.run.handle import RunHandle, attach
    from workbench.run.launch import launch
    from workbench.store.load import load_runs, load_traces

#: Each public name and the module that defines it.
_HOMES = {
    "ConfigError": "workbench.errors",
    "FaultInjection": "workbench.config.run_config",
    "PreflightError": "workbench.errors",
    "RunConfig": "workbench.config.run_config",
    "RunFailedError": "workbench.errors",
    "RunHandle": "workbench.run.handle",
    "WarmPool": "workbench.run.backends.pool",
    "attach": "workbench.run.handle",
    "launch": "workbench.run.launch",
    "load_runs": "workbench.store.load",
    "load_traces": "workbench.store.load",
    "warm_pool": "workbench.run.backends.pool",
}

__all__ = [
    "ConfigError",
    "FaultInjection",
    "PreflightError",
    "RunConfig",
    "RunFailedError",
    "RunHandle",
    "WarmPool",
    "attach",
    "launch",
    "load_runs",
    "load_traces",
    "warm_pool",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
