"""Trace schema 2's FSDP columns beside files written before them: a schema-1 rank file (a
consolidated Parquet one and a live Arrow stream) reads with the FSDP columns null, through
pandas and through the engine, and its DDP columns as written. No processes."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from workbench import schema
from workbench.store.arrow_stream import StreamWriter
from workbench.store.engine import steps_view
from workbench.store.load import load_traces

FSDP = [c for c, version in schema.ADDED_IN.items() if version == 2]


def _v1_row(rank: int, step: int) -> dict:
    row = {c: None for c in schema.STEP_COLUMNS if c not in FSDP}
    row.update(run_id="old", rank=rank, local_rank=rank, host="h", world_size=2, attempt=0, epoch=0)
    row.update(step=step, warmup=False, t_start_s=0.1 * step, step_s=0.05, samples=8)
    row.update(comm_bytes=4096, comm_buckets=1, comm_s=0.01, comm_exposed_s=0.002)
    return row


def test_the_fsdp_columns_are_schema_2s_and_an_older_file_reads_them_null(tmp_path: Path) -> None:
    assert schema.TRACE_SCHEMA_VERSION == 2
    assert sorted(FSDP) == sorted(
        f"{k}_{w}"
        for k in ("all_gather", "reduce_scatter")
        for w in ("bytes", "s", "exposed_s", "calls")
    )
    assert all(c in schema.STEP_COLUMNS for c in FSDP)
    run = tmp_path / "old"
    traces = run / schema.TRACES_DIR
    traces.mkdir(parents=True)
    v1 = {c: t for c, t in schema.STEP_COLUMNS.items() if c not in FSDP}
    # rank 0 consolidated (Parquet), rank 1 live (an Arrow stream), both without the columns
    pq.write_table(pa.Table.from_pylist([_v1_row(0, s) for s in (1, 2)]), traces / "x.parquet")
    (traces / "x.parquet").rename(traces / schema.steps_file(0))
    writer = StreamWriter(traces / schema.live_steps_file(1), v1)
    rows = [_v1_row(1, s) for s in (1, 2)]
    writer.write({c: [r[c] for r in rows] for c in v1}, len(rows))
    writer.close()

    frame = load_traces(run, "steps")
    assert list(frame.columns) == list(schema.STEP_COLUMNS) and len(frame) == 4
    assert frame[FSDP].isna().all().all()
    assert (frame["comm_bytes"] == 4096).all() and (frame["comm_exposed_s"] == 0.002).all()

    engine = steps_view([run]).execute(
        f"SELECT comm_bytes, {', '.join(FSDP)} FROM steps ORDER BY rank, step"
    )
    got = engine.fetchall()
    assert len(got) == 4
    assert all(r[0] == 4096 and all(v is None for v in r[1:]) for r in got), got
