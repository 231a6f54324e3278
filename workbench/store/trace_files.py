"""Consolidated trace files: a rank's live rows (Arrow stream, or JSONL from older runs) turned into
one Parquet file per kind at the end of its run, and trimmed to a checkpoint's step before a
resumed attempt appends."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from workbench import schema
from workbench.store.arrow_stream import arrow_schema, read_stream
from workbench.store.files import atomic_write_bytes
from workbench.store.jsonl import read_jsonl

if TYPE_CHECKING:
    import pyarrow as pa


def conform(table: pa.Table, target: pa.Schema) -> pa.Table:
    """``table`` with exactly ``target``'s columns, in order and types (missing ones null)."""
    import pyarrow as pa

    arrays = [
        table.column(f.name).cast(f.type)
        if f.name in table.column_names
        else pa.nulls(table.num_rows, f.type)
        for f in target
    ]
    return pa.Table.from_arrays(arrays, schema=target)


def live_paths(traces_dir: Path, kind: str, rank: int) -> list[Path]:
    """The live files of one rank and kind: its Arrow stream and an older run's JSONL."""
    return [
        traces_dir / schema.trace_file(kind, rank, schema.LIVE_SUFFIX),
        traces_dir / schema.trace_file(kind, rank, schema.LEGACY_LIVE_SUFFIX),
    ]


def read_rank_trace(traces_dir: Path, kind: str, rank: int) -> pa.Table | None:
    """Every row of one rank's trace of one kind: the Parquet file (earlier attempts, or the
    whole run once consolidated), then the live rows. None when there are no files at all."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = arrow_schema(schema.trace_columns(kind))
    parts = []
    parquet = traces_dir / schema.trace_file(kind, rank)
    if parquet.exists():
        parts.append(pq.read_table(parquet))
    stream, legacy = live_paths(traces_dir, kind, rank)
    table = read_stream(stream)
    if table is not None:
        parts.append(table)
    if legacy.exists():
        rows = [{c: r.get(c) for c in target.names} for r in read_jsonl(legacy)]
        parts.append(pa.Table.from_pylist(rows, schema=target))
    if not parts:
        return None
    table = pa.concat_tables([conform(t, target) for t in parts])
    return _first_of_each_step(table) if len(parts) > 1 else table


#: What names a row: a rank traces one row per step of an attempt.
ROW_KEYS = ["run_id", "rank", "attempt", "step"]


def _first_of_each_step(table: pa.Table) -> pa.Table:
    """``table`` with the first row of each :data:`ROW_KEYS`: a rank stopped after writing its
    Parquet file but before removing its live file leaves the same rows in both (the Parquet
    copy comes first and is kept), as :func:`workbench.store.load.load_traces` reads them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    at = table.append_column("_row", pa.array(range(table.num_rows), pa.int64()))
    first = at.group_by(ROW_KEYS, use_threads=False).aggregate([("_row", "min")])["_row_min"]
    return table if len(first) == table.num_rows else table.take(pc.sort_indices(first))


def _nan_as_null(table: pa.Table) -> pa.Table:
    """``table`` with a float NaN as null (pandas counts both as missing): Parquet writers leave
    NaN out of a column's min/max, and a reader that trusts those would keep it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = [
        pc.if_else(pc.is_nan(c), pa.scalar(None, f.type), c) if pa.types.is_floating(f.type) else c
        for f, c in zip(table.schema, table.columns, strict=True)
    ]
    return pa.Table.from_arrays(columns, schema=table.schema)


def _replace_with_parquet(table: pa.Table, traces_dir: Path, kind: str, rank: int) -> None:
    """Write ``table`` as the rank's Parquet file (atomically), then remove its live files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(_nan_as_null(table), sink)
    atomic_write_bytes(traces_dir / schema.trace_file(kind, rank), sink.getvalue().to_pybytes())
    for path in live_paths(traces_dir, kind, rank):
        path.unlink(missing_ok=True)


def consolidate(traces_dir: Path, rank: int) -> None:
    """Turn this rank's live rows (and any earlier Parquet) into one Parquet file per kind."""
    for kind in schema.TRACE_KINDS:
        table = read_rank_trace(traces_dir, kind, rank)
        if table is None:
            table = arrow_schema(schema.trace_columns(kind)).empty_table()
        _replace_with_parquet(table, traces_dir, kind, rank)


def trim_for_resume(traces_dir: Path, rank: int, last_step: int) -> None:
    """Before a resumed attempt appends: keep only rows up to the checkpoint's step, so the steps
    it repeats are traced once, by the attempt that completes them."""
    import pyarrow.compute as pc

    for kind in schema.TRACE_KINDS:
        table = read_rank_trace(traces_dir, kind, rank)
        if table is None:
            continue
        table = table.filter(pc.less_equal(table["step"], last_step))
        _replace_with_parquet(table, traces_dir, kind, rank)
