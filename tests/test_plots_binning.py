"""Figures that scale: binning steps and ranks, and the ranks at the quantiles, on hand-built
frames whose cells are worked out on paper."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.analysis import memory_by_rank, phase_breakdown
from workbench.ui import plots
from workbench.ui.plots import binning
from workbench.ui.report import write_report

from .frames import ddp_steps, make_runs, make_steps


def grid_frame(ranks: int, steps: int, hosts_of: int | None = None) -> pd.DataFrame:
    """value = 1000 x rank + step, for every rank and step (from 1)."""
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(1, steps + 1), ranks)
    frame = pd.DataFrame({"rank": rank, "step": step, "v": 1000.0 * rank + step})
    if hosts_of is not None:
        frame["host"] = [f"node{r // hosts_of}" for r in rank]
    return frame


def test_bin_size() -> None:
    assert binning.bin_size(1000, 100) == 10
    assert binning.bin_size(1001, 100) == 11  # 91 bins: never more than 100
    assert binning.bin_size(50, 100) == 1
    assert binning.bin_size(0, 100) == 1
    with pytest.raises(ValueError, match="max_bins must be >= 1, got 0"):
        binning.bin_size(10, 0)


def test_ten_ranks_by_a_thousand_steps_into_a_hundred_columns() -> None:
    # bin k holds steps 10k+1 .. 10k+10 of one rank: values 1000 r + 10k + 1 .. + 10k + 10,
    # median 1000 r + 10k + 5.5
    grid = binning.heat_grid(grid_frame(10, 1000), "v", max_columns=100)
    assert grid.z.shape == (10, 100)
    assert grid.steps_per_bin == 10
    assert list(grid.steps[:3]) == [1, 11, 21]  # each column labelled by its first step
    expected = 1000.0 * np.arange(10)[:, None] + 10.0 * np.arange(100)[None, :] + 5.5
    assert grid.z == pytest.approx(expected)
    assert grid.statistic == "median per bin of 10 steps"
    assert not grid.rows.grouped and grid.rows.labels == [str(r) for r in range(10)]


def test_a_median_not_a_mean_and_missing_values_left_out() -> None:
    # one rank, 4 steps in 2 bins: (1, 100) -> median 50.5 (the mean too); (3, NaN) -> 3
    frame = pd.DataFrame({"rank": 0, "step": [1, 2, 3, 4], "v": [1.0, 100.0, 3.0, np.nan]})
    binned, size = binning.bin_steps(frame, "v", max_bins=2)
    assert size == 2
    assert list(binned["step"]) == [1, 3] and list(binned["v"]) == pytest.approx([50.5, 3.0])
    # three values in a bin: (1, 2, 30) -> median 2, where the mean would be 11
    frame = pd.DataFrame({"rank": 0, "step": [1, 2, 3], "v": [1.0, 2.0, 30.0]})
    assert list(binning.bin_steps(frame, "v", 1)[0]["v"]) == [2.0]


def test_many_ranks_grouped_by_host_keep_the_slowest_rank() -> None:
    # 1,024 ranks on 128 hosts of 8, 400 steps into 200 columns of 2 steps; rank 8 r + 7 is
    # the slowest of host r: cell (host h, bin k) = 1000 (8h + 7) + 2k + 1.5
    grid = binning.heat_grid(grid_frame(1024, 400, hosts_of=8), "v", 200, 128)
    assert grid.z.shape == (128, 200)
    assert grid.rows.labels[3] == "node3 (ranks 24-31)"
    assert grid.z[3, 0] == pytest.approx(1000.0 * 31 + 1.5)
    assert grid.z[127, 199] == pytest.approx(1000.0 * 1023 + 2 * 199 + 1.5)
    assert grid.statistic == (
        "median per bin of 2 steps; one row per host (128 hosts of 8 ranks), its slowest rank"
    )


def test_many_ranks_on_one_host_in_blocks_of_consecutive_ranks() -> None:
    hosts = pd.Series("one", index=range(300))
    rows = binning.rank_rows(hosts, max_rows=100)
    assert rows.how == "one row per 3 consecutive ranks"
    assert len(rows.labels) == 100 and rows.labels[:2] == ["ranks 0-2", "ranks 3-5"]
    assert rows.row[299] == 99
    # 250 hosts are more rows than 100: blocks too, the last one short
    hosts = pd.Series([f"n{r}" for r in range(250)], index=range(250))
    rows = binning.rank_rows(hosts, max_rows=100)
    assert len(rows.labels) == 84 and rows.labels[-1] == "rank 249"


def test_the_ranks_at_the_quantiles() -> None:
    values = pd.Series(np.arange(100.0), index=np.arange(100)[::-1])  # rank 99 has value 0
    picked = binning.quantile_ranks(values)
    # positions round(q x 99): 0, 10 (9.9), 50 (49.5 rounds to even: 50), 89 (89.1), 99
    assert picked == [("min", 99), ("p10", 89), ("median", 49), ("p90", 10), ("max", 0)]
    two = binning.quantile_ranks(pd.Series([5.0, 1.0], index=[0, 1]))
    # positions 0, 0 (0.1), 0 (0.5 rounds to even), 1, 1: rank 1 named once, by the higher
    assert two == [("median", 1), ("max", 0)]
    assert binning.quantile_ranks(pd.Series([np.nan], index=[0])) == []


def test_heatmap_of_many_ranks_is_binned_and_says_how() -> None:
    steps = make_steps("big", world_size=200, n_steps=12, warmup_steps=2)  # hosts of 8
    fig = plots.step_time_heatmap(steps, max_steps=5, max_rows=100)
    heat = fig.data[0]
    assert np.asarray(heat.z).shape == (25, 5)  # 25 hosts; 10 measured steps in bins of 2
    assert list(heat.y)[:2] == ["node0 (ranks 0-7)", "node1 (ranks 8-15)"]
    assert list(heat.x) == [3, 5, 7, 9, 11]
    said = fig.layout.title.subtitle.text
    assert "Median per bin of 2 steps" in said and "one row per host" in said
    assert "%{y}" in heat.hovertemplate and "bin of 2 steps" in heat.hovertemplate


def test_the_straggler_shows_in_its_hosts_row() -> None:
    steps = ddp_steps(world_size=48, n_steps=60, slow_rank=21, slow_from=10)  # hosts of 8
    heat = plots.step_time_heatmap(steps, value="compute_s", max_rows=6).data[0]
    z = np.asarray(heat.z)
    assert z.shape == (6, 58)
    col = list(heat.x).index(30)
    assert z[2, col] == pytest.approx(900.0) and z[1, col] == pytest.approx(600.0)  # ms


def test_phase_bars_past_32_ranks_are_the_ranks_at_the_quantiles() -> None:
    # 40 ranks; rank 21 is slow from step 10, so its mean compute is the largest
    steps = ddp_steps(world_size=40, n_steps=60, slow_rank=21, slow_from=10)
    fig = plots.phase_breakdown_figure(phase_breakdown(steps), "d")
    x = list(fig.data[0].x)
    assert len(x) == 5 and x[-1] == "max (rank 21)"
    assert [label.split(" ")[0] for label in x] == ["min", "p10", "median", "p90", "max"]
    assert "40 ranks (more than 32)" in fig.layout.title.subtitle.text
    small = plots.phase_breakdown_figure(phase_breakdown(ddp_steps(world_size=32)), "d")
    assert list(small.data[0].x) == list(range(32))  # up to 32: every rank


def test_memory_bars_past_32_ranks_are_the_ranks_at_the_quantiles() -> None:
    # make_steps: rank r's RSS is 1 GiB + r MiB, so the quantiles of 64 ranks are by rank:
    # positions 0, 6 (6.3), 32 (31.5 rounds to even), 57 (56.7), 63
    memory = memory_by_rank(make_steps("m", world_size=64))
    fig = plots.memory_figure(memory)
    assert list(fig.data[0].x) == [
        "min (rank 0)",
        "p10 (rank 6)",
        "median (rank 32)",
        "p90 (rank 57)",
        "max (rank 63)",
    ]
    assert list(fig.data[0].y) == pytest.approx([1 + r / 1024 for r in (0, 6, 32, 57, 63)])
    assert "more than 32" in fig.layout.title.subtitle.text


def test_the_report_of_1024_ranks_stays_small(tmp_path) -> None:
    # 1,024 ranks on 128 hosts of 8, rank 683 planted slow from step 20: the rank x step
    # figures have a row per host, the per-rank bars and the bands name the slowest rank
    steps = ddp_steps(world_size=1024, n_steps=60, slow_rank=683, slow_from=20, noise=0.02)
    runs = make_runs([{"run_id": "d", "world_size": 1024}])
    page = write_report(runs, steps, None, tmp_path / "report.html")
    assert page.stat().st_size <= 20 * 10**6
    text = page.read_text(encoding="utf-8").replace("<br>", " ")  # subtitles wrap
    assert "node85 (ranks 680-687)" in text  # a heatmap row
    assert "max (rank 683)" in text  # the phase bars' slowest rank
    assert "One row per host (128 hosts of 8 ranks), its slowest rank" in text
    assert "slowest: rank 683" in text  # its own line over the bands across ranks


def test_quantile_bands_across_ranks_per_bin() -> None:
    # 100 ranks, value = rank in the bin of step 1 and 2 x rank in the bin of step 11; rank 100
    # has no value (left out): positions 0, 10 (9.9), 50 (49.5 rounds to even), 89 (89.1), 99
    rank = np.tile(np.arange(101), 2)
    step = np.repeat([1, 11], 101)
    v = np.where(step == 1, rank, 2.0 * rank).astype("float64")
    v[rank == 100] = np.nan
    binned = pd.DataFrame({"rank": rank, "step": step, "v": v})
    bands = binning.rank_bands(binned, "v")
    assert list(bands["step"]) == [1, 11]
    assert list(bands.iloc[0, 1:]) == [0.0, 10.0, 50.0, 89.0, 99.0]
    assert list(bands.iloc[1, 1:]) == [0.0, 20.0, 100.0, 178.0, 198.0]
    assert list(bands.columns[1:]) == [name for name, _ in binning.QUANTILES]
    assert binning.slowest_rank(binned, "v") == 99
    assert binning.slowest_rank(binned.assign(v=np.nan), "v") is None


def test_compute_across_ranks_a_line_each_up_to_32_then_bands() -> None:
    few = plots.rank_spread_figure(ddp_steps(world_size=4, n_steps=60, slow_rank=2))
    assert [t.name for t in few.data] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    # 40 ranks computing 0.6 s a step, rank 21 0.9 s from step 10 on: the bands are 600 ms
    # but the max (900 ms), and the slowest rank is named
    many = plots.rank_spread_figure(
        ddp_steps(world_size=40, n_steps=60, slow_rank=21, slow_from=10)
    )
    names = [t.name for t in many.data]
    assert names == ["max", "p90", "p10", "min", "median", "slowest: rank 21"]
    at = list(many.data[0].x).index(30)
    ys = {t.name: list(t.y)[at] for t in many.data}
    assert ys == pytest.approx(
        {
            "max": 900.0,
            "p90": 600.0,
            "p10": 600.0,
            "min": 600.0,
            "median": 600.0,
            "slowest: rank 21": 900.0,
        }
    )
    assert many.data[2].fill == "tonexty"
    assert "40 ranks (more than 32)" in many.layout.title.subtitle.text
