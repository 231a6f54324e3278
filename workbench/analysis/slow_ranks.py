"""Stragglers: ranks persistently slower than the median of the other ranks.

(The module is not named ``stragglers``: the package exports :func:`stragglers`, and a function of
the submodule's own name would shadow the submodule.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.rank_cells import RankCells, binned_medians, rank_cells, scattered_cells
from workbench.analysis.stored import StoredSteps
from workbench.analysis.windows import check_columns, detected_warmup, measured_steps
from workbench.schema import STEP_COLUMNS
from workbench.store.measured_query import BACKWARD_COMPUTE, measured_rows

STRAGGLER_COLUMNS = [
    "run_id",
    "attempt",
    "rank",
    "host",
    "world_size",
    "start_step",
    "end_step",
    "slow_steps",
    "slow_fraction",
    "ratio",
    "value_s",
    "others_s",
    "extra_s",
    "slow_phase",
    "slow_phase_extra_s",
]
#: The traced phases a straggler's extra time is attributed to (backward compute: DDP's timer on
#: its sampled steps, never the backward that holds the wait for a slow rank).
SLOW_PHASES = ("data_s", "forward_s", "backward_compute_s", "optimizer_s")


#: Rows per block of :func:`_median_of_others` (bounds its working memory on a large run).
_BLOCK_ROWS = 1024


def _median_of_others(a: np.ndarray) -> np.ndarray:
    """:func:`_median_of_others_block` over blocks of rows (each row's median is its own)."""
    if a.shape[0] <= _BLOCK_ROWS:
        return _median_of_others_block(a)
    out = np.empty_like(a, dtype="float64")
    for i in range(0, a.shape[0], _BLOCK_ROWS):
        out[i : i + _BLOCK_ROWS] = _median_of_others_block(a[i : i + _BLOCK_ROWS])
    return out


def _median_of_others_block(a: np.ndarray) -> np.ndarray:
    """Row-wise median of the other columns for each cell of ``a`` (steps x ranks; NaN = absent).

    With a row's ``c`` values sorted as ``v``, the others' median of a cell ``x`` is the mean of
    ``pick((c - 2) // 2)`` and ``pick((c - 1) // 2)``, where ``pick(i)`` is ``v[i]`` when
    ``v[i] < x`` and ``v[i + 1]`` otherwise (``x`` removed from the sorted row; which of several
    equal values is removed does not change the rest). So three order statistics per row serve
    every cell: one partial sort (``np.partition``, linear) per row, no full sort.
    """
    count = np.sum(~np.isnan(a), axis=1)
    med = np.full(a.shape, np.nan)
    for c in np.unique(count):
        if c < 2:
            continue
        at = None if bool((count == c).all()) else np.flatnonzero(count == c)
        sub = a if at is None else a[at]
        lo, hi = (int(c) - 2) // 2, (int(c) - 1) // 2
        kth = sorted({lo, lo + 1, min(lo + 2, int(c) - 1)})
        part = np.partition(sub, kth, axis=1)  # NaN sorts last: the c values come first
        v0, v1 = part[:, lo : lo + 1], part[:, lo + 1 : lo + 2]
        low = np.where(v0 < sub, v0, v1)
        if hi == lo:
            high = low
        else:
            high = np.where(v1 < sub, v1, part[:, lo + 2 : lo + 3])
        got = (low + high) / 2
        got[np.isnan(sub)] = np.nan
        if at is None:
            return got
        med[at] = got
    return med


#: The phases every step times on its own rank (no waiting for the others in them).
HOST_PHASES = ("data_s", "forward_s", "optimizer_s")


def rank_compute(m: pd.DataFrame) -> pd.DataFrame:
    """``m`` (measured steps) with ``_backward_compute_s`` and ``compute_s`` added: what a
    rank computes itself in a step, the waits for the other ranks left out.

    Backward compute is DDP's ``backward_compute_s`` on the steps it sampled; where the trace
    has no such timer but times communication on that row (a comm hook), ``backward_s - comm_s``
    (backward less its communication, the wait for late gradients included); NaN on the other
    steps, never carried from a sample. ``compute_s`` is ``data_s + forward_s + optimizer_s``
    plus that backward compute; NaN where the backward compute is unknown."""
    nan = pd.Series(np.nan, index=m.index, dtype="float64")
    timer = m["backward_compute_s"] if "backward_compute_s" in m.columns else nan
    if "backward_s" in m.columns and "comm_s" in m.columns:
        hooked = (m["backward_s"] - m["comm_s"]).clip(lower=0)
        timer = timer.where(timer.notna(), hooked)
    host = sum((m[p] for p in HOST_PHASES if p in m.columns), start=nan.fillna(0.0))
    return m.assign(
        _backward_compute_s=timer.astype("float64"),
        _host_s=host.astype("float64"),
        compute_s=(host + timer).astype("float64"),
    )


def _measure(steps: pd.DataFrame, measure: str) -> pd.DataFrame:
    """Measured steps with the measure under ``_value`` (``compute_s``: :func:`rank_compute`,
    NaN where a step's backward compute was not sampled) and the host phases under
    ``_host_s``."""
    float_cols = [c for c, t in STEP_COLUMNS.items() if t == "float64" and c in steps.columns]
    if measure != "compute_s" and measure not in float_cols:
        valid = ", ".join(["compute_s", *float_cols])
        raise ValueError(f"unknown straggler measure {measure!r}; valid names: {valid}")
    check_columns(steps, ("world_size",) if measure == "compute_s" else ("world_size", measure))
    phases = ("data_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "backward_compute_s")
    m = rank_compute(measured_steps(steps, ["world_size", "host", measure, *phases]))
    return m.assign(_value=m[measure].astype("float64"))


def _cells_of_frame(g: pd.DataFrame, names: Sequence[str]) -> RankCells:
    """:func:`rank_cells` of one run attempt's rows of a frame (``_measure``'s columns)."""
    hosts = g.groupby("rank")["host"].first().dropna() if "host" in g.columns else {}
    return rank_cells(
        g["step"].to_numpy(dtype="int64"),
        g["rank"].to_numpy(dtype="int64"),
        {n: g[n].to_numpy(dtype="float64") for n in names if n in g.columns},
        g.groupby("step")["world_size"].max(),
        {int(r): h for r, h in dict(hosts).items()},
    )


def _select(mat: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``mat[rows][:, cols]``, without a copy when they select everything."""
    if rows.all():
        return mat if cols.all() else mat[:, cols]
    return mat[rows][:, cols] if not cols.all() else mat[rows]


def _slow_phases(
    cells: RankCells, rows: np.ndarray, cols: np.ndarray, candidates: list[tuple[int, np.ndarray]]
) -> list[tuple[str, float]]:
    """For each candidate (column ``j``, its slow rows ``idx``): the traced phase in which it
    exceeds the median of the other ranks the most over those rows (median excess, seconds);
    ``("", nan)`` when no phase exceeds it. Each phase's medians are computed once, for all
    candidates, over the rows any of them needs."""
    best: list[tuple[str, float]] = [("", float("nan"))] * len(candidates)
    if not candidates:
        return best
    needed = np.unique(np.concatenate([idx for _, idx in candidates]))
    for phase in SLOW_PHASES:
        column = "_backward_compute_s" if phase == "backward_compute_s" else phase
        if column not in cells.values:
            continue
        a = _select(cells.values[column], rows, cols)[needed]
        med = _median_of_others(a)
        for k, (j, idx) in enumerate(candidates):
            at = np.searchsorted(needed, idx)
            excess = a[at, j] - med[at, j]
            if not np.isfinite(excess).any():  # not measured on those steps (a sampled timer)
                continue
            extra = float(np.nanmedian(excess))
            if extra > 0 and not extra <= best[k][1]:
                best[k] = (phase, extra)
    return best


def _attempt_stragglers(
    cells: RankCells, threshold: float, min_steps: int, persistence: float, measure: str
) -> list[dict[str, Any]]:
    """The stragglers of one run attempt's measured cells (``_value`` holds the measure).

    ``compute_s`` with backward compute on some steps only (DDP's sampled timer): the host
    phases over every step, and the whole compute over the sampled steps alone (those where
    every rank's row has it: a rank slow in backward shows nowhere else); a rank found by both
    is reported from its earlier start."""
    missing = np.isnan(cells.values["_value"]) & cells.present  # derived: not held after
    every = np.ones(len(cells.steps), dtype=bool)
    if measure != "compute_s" or not missing.any():
        return _found(cells, every, "_value", threshold, min_steps, persistence)
    sampled = ~missing.any(axis=1)
    del missing
    host = _found(cells, every, "_host_s", threshold, min_steps, persistence)
    full = _found(cells, sampled, "_value", threshold, min_steps, persistence)
    best: dict[int, dict[str, Any]] = {}
    for row in (*host, *full):
        kept = best.get(row["rank"])
        if kept is None or row["start_step"] < kept["start_step"]:
            best[row["rank"]] = row
    return [best[r] for r in sorted(best)]


def _found(
    cells: RankCells,
    rows: np.ndarray,
    column: str,
    threshold: float,
    min_steps: int,
    persistence: float,
) -> list[dict[str, Any]]:
    """The ranks whose ``column`` is persistently above the median of the other ranks', over
    the steps ``rows`` selects (the ranks with a row on them)."""
    cols = cells.present[rows].any(axis=0)
    if not rows.any() or cols.sum() < 2 or rows.sum() < min_steps:
        return []
    a = _select(cells.values[column], rows, cols)
    steps, ranks = cells.steps[rows], cells.ranks[cols]
    ref = _median_of_others(a)
    ratio = np.full_like(a, np.nan)  # one matrix: a / ref where ref > 0
    np.divide(a, ref, out=ratio, where=ref > 0)
    slow = ratio > 1 + threshold  # NaN is not slow
    csum = np.vstack([np.zeros((1, a.shape[1]), "int32"), np.cumsum(slow, axis=0, dtype="int32")])
    window = csum[min_steps:] - csum[:-min_steps]  # slow count in [i, i + min_steps)
    qualifies = slow[: window.shape[0]] & (window >= persistence * min_steps - 1e-9)
    world = int(cells.step_world[rows].max())
    starts = [(int(j), int(np.argmax(qualifies[:, j]))) for j in np.flatnonzero(qualifies.any(0))]
    tails = [(j, i + np.flatnonzero(slow[i:, j])) for j, i in starts]
    phases = _slow_phases(cells, rows, cols, tails)
    found = []
    for (j, i), (_, idx), (phase, phase_extra) in zip(starts, tails, phases, strict=True):
        tail = slow[i:, j]
        rank = int(ranks[j])
        found.append(
            {
                "rank": rank,
                "host": cells.hosts.get(rank),
                "world_size": world,
                "start_step": int(steps[i]),
                "end_step": int(steps[idx[-1]]),
                "slow_steps": int(tail.sum()),
                "slow_fraction": float(tail.mean()),
                "ratio": float(np.median(ratio[idx, j])),
                "value_s": float(np.median(a[idx, j])),
                "others_s": float(np.median(ref[idx, j])),
                "extra_s": float(np.median(a[idx, j] - ref[idx, j])),
                "slow_phase": phase,
                "slow_phase_extra_s": phase_extra,
            }
        )
    return found


def stragglers(
    steps: pd.DataFrame,
    threshold: float = 0.1,
    min_steps: int = 10,
    persistence: float = 0.8,
    measure: str = "compute_s",
) -> pd.DataFrame:
    """Ranks persistently slower than the median of the other ranks; one row per straggler.

    In DDP every rank waits for the slowest at each allreduce, so ``step_s`` is nearly equal on
    all ranks and a rank that waits is not slow: the default measure is therefore what each
    rank computes itself, ``compute_s = data_s + forward_s + optimizer_s + backward compute``
    (:func:`rank_compute`: DDP's ``backward_compute_s`` on the steps it sampled, never carried
    to the steps between; the waits sit in ``comm_s`` and ``backward_s`` and are left out).
    With backward compute sampled on some steps only, the host phases are compared on every
    step and the whole compute on the sampled steps alone, ``min_steps`` of them: one sampled
    hiccup is no straggler. Any float step column (``forward_s``, ``data_s``, ...) can be used
    instead. Per measured step, a rank's ratio is its measure over the median of the other
    ranks' (NaN when that median is not positive); it is *slow* when ``ratio > 1 +
    threshold``. A rank is a straggler from the first slow step that starts ``min_steps``
    consecutive steps of which at least ``persistence`` are slow (a robust window: isolated
    spikes do not count). Reported: ``start_step``, ``end_step`` (last slow step),
    ``slow_steps`` and ``slow_fraction`` from the start on, ``ratio`` (median over those slow
    steps), ``value_s`` / ``others_s`` (medians of its measure and the others' median) and
    ``extra_s`` (their difference: seconds per step the run loses to it). ``slow_phase`` names
    the traced phase (:data:`SLOW_PHASES`; backward compute where measured) in which the rank
    exceeds the others' median the most over those steps, by ``slow_phase_extra_s`` (median
    seconds per step); empty when no traced phase is slower (the time is outside them).
    """
    _check_rule(threshold, min_steps, persistence)
    m = _measure(steps, measure)
    names = ("_value", "_host_s", *HOST_PHASES, "_backward_compute_s")
    found: list[dict[str, Any]] = []
    for (run_id, attempt), g in m.groupby(["run_id", "attempt"], sort=True):
        cells = _cells_of_frame(g, names)
        for row in _attempt_stragglers(cells, threshold, min_steps, persistence, measure):
            found.append({"run_id": run_id, "attempt": int(attempt), **row})
    return pd.DataFrame(found, columns=STRAGGLER_COLUMNS)


def _check_rule(threshold: float, min_steps: int, persistence: float) -> None:
    if min_steps < 1 or not 0 < persistence <= 1 or threshold < 0:
        raise ValueError(
            f"need min_steps >= 1, 0 < persistence <= 1, threshold >= 0; got "
            f"min_steps={min_steps}, persistence={persistence}, threshold={threshold}"
        )


def stragglers_in_store(
    run_dirs: Iterable[str | Path],
    threshold: float = 0.1,
    min_steps: int = 10,
    persistence: float = 0.8,
    measure: str = "compute_s",
    stored: StoredSteps | None = None,
) -> pd.DataFrame:
    """:func:`stragglers` of the runs in ``run_dirs`` (run folders), read through the engine:
    each run's measured rows come out of its files with only the columns the rule needs (warm-up
    filtered in the engine), one run at a time, and are laid out as step x rank matrices once.
    The same rule and columns as :func:`stragglers` of ``load_traces(run_dirs)``, in a fraction
    of its time and memory on a large sweep. ``stored``: the same runs' step rows in the
    engine, whose passes already found the warm-up and the hosts (only the rows are read)."""
    _check_rule(threshold, min_steps, persistence)
    float_cols = [c for c, t in STEP_COLUMNS.items() if t == "float64"]
    if measure != "compute_s" and measure not in float_cols:
        valid = ", ".join(["compute_s", *float_cols])
        raise ValueError(f"unknown straggler measure {measure!r}; valid names: {valid}")
    columns = {**{p: p for p in HOST_PHASES}, "_backward_compute_s": BACKWARD_COMPUTE}
    if measure != "compute_s":
        columns["_value"] = measure
    if stored is not None:  # the heatmaps' step time, binned from the same read
        columns["step_s"] = "step_s"
    found: list[dict[str, Any]] = []
    for run_dir in run_dirs:
        known = None if stored is None else stored.known
        for part in measured_rows(run_dir, columns, detected_warmup, known):
            cells = scattered_cells(
                part.steps, part.ranks, part.batches, part.step_world, part.hosts
            )
            run_id, attempt = part.run_id, part.attempt
            del part
            step_s = cells.values.pop("step_s", None)  # the heatmaps', not the rule's
            if stored is not None and stored.attempts_measured(run_id) == [attempt]:
                compute = cells.values["_host_s"] + cells.values["_backward_compute_s"]
                both = {"step_s": step_s, "compute_s": compute}
                stored.keep_binned(run_id, binned_medians(cells, both, stored.heatmap_bins))
                del compute, both
            del step_s
            for row in _attempt_stragglers(cells, threshold, min_steps, persistence, measure):
                found.append({"run_id": run_id, "attempt": attempt, **row})
    frame = pd.DataFrame(found, columns=STRAGGLER_COLUMNS)
    return frame.sort_values(["run_id", "attempt", "rank"], ignore_index=True)
