"""Consolidated trace files: a rank's JSONL rows turned into one Parquet file per kind at the end
of its run, and trimmed to a checkpoint's step before a resumed attempt appends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench import schema
from workbench.store.files import atomic_write_bytes
from workbench.store.jsonl import read_jsonl


def _arrow_schema(columns: dict[str, str]) -> Any:
    import pyarrow as pa

    types = {
        "string": pa.string(),
        "int64": pa.int64(),
        "float64": pa.float64(),
        "bool": pa.bool_(),
    }
    return pa.schema(
        [pa.field(name, types[kind]) for name, kind in columns.items()],
        metadata={"workbench_trace_schema": str(schema.TRACE_SCHEMA_VERSION)},
    )


def _read_rows(traces_dir: Path, stem: str) -> list[dict[str, Any]]:
    """Rows of one rank's trace: the Parquet file if consolidated, plus any JSONL beside it."""
    rows: list[dict[str, Any]] = []
    parquet = traces_dir / f"{stem}.parquet"
    if parquet.exists():
        import pyarrow.parquet as pq

        rows.extend(pq.read_table(parquet).to_pylist())
    rows.extend(read_jsonl(traces_dir / f"{stem}.jsonl"))
    return rows


def _write_parquet(rows: list[dict[str, Any]], columns: dict[str, str], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(
        [{c: r.get(c) for c in columns} for r in rows], schema=_arrow_schema(columns)
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(path, sink.getvalue().to_pybytes())


def consolidate(traces_dir: Path, rank: int) -> None:
    """Turn this rank's JSONL rows (and any earlier Parquet) into one Parquet file per kind."""
    for stem_of, columns in (
        (schema.steps_file, schema.STEP_COLUMNS),
        (schema.eval_file, schema.EVAL_COLUMNS),
    ):
        stem = stem_of(rank, "x")[:-2]
        rows = _read_rows(traces_dir, stem)
        _write_parquet(rows, columns, traces_dir / f"{stem}.parquet")
        (traces_dir / f"{stem}.jsonl").unlink(missing_ok=True)


def trim_for_resume(traces_dir: Path, rank: int, last_step: int) -> None:
    """Before a resumed attempt appends: keep only rows up to the checkpoint's step, so the steps
    it repeats are traced once, by the attempt that completes them."""
    for stem_of, columns in (
        (schema.steps_file, schema.STEP_COLUMNS),
        (schema.eval_file, schema.EVAL_COLUMNS),
    ):
        stem = stem_of(rank, "x")[:-2]
        rows = [r for r in _read_rows(traces_dir, stem) if r["step"] <= last_step]
        if not rows and not (traces_dir / f"{stem}.parquet").exists():
            continue
        _write_parquet(rows, columns, traces_dir / f"{stem}.parquet")
        (traces_dir / f"{stem}.jsonl").unlink(missing_ok=True)
