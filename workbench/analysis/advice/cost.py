"""What a study cost, in one line of its finding: the device-seconds its launches held (a
device-second: one device, GPU or CPU rank, held for one second; failed launches count), in
all and by world size."""

from __future__ import annotations

import pandas as pd


def _amount(device_s: float) -> str:
    """``84 device-seconds``, ``1.4 device-minutes`` beside it from 60, hours from 3,600."""
    text = f"{device_s:,.0f} device-seconds"
    if device_s >= 3600:
        return f"{text} ({device_s / 3600:,.1f} device-hours)"
    if device_s >= 60:
        return f"{text} ({device_s / 60:,.1f} device-minutes)"
    return text


def cost_line(runs: pd.DataFrame) -> str | None:
    """``cost: 412 device-seconds (6.9 device-minutes) in 12 launches; 1 rank: 98, 2 ranks:
    314``; None where no run recorded what it held."""
    if "device_s" not in runs.columns or "world_size" not in runs.columns:
        return None
    held = runs[runs["device_s"].notna()]
    if held.empty:
        return None
    total = float(held["device_s"].sum())
    launches = f"{len(held)} launch{'es' if len(held) != 1 else ''}"
    by_size = held.groupby("world_size")["device_s"].sum()
    parts = ", ".join(f"{int(n)} rank{'s' if n != 1 else ''}: {s:,.0f}" for n, s in by_size.items())
    return f"cost: {_amount(total)} in {launches}; by world size, device-seconds: {parts}"
