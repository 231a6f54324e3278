"""Parquet training data sharded by row groups: writing, counting and repartitioning files.

A file holds feature columns ``x0 .. x{d-1}`` (float32) and ``label`` (int64). Rank ``r`` of ``n``
reads row groups ``r, r + n, r + 2n, ...``; so the number of row groups must be a multiple of the
number of processes, or the ranks would see different amounts of data. ``repartition`` rewrites a
file with another row-group size to make it so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from workbench.store.files import atomic_write_bytes


def make_parquet_dataset(
    path: str | Path,
    samples: int,
    features: int = 32,
    classes: int = 4,
    seed: int = 0,
    rows_per_group: int = 256,
) -> Path:
    """Write a classification dataset with a learnable signal (labels from a fixed random
    teacher) as Parquet with row groups of ``rows_per_group`` rows."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features), dtype=np.float32)
    teacher = np.random.default_rng(12345).standard_normal((features, classes)).astype(np.float32)
    labels = np.argmax(np.tanh(x) @ teacher, axis=1).astype(np.int64)
    table = pa.table({**{f"x{i}": x[:, i] for i in range(features)}, "label": labels})
    return _write(table, Path(path), rows_per_group)


def _write(table: pa.Table, path: Path, rows_per_group: int | list[int]) -> Path:
    """Write ``table`` atomically; row groups of ``rows_per_group`` rows, or of exactly the
    listed sizes."""
    sink = pa.BufferOutputStream()
    if isinstance(rows_per_group, int):
        pq.write_table(table, sink, row_group_size=rows_per_group)
    else:
        with pq.ParquetWriter(sink, table.schema) as writer:
            start = 0
            for size in rows_per_group:
                writer.write_table(table.slice(start, size), row_group_size=size)
                start += size
    atomic_write_bytes(path, sink.getvalue().to_pybytes())
    return path


def row_groups(path: str | Path) -> int:
    return pq.ParquetFile(path).num_row_groups


def repartition(
    src: str | Path,
    dst: str | Path | None = None,
    *,
    row_groups_count: int | None = None,
    rows_per_group: int | None = None,
) -> Path:
    """Rewrite ``src`` (in place when ``dst`` is None) with exactly ``row_groups_count`` row
    groups (sizes differing by one row at most) or with ``rows_per_group`` rows each."""
    if (row_groups_count is None) == (rows_per_group is None):
        raise ValueError("give exactly one of row_groups_count and rows_per_group")
    table = pq.read_table(src)
    if row_groups_count is not None:
        if row_groups_count < 1 or row_groups_count > table.num_rows:
            raise ValueError(
                f"row_groups_count={row_groups_count}: must be in 1..{table.num_rows} (the rows)"
            )
        # Rounding one size up can leave fewer groups than asked (225 rows in 16 -> 15 of 15).
        q, r = divmod(table.num_rows, row_groups_count)
        return _write(table, Path(dst or src), [q + 1] * r + [q] * (row_groups_count - r))
    assert rows_per_group is not None
    if rows_per_group < 1:
        raise ValueError(f"rows_per_group={rows_per_group}: must be >= 1")
    return _write(table, Path(dst or src), rows_per_group)


def partition_problem(path: str | Path, processes: int) -> str | None:
    """Why ``path`` cannot be sharded over ``processes`` ranks, with the fix; None when it can."""
    groups = row_groups(path)
    if groups % processes == 0:
        return None
    fix = processes * max(1, round(groups / processes))
    return (
        f"has {groups} row groups, not a multiple of the {processes} processes; rewrite it with "
        f"`workbench repartition {path} --row-groups {fix}` (or any multiple of {processes})"
    )
