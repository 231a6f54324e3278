"""One run attempt's measured step rows as step x rank matrices, built in one pass over the rows:
from a frame's columns (:func:`rank_cells`) or from batches of rows streamed out of the engine
(:func:`scattered_cells`). The straggler analysis reads every per-step comparison off them
(``workbench.analysis.stragglers.slow_ranks``). No torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd


@dataclass
class RankCells:
    """One run attempt's measured steps as step x rank matrices (NaN where a rank has no row or
    no value): ``values`` by name (``_value``, ``_host_s`` and the straggler's phases),
    ``present`` (the cell has a row), ``step_world`` (the largest world size of each step's
    rows) and each rank's host (its first row's that has one)."""

    steps: np.ndarray
    ranks: np.ndarray
    present: np.ndarray
    values: dict[str, Any]
    step_world: np.ndarray
    hosts: dict[int, object]

    def rows(self, name: str, at: np.ndarray | slice, column: int | None = None) -> np.ndarray:
        """Rows ``at`` of the matrix ``name`` (of one ``column`` only, when given), held or
        derived from held ones (``_host_s``: the host phases' sum; ``_compute_s``, and
        ``_value`` where not held: that plus the backward compute), the sums of
        :func:`workbench.analysis.stragglers.slow_ranks.rank_compute`: a block at a time, so a
        derived matrix is never held whole."""
        values = self.values
        if name in values:
            return values[name][at] if column is None else values[name][at, column]
        if name == "_host_s":
            phases = [self.rows(p, at, column) for p in ("data_s", "forward_s", "optimizer_s")]
            return 0.0 + phases[0] + phases[1] + phases[2]
        if name in ("_compute_s", "_value"):
            return self.rows("_host_s", at, column) + self.rows("_backward_compute_s", at, column)
        raise KeyError(name)


class RowSparse:
    """A step x rank matrix with values on some steps only (DDP's sampled timers: one step in
    fifty): those rows (``rows``: positions, sorted) are held, every other row is NaN. Indexed
    as the matrix it stands for, by rows (a slice or positions) and at most one column."""

    def __init__(self, n_rows: int, rows: np.ndarray, held: np.ndarray) -> None:
        self.rows, self.held = rows, held
        self.shape = (n_rows, held.shape[1])

    def __getitem__(self, key: Any) -> np.ndarray:
        at, column = key if isinstance(key, tuple) else (key, None)
        pos = np.arange(self.shape[0])[at] if isinstance(at, slice) else np.asarray(at)
        k = np.minimum(np.searchsorted(self.rows, pos), max(len(self.rows) - 1, 0))
        hit = self.rows[k] == pos if len(self.rows) else np.zeros(len(pos), dtype=bool)
        out = np.full((len(pos),) if column is not None else (len(pos), self.shape[1]), np.nan)
        out[hit] = self.held[k[hit]] if column is None else self.held[k[hit], column]
        return out


def rank_cells(
    step: np.ndarray,
    rank: np.ndarray,
    columns: dict[str, np.ndarray],
    step_world: pd.Series,
    hosts: dict[int, object],
) -> RankCells:
    """The matrices of one run attempt's measured rows (``step``, ``rank`` and one array per
    column, aligned), each cell the mean of its rows' values (NaN ignored), built in one pass
    over the rows. ``step_world``: the largest world size by step; ``hosts``: by rank."""
    steps, si = dense_index(step)
    ranks, ri = dense_index(rank)
    shape = (len(steps), len(ranks))
    flat = si * len(ranks) + ri
    counts = np.bincount(flat, minlength=shape[0] * shape[1])
    unique = not len(counts) or counts.max() <= 1
    values = {}
    for name in list(columns):
        col = np.asarray(columns.pop(name), dtype="float64")  # the rows go as the matrix comes
        if unique:
            mat = np.full(shape[0] * shape[1], np.nan)
            mat[flat] = col
        else:  # a cell of several rows: their mean, as pandas' groupby mean
            ok = ~np.isnan(col)
            total = np.bincount(flat[ok], weights=col[ok], minlength=len(counts))
            n = np.bincount(flat[ok], minlength=len(counts))
            with np.errstate(invalid="ignore", divide="ignore"):
                mat = np.where(n > 0, total / np.maximum(n, 1), np.nan)
        values[name] = mat.reshape(shape)
    world = step_world.reindex(steps).to_numpy(dtype="int64")
    return RankCells(steps, ranks, (counts > 0).reshape(shape), values, world, hosts)


#: Most step bins a heatmap of a run draws (its columns); the figures' ``MAX_COLUMNS``.
HEATMAP_BINS = 400


def binned_medians(
    cells: RankCells, names: dict[str, str], max_bins: int = HEATMAP_BINS
) -> tuple[pd.DataFrame, int]:
    """The matrices ``names`` (output name: the cells' name, held or derived, see
    :meth:`RankCells.rows`) per rank and bin of consecutive steps: the steps cut into bins of
    ``ceil(n / max_bins)``, each labelled by its first step, a cell the median of its bin's
    values (missing ones left out; NaN when all are), a row for each rank and bin the rank has
    a row in. The binning of :meth:`workbench.store.digests.query.StepDigest.binned`, from
    matrices already in memory, a few bins at a time. Returns ``(frame of rank, step, host
    and one column per name; steps per bin)``."""
    n_steps, n_ranks = cells.present.shape
    size = max(1, -(-n_steps // max(1, max_bins)))
    bins = -(-n_steps // size) if n_steps else 0
    has = np.zeros((bins, n_ranks), dtype=bool)
    medians = {name: np.full((bins, n_ranks), np.nan) for name in names}
    chunk = max(1, _BIN_BLOCK_ROWS // size)  # bins at a time

    def folded(mat: np.ndarray, fill: object, count: int) -> np.ndarray:
        pad = count * size - mat.shape[0]
        if pad:
            mat = np.concatenate([mat, np.full((pad, n_ranks), fill, dtype=mat.dtype)])
        return mat.reshape(count, size, n_ranks)

    for b0 in range(0, bins, chunk):
        count = min(bins, b0 + chunk) - b0
        rows = slice(b0 * size, min(n_steps, (b0 + count) * size))
        has[b0 : b0 + count] = folded(cells.present[rows], False, count).any(axis=1)
        for name, source in names.items():
            block = folded(cells.rows(source, rows), np.nan, count)
            medians[name][b0 : b0 + count] = _bin_medians(block)
    b, r = np.nonzero(has)
    out = pd.DataFrame(
        {
            "rank": cells.ranks[r],
            "step": cells.steps[b * size],
            "host": pd.Series([cells.hosts.get(int(x)) for x in cells.ranks[r]], dtype=object),
        }
    )
    for name in names:
        out[name] = medians[name][b, r]
    order = np.lexsort((out["step"].to_numpy(), out["rank"].to_numpy()))
    return out.iloc[order].reset_index(drop=True), size


#: Step rows per block of :func:`binned_medians` (whole bins; at least one bin).
_BIN_BLOCK_ROWS = 8192


def _bin_medians(folded: np.ndarray) -> np.ndarray:
    """The median over axis 1 of ``folded`` (bins x steps x ranks), NaN left out (NaN where a
    bin has no value): sorted once (NaN last), the middle one or two of each bin's values."""
    ordered = np.sort(folded, axis=1)
    n = np.sum(~np.isnan(ordered), axis=1)  # bins x ranks
    low = np.take_along_axis(ordered, np.maximum((n - 1) // 2, 0)[:, None, :], axis=1)[:, 0]
    high = np.take_along_axis(ordered, (n // 2)[:, None, :], axis=1)[:, 0]
    with np.errstate(invalid="ignore"):
        return np.where(n > 0, (low + high) / 2, np.nan)


def dense_index(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct integers of ``values`` and each value's position among them
    (``np.unique(values, return_inverse=True)``), in linear time when they span a range not
    much larger than their count (steps and ranks do)."""
    values = np.asarray(values, dtype="int64")
    if not len(values):
        return values, values
    low, high = int(values.min()), int(values.max())
    if high - low > 4 * len(values) + 1024:
        return np.unique(values, return_inverse=True)
    seen = np.zeros(high - low + 1, dtype=bool)
    seen[values - low] = True
    where = np.cumsum(seen) - 1
    return np.flatnonzero(seen) + low, where[values - low]


def _positions(at: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each offset falls in ``at`` (a lookup by value less the smallest), and which
    offsets are known there."""
    inside = (offsets >= 0) & (offsets < len(at))
    if inside.all():  # the usual case: the lookup alone
        found = at[offsets]
    else:
        found = np.full(len(offsets), -1)
        found[inside] = at[offsets[inside]]
    return found >= 0, found


def scattered_cells(
    steps: np.ndarray,
    ranks: np.ndarray | None,
    batches: Iterable[dict[str, np.ndarray]],
    step_world: pd.Series,
    hosts: dict[int, object],
) -> RankCells:
    """:class:`RankCells` built from batches of rows (``step``, ``rank``, ``data_s``,
    ``forward_s``, ``optimizer_s``, ``_backward_compute_s`` and, for another measure than
    ``compute_s``, ``_value``), each batch scattered into the matrices as it comes, so only one
    batch of rows is held at a time. ``steps``: every one the rows hold, sorted; a row of another
    step is left out. ``ranks``: every one the rows hold, sorted (a row of another rank, a live
    run's written since they were read, is left out), or None: those the rows hold, found as
    they come. One row per cell (the store writes one row per rank and step of an attempt).

    The matrices are laid out rank by rank (a transposed view of rank x step arrays): rows come
    out of the engine a rank's file at a time, in step order, so each is written next to the
    last instead of a whole matrix row away."""
    n_steps = len(steps)
    step_at = np.full(int(steps.max()) - int(steps.min()) + 1 if n_steps else 0, -1)
    step_at[steps - steps.min()] = np.arange(n_steps)
    axis = _RankAxis(ranks, int(step_world.max()) if len(step_world) else 1)
    values: dict[str, np.ndarray] = {}
    present = np.zeros((axis.size, n_steps), dtype=bool)
    for batch in batches:
        known_step, row = _positions(step_at, batch.pop("step") - steps.min())
        known_rank, column = axis.columns(batch.pop("rank"))
        if axis.size != present.shape[0]:  # a rank outside the range seen so far: widened
            present = axis.widened(present, False)
            values = {name: axis.widened(mat, np.nan) for name, mat in values.items()}
        keep = known_step & known_rank
        every = bool(keep.all())
        flat = column * n_steps + row if every else column[keep] * n_steps + row[keep]
        present.reshape(-1)[flat] = True
        for name, col in batch.items():
            if name not in values:
                values[name] = np.full((axis.size, n_steps), np.nan)
            values[name].reshape(-1)[flat] = col if every else col[keep]
    held, present, values = axis.held(present, values)
    world = step_world.reindex(steps).to_numpy(dtype="int64")
    return RankCells(steps, held, present.T, {n: m.T for n, m in values.items()}, world, hosts)


class _RankAxis:
    """The rank axis of :func:`scattered_cells`' matrices: the ranks given (a row's column is
    its rank's position among them), or the ranks found (a row's column is its rank less the
    lowest; the range starts at ``0 .. world - 1`` and widens to hold a rank outside it; the
    ranks without a row are dropped at the end)."""

    def __init__(self, ranks: np.ndarray | None, world: int) -> None:
        self.given = ranks
        if ranks is not None:
            self.low = int(ranks.min()) if len(ranks) else 0
            span = int(ranks.max()) - self.low + 1 if len(ranks) else 0
            self.at = np.full(span, -1)
            self.at[ranks - self.low] = np.arange(len(ranks))
            self.size = len(ranks)
        else:
            self.low, self.size = 0, max(1, world)
        self._grown_by = 0

    def columns(self, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which rows' ranks have a column, and each row's column."""
        if self.given is not None:
            return _positions(self.at, rank - self.low)
        if len(rank):
            low, high = int(rank.min()), int(rank.max()) + 1
            if low < self.low or high > self.low + self.size:
                new_low = min(low, self.low)
                self._grown_by = self.low - new_low
                self.size = max(high, self.low + self.size) - new_low
                self.low = new_low
        return np.ones(len(rank), dtype=bool), rank - self.low

    def widened(self, mat: np.ndarray, fill: object) -> np.ndarray:
        """A matrix of the axis before it last grew, in the grown one."""
        out = np.full((self.size, mat.shape[1]), fill, dtype=mat.dtype)
        out[self._grown_by : self._grown_by + mat.shape[0]] = mat
        return out

    def held(
        self, present: np.ndarray, values: dict[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """The ranks of the matrices, and the matrices: those found keep the ranks that have a
        row (a copy only when some in the range have none)."""
        if self.given is not None:
            return self.given, present, values
        has = present.any(axis=1)
        ranks = self.low + np.flatnonzero(has)
        if has.all():
            return ranks, present, values
        return ranks, present[has], {name: mat[has] for name, mat in values.items()}
