"""workbench: launch, trace and analyse PyTorch DDP scaling studies.

Importing the package does not import torch: dashboards and analysis open fast without it.
"""

from .config import FaultInjection, RunConfig
from .errors import ConfigError, PreflightError, RunFailedError
from .launch import RunHandle, launch
from .store import load_runs, load_traces

__all__ = [
    "ConfigError",
    "FaultInjection",
    "PreflightError",
    "RunConfig",
    "RunFailedError",
    "RunHandle",
    "launch",
    "load_runs",
    "load_traces",
]
__version__ = "0.1.0"
