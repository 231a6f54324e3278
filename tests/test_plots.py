"""Figures: the data each one draws (trace names, x and y values), not only that it exists."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from workbench.analysis import (
    ScalingFamilyWarning,
    eval_breakdown,
    memory_by_rank,
    phase_breakdown,
    scaling_table,
)
from workbench.analysis.model.scaling_model import NetworkModel, predicted_vs_measured
from workbench.ui import plots

from .frames import ddp_steps, make_runs, make_steps, scaling_sweep


@pytest.fixture(autouse=True)
def no_show(monkeypatch: pytest.MonkeyPatch) -> None:
    """A figure function must never show a figure itself."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a figure function called show()")

    monkeypatch.setattr(go.Figure, "show", refuse)


@pytest.fixture
def sweep() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    runs, steps, evals = scaling_sweep()
    return runs, steps, evals, scaling_table(runs, steps, evals)


def two_precisions() -> pd.DataFrame:
    rows, parts = [], []
    for precision, times in (("fp32", {1: 1.0, 2: 1.25}), ("fp16", {1: 0.5, 2: 0.5})):
        for n, s in times.items():
            rows.append({"run_id": f"{precision}-{n}", "world_size": n, "precision": precision})
            parts.append(make_steps(f"{precision}-{n}", world_size=n, step_s=s))
    return scaling_table(make_runs(rows), pd.concat(parts))


def trace(fig: go.Figure, name: str) -> go.BaseTraceType:
    found = [t for t in fig.data if t.name == name]
    assert len(found) == 1, f"no single trace {name!r} in {[t.name for t in fig.data]}"
    return found[0]


def test_throughput_per_device_one_line_per_group(sweep) -> None:
    fig = plots.throughput_per_device_figure(sweep[3])
    assert [t.name for t in fig.data] == ["model=mlp, precision=fp32"]
    assert list(fig.data[0].x) == [1, 2, 4]
    assert list(fig.data[0].y) == pytest.approx([8.0, 6.4, 5.0])
    assert "samples/s" in fig.layout.yaxis.title.text
    assert "samples/s" in fig.data[0].hovertemplate

    fig = plots.throughput_per_device_figure(two_precisions())
    assert sorted(t.name for t in fig.data) == ["precision=fp16", "precision=fp32"]
    assert list(trace(fig, "precision=fp16").y) == pytest.approx([16.0, 16.0])


def test_speedup_with_ideal_line_and_efficiency_labels(sweep) -> None:
    fig = plots.speedup_figure(sweep[3])
    group = fig.data[0]
    assert list(group.y) == pytest.approx([1.0, 1.6, 2.5])
    assert list(group.text) == ["100 %", "80 %", "62 %"]  # 0.625: 62.5 rounds to even
    ideal = trace(fig, "ideal")
    assert list(ideal.x) == [1, 4] and list(ideal.y) == [1, 4]
    assert ideal.line.dash == "dash"
    assert "devices" in fig.layout.xaxis.title.text


def test_epoch_time(sweep) -> None:
    fig = plots.epoch_time_figure(sweep[3])
    # end to end (the evaluation after step 5 included): 640 x (8 step_s + 0.75, 0.75, 0.85 s)
    # / (64, 128, 256) samples
    assert list(fig.data[0].y) == pytest.approx([87.5, 53.75, 34.125])
    assert "(s)" in fig.layout.yaxis.title.text


def test_phase_breakdown_per_rank_and_per_run(sweep) -> None:
    phases = phase_breakdown(sweep[1])
    fig = plots.phase_breakdown_figure(phases, "ws4")
    names = ["data", "forward", "backward", "optimizer", "other"]
    assert [t.name for t in fig.data] == [*names, "between steps", "checkpoint", "evaluation"]
    assert fig.layout.barmode == "stack"
    assert list(trace(fig, "backward").x) == [0, 1, 2, 3]
    assert list(trace(fig, "backward").y) == pytest.approx([1100.0] * 4)  # 1.1 s in ms
    custom = np.asarray(trace(fig, "backward").customdata, dtype="float64")
    assert custom[:, 1] == pytest.approx([300.0] * 4)  # the allreduce span, in the hover
    fig = plots.phase_breakdown_figure(phases, by="run")
    assert list(trace(fig, "other").x) == ["ws1", "ws2", "ws4"]
    assert list(trace(fig, "other").y) == pytest.approx([100.0, 100.0, 100.0])
    fig = plots.phase_breakdown_figure(phases[phases["run_id"] != "ws1"])
    assert list(trace(fig, "data").x)[:3] == ["ws2/r0", "ws2/r1", "ws4/r0"]
    with pytest.raises(ValueError, match="valid names: ws1, ws2, ws4"):
        plots.phase_breakdown_figure(phases, "ws3")


def test_step_time_heatmap_shows_the_straggler_in_compute() -> None:
    steps = ddp_steps(world_size=4, n_steps=100, slow_rank=2, slow_from=40)
    fig = plots.step_time_heatmap(steps, value="compute_s")
    heat = fig.data[0]
    z = np.asarray(heat.z)
    assert z.shape == (4, 98)  # ranks x measured steps
    assert list(heat.y) == [0, 1, 2, 3]
    assert z[2, list(heat.x).index(50)] == pytest.approx(900.0)  # ms
    assert z[1, list(heat.x).index(50)] == pytest.approx(600.0)
    step = np.asarray(plots.step_time_heatmap(steps).data[0].z)
    assert step[:, -1] == pytest.approx([1000.0] * 4)  # step time: all ranks wait for rank 2


def test_step_time_heatmap_compute_from_sampled_comm_times() -> None:
    # trace_comm="sampled": comm_s only on steps 1-10 and every 10th; each rank's latest sample
    # stands for the steps after it, so compute is right on unsampled steps too.
    steps = ddp_steps(world_size=4, n_steps=100, slow_rank=2, slow_from=40)
    steps.loc[(steps["step"] > 10) & (steps["step"] % 10 != 0), "comm_s"] = np.nan
    heat = plots.step_time_heatmap(steps, value="compute_s").data[0]
    z = np.asarray(heat.z)
    assert z[2, list(heat.x).index(55)] == pytest.approx(900.0)
    assert z[1, list(heat.x).index(55)] == pytest.approx(600.0)


def test_step_time_heatmap_is_downsampled_for_display() -> None:
    steps = make_steps("long", world_size=2, n_steps=1002, warmup_steps=2)
    fig = plots.step_time_heatmap(steps, max_steps=100)
    heat = fig.data[0]
    assert np.asarray(heat.z).shape == (2, 100)
    assert list(heat.x)[:2] == [3, 13]  # bins of 10 steps, labelled by their first
    assert "bin" in fig.layout.xaxis.title.text
    with pytest.raises(ValueError, match="pass run_id"):
        plots.step_time_heatmap(pd.concat([steps, make_steps("other")]))


def test_memory_per_rank_in_gib() -> None:
    fig = plots.memory_figure(memory_by_rank(make_steps("m", world_size=2, cuda=True)))
    assert [t.name for t in fig.data] == ["process RSS peak", "CUDA peak", "GPU memory (NVML) peak"]
    assert list(fig.data[2].y) == pytest.approx([4e9 / 2**30] * 2)
    assert list(fig.data[0].x) == ["0", "1"]
    assert list(fig.data[0].y) == pytest.approx([1.0, 1 + 1 / 1024])
    assert list(fig.data[1].y) == pytest.approx([2.5e9 / 2**30, (2.5e9 + 1e6) / 2**30])
    assert "GiB" in fig.layout.yaxis.title.text
    cpu = plots.memory_figure(memory_by_rank(make_steps("c", world_size=2)))
    assert [t.name for t in cpu.data] == ["process RSS peak"]


def test_eval_breakdown_stacked_per_run(sweep) -> None:
    table = eval_breakdown(sweep[2])
    fig = plots.eval_breakdown_figure(table)
    assert [t.name for t in fig.data] == ["predict", "wait", "gather", "metric", "broadcast"]
    assert list(fig.data[0].x) == ["ws1 (N=1)", "ws2 (N=2)", "ws4 (N=4)"]
    assert list(trace(fig, "gather").y) == pytest.approx([100.0, 100.0, 100.0])  # ms
    slowest = plots.eval_breakdown_figure(table, ranks="slowest")
    # One rank's parts per evaluation: at N=2 rank 0 (0.75 s against rank 1's 0.65 s), at N=4
    # rank 3 (gather 0.4: 0.85 s) with no metric time. Per-part maxima drew 0.2 s of gather
    # (rank 1) on 0.2 s of metric (rank 0) at N=2.
    assert list(trace(slowest, "gather").y) == pytest.approx([100.0, 100.0, 400.0])
    assert list(trace(slowest, "metric").y) == pytest.approx([200.0, 200.0, 0.0])
    assert "slowest rank" in slowest.layout.title.text
    with pytest.raises(ValueError, match="valid names: rank0, slowest"):
        plots.eval_breakdown_figure(table, ranks="all")


def test_loss_and_metric_curves(sweep) -> None:
    _, steps, evals, _ = sweep
    fig = plots.loss_curves_figure(steps)
    assert [t.name for t in fig.data] == ["ws1 (N=1)", "ws2 (N=2)", "ws4 (N=4)"]
    assert list(fig.data[0].x) == list(range(1, 11))
    assert list(fig.data[0].y) == pytest.approx([2.0 - 0.1 * k for k in range(10)])
    long = plots.loss_curves_figure(make_steps("l", world_size=1, n_steps=5000), max_points=500)
    assert len(long.data[0].x) == 500
    fig = plots.metric_curves_figure(evals)
    assert list(fig.data[0].x) == [5, 10] and list(fig.data[0].y) == pytest.approx([0.5, 0.85])
    assert fig.layout.yaxis.title.text == "accuracy"


def test_quality_and_tradeoff_against_devices(sweep) -> None:
    table = sweep[3]
    fig = plots.quality_vs_devices_figure(table)
    loss, metric = fig.data
    assert list(loss.y) == pytest.approx([1.1] * 3) and loss.xaxis == "x"
    assert list(metric.y) == pytest.approx([0.85, 0.8, 0.7]) and metric.xaxis == "x2"
    fig = plots.tradeoff_figure(table)
    left, right = fig.data
    assert list(left.x) == [1, 2, 4] and list(left.y) == pytest.approx([0.85, 0.8, 0.7])
    assert list(right.y) == pytest.approx([1.0, 1.6, 2.5]) and right.xaxis == "x2"
    assert left.showlegend and not right.showlegend
    assert fig.layout.yaxis2.title.text == "speedup (x)"


def test_predicted_vs_measured(sweep) -> None:
    runs, steps, _ = scaling_sweep(evals=False)
    net = NetworkModel(name="slow", bandwidth_bytes_per_s=1e6, latency_s=0.0)
    pvm = predicted_vs_measured(runs, steps, net, world_sizes=[8])
    fig = plots.predicted_vs_measured_figure(pvm, network="slow")
    measured = trace(fig, "model=mlp, precision=fp32, measured")
    predicted = trace(fig, "model=mlp, precision=fp32, predicted")
    assert "Network: slow." in fig.layout.title.subtitle.text  # not in 40-character legends
    assert list(measured.x) == [1, 2, 4]
    assert list(measured.y) == pytest.approx([1.0, 1.6, 2.5])
    assert list(predicted.x) == [1, 2, 4, 8]
    assert list(predicted.y) == pytest.approx([1.0, 1.0, 1.6, 8 / 2.75])


def test_unknown_columns_raise_with_valid_names(sweep) -> None:
    with pytest.raises(ValueError, match="valid names"):
        plots.speedup_figure(sweep[3].drop(columns="efficiency"))
    with pytest.raises(ValueError, match="valid names"):
        plots.throughput_per_device_figure(sweep[3], group_by=["precison"])


def test_the_grouping_is_passed_not_read_from_the_table() -> None:
    table = two_precisions()
    merged = pd.concat([table.iloc[:2], table.iloc[2:]], ignore_index=True)  # drops any attrs
    fig = plots.speedup_figure(merged, group_by=["precision"])
    groups = sorted(t.name for t in fig.data if t.name != "ideal")
    assert groups == ["precision=fp16", "precision=fp32"]
    assert sorted(t.name for t in plots.speedup_figure(merged).data) == ["ideal", *groups]
    fig = plots.throughput_per_device_figure(merged, group_by=[])
    assert [t.name for t in fig.data] == ["all runs"]


def repeated() -> pd.DataFrame:
    """N=1 once (8 samples/s); N=2 twice (12.8 and 16 samples/s): std only at N=2."""
    runs, steps, _ = scaling_sweep(evals=False)
    again = make_steps("ws2b", world_size=2, step_s=1.0)
    runs = pd.concat([runs, make_runs([{"run_id": "ws2b", "world_size": 2, "seed": 1}])])
    return scaling_table(runs, pd.concat([steps, again]))


def test_a_one_run_point_has_no_error_bar() -> None:
    table = repeated()
    fig = plots.throughput_per_device_figure(table)
    bars = np.asarray(fig.data[0].error_y.array, dtype="float64")
    # N=1 and N=4: one run each, no bar (NaN, never 0); N=2: the std of 6.4 and 8 per device
    assert np.isnan(bars[0]) and np.isnan(bars[2])
    assert bars[1] == pytest.approx(np.std([6.4, 8.0], ddof=1))
    # the speedup's base is one run: no spread known at either end, so no error bars at all
    assert plots.speedup_figure(table).data[0].error_y.array is None
    single = plots.throughput_per_device_figure(two_precisions())  # every point one run
    assert all(t.error_y.array is None for t in single.data)
    assert '"bdata"' in fig.to_json()  # NaN travels as NaN (binary), not as null (drawn as 0)


def test_family_labels_name_the_batch_held_fixed() -> None:
    rows, parts = [], []
    for n in (1, 2):
        rows.append({"run_id": f"w{n}", "world_size": n, "per_device_batch_size": 8})
        parts.append(make_steps(f"w{n}", world_size=n))
        rows.append({"run_id": f"s{n}", "world_size": n, "per_device_batch_size": 32 // n})
        parts.append(make_steps(f"s{n}", world_size=n, samples=32 // n))
    runs = make_runs(rows)
    runs["global_batch_size"] = runs["per_device_batch_size"] * runs["world_size"]
    with pytest.warns(ScalingFamilyWarning):  # pdb 8 and gb 32: both families, no crossing
        table = scaling_table(runs, pd.concat(parts))
    fig = plots.speedup_figure(table)
    names = sorted(t.name for t in fig.data if t.name != "ideal")
    assert names == ["strong, global batch 32", "weak, per-device batch 8"]


def test_a_missing_option_does_not_blank_a_legend_label() -> None:
    # Two models: the transformer has a d_model option, the mlp none (NaN in the runs frame).
    runs = make_runs(
        [
            {"run_id": "m1", "world_size": 1, "model": "mlp"},
            {"run_id": "t1", "world_size": 1, "model": "transformer"},
        ]
    )
    runs["model_options.d_model"] = [np.nan, 64.0]
    steps = pd.concat([make_steps("m1", world_size=1), make_steps("t1", world_size=1)])
    fig = plots.speedup_figure(scaling_table(runs, steps))
    names = sorted(t.name for t in fig.data)
    # 45 characters: cut to 39 in the legend, in full in the hover, and the subtitle says so
    assert names == [
        "ideal",
        "model=mlp, model_options.d_model=nan",
        "model=transformer, model_options.d_mod…",
    ]
    hovers = " ".join(t.hovertemplate for t in fig.data)
    assert "model=transformer, model_options.d_model=64.0<br>" in hovers
    assert "Legend names shortened" in fig.layout.title.subtitle.text
