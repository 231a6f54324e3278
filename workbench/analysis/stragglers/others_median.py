"""The median of the other ranks at each cell of a step x rank matrix, from three order
statistics of its step's row: the straggler rule compares each rank with it
(``workbench.analysis.stragglers.slow_ranks``).

With a row's ``c`` values sorted as ``v``, the others' median of a cell ``x`` is the mean of
``pick((c - 2) // 2)`` and ``pick((c - 1) // 2)``, where ``pick(i)`` is ``v[i]`` when ``v[i] < x``
and ``v[i + 1]`` otherwise (``x`` removed from the sorted row; which of several equal values is
removed does not change the rest). So three order statistics per row (:class:`RowStats`, one
partial sort per row) serve every cell of it: a large run keeps those, a few numbers per step,
instead of a matrix of medians, and works out any cell's median when it needs it. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Rows per block of a matrix the rule works through at once (bounds its working memory).
BLOCK_ROWS = 1024


@dataclass
class RowStats:
    """Per row of a matrix: ``count`` (values that are not NaN) and the order statistics
    ``v0 = v[lo]``, ``v1 = v[lo + 1]`` and, for an odd count, ``v2 = v[lo + 2]`` of its sorted
    values, ``lo = (count - 2) // 2`` (NaN where not needed or the count is under 2)."""

    count: np.ndarray
    v0: np.ndarray
    v1: np.ndarray
    v2: np.ndarray

    @classmethod
    def empty(cls, rows: int) -> RowStats:
        """Stats of ``rows`` rows, to be filled block by block (:meth:`put`)."""
        nan = np.full(rows, np.nan)
        return cls(np.zeros(rows, dtype="int64"), nan, nan.copy(), nan.copy())

    def put(self, start: int, block: RowStats) -> None:
        """Write ``block``'s rows from row ``start`` on."""
        end = start + len(block.count)
        for name in ("count", "v0", "v1", "v2"):
            getattr(self, name)[start:end] = getattr(block, name)

    def take(self, rows: np.ndarray) -> RowStats:
        """The stats of ``rows`` (positions)."""
        return RowStats(self.count[rows], self.v0[rows], self.v1[rows], self.v2[rows])


def row_stats(a: np.ndarray) -> RowStats:
    """:class:`RowStats` of ``a`` (rows x columns; NaN = absent), one partial sort per row of a
    count (``np.partition``, linear; NaN sorts last, so a row's values come first)."""
    count = np.sum(~np.isnan(a), axis=1)
    stats = RowStats.empty(a.shape[0])
    stats.count[:] = count
    for c in np.unique(count):
        if c < 2:
            continue
        at = slice(None) if bool((count == c).all()) else np.flatnonzero(count == c)
        lo = (int(c) - 2) // 2
        odd = int(c) % 2 == 1
        kth = [lo, lo + 1, lo + 2] if odd else [lo, lo + 1]
        part = np.partition(a[at], kth, axis=1)
        stats.v0[at] = part[:, lo]
        stats.v1[at] = part[:, lo + 1]
        if odd:
            stats.v2[at] = part[:, lo + 2]
    return stats


def row_stats_blocked(a: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> RowStats:
    """:func:`row_stats` of ``a[rows][:, cols]`` (``rows``: positions), a block of rows at a
    time: no copy of the whole selection is made."""
    stats = RowStats.empty(len(rows))
    for i in range(0, len(rows), BLOCK_ROWS):
        block = a[rows[i : i + BLOCK_ROWS]]
        stats.put(i, row_stats(block[:, cols]))
    return stats


def others_median(x: np.ndarray, stats: RowStats) -> np.ndarray:
    """The median of the other values of each cell's row: ``x`` is a block of rows (rows x
    columns, ``stats`` per row) or one value per row (``stats`` per value). NaN where ``x`` is
    NaN or the row holds fewer than two values."""
    column = x.ndim == 2
    count, v0, v1, v2 = (
        (s[:, None] if column else s) for s in (stats.count, stats.v0, stats.v1, stats.v2)
    )
    low = np.where(v0 < x, v0, v1)
    high = np.where(count % 2 == 1, np.where(v1 < x, v1, v2), low)
    got = (low + high) / 2
    got[np.isnan(x) | np.broadcast_to(count < 2, x.shape)] = np.nan
    return got


def median_of_others(a: np.ndarray) -> np.ndarray:
    """Row-wise median of the other columns for each cell of ``a`` (steps x ranks; NaN =
    absent), a block of rows at a time."""
    out = np.empty(a.shape, dtype="float64")
    for i in range(0, a.shape[0], BLOCK_ROWS):
        block = a[i : i + BLOCK_ROWS]
        out[i : i + BLOCK_ROWS] = others_median(block, row_stats(block))
    return out
