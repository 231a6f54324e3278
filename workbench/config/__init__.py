"""Run configuration: every knob of one run, with its allowed values declared beside it, and the
checks that span fields. Pure: no torch, no machine facts (those are ``workbench.run.preflight``).
Imports only ``workbench.errors``.

Modules: ``choices`` (allowed values, model options), ``names`` (folder-name and plug-in
patterns), ``fields`` (constraint-carrying fields and their checker), ``fault``
(FaultInjection), ``rules`` (the named cross-field checks), ``run_config`` (RunConfig)."""

from workbench.config.run_config import (
    MODEL_OPTIONS,
    FaultInjection,
    RunConfig,
    field_help,
    init_field_names,
)

__all__ = ["MODEL_OPTIONS", "FaultInjection", "RunConfig", "field_help", "init_field_names"]
