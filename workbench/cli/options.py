"""The run configuration as command-line flags: one flag per RunConfig field, generated from the
fields themselves so the CLI never lags the config."""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Sequence
from typing import Any

from workbench.config.run_config import RunConfig, field_help

_ALIASES = {"max_steps": ["--steps"]}


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


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected JSON, got {text!r}: {exc}") from exc


def add_config_options(parser: argparse.ArgumentParser, skip: Sequence[str] = ()) -> None:
    """One option per RunConfig field, with the field's own help: the CLI never lags the config."""
    helps = field_help()
    group = parser.add_argument_group("run configuration (RunConfig fields)")
    for f in dataclasses.fields(RunConfig):
        if not f.init or f.name in skip:
            continue
        kind = _field_type(f)
        convert: Any = {int: int, float: float, bool: _bool, str: str}.get(kind, _json)
        flags = [f"--{f.name.replace('_', '-')}"] + _ALIASES.get(f.name, [])
        default = f.default if f.default is not dataclasses.MISSING else "{}"
        group.add_argument(
            *flags,
            dest=f.name,
            type=convert,
            default=argparse.SUPPRESS,
            help=f"{helps[f.name]} (default: {default})",
        )


def config_from_args(args: argparse.Namespace) -> RunConfig:
    fields = {f.name for f in dataclasses.fields(RunConfig) if f.init}
    values = {k: v for k, v in vars(args).items() if k in fields}
    if "per_device_batch_size" not in values and "global_batch_size" not in values:
        values["per_device_batch_size"] = 32
    return RunConfig(**values)
