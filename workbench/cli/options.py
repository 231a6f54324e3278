"""The run configuration as command-line flags: one flag per RunConfig field, generated from the
fields themselves (type, help, choices, default) so the CLI never lags the config, shown in
groups a person can scan."""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Sequence
from typing import Any

from workbench.cli.help import Switch, plain
from workbench.config.run_config import RunConfig

_ALIASES = {
    "max_steps": ["--steps"],
    "script_module": ["--module"],
    "timeout_min": ["--time-min"],  # what sbatch calls it
}
#: The RunConfig fields of each help group, in the order shown. A field in none of them (a new
#: one) is shown under "other settings", so it still has a flag.
GROUPS: dict[str, tuple[str, ...]] = {
    "naming and storage": ("sweep", "run_name", "output_dir"),
    "your own training (instead of a built-in model; its arguments after --)": (
        "script",
        "script_module",
        "script_args",
    ),
    "model and data": (
        "model",
        "model_options",
        "dataset",
        "dataset_options",
        "train_samples",
        "eval_samples",
        "seed",
    ),
    "layout (ranks and devices)": (
        "world_size",
        "nodes",
        "tasks_per_node",
        "strategy",
        "device",
        "backend",
        "threads_per_rank",
    ),
    "batch": ("per_device_batch_size", "global_batch_size", "gradient_accumulation_steps"),
    "schedule and optimizer": (
        "epochs",
        "max_steps",
        "warmup_steps",
        "until_known",
        "until_known_max_s",
        "until_known_launches",
        "optimizer",
        "learning_rate",
        "momentum",
        "weight_decay",
        "lr_scaling",
        "lr_reference_batch",
        "lr_warmup_steps",
        "precision",
    ),
    "DDP": (
        "find_unused_parameters",
        "bucket_cap_mb",
        "gradient_as_bucket_view",
        "static_graph",
        "sync_batchnorm",
        "comm_hook",
        "powersgd_rank",
    ),
    "FSDP": ("reshard_after_forward", "fsdp_param_dtype", "fsdp_reduce_dtype"),
    "evaluation": (
        "eval_every_epochs",
        "eval_at_end",
        "eval_batch_size",
        "eval_on",
        "eval_timeout_s",
    ),
    "robustness (checkpoints, timeouts, preemption)": (
        "checkpoint_every_steps",
        "collective_timeout_s",
        "timeout_min",
        "master_port",
        "signal_delay_s",
        "stop_check_every_steps",
    ),
    "tracing": (
        "trace_flush_s",
        "trace_sample_ids",
        "trace_comm",
        "trace_comm_every_steps",
        "network_benchmark",
        "profile_steps",
    ),
}
#: Fields with a flag that help does not show: test-only.
HIDDEN = ("fault",)
#: The per-device batch when neither batch is given (RunConfig itself needs one of them).
DEFAULT_PER_DEVICE_BATCH = 32
_METAVARS = {int: "N", float: "NUM", str: "TEXT"}
_KIND_METAVARS = {"folder_name": "NAME", "path": "DIR"}
_FIELD_METAVARS = {"script": "FILE.py", "script_module": "PKG.MODULE"}


def _field_type(f: dataclasses.Field[Any]) -> Any:
    hint = typing.get_type_hints(RunConfig)[f.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]
    return hint


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers >= 1, e.g. 1,2,4; got {text!r}"
        )
    return sizes


def fraction(text: str) -> float:
    """A fraction written as one (``0.02``) or as a percentage (``2%``)."""
    try:
        return float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a fraction (0.02) or a percentage (2%), got {text!r}"
        ) from None


def budget(text: str) -> float:
    """``--budget``: device-seconds (:func:`workbench.config.budget.budget_seconds`)."""
    from workbench.config.budget import budget_seconds

    try:
        return budget_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: Fields whose flag reads its value its own way.
_CONVERTERS = {"until_known": fraction}


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected JSON, got {text!r}: {exc}") from exc


def _metavar(f: dataclasses.Field[Any], kind: Any) -> str:
    """What the flag takes: its choices (``{a,b}``, with ``MODULE:FACTORY`` where a plug-in may
    be named), a string format, or the kind of number; JSON for the rest."""
    if "choices" in f.metadata:
        extra = ("MODULE:FACTORY",) if f.metadata.get("plugin") else ()
        return "{" + ",".join((*f.metadata["choices"], *extra)) + "}"
    if f.name == "until_known":
        return "FRACTION"
    if f.name in _FIELD_METAVARS:
        return _FIELD_METAVARS[f.name]
    if "kind" in f.metadata:
        return _KIND_METAVARS.get(f.metadata["kind"], "TEXT")
    return _METAVARS.get(kind, "JSON")


def _default(f: dataclasses.Field[Any], kind: Any) -> str:
    """`` (default: ...)`` for the help, or nothing where there is no value to show."""
    if f.name == "per_device_batch_size":
        return f" (default: {DEFAULT_PER_DEVICE_BATCH} unless --global-batch-size is given)"
    if f.default is dataclasses.MISSING or f.default is None:
        return ""
    if f.name == "script_args":
        return " (default: none; on the command line, everything after --)"
    if kind is bool:
        return f" (default: {'on' if f.default else 'off'})"
    return f" (default: {f.default})"


def _add_field(group: Any, f: dataclasses.Field[Any]) -> None:
    """The flag of one field; validation stays in RunConfig, which names the field and what it
    allows, so a choice is listed in help but not checked by argparse."""
    kind = _field_type(f)
    flags = [f"--{f.name.replace('_', '-')}"] + _ALIASES.get(f.name, [])
    helped = plain(f.metadata.get("help", "") + _default(f, kind))
    shown = argparse.SUPPRESS if f.name in HIDDEN else helped
    if kind is bool:
        group.add_argument(
            *flags, dest=f.name, action=Switch, convert=_bool, default=argparse.SUPPRESS, help=shown
        )
        return
    convert: Any = _CONVERTERS.get(f.name) or {int: int, float: float, str: str}.get(kind, _json)
    group.add_argument(
        *flags,
        dest=f.name,
        type=convert,
        default=argparse.SUPPRESS,
        metavar=_metavar(f, kind),
        help=shown,
    )


def add_config_options(parser: argparse.ArgumentParser, skip: Sequence[str] = ()) -> None:
    """One flag per RunConfig field, with the field's own help, in :data:`GROUPS`."""
    fields = {f.name: f for f in dataclasses.fields(RunConfig) if f.init and f.name not in skip}
    grouped = {name for names in GROUPS.values() for name in names}
    other = tuple(n for n in fields if n not in grouped and n not in HIDDEN)
    for title, names in [*GROUPS.items(), ("other settings", other)]:
        present = [fields[n] for n in names if n in fields]
        if present:
            group = parser.add_argument_group(title)
            for f in present:
                _add_field(group, f)
    for name in HIDDEN:
        if name in fields:
            _add_field(parser, fields[name])


def config_from_args(args: argparse.Namespace) -> RunConfig:
    fields = {f.name for f in dataclasses.fields(RunConfig) if f.init}
    values = {k: v for k, v in vars(args).items() if k in fields}
    script = values.get("script") is not None or values.get("script_module") is not None
    batch_given = "per_device_batch_size" in values or "global_batch_size" in values
    if not script and not batch_given:
        values["per_device_batch_size"] = DEFAULT_PER_DEVICE_BATCH
    return RunConfig(**values)
