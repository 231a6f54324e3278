"""Patterns for names that become folders or import paths, defined once for configs and sweeps."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from workbench.errors import Problem

#: A folder name: a letter or digit, then letters, digits, '_', '.', '+', '-' (no '/', no newline).
FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
FOLDER_NAME_RULE = (
    "a folder name: letters, digits, '_', '-', '.', '+', starting with a letter or digit"
)
#: A plug-in: 'package.module:factory'.
PLUGIN = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def is_folder_name(value: Any) -> bool:
    """Whether ``value`` is a string that is a whole folder name (``fullmatch``: a trailing
    newline, which ``$`` would accept, is refused)."""
    return isinstance(value, str) and FOLDER_NAME.fullmatch(value) is not None


def is_plugin(value: Any) -> bool:
    """Whether ``value`` names a plug-in factory as 'package.module:factory'."""
    return isinstance(value, str) and PLUGIN.fullmatch(value) is not None


def folder_name_problem(field: str, value: Any) -> Problem | None:
    """The problem with ``value`` as the folder name in ``field``, or None."""
    return None if is_folder_name(value) else Problem(field, value, FOLDER_NAME_RULE)


#: A module to run with ``python -m``: dotted identifiers.
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def is_module_name(value: Any) -> bool:
    """Whether ``value`` is a dotted module name (``pkg.train``)."""
    return isinstance(value, str) and MODULE_NAME.fullmatch(value) is not None


def script_name(script: str | None, module: str | None) -> str:
    """A script's short name: its file name without ``.py``, or its module's last part."""
    if script is not None:
        return Path(script).stem
    return str(module).rsplit(".", 1)[-1]
