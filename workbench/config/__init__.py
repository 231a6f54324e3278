"""Run configuration: every knob of one run, with its allowed values declared beside it, and the
checks that span fields. Pure: no torch, no machine facts (those are ``workbench.run.preflight``).
Imports only ``workbench.errors``."""

from workbench.config.run_config import (
    MODEL_OPTIONS,
    FaultInjection,
    RunConfig,
    field_help,
    init_field_names,
)

__all__ = ["MODEL_OPTIONS", "FaultInjection", "RunConfig", "field_help", "init_field_names"]
