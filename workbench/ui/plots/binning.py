"""Figures that scale to thousands of ranks and steps: pure binning of per-rank, per-step values.

A figure never draws more cells than a browser shows at once: a rank x step heatmap has at most
``MAX_COLUMNS`` columns (bins of consecutive steps, each cell the median of its steps) and
``MAX_ROWS`` rows (past that, one row per host, or per block of consecutive ranks, each the
slowest of its ranks so a straggler still shows); a per-rank chart past ``BAND_RANKS`` ranks
shows the ranks at the quantiles of ``QUANTILES`` instead of every rank. Every function here maps
frames to frames (or labels) and draws nothing; the figures state the binning they were given.
No torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analysis.measured.rank_cells import HEATMAP_BINS
from workbench.analysis.measured.windows import check_columns

#: Most step columns of a heatmap (a wide figure shows about this many).
MAX_COLUMNS = HEATMAP_BINS
#: Most rank rows of a heatmap; past this many ranks, rows are hosts or blocks of ranks.
MAX_ROWS = 128
#: Most ranks a per-rank chart draws one by one; past this many, the ranks at ``QUANTILES``.
BAND_RANKS = 32
#: The quantiles across ranks a chart of many ranks shows, by name (0 and 1: min and max).
QUANTILES: tuple[tuple[str, float], ...] = (
    ("min", 0.0),
    ("p10", 0.1),
    ("median", 0.5),
    ("p90", 0.9),
    ("max", 1.0),
)


def bin_size(n_steps: int, max_bins: int) -> int:
    """Consecutive steps per bin so that ``n_steps`` fit in at most ``max_bins`` bins (1: none).

    1,000 steps into 100 bins: 10; 1,001 steps: 11 (91 bins)."""
    if max_bins < 1:
        raise ValueError(f"max_bins must be >= 1, got {max_bins}")
    return max(1, math.ceil(n_steps / max_bins))


def bin_steps(
    frame: pd.DataFrame, value: str, max_bins: int, x: str = "step", by: str = "rank"
) -> tuple[pd.DataFrame, int]:
    """The median of ``value`` per ``by`` and bin of consecutive ``x`` values, and the bin size.

    The distinct ``x`` values (sorted, over the whole frame) are cut into bins of
    :func:`bin_size` consecutive values; a bin is labelled by its first ``x``. Missing values
    are left out of a median (a bin with none is NaN). Returns ``(frame of by, x, value; bin
    size)``; with a bin size of 1 the rows are the frame's own (duplicates of a ``by, x`` pair
    take their median too)."""
    check_columns(frame, [x, by, value], "frame")
    frame = frame[frame[x].notna()]
    xs = np.sort(pd.unique(frame[x].dropna()))
    size = bin_size(len(xs), max_bins)
    first = xs[np.searchsorted(xs, frame[x].to_numpy()) // size * size]
    keys = pd.DataFrame({by: frame[by].to_numpy(), x: first})
    values = pd.to_numeric(frame[value], errors="coerce").astype("float64").to_numpy()
    keys[value] = values
    out = keys.groupby([by, x], sort=True)[value].median().reset_index()
    return out, size


@dataclass(frozen=True)
class RankRows:
    """Which heatmap row each rank falls in: ``row`` per rank (a Series indexed by rank, the
    rows' order is their first rank's), ``labels`` per row in that order, and ``how`` in words
    (empty when every rank has its own row)."""

    row: pd.Series
    labels: list[str]
    how: str

    @property
    def grouped(self) -> bool:
        """Whether some row holds more than one rank."""
        return bool(self.how)


def _span(ranks: pd.Index) -> str:
    lo, hi = int(ranks.min()), int(ranks.max())
    return f"rank {lo}" if lo == hi else f"ranks {lo}-{hi}"


def rank_rows(hosts: pd.Series, max_rows: int = MAX_ROWS) -> RankRows:
    """Rows for the ranks of ``hosts`` (host name per rank, indexed by rank; NaN if unknown).

    Up to ``max_rows`` ranks: a row each. More: one row per host when there are 2 to
    ``max_rows`` hosts, else blocks of consecutive ranks (:func:`bin_size` ranks a block).
    1,024 ranks on 128 hosts of 8: 128 rows, ``node3 (ranks 24-31)``; 300 ranks on one host
    with ``max_rows=100``: 100 rows of 3 ranks, ``ranks 0-2``."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    hosts = hosts.sort_index()
    ranks = hosts.index
    if len(ranks) <= max_rows:
        row = pd.Series(np.arange(len(ranks)), index=ranks)
        return RankRows(row, [str(int(r)) for r in ranks], "")
    n_hosts = hosts.nunique()
    if hosts.notna().all() and 1 < n_hosts <= max_rows:
        order = pd.unique(hosts)  # by each host's first rank
        number = {h: i for i, h in enumerate(order)}
        row = hosts.map(number).astype("int64")
        labels = [f"{h} ({_span(ranks[(hosts == h).to_numpy()])})" for h in order]
        per_host = hosts.value_counts()
        count = (
            f"{per_host.iloc[0]} ranks"
            if per_host.nunique() == 1
            else f"{per_host.min()}-{per_host.max()} ranks"
        )
        return RankRows(row, labels, f"one row per host ({n_hosts} hosts of {count})")
    size = bin_size(len(ranks), max_rows)
    row = pd.Series(np.arange(len(ranks)) // size, index=ranks)
    labels = [_span(ranks[i : i + size]) for i in range(0, len(ranks), size)]  # sorted ranks
    return RankRows(row, labels, f"one row per {size} consecutive ranks")


@dataclass(frozen=True)
class HeatGrid:
    """A binned rank x step grid: ``z`` (rows x columns, NaN where nothing was measured), the
    columns' first steps, the rows, the bin size in steps and, in words, what a cell is
    (``statistic``; empty when a cell is one rank's step)."""

    z: np.ndarray
    steps: np.ndarray
    rows: RankRows
    steps_per_bin: int
    statistic: str


def heat_grid(
    frame: pd.DataFrame,
    value: str,
    max_columns: int = MAX_COLUMNS,
    max_rows: int = MAX_ROWS,
) -> HeatGrid:
    """``value`` per rank and step (``frame``: ``rank, step, value`` and optionally ``host``)
    as a grid of at most ``max_columns`` x ``max_rows`` cells.

    Each rank's steps are binned (:func:`bin_steps`: the median over a bin's steps); when ranks
    share a row (:func:`rank_rows`), the cell is the largest of their medians, so a slow rank is
    not averaged away. 10 ranks x 1,000 steps into 100 columns: each cell is the median of 10
    values of one rank."""
    check_columns(frame, ["rank", "step", value], "frame")
    binned, size = bin_steps(frame, value, max_columns)
    hosts = (
        frame.groupby("rank", sort=True)["host"].first()
        if "host" in frame.columns
        else pd.Series(np.nan, index=np.sort(pd.unique(frame["rank"])), dtype="object")
    )
    return grid_of_binned(binned, value, size, hosts, max_rows)


def grid_of_binned(
    binned: pd.DataFrame, value: str, size: int, hosts: pd.Series, max_rows: int = MAX_ROWS
) -> HeatGrid:
    """:func:`heat_grid` from values already binned (:func:`bin_steps`' frame and bin size,
    or the engine's) and each rank's host (indexed by rank)."""
    rows = rank_rows(hosts, max_rows)
    binned["row"] = binned["rank"].map(rows.row).to_numpy()
    cells = binned.groupby(["row", "step"], sort=True)[value].max()  # NaN only when all are
    grid = cells.unstack("step").reindex(range(len(rows.labels)))
    parts = [] if size == 1 else [f"median per bin of {size} steps"]
    if rows.grouped:
        parts.append(f"{rows.how}, its slowest rank")
    statistic = "; ".join(parts)
    return HeatGrid(grid.to_numpy(dtype="float64"), grid.columns.to_numpy(), rows, size, statistic)


def quantile_ranks(per_rank: pd.Series) -> list[tuple[str, int]]:
    """The ranks at :data:`QUANTILES` of ``per_rank`` (a value per rank, indexed by rank):
    ``(name, rank)`` in ascending order of value; the rank at a quantile q is the one at position
    round(q x (n - 1)) of the ranks sorted by value (ties by rank), so min and max are real
    ranks. Ranks whose value is missing are left out; a rank at two quantiles is named once,
    by the higher one (``max`` names the slowest).

    Values 0..99 on ranks 0..99: min 0, p10 10, median 50, p90 89, max 99."""
    values = per_rank.dropna()
    if values.empty:
        return []
    frame = pd.DataFrame({"rank": values.index.to_numpy(), "v": values.to_numpy()})
    ordered = frame.sort_values(["v", "rank"], kind="stable")["rank"].to_numpy()
    n = len(ordered)
    picked: dict[int, str] = {}
    for name, q in QUANTILES:
        picked[int(ordered[round(q * (n - 1))])] = name
    order = {int(r): i for i, r in enumerate(ordered)}
    return sorted(((name, r) for r, name in picked.items()), key=lambda nr: order[nr[1]])


def rank_bands(binned: pd.DataFrame, value: str, x: str = "step") -> pd.DataFrame:
    """Across ranks, per ``x`` (a step bin of :func:`bin_steps`), the :data:`QUANTILES` of
    ``value``: columns ``x`` and one per quantile name, each the value at position
    round(q x (n - 1)) of the bin's n ranks in order (missing values left out), as
    :func:`quantile_ranks` picks ranks. Ranks 0..99 with value = rank in every bin: min 0,
    p10 10, median 50, p90 89, max 99."""
    check_columns(binned, ["rank", x, value], "binned")
    grid = binned.pivot_table(index="rank", columns=x, values=value, aggfunc="first", dropna=False)
    ordered = np.sort(grid.to_numpy(dtype="float64"), axis=0)  # NaN last
    n = np.sum(~np.isnan(ordered), axis=0)
    cols = np.arange(ordered.shape[1])
    out = pd.DataFrame({x: grid.columns.to_numpy()})
    for name, q in QUANTILES:
        at = np.rint(q * np.maximum(n - 1, 0)).astype("int64")
        out[name] = np.where(n > 0, ordered[at, cols], np.nan)
    return out


def slowest_rank(binned: pd.DataFrame, value: str) -> int | None:
    """The rank whose median of ``value`` over its bins is the largest (the lowest rank on a
    tie), or None when no value is known."""
    check_columns(binned, ["rank", value], "binned")
    medians = binned.groupby("rank", sort=True)[value].median().dropna()
    return None if medians.empty else int(medians.idxmax())


def quantile_label(name: str, rank: int) -> str:
    """A bar's label for the rank at a quantile: ``p90 (rank 812)``."""
    return f"{name} (rank {rank})"


def many_ranks_note(n_ranks: int, by: str, top: str = "the slowest") -> str:
    """The subtitle line of a per-rank chart that shows the ranks at the quantiles (``top``:
    what the rank at the max is, in words)."""
    names = ", ".join(name for name, _ in QUANTILES)
    return (
        f"{n_ranks:,} ranks (more than {BAND_RANKS}): the ranks at the {names} of {by} across "
        f"ranks are shown, each named; max is {top}."
    )
