"""The straggler rule on one run attempt's step x rank matrices
(``workbench.analysis.measured.rank_cells``): which ranks are persistently slower than the median
of the other ranks, from when, by how much, and in which traced phase. The rule itself is written
down in :func:`workbench.analysis.stragglers.slow_ranks.stragglers`. Each step's comparison comes
from three order statistics of its row (``workbench.analysis.stragglers.others_median``), a block
of steps at a time, so a run of 100,000 steps x 512 ranks holds no matrix of medians or ratios. No
torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.analysis.measured.intervals import batch_median_interval
from workbench.analysis.measured.rank_cells import RankCells
from workbench.analysis.stragglers.others_median import (
    BLOCK_ROWS,
    RowStats,
    others_median,
    row_stats,
    row_stats_blocked,
)

#: The traced phases a straggler's extra time is attributed to (backward compute: DDP's timer on
#: its sampled steps, never the backward that holds the wait for a slow rank).
SLOW_PHASES = ("data_s", "forward_s", "backward_compute_s", "optimizer_s")

#: A phase's step x rank matrix, read when a straggler needs it and the cells do not hold it.
PhaseSource = Callable[[str], Any]


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


def attempt_stragglers(
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
    if phase_source is not None:  # each matrix can be read again: hold one at a time
        cells.values.clear()
    _name_slow_phases(cells, found, phase_source)
    best: dict[int, dict[str, Any]] = {}
    for row in (row for f in found for row in f.rows):
        kept = best.get(row["rank"])
        if kept is None or row["start_step"] < kept["start_step"]:
            best[row["rank"]] = row
    rows = [best[r] for r in sorted(best)]
    if len(rows) > 1 and max(row["world_size"] for row in rows) == 2:
        # two ranks, each the other's median: at most one is the slow one, the one that
        # costs the run more seconds
        rows = [max(rows, key=lambda row: row["extra_s"] * row["slow_steps"])]
    return rows


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


def _resolved(
    cells: RankCells, at: np.ndarray, col: int, column: str, stats: RowStats, window: np.ndarray
) -> bool:
    """Whether a rank's excess over the median of the others is resolved on the rows
    ``window`` (positions in ``at``): the 95 % interval of its batch medians
    (``batch_median_interval``) lies above 0. The window is every step, slow or not, after
    the ``min_steps`` that found the rank up to its last slow one: steps the persistence rule
    did not select, so that a stretch of noisy steps it found by chance (common with two
    ranks, each the other's median) is not named, while a rank slow for a while and then not
    is (4 such steps at least)."""
    value = cells.rows(column, at[window], col)
    low, _ = batch_median_interval(value - others_median(value, stats.take(window)))
    return bool(low > 0)


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
        window = np.arange(i + min_steps, idx[-1] + 1)  # after the steps that found it
        if not _resolved(cells, at, col_at[j], column, stats, window):
            continue
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
