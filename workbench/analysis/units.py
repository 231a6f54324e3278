"""Numbers for people: ``21,005/s``, ``78 %``, ``0.58x``, ``1.52 ms``, ``0.31 GiB``, one function
per unit, so the report, the dashboard and the CLI say the same thing the same way."""

from __future__ import annotations

import math


def rate(value: float) -> str:
    """Samples per second for people: ``21,005/s``; ``12.5/s`` below 100."""
    if not math.isfinite(value):
        return "n/a"
    return f"{value:,.0f}/s" if value >= 100 else f"{value:.3g}/s"


def percent(share: float) -> str:
    """A share as ``78 %`` (``0.4 %`` below one percent)."""
    if not math.isfinite(share):
        return "n/a"
    return f"{share * 100:.0f} %" if abs(share) >= 0.01 else f"{share * 100:.1f} %"


def ratio(value: float) -> str:
    """A speedup as ``0.58x``."""
    return f"{value:.2f}x" if math.isfinite(value) else "n/a"


def seconds(value: float) -> str:
    """A duration as ``1.52 ms``, ``340 us`` or ``2.4 s``."""
    if not math.isfinite(value):
        return "n/a"
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} us"


def gib(nbytes: float) -> str:
    """Bytes as ``0.31 GiB``."""
    return f"{nbytes / 2**30:.2g} GiB" if math.isfinite(nbytes) else "n/a"


def number(value: float, digits: int = 3) -> str:
    """A plain number for people, never in exponent form: ``15,290``, ``123``, ``2.31``,
    ``0.000173`` (``digits`` significant digits, whole numbers with separators from there up)."""
    if not math.isfinite(value):
        return "n/a"
    if value != 0 and abs(value) < 10 ** (digits - 1):
        value = float(f"{value:.{digits}g}")  # 99.96 -> 100, which gets no extra digit
    if value == 0 or abs(value) >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    decimals = min(digits - 1 - math.floor(math.log10(abs(value))), 12)
    return f"{value:,.{decimals}f}"
