"""A study's budget in device-seconds, as people write it: ``2000``, ``2000 device-seconds``,
``30 device-minutes``, ``30min``, ``2 device-hours``, ``2h`` (a device-second is one device,
GPU or CPU rank, held for one second)."""

from __future__ import annotations

import re

_UNIT_S = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0}
_UNIT_S.update({"h": 3600.0, "hour": 3600.0})
_BUDGET = re.compile(
    r"\s*([0-9][0-9_,]*\.?[0-9]*)\s*(?:device[- ]?)?(s|sec|seconds?|m|min|minutes?|h|hours?)?\s*"
)
ALLOWED = "device-seconds, e.g. 2000, '2000 device-seconds', '30 device-minutes', 2h"


def budget_seconds(text: str | float | int) -> float:
    """Device-seconds from a number or a text with its unit; a ValueError saying what is
    allowed where it is neither, or not above 0."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        match = _BUDGET.fullmatch(str(text))
        if not match:
            raise ValueError(f"{text!r}: expected {ALLOWED}")
        unit = (match.group(2) or "s").removesuffix("s") or "s"
        value = float(match.group(1).replace(",", "").replace("_", "")) * _UNIT_S[unit]
    if not value > 0:
        raise ValueError(f"{text!r}: a budget above 0 {ALLOWED.split(',')[0]}")
    return value
