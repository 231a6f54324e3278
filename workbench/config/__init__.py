"""Run configuration: every knob of one run, with its allowed values declared beside it, and the
checks that span fields. Pure: no torch, no machine facts (those are ``workbench.run.preflight``).
Imports only ``workbench.errors``.

Modules: ``choices`` (allowed values, model options and size presets), ``names`` (folder-name and
plug-in patterns), ``fields`` (constraint-carrying fields and their checker), ``fault``
(FaultInjection), ``sizes`` (a built-in model's options: defaults, then a size preset, then the
options given), ``rules`` (the named cross-field checks), ``run_config`` (RunConfig)."""

from workbench.config.choices import MODEL_SIZES
from workbench.config.run_config import (
    MODEL_OPTIONS,
    FaultInjection,
    RunConfig,
    field_help,
    init_field_names,
)

__all__ = [
    "MODEL_OPTIONS",
    "MODEL_SIZES",
    "FaultInjection",
    "RunConfig",
    "field_help",
    "init_field_names",
]
