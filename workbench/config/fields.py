"""Dataclass fields that declare their own constraints, and one checker that reads them.

A field's annotation says what it holds (``int``, ``float``, ``bool``, ``str``, a mapping) and,
with ``| None``, that it may be omitted; its metadata (made by :func:`setting`) adds the rest:
choices, bounds, a string format. :func:`check_fields` turns every broken constraint into a
:class:`~workbench.errors.Problem`. Rules that span fields are ``workbench.config.rules``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from workbench.config.names import FOLDER_NAME_RULE, is_folder_name, is_plugin
from workbench.errors import ConfigError, Problem

T = TypeVar("T")
#: A value test and the rule it enforces, in words.
Check = tuple[Callable[[Any], bool], str]
PLUGIN_RULE = "'package.module:factory'"
_CHECKS: dict[type, tuple[tuple[str, bool, Check], ...]] = {}
#: String formats a field may declare with ``kind=``.
FORMATS: dict[str, Check] = {
    "folder_name": (is_folder_name, FOLDER_NAME_RULE),
    "path": (lambda v: isinstance(v, str) and v != "", "a folder path"),
}


def setting(
    help: str,
    default: Any = None,
    *,
    default_factory: Callable[[], Any] | None = None,
    choices: Sequence[str] | None = None,
    plugin: bool | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    kind: str | None = None,
) -> Any:
    """A dataclass field with its help and its constraints in ``metadata``: ``choices`` (with
    ``plugin``: or a 'package.module:factory'), ``minimum``/``maximum`` (inclusive), ``above``
    (exclusive minimum, for numbers), ``kind`` (a string format of :data:`FORMATS`)."""
    if kind is not None and kind not in FORMATS:
        raise ValueError(f"kind={kind!r}: must be one of {', '.join(FORMATS)}")
    bounds = dict(minimum=minimum, maximum=maximum, above=above)
    meta: dict[str, Any] = {"help": help, **{k: v for k, v in bounds.items() if v is not None}}
    if choices is not None:
        meta.update(choices=tuple(choices), plugin=bool(plugin))
    if kind is not None:
        meta["kind"] = kind
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def is_int(value: Any) -> bool:
    """An integer, but not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float, but not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bounds(meta: Mapping[str, Any]) -> str:
    """The bounds of a number field, in words (' >= 1', ' in 1024..65535', ' > 0', or '')."""
    lo, hi, above = meta.get("minimum"), meta.get("maximum"), meta.get("above")
    if lo is not None and hi is not None:
        return f" in {lo}..{hi}"
    if above is not None:
        return f" > {above}" + (f" and <= {hi}" if hi is not None else "")
    if lo is not None:
        return f" >= {lo}"
    return f" <= {hi}" if hi is not None else ""


def _within(value: Any, meta: Mapping[str, Any]) -> bool:
    """Whether a number keeps the field's bounds."""
    lo, hi, above = meta.get("minimum"), meta.get("maximum"), meta.get("above")
    return (
        (lo is None or value >= lo)
        and (hi is None or value <= hi)
        and (above is None or value > above)
    )


def _choice_check(name: str, meta: Mapping[str, Any]) -> Check:
    """One of the field's ``choices`` (or, with ``plugin``, a 'package.module:factory')."""
    choices = meta["choices"]

    def listed(v: Any) -> bool:
        return isinstance(v, str) and v in choices

    if meta.get("plugin"):
        quoted = ", ".join(repr(c) for c in choices)
        return (
            lambda v: listed(v) or is_plugin(v),
            f"a built-in {name}: {quoted} or {PLUGIN_RULE}",
        )
    return listed, f"must be one of {', '.join(choices)}"


def _type_check(tp: Any, meta: Mapping[str, Any]) -> Check | None:
    """The check a plain annotation implies, or None (a rule in ``rules`` checks the field)."""
    if tp is bool:
        return (lambda v: isinstance(v, bool)), "must be true or false"
    if tp is int:
        return (lambda v: is_int(v) and _within(v, meta)), "must be an integer" + _bounds(meta)
    if tp is float:
        return (
            (lambda v: is_number(v) and _within(v, meta)),
            "must be a finite number" + _bounds(meta),
        )
    if tp is str:
        return (lambda v: isinstance(v, str)), "must be a string"
    if isinstance(tp, type) and issubclass(tp, Mapping):
        return (lambda v: isinstance(v, Mapping)), "a mapping of option -> value"
    return None


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """The annotation's type without ``None`` (generics reduced to their origin), and whether
    ``None`` is allowed."""
    args = typing.get_args(hint)
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        rest = [a for a in args if a is not type(None)]
        hint = rest[0] if len(rest) == 1 else hint
    return typing.get_origin(hint) or hint, optional


def field_checks(cls: type) -> tuple[tuple[str, bool, Check], ...]:
    """Per settable field of the dataclass ``cls`` that has a check of its own: its name,
    whether None is allowed, and the check (worked out once per class)."""
    if cls not in _CHECKS:
        _CHECKS[cls] = _field_checks(cls)
    return _CHECKS[cls]


def _field_checks(cls: type) -> tuple[tuple[str, bool, Check], ...]:
    """:func:`field_checks`, worked out from the annotations and metadata."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp, optional = _unwrap(hints[f.name])
        if not f.init:
            continue
        if "choices" in f.metadata:
            check: Check | None = _choice_check(f.name, f.metadata)
        elif "kind" in f.metadata:
            check = FORMATS[f.metadata["kind"]]
        else:
            check = _type_check(tp, f.metadata)
        if check is not None:
            out.append((f.name, optional, check))
    return tuple(out)


def check_fields(obj: Any, prefix: str = "") -> list[Problem]:
    """Every field of the dataclass instance ``obj`` that breaks its own declared constraint
    (field names get ``prefix``, e.g. ``"fault."``)."""
    problems = []
    for name, optional, (test, rule) in field_checks(type(obj)):
        value = getattr(obj, name)
        if not (optional and value is None) and not test(value):
            problems.append(Problem(prefix + name, value, rule))
    return problems


def did_you_mean(name: Any, valid: Sequence[str]) -> str:
    """``"did you mean 'x'? "`` for the closest valid name, or ``""``."""
    close = difflib.get_close_matches(str(name), list(valid), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def unknown_field(name: str, value: Any, valid: Sequence[str]) -> Problem:
    """The problem of a keyword that is no field: the closest name and every valid one."""
    return Problem(
        name, value, f"unknown field; {did_you_mean(name, valid)}valid: {', '.join(valid)}"
    )


def refuse_unknown_keywords(cls: type[T]) -> type[T]:
    """Make the dataclass ``cls`` answer an unknown keyword with a ConfigError naming it and the
    valid fields (instead of Python's TypeError), together with the other arguments' problems."""
    init = cls.__init__
    valid = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        unknown = sorted(k for k in kwargs if k not in valid)
        if not unknown:
            init(self, *args, **kwargs)
            return
        problems = [unknown_field(k, kwargs[k], valid) for k in unknown]
        try:
            init(self, *args, **{k: v for k, v in kwargs.items() if k in valid})
        except ConfigError as err:
            problems += err.problems
        raise ConfigError(problems, cls.__name__)

    setattr(cls, "__init__", __init__)  # noqa: B010 (mypy refuses assigning a method)
    return cls
