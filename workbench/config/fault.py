"""FaultInjection: make one rank misbehave on purpose (a RunConfig field, checked on its own)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workbench.config.choices import FAULT_KINDS, FAULT_PHASES
from workbench.config.fields import check_fields, refuse_unknown_keywords, setting
from workbench.errors import ConfigError, Problem


@refuse_unknown_keywords
@dataclass(frozen=True, kw_only=True)
class FaultInjection:
    """Make one rank misbehave on purpose, to test how failures are reported (and explained:
    a hang in a step's data loading, forward or optimizer step, a rank that exits)."""

    rank: int = setting("global rank that misbehaves", 0, minimum=0)
    step: int = setting("global step (from 1) at whose start it misbehaves", 1, minimum=1)
    kind: str = setting(
        "raise: an exception; exit: os._exit(3); hang: sleep forever; kill: SIGKILL; "
        "preempt: the scheduler's preemption signal to this rank",
        "raise",
        choices=FAULT_KINDS,
    )
    phase: str = setting(
        "where in the step: at its start, or as its data loading, forward, backward or "
        "optimizer step begins",
        "start",
        choices=FAULT_PHASES,
    )
    attempt: int = setting(
        "only on this attempt (0 = first launch), so a resumed run runs clean", 0, minimum=0
    )

    def __post_init__(self) -> None:
        problems = check_fields(self)
        if problems:
            raise ConfigError(problems, "FaultInjection")


def fault_from_json(value: Any) -> tuple[Any, list[Problem]]:
    """``value`` as a RunConfig's ``fault``: a dict (as JSON gives it) made a FaultInjection,
    with the problems of its keys as ``fault.<key>``; anything else as it is (the rules judge
    it)."""
    if not (isinstance(value, Mapping) and all(isinstance(k, str) for k in value)):
        return value, []
    try:
        return FaultInjection(**value), []
    except ConfigError as err:
        return value, [Problem(f"fault.{p.field}", p.value, p.allowed) for p in err.problems]
