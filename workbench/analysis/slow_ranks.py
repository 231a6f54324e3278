"""Stragglers: ranks persistently slower than the median of the other ranks.

(The module is not named ``stragglers``: the package exports :func:`stragglers`, and a function of
the submodule's own name would shadow the submodule.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.others_median import (
    BLOCK_ROWS,
    RowStats,
    others_median,
    row_stats,
    row_stats_blocked,
)
from workbench.analysis.rank_cells import (
    HEATMAP_BINS,
    RankCells,
    binned_medians,
    rank_cells,
    scattered_cells,
)
from workbench.analysis.stored import StoredSteps
from workbench.analysis.windows import check_columns, detected_warmup, measured_steps
from workbench.schema import STEP_COLUMNS
from workbench.store.measured_query import (
    BACKWARD_COMPUTE,
    AttemptRows,
    measured_rows,
)

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


#: A phase's step x rank matrix, read when a straggler needs it and the cells do not hold it.
PhaseSource = Callable[[str], np.ndarray]


@dataclass
class _Found:
    """One rule's stragglers, before their slow phase: the rows ``at`` and columns ``col_at``
    the rule compared, each straggler's column and slow rows (``tails``, positions in those),
    and its figures (``rows``)."""

    at: np.ndarray
    col_at: np.ndarray
    tails: list[tuple[int, np.ndarray]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)


def _name_slow_phases(
    cells: RankCells, found: Sequence[_Found], phase_source: PhaseSource | None
) -> None:
    """For each straggler of ``found``: the traced phase in which it exceeds the median of the
    other ranks the most over its slow rows (``slow_phase``, by ``slow_phase_extra_s``: median
    excess, seconds); empty and NaN when no phase exceeds it. Each phase is taken once for
    every rule (a phase the cells do not hold comes from ``phase_source``, one at a time), its
    order statistics once per rule over the rows any of its stragglers needs."""
    for f in found:
        for row in f.rows:
            row["slow_phase"], row["slow_phase_extra_s"] = "", float("nan")
    if not any(f.tails for f in found):
        return
    for phase in SLOW_PHASES:
        column = "_backward_compute_s" if phase == "backward_compute_s" else phase
        mat = cells.values.get(column)
        if mat is None and phase_source is not None:
            mat = phase_source(column)
        if mat is None:
            continue
        for f in (f for f in found if f.tails):
            needed = np.unique(np.concatenate([idx for _, idx in f.tails]))
            stats = row_stats_blocked(mat, f.at[needed], f.col_at)
            for (j, idx), row in zip(f.tails, f.rows, strict=True):
                x = mat[f.at[idx], f.col_at[j]]
                excess = x - others_median(x, stats.take(np.searchsorted(needed, idx)))
                if not np.isfinite(excess).any():  # not measured there (a sampled timer)
                    continue
                extra = float(np.nanmedian(excess))
                if extra > 0 and not extra <= row["slow_phase_extra_s"]:
                    row["slow_phase"], row["slow_phase_extra_s"] = phase, extra
        del mat


def _attempt_stragglers(
    cells: RankCells,
    threshold: float,
    min_steps: int,
    persistence: float,
    measure: str,
    phase_source: PhaseSource | None = None,
) -> list[dict[str, Any]]:
    """The stragglers of one run attempt's measured cells (``_value`` holds the measure, or is
    derived as the compute).

    ``compute_s`` with backward compute on some steps only (DDP's sampled timer): the host
    phases over every step, and the whole compute over the sampled steps alone (those where
    every rank's row has it: a rank slow in backward shows nowhere else); a rank found by both
    is reported from its earlier start."""
    rule = (threshold, min_steps, persistence)
    every = np.ones(len(cells.steps), dtype=bool)
    sampled = every
    if measure == "compute_s":
        sampled = np.empty(len(cells.steps), dtype=bool)
        for i in range(0, len(sampled), BLOCK_ROWS):
            block = slice(i, i + BLOCK_ROWS)
            missing = np.isnan(cells.rows("_value", block)) & cells.present[block]
            sampled[block] = ~missing.any(axis=1)
    if sampled.all():
        found = [_found(cells, every, "_value", *rule)]
    else:
        found = [_found(cells, every, "_host_s", *rule), _found(cells, sampled, "_value", *rule)]
    if phase_source is not None:  # every phase can be read again: hold one at a time
        cells.values.clear()
    _name_slow_phases(cells, found, phase_source)
    best: dict[int, dict[str, Any]] = {}
    for row in (row for f in found for row in f.rows):
        kept = best.get(row["rank"])
        if kept is None or row["start_step"] < kept["start_step"]:
            best[row["rank"]] = row
    return [best[r] for r in sorted(best)]


def _slow_cells(
    cells: RankCells, at: np.ndarray, col_at: np.ndarray, column: str, threshold: float
) -> tuple[np.ndarray, RowStats]:
    """Which cells of rows ``at`` and columns ``col_at`` are slow (``column`` over the median of
    the other ranks' above ``1 + threshold``; NaN is not slow), and each row's order
    statistics; a block of rows at a time, so no matrix of medians or ratios is held."""
    every_col = len(col_at) == cells.present.shape[1]
    stats = RowStats.empty(len(at))
    slow = np.empty((len(at), len(col_at)), dtype=bool)
    for i in range(0, len(at), BLOCK_ROWS):
        a = cells.rows(column, at[i : i + BLOCK_ROWS])
        a = a if every_col else a[:, col_at]
        block = row_stats(a)
        stats.put(i, block)
        ref = others_median(a, block)
        with np.errstate(divide="ignore", invalid="ignore"):
            slow[i : i + BLOCK_ROWS] = (ref > 0) & (a / ref > 1 + threshold)
    return slow, stats


def _starts(slow: np.ndarray, min_steps: int, persistence: float) -> list[tuple[int, int]]:
    """Per column with one: the first slow row that starts ``min_steps`` consecutive rows of
    which at least ``persistence`` are slow (``(column, row)``), a few columns at a time."""
    starts = []
    for c in range(0, slow.shape[1], 64):
        part = slow[:, c : c + 64]
        zero = np.zeros((1, part.shape[1]), "int32")
        csum = np.vstack([zero, np.cumsum(part, axis=0, dtype="int32")])
        window = csum[min_steps:] - csum[:-min_steps]  # slow count in [i, i + min_steps)
        qualifies = part[: window.shape[0]] & (window >= persistence * min_steps - 1e-9)
        starts += [
            (c + int(j), int(np.argmax(qualifies[:, j]))) for j in np.flatnonzero(qualifies.any(0))
        ]
    return starts


def _found(
    cells: RankCells,
    rows: np.ndarray,
    column: str,
    threshold: float,
    min_steps: int,
    persistence: float,
) -> _Found:
    """The ranks whose ``column`` is persistently above the median of the other ranks', over
    the steps ``rows`` selects (the ranks with a row on them)."""
    at = np.flatnonzero(rows)
    col_at = np.flatnonzero(cells.present[at].any(axis=0)) if len(at) else at
    found = _Found(at, col_at)
    if not len(at) or len(col_at) < 2 or len(at) < min_steps:
        return found
    slow, stats = _slow_cells(cells, at, col_at, column, threshold)
    world = int(cells.step_world[rows].max())
    for j, i in _starts(slow, min_steps, persistence):
        idx = i + np.flatnonzero(slow[i:, j])
        tail = slow[i:, j]
        rank = int(cells.ranks[col_at[j]])
        value = cells.rows(column, at[idx], col_at[j])
        ref = others_median(value, stats.take(idx))
        found.tails.append((j, idx))
        found.rows.append(
            {
                "rank": rank,
                "host": cells.hosts.get(rank),
                "world_size": world,
                "start_step": int(cells.steps[at[i]]),
                "end_step": int(cells.steps[at[idx[-1]]]),
                "slow_steps": int(tail.sum()),
                "slow_fraction": float(tail.mean()),
                "ratio": float(np.median(value / ref)),
                "value_s": float(np.median(value)),
                "others_s": float(np.median(ref)),
                "extra_s": float(np.median(value - ref)),
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


def _attempt_rows(
    run_dirs: Iterable[str | Path], columns: dict[str, str], stored: StoredSteps | None
) -> Iterator[AttemptRows]:
    """Each run attempt's measured rows, a run folder at a time (with what the passes of
    ``stored`` found: the warm-up, the steps and the hosts)."""
    known = None if stored is None else stored.known
    for run_dir in run_dirs:
        yield from measured_rows(run_dir, columns, detected_warmup, known)


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
    # The host phases come summed out of the engine; each alone only if a straggler needs it.
    columns = {"_host_s": " + ".join(HOST_PHASES), "_backward_compute_s": BACKWARD_COMPUTE}
    if measure != "compute_s":
        columns["_value"] = measure
    found: list[dict[str, Any]] = []
    for part in _attempt_rows(run_dirs, columns, stored):
        cells = scattered_cells(part.steps, part.ranks, part.batches, part.step_world, part.hosts)
        run_id, attempt = part.run_id, part.attempt
        heatmap = stored is not None and stored.attempts_measured(run_id) == [attempt]
        bins = HEATMAP_BINS if stored is None else stored.heatmap_bins
        compute = binned_medians(cells, {"compute_s": "_compute_s"}, bins) if heatmap else None

        def read(name: str, part: AttemptRows = part, cells: RankCells = cells) -> np.ndarray:
            sql = BACKWARD_COMPUTE if name == "_backward_compute_s" else name
            rows = part.read({name: sql})
            return scattered_cells(cells.steps, cells.ranks, rows, part.step_world, {}).values[name]

        for row in _attempt_stragglers(cells, threshold, min_steps, persistence, measure, read):
            found.append({"run_id": run_id, "attempt": attempt, **row})
        if stored is not None and compute is not None:  # the heatmaps' step time: read last
            cells.values = {"step_s": read("step_s")}
            step_s = binned_medians(cells, {"step_s": "step_s"}, bins)[0]["step_s"]
            compute[0].insert(3, "step_s", step_s.to_numpy())
            stored.keep_binned(run_id, compute)
        del cells, part
    frame = pd.DataFrame(found, columns=STRAGGLER_COLUMNS)
    return frame.sort_values(["run_id", "attempt", "rank"], ignore_index=True)
