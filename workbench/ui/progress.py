"""What a live run's step rows say at a glance: steps per second, time left, the loss trend as a
sparkline and the ranks that fall behind. Pure functions of the monitor's frame; no widgets, no
torch."""

from __future__ import annotations

import math

import pandas as pd

from workbench.analysis.stragglers.slow_ranks import stragglers

#: The sparkline's levels, lowest first.
BARS = "▁▂▃▄▅▆▇█"
#: Steps the rate and the sparkline look back over: recent enough to follow a change of pace.
RECENT_STEPS = 20
SPARK_STEPS = 40


def _latest_attempt(steps: pd.DataFrame) -> pd.DataFrame:
    return steps[steps["attempt"] == steps["attempt"].max()] if len(steps) else steps


def steps_per_s(steps: pd.DataFrame, recent: int = RECENT_STEPS) -> float | None:
    """Optimizer steps per second over the latest attempt's last ``recent`` steps (warm-up left
    out when enough measured steps exist), from the steps' start times; the median over the
    ranks. None with fewer than two steps on every rank."""
    rows = _latest_attempt(steps)
    if "warmup" in rows.columns:
        measured = rows[rows["warmup"].fillna(False) == False]  # noqa: E712 (a column)
        if measured.groupby("rank")["step"].nunique().ge(2).any():
            rows = measured
    rates = []
    for _, mine in rows.groupby("rank"):
        mine = mine.sort_values("step").tail(recent)
        span = float(mine["t_start_s"].iloc[-1] - mine["t_start_s"].iloc[0]) if len(mine) else 0
        if len(mine) >= 2 and span > 0:
            rates.append((int(mine["step"].iloc[-1]) - int(mine["step"].iloc[0])) / span)
    return float(pd.Series(rates).median()) if rates else None


def eta_s(done: int, total: int, rate: float | None) -> float | None:
    """Seconds left for the steps not yet done at ``rate`` steps per second (None without one)."""
    if rate is None or not rate > 0:
        return None
    return max(total - done, 0) / rate


def clock(seconds: float | None) -> str:
    """A duration as a clock, ``1:05`` or ``2:03:04``; ``-`` for none."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(round(seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def loss_trend(steps: pd.DataFrame, last: int = SPARK_STEPS) -> list[float]:
    """The mean loss over the ranks at each of the latest attempt's last ``last`` steps."""
    rows = _latest_attempt(steps)
    if rows.empty:
        return []
    loss = rows.groupby("step")["loss"].apply(lambda s: s.astype("float64").mean())
    return [float(v) for v in loss.sort_index().tail(last)]


def sparkline(values: list[float]) -> str:
    """``values`` as a line of block characters, lowest ``▁`` to highest ``█`` (a space for a
    missing value; all middle when they are equal)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    top = len(BARS) - 1
    out = []
    for v in values:
        if not math.isfinite(v):
            out.append(" ")
        elif high == low:
            out.append(BARS[top // 2])
        else:
            out.append(BARS[round((v - low) / (high - low) * top)])
    return "".join(out)


def behind(done: dict[int, int], world: int, allowance: int) -> list[int]:
    """Ranks whose visible progress trails the leading rank's by more than ``allowance`` steps
    (ranks write their rows in batches, so some lag is only the flush). A rank with no row yet
    counts as at step 0."""
    if not done:
        return []
    lead = max(done.values())
    return [r for r in range(world) if lead - done.get(r, 0) > allowance]


def slow_ranks(steps: pd.DataFrame, recent: int = 200) -> dict[int, float]:
    """Ranks whose compute time is persistently above the others' (the report's straggler test,
    :func:`workbench.analysis.stragglers`) over the latest attempt's last ``recent`` steps:
    rank -> how many times the others' compute time it takes."""
    rows = _latest_attempt(steps)
    if rows.empty or rows["rank"].nunique() < 2:
        return {}
    rows = rows[rows["step"] > rows["step"].max() - recent]
    try:
        found = stragglers(rows)
    except (ValueError, KeyError):  # columns a run from before the phases lacks
        return {}
    return {int(r.rank): float(r.ratio) for r in found.itertuples()}
