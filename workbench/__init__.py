"""workbench: launch, trace and analyse PyTorch DDP scaling studies.

Importing the package does not import torch: dashboards and analysis open fast without it.
"""

from workbench.config.run_config import FaultInjection, RunConfig
from workbench.errors import ConfigError, PreflightError, RunFailedError
from workbench.run.backends.pool import WarmPool, warm_pool
from workbench.run.handle import RunHandle, attach
from workbench.run.launch import launch
from workbench.store.load import load_runs, load_traces

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
