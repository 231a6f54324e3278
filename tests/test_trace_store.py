"""The tracer's files and the store's loaders, without starting processes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from workbench import schema
from workbench.errors import NonFiniteLossError
from workbench.store.arrow_stream import StreamWriter, read_messages, read_stream
from workbench.store.files import atomic_write_bytes, read_json, write_json
from workbench.store.load import load_traces
from workbench.store.trace_files import consolidate, trim_for_resume
from workbench.trace.phase_clock import PhaseClock, Phases
from workbench.trace.tracer import Tracer


def _tracer(tmp_path: Path, rank: int = 0, flush_s: float = 60.0) -> Tracer:
    return Tracer(
        tmp_path / "traces",
        run_id="r",
        rank=rank,
        local_rank=rank,
        host="h",
        world_size=2,
        attempt=0,
        flush_s=flush_s,
        device=torch.device("cpu"),
    )


def _step(tracer: Tracer, step: int, **extra) -> None:
    fields = dict(
        epoch=0,
        step=step,
        warmup=step <= 1,
        t_start_s=0.01 * step,
        phases=Phases(0.001, 0.002, 0.003, 0.001, 0.008),
        comm_s=0.002,
        comm_bytes=100,
        comm_buckets=1,
        samples=4,
        loss=1.0 / step,
        lr=0.1,
    )
    tracer.step(**{**fields, **extra})


def _live(tmp_path: Path, rank: int = 0) -> Path:
    return tmp_path / "traces" / schema.live_steps_file(rank)


def _steps_on_disk(path: Path) -> list[int]:
    table = read_stream(path)
    return [] if table is None else table.column("step").to_pylist()


def test_rows_reach_disk_on_flush_interval_and_on_exception(tmp_path: Path) -> None:
    path = _live(tmp_path)
    with pytest.raises(RuntimeError), _tracer(tmp_path, flush_s=0.0) as tracer:
        _step(tracer, 1)
        assert _steps_on_disk(path) == [], "a periodic flush holds the latest row (its gap_s)"
        _step(tracer, 2)
        assert _steps_on_disk(path) == [1], "flush_s=0 writes every row once the next starts"
        tracer.flush()
        assert _steps_on_disk(path) == [1, 2], "an explicit flush writes every row"
        tracer.flush_s = 3600
        _step(tracer, 3)
        assert _steps_on_disk(path) == [1, 2], "buffered until the next flush"
        raise RuntimeError("boom")
    assert _steps_on_disk(path) == [1, 2, 3], "closing on an exception keeps the rows"
    assert path.name == "steps-rank00000.arrows"


def test_buffer_is_bounded(tmp_path: Path) -> None:
    tracer = _tracer(tmp_path)
    tracer.max_rows = 10
    for step in range(1, 26):
        _step(tracer, step)
    # at 10 rows a flush writes 9 and holds the latest: steps 1-9, then 10-18 (at step 19)
    assert len(tracer._rows) == 7 and _steps_on_disk(_live(tmp_path)) == list(range(1, 19))
    tracer.close()


def test_gap_s_and_save_s_on_the_rows(tmp_path: Path) -> None:
    """gap_s = next start - (start + step_s), worked out by hand from the rows given: starts
    0.01 * step, step_s 0.008, so 0.002 wherever the next row was known when written."""
    with _tracer(tmp_path, flush_s=0.0) as tracer:
        for step in (1, 2, 3):
            _step(tracer, step)
        tracer.saved(0.25)  # a checkpoint after step 3: its row is written before the commit
        tracer.flush()
        for step in (4, 5, 6):
            _step(tracer, step, t_start_s=0.01 * step + 0.1)  # 0.1 s later than back to back
    rows = read_stream(_live(tmp_path)).to_pylist()
    gap = {r["step"]: r["gap_s"] for r in rows}
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert gap[1] == pytest.approx(0.002) and gap[2] == pytest.approx(0.002)
    assert gap[4] == pytest.approx(0.002) and gap[5] == pytest.approx(0.002)
    assert gap[3] is None and gap[6] is None, "written before the next step: left to the analysis"
    assert {r["step"]: r["save_s"] for r in rows} == {
        1: None,
        2: None,
        3: 0.25,
        4: None,
        5: None,
        6: None,
    }


def test_live_file_is_an_arrow_stream_with_the_trace_schema(tmp_path: Path) -> None:
    clock = PhaseClock(torch.device("cpu"))
    with _tracer(tmp_path) as tracer:
        for step in (1, 2, 3):
            clock.start()
            for _ in range(4):
                sum(range(1000))
                clock.mark()
            _step(tracer, step, phases=clock.stop(), t_start_s=tracer.since_t0(clock.started_at))
    table = pa.ipc.open_stream(_live(tmp_path).read_bytes()).read_all()  # plain pyarrow reads it
    assert table.column_names == list(schema.STEP_COLUMNS)
    assert table.schema.metadata[b"workbench_trace_schema"] == b"2"
    row = table.to_pylist()[-1]
    assert row["host"] == "h" and row["rank"] == 0 and row["attempt"] == 0 and row["rss_bytes"] > 0
    phases = [row[c] for c in ("data_s", "forward_s", "backward_s", "optimizer_s")]
    assert all(x > 0 for x in phases) and row["step_s"] == pytest.approx(sum(phases))
    assert row["mem_alloc_bytes"] is None and row["loss"] == pytest.approx(1 / 3)


def test_consolidate_writes_parquet_with_schema_and_removes_live_files(tmp_path: Path) -> None:
    with _tracer(tmp_path) as tracer:
        for step in (1, 2, 3):
            _step(tracer, step)
        tracer.evaluation(
            epoch=0,
            step=3,
            t_start_s=0.1,
            predict_s=0.1,
            gather_s=0.01,
            metric_s=0.001,
            broadcast_s=0.001,
            eval_s=0.112,
            samples=10,
            metric_name="accuracy",
            metric_value=0.5,
            loss=1.2,
        )
    consolidate(tmp_path / "traces", 0)
    names = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert names == ["eval-rank00000.parquet", "steps-rank00000.parquet"]
    steps = pd.read_parquet(tmp_path / "traces" / "steps-rank00000.parquet")
    assert list(steps.columns) == list(schema.STEP_COLUMNS)
    assert steps["step"].tolist() == [1, 2, 3] and steps["host"].tolist() == ["h"] * 3
    assert steps["mem_alloc_bytes"].isna().all() and (steps["rss_bytes"] > 0).all()
    evals = load_traces(tmp_path, "eval")
    assert evals[["run_id", "rank", "world_size", "metric_value"]].values.tolist() == [
        ["r", 0, 2, 0.5]
    ]


def test_trim_for_resume_keeps_steps_up_to_the_checkpoint(tmp_path: Path) -> None:
    with _tracer(tmp_path) as tracer:
        for step in range(1, 8):
            _step(tracer, step)
    consolidate(tmp_path / "traces", 0)
    trim_for_resume(tmp_path / "traces", 0, last_step=4)
    assert load_traces(tmp_path)["step"].tolist() == [1, 2, 3, 4]


def test_trim_for_resume_of_live_rows_then_the_next_attempt_appends(tmp_path: Path) -> None:
    with _tracer(tmp_path) as tracer:  # a preempted attempt: its rows are still live
        for step in range(1, 8):
            _step(tracer, step)
    trim_for_resume(tmp_path / "traces", 0, last_step=4)
    assert not _live(tmp_path).exists()
    with _tracer(tmp_path) as tracer:
        for step in range(5, 9):
            _step(tracer, step)
    assert load_traces(tmp_path)["step"].tolist() == list(range(1, 9))
    consolidate(tmp_path / "traces", 0)
    assert pd.read_parquet(tmp_path / "traces" / schema.steps_file(0))["step"].tolist() == list(
        range(1, 9)
    )


def test_a_traced_nan_is_consolidated_as_null(tmp_path: Path) -> None:
    """A diverged loss (traced with ``stop_on_nonfinite`` off) is NaN in the live file and null
    in Parquet: Parquet's min/max statistics leave NaN out, so a reader trusting them (DuckDB
    folds ``isnan`` with them) would keep the NaN in every mean of the column."""
    tracer = _tracer(tmp_path)
    tracer.stop_on_nonfinite = False
    with tracer:
        for step in (1, 2, 3):
            _step(tracer, step, loss=math.nan if step == 2 else 1.0 / step)
    assert math.isnan(read_stream(_live(tmp_path)).column("loss")[1].as_py())
    consolidate(tmp_path / "traces", 0)
    loss = pq.read_table(tmp_path / "traces" / schema.steps_file(0)).column("loss")
    assert loss.to_pylist() == [1.0, None, 1.0 / 3], "null, not NaN"


def test_rows_in_both_files_after_a_stop_mid_consolidation_are_kept_once(tmp_path: Path) -> None:
    """A rank stopped after writing its Parquet file and before removing its live file (a kill at
    the end of a preemption's grace period) leaves the same rows in both; the resumed attempt's
    trim and the final consolidation keep one copy of each (the Parquet one)."""
    with _tracer(tmp_path) as tracer:
        for step in range(1, 7):
            _step(tracer, step)
    live = _live(tmp_path)
    kept = live.read_bytes()
    consolidate(tmp_path / "traces", 0)
    live.write_bytes(kept)  # the live file the stopped rank did not get to remove
    trim_for_resume(tmp_path / "traces", 0, last_step=4)
    with _tracer(tmp_path) as tracer:
        for step in (5, 6):
            _step(tracer, step)
    consolidate(tmp_path / "traces", 0)
    steps = pq.read_table(tmp_path / "traces" / schema.steps_file(0)).column("step").to_pylist()
    assert steps == [1, 2, 3, 4, 5, 6], steps


def test_torn_last_message_is_skipped_and_a_new_writer_cuts_it_off(tmp_path: Path) -> None:
    path = _live(tmp_path)
    with _tracer(tmp_path) as tracer:
        _step(tracer, 1)
        tracer.flush()
        _step(tracer, 2)
    whole = path.read_bytes()
    _, end_of_first, _ = read_messages(whole[: len(whole) - 1])
    path.write_bytes(whole[:-7])  # a crash in the middle of writing the second batch
    assert load_traces(tmp_path)["step"].tolist() == [1]
    assert _steps_on_disk(path) == [1]
    with _tracer(tmp_path) as tracer:  # an attempt restarted without a checkpoint: it appends
        assert path.stat().st_size == end_of_first
        _step(tracer, 3)
    assert load_traces(tmp_path)["step"].tolist() == [1, 3]
    consolidate(tmp_path / "traces", 0)
    assert load_traces(tmp_path)["step"].tolist() == [1, 3]


def test_reading_from_an_offset_returns_only_new_complete_batches(tmp_path: Path) -> None:
    path = tmp_path / "s.arrows"
    writer = StreamWriter(path, {"step": "int64", "x": "float64"}, {"x": 0.5})
    writer.write({"step": [1, 2]}, 2)
    batches, offset, known = read_messages(path.read_bytes())
    assert [b.num_rows for b in batches] == [2] and offset == path.stat().st_size
    writer.write({"step": [3]}, 1)
    with open(path, "ab") as f:
        f.write(b"\xff\xff\xff\xff\x10")  # the start of a message still being written
    batches, used, _ = read_messages(path.read_bytes()[offset:], known)
    assert [b.to_pylist() for b in batches] == [[{"step": 3, "x": 0.5}]]
    assert offset + used == path.stat().st_size - 5
    assert read_messages(b"")[0] == [] and read_stream(tmp_path / "missing.arrows") is None
    writer.close()


def test_a_run_folder_from_before_the_arrow_stream_still_loads(tmp_path: Path) -> None:
    """Live rows as JSONL (the previous tracer's files), with a torn last line."""
    traces = tmp_path / "traces"
    traces.mkdir()
    rows = []
    for step in (1, 2, 3):
        row = {c: None for c in schema.STEP_COLUMNS}
        row.update(run_id="r", rank=0, world_size=1, attempt=0, step=step, loss=1.0 / step)
        rows.append(json.dumps(row) + "\n")
    (traces / schema.steps_file(0, "jsonl")).write_text("".join(rows) + '{"run_id": "r", "st')
    assert load_traces(tmp_path)["step"].tolist() == [1, 2, 3]
    trim_for_resume(traces, 0, last_step=2)
    assert sorted(p.name for p in traces.iterdir()) == ["steps-rank00000.parquet"]
    with _tracer(tmp_path, rank=0) as tracer:
        _step(tracer, 3)
    consolidate(traces, 0)
    steps = load_traces(tmp_path)
    assert steps["step"].tolist() == [1, 2, 3] and steps["loss"].tolist()[:2] == [1.0, 0.5]


def test_a_non_finite_tensor_loss_raises_at_the_flush_naming_its_step(tmp_path: Path) -> None:
    with pytest.raises(NonFiniteLossError) as err, _tracer(tmp_path, rank=1) as tracer:
        for step in range(1, 6):
            loss = torch.tensor(math.nan if step == 4 else 1.0 / step)
            _step(tracer, step, loss=loss)
    assert err.value.step == 4 and err.value.rank == 1 and "at step 4 on rank 1" in str(err.value)
    steps = load_traces(tmp_path)
    assert steps["step"].tolist() == [1, 2, 3] and steps["loss"].tolist()[2] == pytest.approx(1 / 3)


def test_load_traces_skips_a_corrupt_file_with_a_warning_naming_it(tmp_path: Path) -> None:
    with _tracer(tmp_path, rank=0) as t0, _tracer(tmp_path, rank=1) as t1:
        _step(t0, 1)
        _step(t1, 1)
    consolidate(tmp_path / "traces", 0)
    consolidate(tmp_path / "traces", 1)
    bad = tmp_path / "traces" / "steps-rank00001.parquet"
    bad.write_bytes(bad.read_bytes()[:40])
    with pytest.warns(UserWarning, match="steps-rank00001.parquet"):
        steps = load_traces(tmp_path)
    assert steps["rank"].tolist() == [0]


def test_phase_clock_phases_cover_the_step(tmp_path: Path) -> None:
    clock = PhaseClock(torch.device("cpu"))
    with _tracer(tmp_path) as tracer:
        for step in (1, 2):
            clock.start()
            for _ in range(3 * step + 1):  # one, then two micro-batches
                sum(range(1000))
                clock.mark()
            _step(tracer, step, phases=clock.stop())
    steps = load_traces(tmp_path)
    parts = steps[["data_s", "forward_s", "backward_s", "optimizer_s"]]
    assert (parts > 0).all().all()
    assert steps["step_s"].tolist() == pytest.approx(parts.sum(axis=1).tolist())


def test_atomic_write_leaves_no_temporary_files(tmp_path: Path) -> None:
    write_json(tmp_path / "a" / "run.json", {"x": 1})
    atomic_write_bytes(tmp_path / "a" / "b.bin", b"123")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b.bin", "run.json"]
    assert read_json(tmp_path / "a" / "run.json") == {"x": 1}
    assert json.loads((tmp_path / "a" / "run.json").read_text())["x"] == 1
