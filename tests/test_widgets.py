"""The notebook widgets, built in-process: controls are set through ``.value`` and the figure,
table and labels must follow. Fast tests use hand-built stores; slow ones real runs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import pytest

from workbench import schema
from workbench.config.run_config import RunConfig
from workbench.store.arrow_stream import StreamWriter
from workbench.store.files import write_json
from workbench.ui.dashboard import FIGURES, Dashboard
from workbench.ui.launch_panel import LaunchPanel
from workbench.ui.monitor import RunMonitor

from .conftest import base_config
from .frames import make_evals, make_steps, write_run, write_scaling_sweep


@pytest.fixture
def sweep_store(tmp_path: Path) -> Path:
    """Sweep "weak" (world sizes 1, 2, 4 at batch 8 per device, from frames.scaling_sweep) and
    sweep "other" (one fp32 and one bf16 run at 2 ranks)."""
    write_scaling_sweep(tmp_path, train_samples=640)
    for i, precision in enumerate(("fp32", "bf16")):
        run_id = f"o-{precision}"
        write_run(
            tmp_path,
            "other",
            run_id,
            make_steps(run_id, step_s=1.0 + i),
            make_evals(run_id),
            world_size=2,
            per_device_batch_size=8,
            precision=precision,
            train_samples=640,
        )
    return tmp_path


def names(fig: go.FigureWidget) -> list[str]:
    return [t.name for t in fig.data]


def test_dashboard_controls_update_the_same_figure(sweep_store: Path) -> None:
    dash = Dashboard(sweep_store, sweeps=["weak"])
    widget = dash.figure
    assert isinstance(widget, go.FigureWidget)
    assert dash.sweeps.value == ("weak",)
    assert len(dash.runs.value) == 3
    assert dash.figure_kind.value == "throughput"
    assert widget.layout.title.text == "Throughput per device"
    # Born with its first figure: what a saved notebook keeps of the widget.
    assert widget._widget_layout["title"]["text"] == "Throughput per device"
    assert list(widget.data[0].y) == pytest.approx([8.0, 6.4, 5.0])  # samples/s per device
    assert "12.8" in dash.table.value  # the scaling table's 2-rank throughput

    dash.figure_kind.value = "speedup"
    assert dash.figure is widget  # updated in place, never replaced
    assert "ideal" in names(widget)
    assert list(widget.data[0].y) == pytest.approx([1.0, 1.6, 2.5])

    # Every figure draws from the same selection without error.
    for key in FIGURES.values():
        dash.figure_kind.value = key
        assert "cannot draw" not in (widget.layout.title.text or ""), key
        assert len(widget.data) > 0, key

    dash.figure_kind.value = "heatmap"
    assert dash.focus_run.value == "ws4"  # the largest world size first
    assert "run ws4" in widget.layout.title.text
    dash.focus_run.value = "ws2"
    assert "run ws2" in widget.layout.title.text

    dash.figure_kind.value = "throughput"
    dash.runs.value = ("ws1", "ws2")
    assert list(widget.data[0].x) == [1, 2]


def test_dashboard_layout_of_previous_figure_does_not_linger(sweep_store: Path) -> None:
    dash = Dashboard(sweep_store, sweeps=["weak"])
    dash.figure_kind.value = "tradeoff"  # two panels: xaxis2, subplot titles
    assert dash.figure.layout.xaxis2.domain is not None
    dash.figure_kind.value = "throughput"
    layout = dash.figure.layout.to_plotly_json()
    assert "xaxis2" not in layout and "annotations" not in layout


def test_dashboard_group_by_and_sweeps(sweep_store: Path) -> None:
    dash = Dashboard(sweep_store)
    assert set(dash.sweeps.value) == {"weak", "other"}
    dash.sweeps.value = ("other",)
    assert set(dash.runs.value) == {"o-fp32", "o-bf16"}
    # Default grouping separates fp32 from bf16: two lines.
    assert sorted(names(dash.figure)) == ["precision=bf16", "precision=fp32"]
    assert dash.group_by.value == "default"
    assert dash.group_by.label.startswith("default: model, precision")
    # Grouping by model only merges the two into one point of two runs.
    dash.group_by.value = ("model",)
    assert len(dash.figure.data) == 1
    assert "<td>2</td>" in dash.table.value  # runs column


def test_dashboard_refresh_sees_new_runs(sweep_store: Path) -> None:
    dash = Dashboard(sweep_store, sweeps=["other"])
    dash.runs.value = ("o-fp32",)
    write_run(
        sweep_store,
        "other",
        "o-late",
        make_steps("o-late"),
        make_evals("o-late"),
        world_size=2,
        per_device_batch_size=8,
        train_samples=640,
    )
    write_run(
        sweep_store,
        "fresh",
        "f1",
        make_steps("f1", world_size=1),
        make_evals("f1", 1),
        world_size=1,
        per_device_batch_size=8,
    )
    dash.refresh()
    assert "fresh" in dash.sweeps.options
    assert set(dash.runs.value) == {"o-fp32", "o-late"}  # the user's choice kept, new run added


def test_dashboard_on_an_empty_store_says_so(tmp_path: Path) -> None:
    dash = Dashboard(tmp_path / "nothing", sweeps=["nope"])
    assert "No runs" in dash.message.value and "nope" in dash.message.value
    assert "No traced steps" in dash.figure.layout.title.text
    assert "no scaling table" in dash.table.value


def _write_live(traces: Path, rank: int, rows: Any, live: str) -> None:
    """Append ``rows`` (a frame) to a rank's live file the way a rank writes it: a record batch
    on the Arrow stream, or JSON lines for a run from before the stream; then the start of a
    message still being written."""
    if live == "arrows":
        writer = StreamWriter(traces / schema.live_steps_file(rank), schema.STEP_COLUMNS)
        writer.write({c: rows[c].tolist() for c in schema.STEP_COLUMNS}, len(rows))
        writer.close()
        with open(traces / schema.live_steps_file(rank), "ab") as f:
            f.write(b"\xff\xff\xff\xff\x30\x01")  # torn: a crash mid-write, or still writing
    else:
        text = "".join(json.dumps(r) + "\n" for r in rows.to_dict("records"))
        (traces / schema.steps_file(rank, "jsonl")).write_text(text + '{"torn": ')  # half a line


@pytest.mark.parametrize("live", ["arrows", "jsonl"])
def test_run_monitor_follows_live_files_then_parquet(tmp_path: Path, live: str) -> None:
    cfg = RunConfig(
        output_dir=str(tmp_path),
        sweep="s",
        run_name="live",
        world_size=2,
        per_device_batch_size=8,
        max_steps=10,
    )
    path = tmp_path / "s" / "live"
    write_json(path / schema.CONFIG_FILE, cfg.to_dict())
    write_json(
        path / schema.RUN_FILE, {"run_id": "live", "status": "pending", "config": cfg.to_dict()}
    )
    monitor = RunMonitor(path)
    assert [b.max for b in monitor.bars] == [10, 10]
    assert monitor.refresh() == "pending"

    steps = make_steps("live", world_size=2, n_steps=10, step_s=0.5)
    traces = path / schema.TRACES_DIR
    traces.mkdir()
    for rank in (0, 1):
        write_json(
            path / schema.RANKS_DIR / f"rank-{rank:05d}.json",
            {"rank": rank, "status": "running", "pid": 1, "host": "elsewhere"},
        )
        _write_live(
            traces, rank, steps[(steps["rank"] == rank) & (steps["step"] <= 6 - 2 * rank)], live
        )
    assert monitor.refresh() == "running"
    assert [b.value for b in monitor.bars] == [6, 4]
    assert monitor.bar_labels[1].value == "4 / 10"
    # measured steps 3..6 of rank 0 and 3..4 of rank 1: 6 x 8 samples in 2 s
    assert monitor.samples_per_s == pytest.approx(24.0)
    assert monitor.latest_loss == pytest.approx(2.0 - 0.1 * 5)  # rank 0 alone at step 6
    assert "throughput: 24/s" in monitor.throughput_label.value

    if live == "arrows":  # the next batch: read from where the last complete one ended
        live_file = traces / schema.live_steps_file(1)
        offset = monitor._tail._live[live_file][1]
        assert offset == live_file.stat().st_size - 6
        with open(live_file, "r+b") as f:
            f.truncate(offset)  # the writer finishes the torn message: here, it never started
        writer = StreamWriter(live_file, schema.STEP_COLUMNS)
        more = steps[(steps["rank"] == 1) & steps["step"].between(5, 7)]
        writer.write({c: more[c].tolist() for c in schema.STEP_COLUMNS}, len(more))
        writer.close()
        assert monitor.refresh() == "running" and [b.value for b in monitor.bars] == [6, 7]
        assert monitor._tail._live[live_file][1] == live_file.stat().st_size

    # The ranks finish: Parquet replaces the live files, rank records say completed.
    for rank in (0, 1):
        steps[steps["rank"] == rank].to_parquet(traces / schema.steps_file(rank))
        (traces / schema.steps_file(rank, live)).unlink()
        write_json(
            path / schema.RANKS_DIR / f"rank-{rank:05d}.json",
            {"rank": rank, "status": "completed", "pid": 1, "host": "elsewhere"},
        )
    assert monitor.wait(timeout_s=5) is None  # nothing for a notebook cell to echo
    assert monitor.status == "completed"
    assert [b.value for b in monitor.bars] == [10, 10]
    assert [b.bar_style for b in monitor.bars] == ["success", "success"]
    assert monitor.status_label.value == "status: completed"


def test_launch_panel_shows_problems_without_raising(tmp_path: Path) -> None:
    panel = LaunchPanel(base_config(tmp_path, world_size=2))
    config = panel.config()
    assert config is not None and config.world_size == 2 and config.output_dir == str(tmp_path)
    panel.per_device_batch_size.value = 16
    panel.max_steps.value = 3
    panel.precision.value = "bf16"
    panel.sweep.value = "bad name!"
    assert panel.config() is None
    assert "sweep=" in panel.errors.value and "bad name!" in panel.errors.value
    assert panel.launch() is None  # nothing started
    assert panel.monitor is None and not (tmp_path / "bad name!").exists()
    panel.sweep.value = "panel"
    config = panel.config()
    assert config is not None
    assert (config.per_device_batch_size, config.max_steps, config.precision, config.sweep) == (
        16,
        3,
        "bf16",
        "panel",
    )
    assert config.global_batch_size == 32 and "Fix" not in panel.errors.value


def test_launch_panel_shows_preflight_problems(tmp_path: Path) -> None:
    panel = LaunchPanel(base_config(tmp_path, world_size=1))
    panel.precision.value = "fp16"  # valid for device=auto, but this machine has no GPU
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: fp16 is launchable here")
    assert panel.launch() is None
    assert "Cannot launch" in panel.errors.value and "fp16" in panel.errors.value


@pytest.mark.slow
def test_dashboard_on_real_runs(ddp1, ddp2) -> None:  # type: ignore[no-untyped-def]
    dash = Dashboard(ddp1.path.parent.parent, sweeps=["it"])
    assert {"ddp1", "ddp2"} <= set(dash.runs.value)
    dash.runs.value = ("ddp1", "ddp2")
    dash.figure_kind.value = "speedup"
    assert list(dash.figure.data[0].x) == [1, 2]
    dash.figure_kind.value = "eval"
    parts = ["predict", "wait", "gather", "metric", "broadcast"]
    assert [t.name for t in dash.figure.data] == parts
    dash.figure_kind.value = "predicted"
    # ddp2 measured its network (the allreduce micro-benchmark after its last step): the
    # model predicts from that, not from a fit, which two world sizes could not support.
    names = [t.name or "" for t in dash.figure.data]
    assert any(n.endswith(", predicted") for n in names), names
    # in the caption above the figure (the figure's subtitle in the report), not the legend
    said = dash.definition.value  # one node: the link class its runs measured
    assert "Network: within a node: measured allreduce, busbw" in said, said
    assert not dash.figure.layout.title.subtitle.text  # in a widget, drawn under the title


@pytest.mark.slow
@pytest.mark.waits
def test_run_monitor_and_launch_panel_on_a_real_run(tmp_path: Path) -> None:
    # Fresh interpreters (the local executor), not the warm pool, whose ranks reach their
    # first step within about 0.1 s: too soon to see the run say how many of its ranks are up.
    panel = LaunchPanel(
        base_config(tmp_path, world_size=2, checkpoint_every_steps=0, trace_flush_s=0.1), "local"
    )
    panel.sweep.value = "live"
    handle = panel.launch()
    assert handle is not None and panel.monitor is not None
    assert panel.monitor_box.children == (panel.monitor,)
    monitor = panel.monitor
    watcher = RunMonitor(handle.path)  # refreshed here, to see the run start
    said = [watcher.status_label.value]
    total = handle.config.total_steps
    deadline = time.monotonic() + 120
    bars = [0, 0]
    while bars != [total, total] and time.monotonic() < deadline:  # only its thread refreshes
        time.sleep(0.1)
        bars = [b.value for b in monitor.bars]
        watcher.refresh()
        said.append(watcher.status_label.value)
    assert bars == [total, total], "the background thread followed the run to its end"
    # Before its first step row the run says how many of its ranks are up.
    starting = [s for s in said if s.startswith("status: starting, ")]
    assert starting and all(s.endswith("/2 ranks ready") for s in starting), said
    monitor.wait(timeout_s=120)
    assert monitor.status == "completed"
    assert monitor.samples_per_s and monitor.samples_per_s > 0
    assert monitor.latest_loss is not None
    assert monitor.steps_per_s and monitor.steps_per_s > 0
    assert monitor.elapsed_s and monitor.elapsed_s > 0
    assert len(monitor.loss_spark.value) == min(total, 40)  # a block per recent step
    # The monitor let the handle record the outcome: the store says completed.
    assert json.loads((handle.path / schema.RUN_FILE).read_text())["status"] == "completed"
    # A monitor on the folder alone (any executor) reads the same.
    again = RunMonitor(str(handle.path))
    assert again.refresh() == "completed"
    assert again.steps_done == monitor.steps_done
