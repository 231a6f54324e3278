"""Reading digests' Parquet frames into pandas, several runs at once.

A digest holds ten small frames a run; a report reads ten runs. Made pandas frames one file at
a time, the fixed cost of each conversion (about 4 ms) was most of the reading: 90 conversions
at 10.23 M rows. :class:`ReadDigest` keeps a run's frames as the Arrow tables read, each made a
pandas frame only when asked for (a report draws one run's binned frame, not ten), and
:func:`joined_frames` makes the same frame of several runs one Arrow table, then one pandas
frame, equal to the runs' frames made one by one and concatenated. No torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    import pyarrow as pa

#: Columns of a frame that mostly hold what other columns of it give (a step without warm-up
#: rows: its loss over measured rows is its loss over all, its last end is its measured end):
#: written null where they hold exactly that, filled on read, so they cost a digest nothing.
DERIVED: dict[str, dict[str, Callable[[pd.DataFrame], pd.Series]]] = {
    "per_step": {
        "all_end_s": lambda f: f["end_s"],
        "loss": lambda f: f["loss_sum"] / f["loss_n"].where(f["loss_n"] > 0),
    },
}
#: Columns holding lists (Parquet gives them back as arrays; the analysis takes lists).
LIST_COLUMNS = ("hosts", "attempts", "all_attempts")


def filled(table: pa.Table, frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """``frame`` (read from ``table``) with the derived columns' nulls filled in."""
    for column, derive in DERIVED.get(name, {}).items():
        if column in frame.columns:
            null = table.column(column).is_null().to_numpy(zero_copy_only=False)
            frame[column] = np.where(null, derive(frame).to_numpy(dtype="float64"), frame[column])
    return frame


def listed(value: object) -> object:
    """A list column's value as the analysis takes it: a list, or NaN where the engine's merge
    left one (a rank without measured rows)."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return list(value)
    return float("nan") if value is None else value


def strings(column: object) -> np.ndarray:
    """A string column as an object array whose equal values share one str (a run's id on a
    million rows is one object, not a million)."""
    encoded = column.dictionary_encode().combine_chunks()  # type: ignore[attr-defined]
    values = np.asarray(encoded.dictionary.to_pylist(), dtype=object)
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    out = values[np.where(np.isnan(codes), 0, codes).astype("int64")] if len(values) else codes
    if encoded.null_count:
        out = np.where(encoded.is_null().to_numpy(zero_copy_only=False), None, out)
    return np.asarray(out, dtype=object)


def read_table(path: Path) -> pa.Table:
    """One digest file as an Arrow table (``ParquetFile``, not ``read_table``: no dataset
    discovery, half the time on a small file)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).read()


def table_frame(table: pa.Table, name: str = "") -> pd.DataFrame:
    """A digest frame ``name`` read as ``table``, as the analysis takes it: derived columns
    filled, strings shared, lists as lists."""
    import pyarrow as pa

    texts = [
        f.name
        for f in table.schema
        if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
    ]
    frame = filled(table, table.drop_columns(texts).to_pandas(), name)
    for c in texts:
        frame[c] = strings(table.column(c))
    frame = frame[table.column_names]
    for c in frame.columns:
        if c in LIST_COLUMNS:
            # a rank without measured rows holds NaN there, as the engine's merge leaves it
            frame[c] = [listed(v) for v in frame[c]]
    return frame


class ReadDigest(Mapping[str, Any]):
    """One run's digest as read: each frame's Arrow table (``tables``), made a pandas frame when
    first asked for; the tables read only when asked for are their files' paths (``paths``).
    ``binned``: the binned frame's ``attrs`` (its bins and their size)."""

    def __init__(
        self, tables: dict[str, pa.Table], paths: dict[str, Path], binned: dict[str, object]
    ) -> None:
        self.tables, self.paths, self._binned = tables, paths, binned
        self._frames: dict[str, pd.DataFrame] = {}

    def __getitem__(self, name: str) -> Any:
        if name in self.paths:
            return self.paths[name]
        if name not in self._frames:
            frame = table_frame(self.tables[name], name)
            if name == "binned":
                frame.attrs.update(self._binned)
            self._frames[name] = frame
        return self._frames[name]

    def __iter__(self) -> Iterator[str]:
        return iter([*self.tables, *self.paths])

    def __len__(self) -> int:
        return len(self.tables) + len(self.paths)


def unsorted(part: pd.DataFrame, keys: list[str]) -> bool:
    """Whether one run's rows are out of the order of ``keys`` (``run_id`` first, one value)."""
    if len(part) < 2 or not keys[1:]:
        return False
    order = np.lexsort([part[k].to_numpy() for k in reversed(keys[1:])])
    return bool((np.diff(order) < 0).any())


def concat_frames(parts: list[pd.DataFrame], keys: list[str]) -> pd.DataFrame:
    """Runs' frames as one, sorted by ``keys`` (``run_id`` first) as one pass over all their
    rows gives it: the runs in order, each run's rows sorted (most already are: no copy)."""
    kept = [p for p in parts if len(p.columns)]
    if not kept:
        return parts[0] if parts else pd.DataFrame()
    nonempty = [p for p in kept if len(p)] or kept[:1]
    present = [k for k in keys if k in nonempty[0].columns]
    if present and len(nonempty) > 1:
        nonempty = sorted(nonempty, key=lambda p: str(p[present[0]].iloc[0]))
        nonempty = [
            p.sort_values(present, kind="stable", ignore_index=True) if unsorted(p, present) else p
            for p in nonempty
        ]
    return pd.concat(nonempty, ignore_index=True) if len(nonempty) > 1 else nonempty[0]


def joined_frames(tables: Sequence[pa.Table], keys: list[str], name: str) -> pd.DataFrame:
    """The frame ``name`` of several runs (each run's Arrow table) as one pandas frame: what
    :func:`concat_frames` makes of the runs' frames, made from one concatenated table. Tables
    whose columns do not concatenate go the frames' way."""
    import pyarrow as pa

    kept = [t for t in tables if t.num_columns]
    nonempty = [t for t in kept if t.num_rows] or kept[:1]
    present = [k for k in keys if nonempty and k in nonempty[0].column_names]
    if len(nonempty) < 2 or not present:
        return concat_frames([table_frame(t, name) for t in tables], keys)
    nonempty = sorted(nonempty, key=lambda t: str(t.column(present[0])[0].as_py()))
    try:
        whole = pa.concat_tables(nonempty, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return concat_frames([table_frame(t, name) for t in tables], keys)
    frame = table_frame(whole, name)
    bounds = np.cumsum([0, *(t.num_rows for t in nonempty)])
    parts = [frame.iloc[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    if not any(unsorted(p, present) for p in parts):
        return frame
    return concat_frames([p.reset_index(drop=True) for p in parts], keys)
