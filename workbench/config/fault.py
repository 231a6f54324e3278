"""FaultInjection: make one rank misbehave on purpose (a RunConfig field, checked on its own)."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.config.choices import FAULT_KINDS
from workbench.config.fields import check_fields, refuse_unknown_keywords, setting
from workbench.errors import ConfigError


@refuse_unknown_keywords
@dataclass(frozen=True, kw_only=True)
class FaultInjection:
    """Make one rank misbehave on purpose, to test how failures are reported."""

    rank: int = setting("global rank that misbehaves", 0, minimum=0)
    step: int = setting("global step (from 1) at whose start it misbehaves", 1, minimum=1)
    kind: str = setting(
        "raise: an exception; exit: os._exit(3); hang: sleep forever; kill: SIGKILL; "
        "preempt: the scheduler's preemption signal to this rank",
        "raise",
        choices=FAULT_KINDS,
    )
    attempt: int = setting(
        "only on this attempt (0 = first launch), so a resumed run runs clean", 0, minimum=0
    )

    def __post_init__(self) -> None:
        problems = check_fields(self)
        if problems:
            raise ConfigError(problems, "FaultInjection")
