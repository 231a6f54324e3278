"""The tracer's files and the store's loaders, without starting processes."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from workbench import schema
from workbench.rank.tracer import PhaseClock, Tracer
from workbench.store.files import atomic_write_bytes, read_json, write_json
from workbench.store.jsonl import read_jsonl
from workbench.store.load import load_traces
from workbench.store.trace_files import consolidate, trim_for_resume


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
        data_s=0.001,
        forward_s=0.002,
        backward_s=0.003,
        optimizer_s=0.001,
        step_s=0.008,
        comm_s=0.002,
        comm_bytes=100,
        comm_buckets=1,
        samples=4,
        loss=1.0 / step,
        lr=0.1,
    )
    tracer.step(**{**fields, **extra})


def test_rows_reach_disk_on_flush_interval_and_on_exception(tmp_path: Path) -> None:
    path = tmp_path / "traces" / schema.steps_file(0, "jsonl")
    with pytest.raises(RuntimeError), _tracer(tmp_path, flush_s=0.0) as tracer:
        _step(tracer, 1)
        assert len(list(read_jsonl(path))) == 1, "flush_s=0 writes every row at once"
        tracer.steps.flush_s = 3600
        _step(tracer, 2)
        assert len(list(read_jsonl(path))) == 1, "buffered until the next flush"
        raise RuntimeError("boom")
    assert [r["step"] for r in read_jsonl(path)] == [1, 2], "closing on an exception keeps the rows"


def test_buffer_is_bounded(tmp_path: Path) -> None:
    tracer = _tracer(tmp_path)
    tracer.steps.max_rows = 10
    for step in range(1, 26):
        _step(tracer, step)
    assert len(tracer.steps._rows) == 5
    tracer.close()


def test_consolidate_writes_parquet_with_schema_and_removes_jsonl(tmp_path: Path) -> None:
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


def test_trim_for_resume_keeps_steps_up_to_the_checkpoint(tmp_path: Path) -> None:
    with _tracer(tmp_path) as tracer:
        for step in range(1, 8):
            _step(tracer, step)
    consolidate(tmp_path / "traces", 0)
    trim_for_resume(tmp_path / "traces", 0, last_step=4)
    assert load_traces(tmp_path)["step"].tolist() == [1, 2, 3, 4]


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "traces" / schema.steps_file(0, "jsonl")
    with _tracer(tmp_path) as tracer:
        _step(tracer, 1)
    with open(path, "a") as f:
        f.write('{"run_id": "r", "step": 2, "ra')  # a crash mid-write
    assert load_traces(tmp_path)["step"].tolist() == [1]


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


def test_phase_clock_durations_cover_the_step() -> None:
    clock = PhaseClock(torch.device("cpu"))
    clock.start()
    for _ in range(3):
        sum(range(1000))
        clock.mark()
    d = clock.durations()
    assert len(d) == 3 and all(x > 0 for x in d)


def test_atomic_write_leaves_no_temporary_files(tmp_path: Path) -> None:
    write_json(tmp_path / "a" / "run.json", {"x": 1})
    atomic_write_bytes(tmp_path / "a" / "b.bin", b"123")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b.bin", "run.json"]
    assert read_json(tmp_path / "a" / "run.json") == {"x": 1}
    assert json.loads((tmp_path / "a" / "run.json").read_text())["x"] == 1
