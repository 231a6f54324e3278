"""Chart fixes on hand-built frames: integer rank ticks and ms on heatmaps, single evaluations as
markers, hidden curves named, error bars only from repeats, FLOP/s with their peak."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.ui import plots

from .frames import make_evals, make_steps


def test_heatmap_has_integer_rank_ticks_and_a_colour_scale_in_ms() -> None:
    steps = make_steps("h", world_size=3, n_steps=6, warmup_steps=2, step_s=0.25, comm_s=0.05)
    fig = plots.step_time_heatmap(steps)
    heat = fig.data[0]
    assert np.asarray(heat.z) == pytest.approx(np.full((3, 4), 250.0))  # 0.25 s
    assert list(heat.x) == [3, 4, 5, 6] and list(heat.y) == [0, 1, 2]
    assert fig.layout.yaxis.dtick == 1 and fig.layout.yaxis.tickformat == "d"
    assert heat.colorbar.title.text == "ms"
    assert "ms" in heat.hovertemplate
    compute = plots.step_time_heatmap(steps, value="compute_s")
    # each rank's own compute: data 0.1 + forward 0.2 + optimizer 0.1 + backward 0.5 less its
    # communication 0.05 s (no DDP backward timer in these rows)
    assert np.asarray(compute.data[0].z) == pytest.approx(np.full((3, 4), 850.0))
    assert compute.layout.yaxis.dtick == 1 and compute.data[0].colorbar.title.text == "ms"
    assert fig.layout.title.text != compute.layout.title.text


def test_a_single_evaluation_is_a_marker_not_a_line() -> None:
    evals = pd.concat(
        [
            make_evals("once", world_size=2, eval_steps=(30,), metric_values=(0.7,)),
            make_evals("twice", world_size=1, eval_steps=(10, 20), metric_values=(0.5, 0.6)),
        ],
        ignore_index=True,
    )
    fig = plots.metric_curves_figure(evals)
    once, twice = fig.data
    assert once.name == "once (N=2)" and once.mode == "markers"
    assert list(once.x) == [30] and list(once.y) == pytest.approx([0.7])
    assert twice.mode == "lines+markers" and list(twice.y) == pytest.approx([0.5, 0.6])
    loss = plots.loss_curves_figure(make_steps("one", world_size=1, n_steps=1, warmup_steps=0))
    assert loss.data[0].mode == "markers"


def test_a_curve_hidden_under_another_is_named() -> None:
    # w1_b64: one rank of 64 samples; w2_b32: two ranks of 32. Same global batch, same losses
    # (2.0, 1.9, ...): w1_b64 is drawn first and w2_b32 covers it. w4_b8's loss starts at 3.
    steps = pd.concat(
        [
            make_steps("w1_b64", world_size=1, samples=64),
            make_steps("w2_b32", world_size=2, samples=32),
            make_steps("w4_b8", world_size=4, samples=8, loss0=3.0),
        ],
        ignore_index=True,
    )
    fig = plots.loss_curves_figure(steps)
    assert fig.layout.title.subtitle.text == "w1_b64 hidden under w2_b32: same global batch."
    on_top = [t for t in fig.data if t.name == "w2_b32 (N=2)"][0]
    assert on_top.line.dash == "dash"  # the curve under it shows through
    assert [t for t in fig.data if t.name == "w4_b8 (N=4)"][0].line.dash is None
    apart = plots.loss_curves_figure(steps[steps["run_id"] != "w2_b32"])
    assert not apart.layout.title.subtitle.text
    three = pd.concat([steps, make_steps("w8_b8", world_size=8, samples=8)], ignore_index=True)
    # 64 samples per step at 1, 2 and 8 ranks: both lower curves are covered by the last one
    note = plots.loss_curves_figure(three).layout.title.subtitle.text
    assert note == "w1_b64, w2_b32 hidden under w8_b8: same global batch."


def test_a_curve_hidden_with_another_batch_says_same_values() -> None:
    assert plots.hidden_curves(
        {"a": pd.Series([1.0, 2.0], index=[5, 10]), "b": pd.Series([1.0, 2.0], index=[5, 10])}
    ) == {"a": "b"}
    # 0.01 apart on a range of 1: 1 % of the range, visible; 0.004 (0.4 %) is not
    near = {"a": pd.Series([1.0, 2.0], index=[5, 10]), "b": pd.Series([1.004, 2.0], index=[5, 10])}
    far = {"a": pd.Series([1.0, 2.0], index=[5, 10]), "b": pd.Series([1.01, 2.0], index=[5, 10])}
    assert plots.hidden_curves(near) == {"a": "b"}
    assert plots.hidden_curves(far) == {}
    evals = pd.concat(
        [make_evals(r, world_size=1, metric_values=(0.5, 0.8)) for r in ("e1", "e2")],
        ignore_index=True,
    )
    note = plots.metric_curves_figure(evals).layout.title.subtitle.text
    assert note == "e1 hidden under e2: same values."


def point_table(runs: list[int], std: list[float]) -> pd.DataFrame:
    """A scaling table by hand: 1, 2 and 4 devices, with the runs and spread given."""
    return pd.DataFrame(
        {
            "model": "mlp",
            "world_size": [1, 2, 4],
            "runs": runs,
            "samples_per_s_per_device": [8.0, 7.0, 6.0],
            "samples_per_s_per_device_std": std,
        }
    )


def test_error_bars_only_where_a_point_has_repeats() -> None:
    # N=2 has 3 runs with std 0.5; N=1 and N=4 one run each: no bar, even where a std of 0 was
    # written for the single run (never a bar of 0 drawn as if it were a measured spread).
    fig = plots.throughput_per_device_figure(point_table([1, 3, 1], [np.nan, 0.5, 0.0]))
    bars = np.asarray(fig.data[0].error_y.array, dtype="float64")
    assert np.isnan(bars[0]) and np.isnan(bars[2])
    assert bars[1] == pytest.approx(0.5)
    none = plots.throughput_per_device_figure(point_table([1, 1, 1], [np.nan, 0.0, np.nan]))
    assert none.data[0].error_y.array is None
    every = plots.throughput_per_device_figure(point_table([2, 2, 2], [0.25, 0.5, 1.0]))
    assert list(every.data[0].error_y.array) == pytest.approx([0.25, 0.5, 1.0])


def test_throughput_hover_names_tflops_mfu_and_the_peak() -> None:
    table = point_table([1, 1, 1], [np.nan] * 3)
    # 1e12 FLOPs per sample: 8, 7 and 6 TFLOP/s per device; MFU against a 100 TFLOP/s peak
    table["tflops_per_device"] = [8.0, 7.0, 6.0]
    table["mfu"] = [0.08, 0.07, 0.06]
    table["mfu_note"] = "peak 100 TFLOP/s: made-up device fp32 dense, its datasheet"
    line = plots.throughput_per_device_figure(table).data[0]
    custom = np.asarray(line.customdata)
    assert [float(v) for v in custom[:, 0]] == pytest.approx([8.0, 7.0, 6.0])
    assert [float(v) for v in custom[:, 1]] == pytest.approx([8.0, 7.0, 6.0])  # percent
    assert custom[0, 2] == "peak 100 TFLOP/s: made-up device fp32 dense, its datasheet"
    assert "TFLOP/s per device" in line.hovertemplate and "MFU" in line.hovertemplate
    assert "samples/s" in line.hovertemplate
    plain = plots.throughput_per_device_figure(point_table([1, 1, 1], [np.nan] * 3)).data[0]
    assert plain.customdata is None and "MFU" not in plain.hovertemplate


def test_predicted_legend_is_short_and_the_network_goes_to_the_subtitle() -> None:
    # Two groups whose labels run to 60 characters, and a network description of 50: the old
    # legend names ("<label> predicted (<network>)") were over 110 characters.
    pvm = pd.DataFrame(
        {
            "model": ["transformer"] * 4,
            "model_options.d_model": [64.0, 64.0, 128.0, 128.0],
            "model_options.n_layers": [2.0, 2.0, 4.0, 4.0],
            "world_size": [1, 2, 1, 2],
            "measured_speedup": [1.0, 1.5, 1.0, 1.8],
            "predicted_speedup": [1.0, 1.6, 1.0, 1.9],
        }
    )
    network = "measured allreduce, busbw 1.2 GB/s over 2 runs"
    group_by = ["model", "model_options.d_model", "model_options.n_layers"]
    fig = plots.predicted_vs_measured_figure(pvm, group_by=group_by, network=network)
    names = [t.name for t in fig.data]
    assert len(names) == 4 and all(len(n) < 40 for n in names), names
    assert names[0].endswith(", measured") and names[1].endswith(", predicted")
    assert "model_options.d_model=64.0, model_options.n_layers=2.0" in fig.data[0].hovertemplate
    said = fig.layout.title.subtitle.text.replace("<br>", " ")
    assert f"Network: {network}." in said and "Legend names shortened" in said
    assert list(fig.data[1].y) == pytest.approx([1.0, 1.6])
    assert fig.layout.legend.orientation == "h" and fig.layout.legend.y < 0
