"""Numbers for people: ``21,005/s``, ``78 %``, ``0.58x``, ``1.52 ms``, ``0.31 GiB``, one function
per unit, so the report, the dashboard and the CLI say the same thing the same way."""

from __future__ import annotations

import math


def rate(value: float) -> str:
    """Samples per second for people: ``21,005/s``; ``12.5/s`` below 100."""
    if not math.isfinite(value):
        return "n/a"
    return f"{number(value, trim=True)}/s"


def percent(share: float) -> str:
    """A share as ``78 %`` (``0.4 %`` below one percent)."""
    if not math.isfinite(share):
        return "n/a"
    return f"{share * 100:.0f} %" if abs(share) >= 0.01 else f"{share * 100:.1f} %"


def ratio(value: float) -> str:
    """A speedup as ``0.58x``."""
    return f"{value:.2f}x" if math.isfinite(value) else "n/a"


def seconds(value: float) -> str:
    """A duration as ``1.52 ms``, ``340 us``, ``2.4 s`` or ``12,345 s``."""
    if not math.isfinite(value):
        return "n/a"
    rounded = abs(float(f"{value:.3g}"))  # 0.9996 s is 1 s, not 1,000 ms
    if rounded >= 1:
        return f"{number(value, trim=True)} s"
    if rounded >= 1e-3:
        return f"{number(value * 1e3, trim=True)} ms"
    return f"{number(value * 1e6, trim=True)} us"


def gib(nbytes: float) -> str:
    """Bytes as ``0.31 GiB`` (``140 GiB``: never an exponent)."""
    return f"{number(nbytes / 2**30, 2, trim=True)} GiB" if math.isfinite(nbytes) else "n/a"


def number(value: float, digits: int = 3, trim: bool = False) -> str:
    """A plain number for people, never in exponent form: ``15,290``, ``123``, ``2.31``,
    ``0.000173`` (``digits`` significant digits, whole numbers with separators from there up);
    ``trim`` drops trailing zeros (``2.4`` rather than ``2.40``), as ``%g`` would."""
    if not math.isfinite(value):
        return "n/a"
    if value != 0 and abs(value) < 10 ** (digits - 1):
        value = float(f"{value:.{digits}g}")  # 99.96 -> 100, which gets no extra digit
    if value == 0 or abs(value) >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    decimals = min(digits - 1 - math.floor(math.log10(abs(value))), 12)
    text = f"{value:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if trim else text
