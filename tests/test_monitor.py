"""The run monitor at a glance: how many ranks are ready while a run starts, elapsed time, steps
per second, time left, the loss trend, a rank that falls behind, a status row that keeps its
place and nothing echoed under the cell. Hand-built run folders written the way ranks write
them (live Arrow streams, rank records); the real run is in test_widgets."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest

from workbench import schema
from workbench.config.run_config import RunConfig
from workbench.store.arrow_stream import StreamWriter
from workbench.store.files import write_json
from workbench.ui.monitor import RunMonitor
from workbench.ui.progress import clock, sparkline

from .frames import ddp_steps, make_steps


def _run_folder(tmp_path: Path, world_size: int, max_steps: int, **run: object) -> Path:
    cfg = RunConfig(
        output_dir=str(tmp_path),
        sweep="s",
        run_name="live",
        world_size=world_size,
        per_device_batch_size=8,
        max_steps=max_steps,
    )
    path = tmp_path / "s" / "live"
    write_json(path / schema.CONFIG_FILE, cfg.to_dict())
    record = {"run_id": "live", "status": "pending", "config": cfg.to_dict(), **run}
    write_json(path / schema.RUN_FILE, record)
    (path / schema.TRACES_DIR).mkdir()
    return path


def _rank_started(path: Path, rank: int, status: str = "running") -> None:
    """A rank's own record, as it writes it on start (its pid on another host: alive)."""
    write_json(
        path / schema.RANKS_DIR / f"rank-{rank:05d}.json",
        {"rank": rank, "status": status, "pid": 1, "host": "elsewhere"},
    )


def _stream(path: Path, rows: pd.DataFrame) -> None:
    """Each rank's rows on its live Arrow stream, as the tracer flushes them."""
    for rank, mine in rows.groupby("rank"):
        writer = StreamWriter(
            path / schema.TRACES_DIR / schema.live_steps_file(int(rank)), schema.STEP_COLUMNS
        )
        writer.write({c: mine[c].tolist() for c in schema.STEP_COLUMNS}, len(mine))
        writer.close()


def test_starting_run_says_how_many_ranks_are_ready(tmp_path: Path) -> None:
    path = _run_folder(tmp_path, world_size=2, max_steps=10, submitted_at=time.time() - 65)
    monitor = RunMonitor(path)
    assert monitor.refresh() == "pending"
    assert monitor.status_label.value == "status: starting, 0/2 ranks ready"
    assert 65 <= monitor.elapsed_s < 65 + 30  # since submission, on this clock
    _rank_started(path, 0)
    assert monitor.refresh() == "running"
    assert monitor.status_label.value == "status: starting, 1/2 ranks ready"
    _rank_started(path, 1)
    monitor.refresh()
    assert monitor.status_label.value == "status: starting, 2/2 ranks ready"
    assert monitor.rate_label.value == "- steps/s" and monitor.eta_label.value == "ETA -"


def test_progress_rate_time_left_and_loss_trend(tmp_path: Path) -> None:
    path = _run_folder(tmp_path, world_size=2, max_steps=10, submitted_at=time.time())
    for rank in (0, 1):
        _rank_started(path, rank)
    # 0.5 s per step; rank 0 has flushed up to step 6, rank 1 up to step 4.
    steps = make_steps("live", world_size=2, n_steps=10, step_s=0.5)
    _stream(path, steps[steps["step"] <= 6 - 2 * steps["rank"]])
    monitor = RunMonitor(path)
    assert monitor.refresh() == "running"
    assert monitor.status_label.value == "status: running"
    # measured steps 3..6 start 1.5 s apart: 2 steps/s; rank 1 has 6 of 10 steps left: 3 s
    assert monitor.steps_per_s == pytest.approx(2.0)
    assert monitor.rate_label.value == "2 steps/s"
    assert monitor.eta_label.value == "ETA 0:03"
    # loss 2.0, 1.9, ... 1.5 at steps 1..6: scaled to 0..7 that is 7, 5.6, 4.2, 2.8, 1.4, 0
    assert monitor.loss_spark.value == "█▇▅▄▂▁"
    assert monitor.loss_label.value == "loss: 1.5"
    # two steps apart is within a flush (2 s at 2 steps/s): nobody is flagged
    assert monitor.lagging == {} and {b.bar_style for b in monitor.bars} == {""}


def test_a_rank_that_falls_behind_is_highlighted(tmp_path: Path) -> None:
    path = _run_folder(tmp_path, world_size=2, max_steps=40)
    for rank in (0, 1):
        _rank_started(path, rank)
    steps = make_steps("live", world_size=2, n_steps=40, step_s=0.5)
    # rank 1's rows stop at step 3 while rank 0's reach 20: 17 steps, more than 2 flushes'
    # worth (2 + 2 s x 2 steps/s = 6)
    _stream(path, steps[steps["step"] <= 20 - 17 * steps["rank"]])
    monitor = RunMonitor(path)
    monitor.refresh()
    assert [b.bar_style for b in monitor.bars] == ["", "warning"]
    assert monitor.bar_labels[0].value == "20 / 40"
    assert monitor.bar_labels[1].value == "3 / 40  behind: 20 on the lead rank"
    assert monitor.bar_labels[1].style.text_color == "#c60"


def test_a_straggler_is_highlighted_with_its_ratio(tmp_path: Path) -> None:
    path = _run_folder(tmp_path, world_size=4, max_steps=100)
    for rank in range(4):
        _rank_started(path, rank)
    # rank 2 computes 0.9 s instead of 0.6 s from step 20 on (frames.ddp_steps): 1.5x
    steps = ddp_steps(world_size=4, n_steps=60, slow_rank=2, slow_from=20)
    _stream(path, steps.assign(run_id="live"))
    monitor = RunMonitor(path)
    monitor.refresh()
    assert [b.bar_style for b in monitor.bars] == ["", "", "warning", ""]
    assert monitor.bar_labels[2].value == "60 / 100  slow: 1.50x the others' compute"


def test_status_row_keeps_its_place_and_nothing_is_echoed(tmp_path: Path) -> None:
    path = _run_folder(tmp_path, world_size=1, max_steps=10, submitted_at=1000.0)
    steps = make_steps("live", world_size=1, n_steps=10)
    steps.to_parquet(path / schema.TRACES_DIR / schema.steps_file(0))
    _rank_started(path, 0, "completed")
    write_json(
        path / schema.RUN_FILE,
        {"run_id": "live", "status": "completed", "submitted_at": 1000.0, "ended_at": 1125.0},
    )
    monitor = RunMonitor(path)
    assert monitor.wait(timeout_s=5) is None  # a cell ending in monitor.wait() shows nothing
    assert monitor.status == "completed"
    assert monitor.status_label.value == "status: completed"
    assert monitor.elapsed_label.value == "elapsed 2:05"  # submitted to ended
    assert monitor.eta_label.value == "ETA -"
    for label in (
        monitor.status_label,
        monitor.elapsed_label,
        monitor.rate_label,
        monitor.eta_label,
        monitor.throughput_label,
        monitor.loss_label,
    ):
        assert label.layout.width.endswith("ch") and label.style.font_family == "monospace"


def test_clock_and_sparkline() -> None:
    assert [clock(s) for s in (0, 59.4, 65, 3723, None)] == ["0:00", "0:59", "1:05", "1:02:03", "-"]
    assert sparkline([1.0, float("nan"), 1.0]) == "▄ ▄"
    assert sparkline([0.0, 7.0, 3.5]) == "▁█▅"  # 3.5 of 7 levels rounds to 4 (round half even)
    assert sparkline([]) == ""
