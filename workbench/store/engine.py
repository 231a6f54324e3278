"""The columnar engine over the store's trace files: DuckDB, reading only the columns and rows a
query needs (projection and predicate pushdown into the Parquet files).

:func:`steps_view` opens one connection with a ``steps`` view over every rank's step rows of the
given runs: the consolidated Parquet files, and the live rows of a running run (its Arrow streams,
or an older run's JSONL) read as :mod:`workbench.store.load` reads them, then handed to the engine
(a rank's row is in both files for the moment it consolidates: the Parquet one is kept). Float
columns hold NULL where a trace holds NaN, as pandas counts both as missing. Queries that run over
the view live beside it in this floor (``*_query`` modules) and return small pandas frames. No
torch.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from workbench import schema
from workbench.store.arrow_stream import arrow_schema, read_stream
from workbench.store.jsonl import read_jsonl
from workbench.store.trace_files import ROW_KEYS, conform

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

#: The engine's memory ceiling: it spills to disk beyond it rather than growing. A sweep of 10
#: runs x 100,000 steps groups a million steps in the digest's per-step pass: at 256 MB that
#: pass spilled (16.7 s against 9.5 s at 1 GB); the report's peak stayed near 1.7 GiB either way.
MEMORY_LIMIT = os.environ.get("WORKBENCH_ENGINE_MEMORY", "1GB")
#: Threads: the machine's cores, at most 4 (more buys little on a few hundred MB of Parquet and
#: costs memory per thread).
THREADS = max(1, min(4, os.cpu_count() or 1))

_SQL_TYPES = {"string": "VARCHAR", "int64": "BIGINT", "float64": "DOUBLE", "bool": "BOOLEAN"}


def connect() -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB connection with the memory limit and threads set."""
    import duckdb

    con = duckdb.connect(":memory:")
    con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
    con.execute(f"SET threads = {THREADS}")
    con.execute("SET preserve_insertion_order = false")
    con.execute("SET enable_progress_bar = false")
    con.execute("SET parquet_metadata_cache = true")  # each pass opens the same footers
    # Parquet writers (pyarrow among them) leave NaN out of a float column's min/max, and DuckDB
    # folds `x = NaN` (so `nullif`, `isnan`) to false with those statistics: a traced NaN would
    # survive as NaN and spoil every sum it is in. Files the store writes now hold null instead,
    # but older files and other writers' still hold NaN.
    con.execute("SET disabled_optimizers = 'statistics_propagation'")
    return con


def _files(run_dirs: Iterable[str | Path], kind: str) -> tuple[list[str], set[str], list[Path]]:
    """The readable Parquet files of ``kind`` in the runs, the columns they hold (any of them),
    and the live files (Arrow streams, JSONL)."""
    parquet: list[str] = []
    present: set[str] = set()
    live: list[Path] = []
    for run in run_dirs:
        traces = Path(run) / schema.TRACES_DIR
        for path in sorted(traces.glob(f"{kind}-rank*.{schema.FINAL_SUFFIX}")):
            footer = _footer(path)
            if footer is not None:
                parquet.append(str(path))
                present.update(footer[0])
        for suffix in (schema.LIVE_SUFFIX, schema.LEGACY_LIVE_SUFFIX):
            live += sorted(traces.glob(f"{kind}-rank*.{suffix}"))
    return parquet, present, live


@functools.lru_cache(maxsize=1 << 16)
def _parquet_footer(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, ...], int] | None:
    """The columns and rows of ``path``'s Parquet footer (a few hundred bytes read), or None when
    it does not read: a truncated or corrupt file is skipped with the warning
    :func:`workbench.store.load.load_traces` gives, so it cannot hide the other ranks' rows.
    Kept by path, modification time and size: a report's passes open each file's footer once."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
    except Exception as exc:
        warnings.warn(f"skipping unreadable trace file {path}: {exc}", stacklevel=6)
        return None
    return tuple(meta.schema.to_arrow_schema().names), int(meta.num_rows)


def _footer(path: Path) -> tuple[tuple[str, ...], int] | None:
    """:func:`_parquet_footer` of ``path`` as it is now."""
    stat = path.stat()
    return _parquet_footer(str(path), stat.st_mtime_ns, stat.st_size)


def parquet_rows(run_dirs: Iterable[str | Path], kind: str = "steps") -> int:
    """The rows of the runs' consolidated Parquet files of ``kind``, from their footers (kept for
    the passes that follow; a running rank's live rows are not counted): a progress bar's
    total, known before any pass."""
    footers = (_footer(Path(p)) for p in _files(run_dirs, kind)[0])
    return sum(f[1] for f in footers if f is not None)


def _select_list(present: set[str], columns: dict[str, str]) -> str:
    """Every schema column in order: NaN read as NULL, absent columns as typed NULLs."""
    parts = []
    for name, kind in columns.items():
        sql_type = _SQL_TYPES[kind]
        if name not in present:
            parts.append(f"NULL::{sql_type} AS {name}")
        elif kind == "float64":
            parts.append(f"nullif({name}::DOUBLE, 'NaN'::DOUBLE) AS {name}")
        else:
            parts.append(f"{name}::{sql_type} AS {name}")
    return ", ".join(parts)


def _live_table(paths: list[Path], kind: str) -> pa.Table | None:
    """The live rows of ``paths`` as one Arrow table in the schema's columns (None if none); a
    torn last batch or line is left out, as :func:`workbench.store.load.load_traces` does."""
    import pyarrow as pa

    target = arrow_schema(schema.trace_columns(kind))
    tables = []
    for path in paths:
        if path.suffix == f".{schema.LIVE_SUFFIX}":
            table = read_stream(path)
        else:
            rows = [{c: r.get(c) for c in target.names} for r in read_jsonl(path)]
            table = pa.Table.from_pylist(rows, schema=target)
        if table is not None and table.num_rows:
            tables.append(conform(table, target))
    return pa.concat_tables(tables) if tables else None


def steps_view(run_dirs: Iterable[str | Path], kind: str = "steps") -> duckdb.DuckDBPyConnection:
    """A connection whose view ``steps`` (or ``eval`` for ``kind="eval"``) holds every rank's
    rows of ``run_dirs`` in the schema's columns; an empty view when the runs have no traces."""
    columns = schema.trace_columns(kind)
    con = connect()
    parquet, present, live = _files(run_dirs, kind)
    parts = []
    if parquet:
        listed = "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in parquet) + "]"
        source = f"read_parquet({listed}, union_by_name = true)"
        parts.append(f"SELECT {_select_list(present, columns)} FROM {source}")
    table = _live_table(live, kind) if live else None
    if table is not None:
        con.register("_live_rows", table)
        live_sql = f"SELECT {_select_list(set(columns), columns)} FROM _live_rows"
        if parts:  # a row consolidated into Parquet a moment ago is read from there
            on = " AND ".join(f"l.{k} IS NOT DISTINCT FROM p.{k}" for k in ROW_KEYS)
            live_sql = f"SELECT l.* FROM ({live_sql}) l ANTI JOIN ({parts[0]}) p ON {on}"
        parts.append(live_sql)
    if not parts:
        parts.append(f"SELECT {_select_list(set(), columns)} WHERE false")
    name = "steps" if kind == "steps" else "eval"
    con.execute(f"CREATE VIEW {name} AS " + " UNION ALL ".join(parts))
    return con
