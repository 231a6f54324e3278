"""The strategies' comparison in words: per curve and world size asked, which strategy is the
faster, what a rank holds under each, and which fits a device's memory. No torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from workbench.analysis.measured.units import rate, seconds
from workbench.analysis.model.memory import STRATEGIES
from workbench.analysis.model.strategies import CONFIG


def size(nbytes: float) -> str:
    """Bytes for people: ``512 B``, ``79.2 KiB``, ``3.1 MiB``, ``12.4 GiB`` (never 0 GiB for a
    small model)."""
    if not math.isfinite(nbytes):
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return (
                f"{nbytes / scale:,.3g} {unit}"
                if nbytes < 1000 * scale
                else f"{nbytes / scale:,.0f} {unit}"
            )
    return f"{nbytes:,.0f} B"


def decimal_size(nbytes: float) -> str:
    """Bytes in decimal units, as vendors state a device's memory: ``80 GB``, ``20 kB``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:,.4g} {unit}"
    return f"{nbytes:,.0f} B"


def curve_columns(table: pd.DataFrame) -> list[str]:
    """The columns that tell a table's curves apart (the group columns but the strategies')."""
    before = list(table.columns[: list(table.columns).index("from_strategy")])
    return [c for c in before if c not in CONFIG and table[c].astype(str).nunique() > 1]


def preferred(table: pd.DataFrame) -> pd.DataFrame:
    """Per curve, strategy and point, the row from a curve of that strategy where the study
    has one (its own runs), else the row from the other's."""
    own = table["from_strategy"] == table["strategy"]
    keys = [*curve_columns(table), "strategy", "world_size", "nodes"]
    ranked = table.assign(_own=~own).sort_values("_own", kind="stable")
    return ranked.drop_duplicates(keys).drop(columns="_own")


def _fits(rows: pd.DataFrame, device_memory_bytes: float | None) -> str:
    if device_memory_bytes is None or rows["fits"].isna().all():
        return ""
    fit = [s.upper() for s, f in zip(rows["strategy"], rows["fits"], strict=True) if f is True]
    within = f"within {decimal_size(device_memory_bytes)} ({size(device_memory_bytes)})"
    if len(fit) == len(rows):
        return f"; {within}: {'both fit' if len(rows) == 2 else 'it fits'}"
    if not fit:
        return f"; {within}: {'neither fits' if len(rows) == 2 else 'it does not fit'}"
    return f"; {within}: only {', '.join(fit)} fits"


def finding(
    table: pd.DataFrame, world_sizes: Sequence[int], device_memory_bytes: float | None = None
) -> list[str]:
    """One line per curve and world size asked: each strategy's throughput, the faster by how
    much, what a rank holds (parameters, gradients, optimizer state, the working set and the
    activations saved for backward, where measured), and
    which fits ``device_memory_bytes``."""
    rows = preferred(table)
    rows = rows[rows["world_size"].isin([int(n) for n in world_sizes])]
    curve = curve_columns(table)
    lines = []
    for key, point in rows.groupby([*curve, "world_size"], sort=True):
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{c}={v}" for c, v in zip(curve, key, strict=False))
        n = int(key[-1])
        said = ", ".join(
            f"{r['strategy'].upper()} {_rate_interval(r)}" for _, r in point.iterrows()
        )
        text = f"{label + ': ' if label else ''}{n} rank{'s' if n > 1 else ''}: {said}"
        text += _faster(point.dropna(subset=["samples_per_s"]).sort_values("samples_per_s"))
        held = ", ".join(
            f"{s.upper()} {size(t)}"
            for s, t in zip(point["strategy"], point["total_bytes"], strict=True)
        )
        saved = point["activation_bytes"] if "activation_bytes" in point else None
        if saved is not None and saved.notna().any():
            held += f" (activations {size(float(saved.max()))} of it)"
        elif saved is not None:
            held += " (activations not counted: the runs did not measure them)"
        lines.append(f"{text}; a rank holds {held}{_fits(point, device_memory_bytes)}")
    return lines


def _rate_interval(row: pd.Series) -> str:
    """``76.3/s (73.3/s-79.3/s)``: a predicted throughput with its 95 % interval."""
    low, high = float(row.get("low", math.nan)), float(row.get("high", math.nan))
    if not (math.isfinite(low) and math.isfinite(high)):
        return rate(row["samples_per_s"])
    return f"{rate(row['samples_per_s'])} ({rate(low)}-{rate(high)})"


def _faster(known: pd.DataFrame) -> str:
    """`` (FSDP 1.45x as fast)`` where the faster's interval lies above the slower's; where
    they overlap, that the difference is not resolved (never ranked as if it were)."""
    if len(known) != 2 or not known["samples_per_s"].iloc[0] > 0:
        return ""
    slow, fast = known.iloc[0], known.iloc[1]
    if "low" in known.columns and not fast["low"] > slow["high"]:
        return " (not resolved: their 95 % intervals overlap)"
    times = fast["samples_per_s"] / slow["samples_per_s"]
    return f" ({fast['strategy'].upper()} {times:.2f}x as fast)"


def own_strategies(runs: pd.DataFrame, device_memory: float | None) -> list[str] | None:
    """The strategies a study is compared in when none is asked for: its completed runs' own,
    where one is FSDP or a device's memory is asked about; None: the plain prediction."""
    done = runs if "status" not in runs.columns else runs[runs["status"] == "completed"]
    own = sorted({str(s) for s in done.get("strategy", ["ddp"] * len(done))} & set(STRATEGIES))
    if "fsdp" in own or (device_memory is not None and own):
        return own
    return None


#: The strategies' table for a terminal: header, the row's column, how to write it.
STRATEGY_COLUMNS = (
    ("ranks", "world_size", "count"),
    ("samples/s", "samples_per_s", "rate"),
    ("95 % low", "low", "rate"),
    ("95 % high", "high", "rate"),
    ("step", "step_s", "seconds"),
    ("compute", "compute_s", "seconds"),
    ("exposed comm", "exposed_comm_s", "seconds"),
    ("params+grads+optimizer", "state_bytes", "size"),
    ("working set", "working_set_bytes", "size"),
    ("activations", "activation_bytes", "size"),
    ("a rank", "total_bytes", "size"),
)


def strategy_lines(
    table: pd.DataFrame, sizes: Sequence[int], memory: float | None, network: Any
) -> list[str]:
    """The finding in words, then the table (one row per strategy and size asked), then how
    each was modelled."""
    if table.empty:
        return ["no completed run to predict from"]
    lines = finding(table, sizes, memory)
    where = (
        network.description if network is not None else "as the runs measured it, per link class"
    )
    lines += ["", f"network: {where}"]
    rows = preferred(table)
    rows = rows[rows["world_size"].isin(sizes)]
    write: dict[str, Callable[[Any], str]] = {
        "rate": rate,
        "seconds": seconds,
        "size": size,
        "count": lambda v: str(int(v)),
    }
    head = ["curve"] if curve_columns(table) else []
    head += ["strategy", *(h for h, _, _ in STRATEGY_COLUMNS)] + (["fits"] if memory else [])
    body = []
    for _, row in rows.iterrows():
        cells = [", ".join(str(row[c]) for c in curve_columns(table))] if head[0] == "curve" else []
        mark = (
            ""
            if row["from_strategy"] == row["strategy"]
            else f" (from {row['from_strategy'].upper()})"
        )
        cells.append(f"{row['strategy'].upper()}{mark}")
        cells += [write[how](row[c]) for _, c, how in STRATEGY_COLUMNS]
        if memory:
            cells.append({True: "yes", False: "no"}.get(row["fits"], "n/a"))
        body.append(cells)
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    for r in [head, *body]:
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    lines += ["", *(f"model: {n}" for n in dict.fromkeys(rows["note"].dropna()))]
    return lines
