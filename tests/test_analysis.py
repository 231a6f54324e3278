"""Analysis tables on hand-built frames, against answers worked out by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench import analysis
from workbench.analysis import (
    communication,
    default_group_by,
    downsample_for_display,
    eval_breakdown,
    measured_window,
    memory_by_rank,
    phase_breakdown,
    resolve_group_by,
    scaling_table,
    stragglers,
)
from workbench.analysis.measured.rank_cells import RowSparse
from workbench.analysis.model.scaling_model import (
    NETWORK_PRESETS,
    NetworkModel,
    fit_network,
    measured_network,
    predict_scaling,
    predicted_vs_measured,
    ring_allreduce_time,
)
from workbench.analysis.stragglers.others_median import median_of_others, others_median, row_stats
from workbench.analysis.throughput.summary import per_rank_table, run_summary

from .frames import ddp_steps, make_evals, make_runs, make_steps, scaling_sweep


def by_run(frame: pd.DataFrame, column: str) -> dict[str, float]:
    return dict(zip(frame["run_id"], frame[column], strict=True))


# --- measured window and throughput ------------------------------------------------------------


def test_measured_window_is_first_measured_start_to_last_end() -> None:
    _, steps, _ = scaling_sweep(evals=False)
    w = measured_window(steps).set_index("run_id")
    # 10 steps, 2 warm-up: steps 3..10 measured, back to back.
    assert w.loc["ws2", "start_s"] == pytest.approx(2 * 1.25)
    assert w.loc["ws2", "end_s"] == pytest.approx(10 * 1.25)
    assert w.loc["ws2", "measured_s"] == pytest.approx(10.0)
    assert w.loc["ws2", "samples"] == 8 * 2 * 8  # steps x ranks x samples
    assert w.loc["ws2", "steps"] == 8
    assert by_run(w.reset_index(), "samples_per_s") == pytest.approx(
        {"ws1": 8.0, "ws2": 12.8, "ws4": 20.0}
    )


def test_throughput_is_not_a_sum_of_per_rank_rates() -> None:
    steps = make_steps("late", world_size=2)
    steps.loc[steps["rank"] == 1, "t_start_s"] += 1.0  # rank 1 runs 1 s behind
    w = measured_window(steps).iloc[0]
    # window: rank 0's step 3 starts at 2.0, rank 1's step 10 ends at 9 + 1 + 1 = 11.
    assert w["measured_s"] == pytest.approx(9.0)
    assert w["samples_per_s"] == pytest.approx(128 / 9.0)  # a sum of rates would say 16


def test_resumed_run_adds_attempt_windows() -> None:
    first = make_steps("r", world_size=1, n_steps=6, warmup_steps=2)
    second = make_steps("r", world_size=1, n_steps=4, warmup_steps=1, attempt=1)
    second["step"] += 6
    w = measured_window(pd.concat([first, second])).iloc[0]
    assert w["attempts"] == 2
    assert w["measured_s"] == pytest.approx(4.0 + 3.0)  # steps 3-6 and 8-10, gap left out
    assert w["samples"] == 8 * 7


def test_run_with_only_warmup_steps_has_no_rate() -> None:
    steps = make_steps("w", world_size=2, n_steps=2, warmup_steps=2)
    w = measured_window(steps).iloc[0]
    assert w["steps"] == 0 and w["samples"] == 0 and np.isnan(w["samples_per_s"])


# --- scaling table -------------------------------------------------------------------------------


def test_scaling_table_speedup_efficiency_epoch_time() -> None:
    runs, steps, evals = scaling_sweep()
    t = scaling_table(runs, steps, evals).set_index("world_size")
    assert t["samples_per_s"].tolist() == pytest.approx([8.0, 12.8, 20.0])
    assert t["samples_per_s_per_device"].tolist() == pytest.approx([8.0, 6.4, 5.0])
    assert t["speedup"].tolist() == pytest.approx([1.0, 1.6, 2.5])
    assert t["ideal_speedup"].tolist() == pytest.approx([1.0, 2.0, 4.0])
    assert t["efficiency"].tolist() == pytest.approx([1.0, 0.8, 0.625])
    # training alone above; end to end the evaluation after step 5 (0.75 s on 1 and 2 ranks,
    # 0.85 s on 4: rank 3 gathers longest) is in the window of 8 steps
    ends = {1: 8 + 0.75, 2: 10 + 0.75, 4: 12.8 + 0.85}
    samples = {1: 64, 2: 128, 4: 256}
    assert t["end_to_end_samples_per_s"].tolist() == pytest.approx(
        [samples[n] / ends[n] for n in (1, 2, 4)]
    )
    assert t["epoch_s"].tolist() == pytest.approx([640 * ends[n] / samples[n] for n in (1, 2, 4)])
    assert t["wall_step_s"].tolist() == pytest.approx([ends[n] / 8 for n in (1, 2, 4)])
    assert t["runs"].tolist() == [1, 1, 1]
    assert t["final_loss"].tolist() == pytest.approx([1.1] * 3)  # 2.0 - 0.1 * 9
    assert t["final_metric"].tolist() == pytest.approx([0.85, 0.8, 0.7])
    # target: the worst final accuracy of the group (0.7), reached at the step-10 evaluation,
    # which starts at 10 * step_s plus the step-5 evaluation (0.75, 0.75, 0.85 s) and lasts
    # 0.75 s on rank 0.
    assert t["target_metric"].tolist() == pytest.approx([0.7] * 3)
    assert t["time_to_quality_s"].tolist() == pytest.approx([11.5, 14.0, 17.6])


def test_time_to_quality_with_explicit_target_and_lower_is_better() -> None:
    runs, steps, evals = scaling_sweep()
    t = scaling_table(runs, steps, evals, target_metric=0.5).set_index("world_size")
    assert t["time_to_quality_s"].tolist() == pytest.approx([5.75, 5 * 1.25 + 0.75, 8.75])
    evals = evals.assign(metric_name="loss", metric_value=1 - evals["metric_value"])
    t = scaling_table(runs, steps, evals).set_index("world_size")
    assert t["target_metric"].tolist() == pytest.approx([0.3] * 3)  # worst = highest loss
    assert t["time_to_quality_s"].tolist() == pytest.approx([11.5, 14.0, 17.6])


def test_repeated_runs_are_averaged_with_std_and_count() -> None:
    runs, steps, _ = scaling_sweep(evals=False)
    again = make_steps("ws2b", world_size=2, step_s=1.0)  # 16 samples/s
    runs = pd.concat([runs, make_runs([{"run_id": "ws2b", "world_size": 2}])])
    t = scaling_table(runs, pd.concat([steps, again])).set_index("world_size")
    assert t.loc[2, "runs"] == 2
    assert t.loc[2, "samples_per_s"] == pytest.approx(14.4)
    assert t.loc[2, "samples_per_s_std"] == pytest.approx(np.std([12.8, 16.0], ddof=1))
    assert t.loc[2, "speedup"] == pytest.approx(14.4 / 8)
    # The base (N=1) is one run: its spread is unknown, so the speedup has no error bar (it was
    # the N=2 spread over the base mean, as if the base were exact).
    assert np.isnan(t.loc[2, "speedup_std"]) and np.isnan(t.loc[2, "efficiency_std"])
    assert np.isnan(t.loc[1, "samples_per_s_std"])


def test_groups_have_their_own_baseline() -> None:
    rows, parts = [], []
    for precision, times in (("fp32", {2: 1.0, 4: 1.25}), ("fp16", {1: 0.5, 2: 0.5})):
        for n, s in times.items():
            run_id = f"{precision}-{n}"
            rows.append({"run_id": run_id, "world_size": n, "precision": precision})
            parts.append(make_steps(run_id, world_size=n, step_s=s))
    t = scaling_table(make_runs(rows), pd.concat(parts))
    t = t.set_index(["precision", "world_size"])
    assert t.loc[("fp32", 4), "base_world_size"] == 2
    assert t.loc[("fp32", 4), "speedup"] == pytest.approx(1.6)  # 25.6 / 16
    assert t.loc[("fp32", 4), "efficiency"] == pytest.approx(0.8)
    assert t.loc[("fp16", 2), "speedup"] == pytest.approx(2.0)
    assert t.loc[("fp16", 2), "efficiency"] == pytest.approx(1.0)


def test_default_group_by_holds_a_batch_fixed_per_family() -> None:
    weak = make_runs([{"run_id": f"w{n}", "world_size": n} for n in (1, 2, 4)])
    keys = default_group_by(weak)
    assert keys[:2] == ["model", "precision"] and keys[-2:] == ["scaling", "fixed_batch_size"]
    assert not {"per_device_batch_size", "global_batch_size", "world_size", "nodes"} & set(keys)
    t = scaling_table(weak, pd.concat([make_steps(f"w{n}", world_size=n) for n in (1, 2, 4)]))
    assert t["scaling"].tolist() == ["weak"] * 3 and t["fixed_batch_size"].tolist() == [8] * 3
    assert t["global_batch_size"].tolist() == [8, 16, 32]
    strong = make_runs(
        [{"run_id": f"s{n}", "world_size": n, "per_device_batch_size": 64 // n} for n in (1, 2, 4)]
    )
    strong["global_batch_size"] = 64
    steps = pd.concat([make_steps(f"s{n}", world_size=n, samples=64 // n) for n in (1, 2, 4)])
    t = scaling_table(strong, steps)
    assert t["scaling"].tolist() == ["strong"] * 3 and t["fixed_batch_size"].tolist() == [64] * 3
    assert t["per_device_batch_size"].tolist() == [64, 32, 16]
    assert t["speedup"].tolist() == pytest.approx([1.0, 1.0, 1.0])  # 64 samples per 1 s step


def test_unknown_or_bad_group_names_raise_with_valid_names() -> None:
    runs, steps, _ = scaling_sweep(evals=False)
    with pytest.raises(ValueError, match=r"\['modle'\].*valid names:.*model"):
        scaling_table(runs, steps, group_by=["modle"])
    with pytest.raises(ValueError, match="world_size"):
        scaling_table(runs, steps, group_by=["model", "world_size"])
    with pytest.raises(ValueError, match="valid names"):
        measured_window(steps.drop(columns="samples"))


def test_resolve_group_by_default_single_name_and_checks() -> None:
    runs, _, _ = scaling_sweep()
    keys = resolve_group_by(runs)
    assert keys == default_group_by(runs)
    assert resolve_group_by(runs, keys) == keys  # resolving twice changes nothing
    assert resolve_group_by(runs, "precision") == ["precision"]
    assert resolve_group_by(runs, []) == []
    with pytest.raises(ValueError, match=r"\['modle'\].*valid names:.*model"):
        resolve_group_by(runs, ["modle"])
    with pytest.raises(ValueError, match="scaling axis"):
        resolve_group_by(runs, ["nodes"])


def test_the_grouping_is_passed_never_kept_in_the_frame() -> None:
    # pandas drops DataFrame.attrs on merge and concat: the grouping must not live there.
    runs, steps, evals = scaling_sweep()
    keys = resolve_group_by(runs, ["model"])
    t = scaling_table(runs, steps, evals, group_by=keys)
    assert t.attrs == {}
    assert list(t.columns[:2]) == ["model", "world_size"]
    assert analysis.run_table(runs, steps, group_by=keys).attrs == {}


def test_only_completed_runs_by_default() -> None:
    runs, steps, _ = scaling_sweep(evals=False)
    runs.loc[runs["run_id"] == "ws4", "status"] = "failed"
    assert scaling_table(runs, steps)["world_size"].tolist() == [1, 2]
    assert scaling_table(runs, steps, statuses=None)["world_size"].tolist() == [1, 2, 4]


def test_empty_group_by_is_one_group() -> None:
    runs, steps, _ = scaling_sweep(evals=False)
    t = scaling_table(runs[["run_id", "status"]], steps, group_by=[])
    assert t["speedup"].tolist() == pytest.approx([1.0, 1.6, 2.5])
    assert "_group" not in t.columns


# --- breakdowns ---------------------------------------------------------------------------------


def test_phase_breakdown_means_std_and_other() -> None:
    steps = make_steps("p", world_size=2)
    # rank 1's forward alternates 0.1 / 0.3 on measured steps: mean 0.2, std 0.1069 (ddof 1)
    measured = (steps["rank"] == 1) & ~steps["warmup"]
    steps.loc[measured, "forward_s"] = np.tile([0.1, 0.3], 4)
    steps.loc[(steps["rank"] == 0) & ~steps["warmup"], "backward_s"] = 0.9  # phases > step
    p = phase_breakdown(steps).set_index("rank")
    assert p.loc[1, "forward_s"] == pytest.approx(0.2)
    assert p.loc[1, "forward_s_std"] == pytest.approx(np.std(np.tile([0.1, 0.3], 4), ddof=1))
    assert p.loc[1, "other_s"] == pytest.approx(1.0 - 0.9)
    assert p.loc[0, "other_s"] == 0.0  # 1.0 - 1.3 clipped
    assert p.loc[0, "steps"] == 8
    assert p.loc[0, "comm_s"] == pytest.approx(0.3)


def test_a_rank_restarted_before_its_first_checkpoint_keeps_its_first_host() -> None:
    """Requeued onto another node before any checkpoint, a rank traces step 1 again: its host
    is still the one it started on (the first traced row: by attempt, then step)."""
    first = make_steps("p", world_size=2, n_steps=6).assign(host="nodeA", attempt=0)
    again = make_steps("p", world_size=2, n_steps=6, warmup_steps=0)  # its step 1 measured
    steps = pd.concat([first, again.assign(host="nodeB", attempt=1)], ignore_index=True)
    steps = steps.sort_values(["run_id", "rank", "step"], kind="stable", ignore_index=True)
    by_step = steps[~steps["warmup"]].groupby("rank")["host"].first()  # as load_traces orders
    assert by_step.tolist() == ["nodeB", "nodeB"]
    p = phase_breakdown(steps)
    assert p["host"].tolist() == ["nodeA", "nodeA"]


def test_exposed_communication_from_the_one_rank_reference() -> None:
    runs, steps, _ = scaling_sweep(evals=False)
    c = communication(steps, runs).groupby("run_id").first()
    # backward: 0.5 s at N=1, 0.75 at N=2, 1.1 at N=4; comm_s 0.3
    assert c.loc["ws1", "exposed_comm_s"] == 0.0
    assert c.loc["ws2", "exposed_comm_s"] == pytest.approx(0.25)
    assert c.loc["ws2", "overlapped_comm_s"] == pytest.approx(0.05)
    assert c.loc["ws4", "exposed_comm_s"] == pytest.approx(0.3)  # 0.6 capped at comm_s
    assert set(c["method"]) == {"reference"}
    assert c.loc["ws2", "comm_share"] == pytest.approx(0.3 / 1.25)
    assert c.loc["ws2", "exposed_share"] == pytest.approx(0.25 / 1.25)
    assert c.loc["ws2", "bus_bandwidth_bytes_per_s"] == pytest.approx(1e6 / 0.3)
    assert c.loc["ws4", "bus_bandwidth_bytes_per_s"] == pytest.approx(1.5e6 / 0.3)
    assert np.isnan(c.loc["ws1", "bus_bandwidth_bytes_per_s"])


def test_exposed_communication_without_reference_is_the_no_overlap_bound() -> None:
    runs, steps, _ = scaling_sweep(evals=False)
    c = communication(steps).groupby("run_id").first()
    assert set(c["method"]) == {"no_overlap_bound"}
    assert c.loc["ws2", "exposed_comm_s"] == pytest.approx(0.3)  # min(0.3, 0.75)
    # smallest world size 2: ws2 is the reference (bound), ws4 measured against it
    c = communication(steps[steps["world_size"] > 1], runs).groupby("run_id").first()
    assert c.loc["ws2", "method"] == "no_overlap_bound"
    assert c.loc["ws4", "method"] == "reference"
    assert c.loc["ws4", "exposed_comm_s"] == pytest.approx(0.3)  # min(1.1 - 0.75, 0.3)


def test_eval_breakdown_rank0_and_slowest() -> None:
    evals = pd.concat([make_evals("a", world_size=1), make_evals("b", world_size=4)])
    e = eval_breakdown(evals).set_index("run_id")
    assert e.loc["b", "evaluations"] == 2
    assert e.loc["b", "predict_s"] == pytest.approx(0.4)
    assert e.loc["b", "gather_s"] == pytest.approx(0.1)
    assert e.loc["b", "metric_s"] == pytest.approx(0.2)
    # Slowest rank: rank 3 (gathers 4x longer: 0.4 + 0.4 + 0 + 0.05 = 0.85 s against rank 0's
    # 0.75 s); its parts, all of them, not rank 0's metric time stacked on rank 3's gather.
    assert e.loc["b", "slowest_rank"] == 3
    assert e.loc["b", "gather_s_slowest"] == pytest.approx(0.4)
    assert e.loc["b", "metric_s_slowest"] == 0.0
    assert e.loc["b", "eval_s_slowest"] == pytest.approx(0.4 + 0.4 + 0.0 + 0.05)
    assert e.loc["b", "samples"] == 64
    assert e.loc["a", "metric_value"] == pytest.approx(0.8)


def test_memory_by_rank_peaks() -> None:
    m = memory_by_rank(make_steps("m", world_size=2, cuda=True)).set_index("rank")
    assert m.loc[1, "rss_peak_bytes"] == (1 << 30) + (1 << 20)
    assert m.loc[1, "cuda_peak_bytes"] == pytest.approx(2.5e9 + 1e6)
    assert m.loc[0, "cuda_reserved_peak_bytes"] == pytest.approx(3e9)
    assert m.loc[0, "device_peak_bytes"] == pytest.approx(4e9)
    cpu = memory_by_rank(make_steps("c", world_size=2))
    assert cpu["cuda_peak_bytes"].isna().all()


# --- stragglers ---------------------------------------------------------------------------------


def test_balanced_run_has_no_straggler() -> None:
    assert stragglers(ddp_steps(noise=0.05)).empty
    assert stragglers(ddp_steps(world_size=2, noise=0.05)).empty


def test_planted_straggler_found_with_rank_ratio_and_start() -> None:
    found = stragglers(ddp_steps(slow_rank=5, slow_from=40))
    assert len(found) == 1
    row = found.iloc[0]
    assert (row["run_id"], row["rank"], row["start_step"], row["end_step"]) == ("d", 5, 40, 100)
    assert row["ratio"] == pytest.approx(1.5)
    assert row["slow_steps"] == 61 and row["slow_fraction"] == 1.0
    assert row["value_s"] == pytest.approx(0.9) and row["others_s"] == pytest.approx(0.6)
    assert row["extra_s"] == pytest.approx(0.3)


def test_planted_straggler_in_two_ranks_and_under_noise() -> None:
    found = stragglers(ddp_steps(world_size=2, slow_rank=0, slow_from=20, noise=0.02))
    assert found["rank"].tolist() == [0]
    assert found["start_step"].iloc[0] == 20
    assert found["ratio"].iloc[0] == pytest.approx(1.5, rel=0.05)


def test_straggler_found_from_sampled_comm_times() -> None:
    # trace_comm="sampled": DDP's timers only on steps 1-10 and every 10th; rows in any order.
    # Rank 5's extra is in backward compute, seen on the sampled steps alone: 20, 30, ..., 100
    # are 9 of them, persistent over min_steps=5 sampled steps (not over the default 10), and
    # resolved on the 4 sampled steps after those 5 that found it.
    steps = ddp_steps(slow_rank=5, slow_from=20)
    sampled = (steps["step"] <= 10) | (steps["step"] % 10 == 0)
    steps.loc[~sampled, ["comm_s", "backward_compute_s"]] = np.nan
    shuffled = steps.sample(frac=1.0, random_state=0)
    assert stragglers(shuffled).empty
    found = stragglers(shuffled, min_steps=5)
    assert found[["rank", "start_step", "end_step", "slow_steps"]].values.tolist() == [
        [5, 20, 100, 9]
    ]
    assert found["ratio"].iloc[0] == pytest.approx(1.5)
    assert found["slow_phase"].tolist() == ["backward_compute_s"]


def test_comm_filled_carries_each_ranks_samples_forward() -> None:
    steps = pd.DataFrame(
        {
            "run_id": ["a"] * 6 + ["b"] * 2,
            "rank": [0, 0, 0, 1, 1, 1, 0, 0],
            "step": [3, 1, 2, 1, 2, 3, 1, 2],
            "comm_s": [np.nan, np.nan, 0.5, 0.1, np.nan, np.nan, np.nan, np.nan],
        },
        index=[10, 11, 12, 13, 14, 15, 16, 17],
    )
    filled = analysis.comm_filled(steps)
    assert filled.index.tolist() == steps.index.tolist()
    assert filled.tolist() == pytest.approx(
        [0.5, 0.5, 0.5, 0.1, 0.1, 0.1, np.nan, np.nan], nan_ok=True
    )


def test_transient_and_intermittent_slowness() -> None:
    found = stragglers(ddp_steps(slow_rank=3, slow_from=30, slow_until=49))
    assert found[["rank", "start_step", "end_step", "slow_steps"]].values.tolist() == [
        [3, 30, 49, 20]
    ]
    steps = ddp_steps(slow_rank=3, slow_from=3)
    odd = (steps["step"] % 2 == 1) & (steps["rank"] == 3)
    steps.loc[odd, "backward_compute_s"] = 0.2  # slow on every other step only
    assert stragglers(steps).empty  # 50 % < persistence 0.8
    assert len(stragglers(steps, persistence=0.5)) == 1


def test_straggler_on_another_measure_and_unknown_measure() -> None:
    steps = make_steps("f", world_size=4, n_steps=30)
    steps.loc[(steps["rank"] == 2) & (steps["step"] >= 10), "forward_s"] = 0.3
    found = stragglers(steps, measure="forward_s")
    assert found[["rank", "start_step"]].values.tolist() == [[2, 10]]
    assert found["ratio"].iloc[0] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="valid names: compute_s, .*forward_s"):
        stragglers(steps, measure="fwd")


def test_median_of_others_matches_brute_force() -> None:
    rng = np.random.default_rng(1)
    for n in (2, 3, 4, 7):
        a = rng.normal(size=(20, n))
        a[rng.uniform(size=a.shape) < 0.15] = np.nan
        got = median_of_others(a)
        for i in range(a.shape[0]):
            for j in range(n):
                others = np.delete(a[i], j)
                others = others[~np.isnan(others)]
                want = np.median(others) if len(others) and not np.isnan(a[i, j]) else np.nan
                assert got[i, j] == pytest.approx(want, nan_ok=True)


def test_others_median_of_single_cells_equals_the_whole_rows() -> None:
    """The straggler rule keeps three order statistics per step and works out a cell's others'
    median when it needs it: for single cells, as for whole rows."""
    rng = np.random.default_rng(2)
    a = rng.normal(size=(30, 5))
    a[rng.uniform(size=a.shape) < 0.2] = np.nan
    whole = median_of_others(a)
    stats = row_stats(a)
    rows, cols = np.nonzero(np.ones(a.shape, dtype=bool))
    single = others_median(a[rows, cols], stats.take(rows))
    np.testing.assert_array_equal(single, whole[rows, cols])


def test_a_row_sparse_matrix_reads_as_the_dense_one() -> None:
    dense = np.full((10, 3), np.nan)
    held = np.array([2, 5, 9])
    dense[held] = np.arange(9.0).reshape(3, 3)
    sparse = RowSparse(10, held, dense[held])
    for key in (slice(None), slice(3, 8), np.array([0, 2, 9]), (np.array([5, 6, 9]), 1)):
        np.testing.assert_array_equal(sparse[key], dense[key])


# --- display helper -------------------------------------------------------------------------------


def test_downsample_for_display_bins_per_group() -> None:
    frame = pd.DataFrame(
        {"rank": np.repeat([0, 1], 1000), "step": np.tile(np.arange(1, 1001), 2), "host": "h"}
    )
    frame["v"] = frame["step"] * 1.0 + frame["rank"]
    small = downsample_for_display(frame, 200, x="step", by=["rank"])
    assert small.groupby("rank").size().tolist() == [100, 100]
    first = small[small["rank"] == 1].iloc[0]
    assert first["step"] == 1 and first["v"] == pytest.approx(5.5 + 1)  # mean of steps 1..10
    assert list(small.columns) == list(frame.columns)
    assert downsample_for_display(frame, 5000) is frame
    with pytest.raises(ValueError, match="valid names"):
        downsample_for_display(frame, 10, x="t")


# --- scaling model -------------------------------------------------------------------------------


# --- one run's summary --------------------------------------------------------------------------


def test_run_summary_and_per_rank_table_from_frames() -> None:
    steps, evals = make_steps("s", world_size=2), make_evals("s", world_size=2)
    summary = run_summary(steps, evals)
    assert summary["traced_steps"] == 10 and summary["measured_steps"] == 8
    assert summary["measured_wall_s"] == pytest.approx(8.0)
    assert summary["samples_per_s"] == pytest.approx(16.0)  # 8 steps x 2 ranks x 8 / 8 s
    assert summary["samples_per_s_per_device"] == pytest.approx(8.0)
    assert summary["mean_backward_s"] == pytest.approx(0.5)
    assert summary["final_loss"] == pytest.approx(1.1)
    assert summary["final_metric"] == pytest.approx(0.8)
    assert run_summary(steps.iloc[0:0], evals.iloc[0:0]) == {"traced_steps": 0}
    per_rank = per_rank_table(steps)
    assert per_rank.index.tolist() == [0, 1]
    assert per_rank["samples_per_s"].tolist() == pytest.approx([8.0, 8.0])
    assert per_rank["peak_rss_mib"].tolist() == pytest.approx([1024.0, 1025.0])


def test_ring_allreduce_time_by_hand() -> None:
    # 2 (N-1)/N * bytes / bw + 2 (N-1) * latency * buckets
    assert ring_allreduce_time(1e9, 4, 1e10, 1e-5) == pytest.approx(0.15 + 6e-5)
    assert ring_allreduce_time(1e9, 4, 1e10, 1e-5, buckets=25) == pytest.approx(0.15 + 1.5e-3)
    assert ring_allreduce_time(1e9, 1, 1e10, 1e-5) == 0.0
    got = ring_allreduce_time(1e6, np.array([2, 8]), 1e6, 0.0)
    assert got.tolist() == pytest.approx([1.0, 1.75])
    with pytest.raises(ValueError, match="bandwidth"):
        ring_allreduce_time(1e6, 2, 0.0, 0.0)


def test_network_presets_are_sane() -> None:
    assert {"nvlink", "infiniband-hdr", "ethernet-25g", "ethernet-10g"} <= set(NETWORK_PRESETS)
    bw = {k: v.bandwidth_bytes_per_s for k, v in NETWORK_PRESETS.items()}
    assert bw["nvlink"] > bw["infiniband-hdr"] > bw["ethernet-25g"] > bw["ethernet-10g"]
    assert bw["infiniband-hdr"] <= 200e9 / 8  # never above line rate
    assert bw["ethernet-25g"] <= 25e9 / 8 and bw["ethernet-10g"] <= 10e9 / 8


SLOW_NET = NetworkModel(name="slow", bandwidth_bytes_per_s=1e6, latency_s=0.0)


def test_predict_scaling_from_one_rank_run() -> None:
    steps = make_steps("one", world_size=1)  # step 1.0 s, 8 samples
    pred = predict_scaling(steps, SLOW_NET, [1, 2, 4], gradient_bytes=1e6).set_index("world_size")
    # ring: 1 s at N=2, 1.5 s at N=4; no overlap
    assert pred["step_s"].tolist() == pytest.approx([1.0, 2.0, 2.5])
    assert pred["samples_per_s"].tolist() == pytest.approx([8.0, 8.0, 32 / 2.5])
    assert pred["speedup"].tolist() == pytest.approx([1.0, 1.0, 1.6])
    assert pred["efficiency"].tolist() == pytest.approx([1.0, 0.5, 0.4])
    # the model's inputs travel as columns, not in DataFrame.attrs
    assert pred.attrs == {}
    assert set(pred["network"]) == {"slow"} and set(pred["gradient_bytes"]) == {1e6}
    assert set(pred["buckets"]) == {1} and set(pred["overlap"]) == {0.0}
    half = predict_scaling(steps, SLOW_NET, [2], overlap=0.5, gradient_bytes=1e6)
    assert half["step_s"].iloc[0] == pytest.approx(1.5)
    assert half["speedup"].iloc[0] == pytest.approx(2 / 1.5)


def test_predict_scaling_from_multi_rank_run_and_latency_per_bucket() -> None:
    steps = make_steps("two", world_size=2, step_s=1.25, comm_s=0.3, comm_buckets=4)
    net = NetworkModel(name="n", bandwidth_bytes_per_s=1e7, latency_s=1e-3)
    pred = predict_scaling(steps, net, [2, 8]).set_index("world_size")
    compute = 1.25 - 0.3
    assert pred["compute_s"].iloc[0] == pytest.approx(compute)
    ring8 = 2 * 7 / 8 * 1e6 / 1e7 + 2 * 7 * 1e-3 * 4
    assert pred.loc[8, "step_s"] == pytest.approx(compute + ring8)
    assert pred.loc[8, "speedup"] == pytest.approx(8 * compute / (compute + ring8))


def test_predict_scaling_rejects_bad_input() -> None:
    _, steps, _ = scaling_sweep(evals=False)
    with pytest.raises(ValueError, match="one run"):
        predict_scaling(steps, "nvlink", [2])
    with pytest.raises(ValueError, match="valid names: nvlink"):
        predict_scaling(steps[steps["run_id"] == "ws1"], "token-ring", [2])
    with pytest.raises(ValueError, match="overlap"):
        predict_scaling(steps[steps["run_id"] == "ws1"], "nvlink", [2], overlap=1.5)


def ring_run(run_id: str, n: int, nbytes: int, buckets: int, bw: float, lat: float) -> pd.DataFrame:
    comm = ring_allreduce_time(nbytes, n, bw, lat, buckets)
    steps = make_steps(run_id, world_size=n, comm_s=comm, comm_bytes=nbytes, comm_buckets=buckets)
    steps.loc[steps["rank"] == 1, "comm_s"] += 0.05  # rank 1 waits on the others: not network
    return steps


def test_measured_network_fits_bandwidth_and_latency() -> None:
    steps = pd.concat(
        [
            ring_run("a", 2, 100_000_000, 4, 1e9, 1e-4),
            ring_run("b", 4, 200_000_000, 1, 1e9, 1e-4),
            ring_run("c", 8, 100_000_000, 2, 1e9, 1e-4),
        ]
    )
    net = measured_network(steps)
    assert net is not None
    assert net.bandwidth_bytes_per_s == pytest.approx(1e9)
    assert net.latency_s == pytest.approx(1e-4)
    fit = fit_network(steps)
    assert fit.world_sizes == (2, 4, 8) and fit.residual_s == pytest.approx(0.0, abs=1e-9)
    assert "residual" in fit.note
    # Two world sizes: two parameters through two points leave no residual to judge them by
    # (it used to fit anyway, and one run gave a "bus bandwidth" with an assumed latency).
    two = fit_network(steps[steps["run_id"] != "c"])
    assert two.model is None and np.isnan(two.residual_s)
    assert "3 or more world sizes" in two.note and "2, 4" in two.note
    assert measured_network(steps[steps["run_id"] == "a"]) is None
    assert measured_network(make_steps("solo", world_size=1)) is None


def test_predicted_vs_measured_table() -> None:
    runs, steps, _ = scaling_sweep(evals=False)
    pvm = predicted_vs_measured(runs, steps, SLOW_NET, world_sizes=[8]).set_index("world_size")
    assert pvm.index.tolist() == [1, 2, 4, 8]
    assert set(pvm["base_run_id"]) == {"ws1"}
    # base: 1-rank run, compute 1.0 s; gradient bytes (1e6) from the group's multi-rank runs
    assert pvm["predicted_step_s"].tolist() == pytest.approx([1.0, 2.0, 2.5, 2.75])
    assert pvm["predicted_speedup"].tolist() == pytest.approx([1.0, 1.0, 1.6, 8 / 2.75])
    assert pvm["measured_speedup"].iloc[:3].tolist() == pytest.approx([1.0, 1.6, 2.5])
    assert np.isnan(pvm.loc[8, "measured_speedup"])
    assert pvm.loc[2, "relative_error"] == pytest.approx(8 / 12.8 - 1)
    assert pvm.attrs == {}
    assert set(pvm["network"]) == {"slow"} and set(pvm["note"]) == {
        "weak scaling from 1 run(s) at N=1"
    }
    by_model = predicted_vs_measured(runs, steps, SLOW_NET, group_by=["model"])
    # a point is its world size and nodes, with the link class its allreduce crossed
    assert list(by_model.columns[:5]) == ["model", "world_size", "nodes", "link_class", "network"]


def test_a_straggler_is_attributed_to_the_phase_that_makes_it_slow() -> None:
    # Rank 2 of 4 loads each batch 0.3 s slower from step 30 on (a slow disk); the others wait
    # for it in their allreduce, so their comm grows by 0.3 s and their backward with it.
    steps = make_steps("d", world_size=4, n_steps=60, step_s=1.0, data_s=0.1, comm_s=0.1)
    slow = (steps["rank"] == 2) & (steps["step"] >= 30)
    steps.loc[slow, "data_s"] += 0.3
    waiting = ~slow & (steps["step"] >= 30)
    steps.loc[waiting, "comm_s"] += 0.3
    steps.loc[waiting, "backward_s"] += 0.3
    steps.loc[steps["step"] >= 30, "step_s"] += 0.3
    found = stragglers(steps)
    assert found["rank"].tolist() == [2] and found["start_step"].tolist() == [30]
    assert found["slow_phase"].tolist() == ["data_s"]
    assert found["slow_phase_extra_s"].tolist() == pytest.approx([0.3])
    # the same planted in forward instead
    steps = make_steps("d", world_size=4, n_steps=60, step_s=1.0, comm_s=0.1)
    steps.loc[slow, "forward_s"] += 0.2
    steps.loc[waiting, "comm_s"] += 0.2
    steps.loc[waiting, "backward_s"] += 0.2
    steps.loc[steps["step"] >= 30, "step_s"] += 0.2
    assert stragglers(steps)["slow_phase"].tolist() == ["forward_s"]


def _with_checkpoint_and_evaluation_after_step_5() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two ranks, 10 back-to-back 1 s steps (2 warm-up), then after step 5: the evaluation of
    make_evals (0.75 s on rank 0, 0.65 s on rank 1), a checkpoint (0.3 s on rank 0, 0.25 s on
    rank 1) and 0.05 s of loop work on rank 0 (0.2 s on rank 1), so steps 6-10 start 1.1 s
    later. Rank 0's row of step 5 went to disk before the checkpoint: no traced gap_s."""
    steps = make_steps(world_size=2, n_steps=10, warmup_steps=2, step_s=1.0)
    steps.loc[steps["step"] >= 6, "t_start_s"] += 1.1
    at5 = steps["step"] == 5
    steps.loc[at5, "gap_s"] = np.where(steps.loc[at5, "rank"] == 0, np.nan, 1.1)
    steps.loc[at5, "save_s"] = np.where(steps.loc[at5, "rank"] == 0, 0.3, 0.25)
    evals = make_evals(world_size=2, eval_steps=(5, 10), metric_values=(0.5, 0.8))
    return steps, evals


def test_train_throughput_leaves_out_evaluations_and_checkpoints_inside_the_window() -> None:
    steps, evals = _with_checkpoint_and_evaluation_after_step_5()
    w = measured_window(steps, evals).iloc[0]
    # window: step 3's start (2.0) to step 10's end (9 + 1.1 + 1 = 11.1); 8 steps x 2 ranks x 8
    assert w["measured_s"] == pytest.approx(9.1)
    assert w["samples_per_s"] == pytest.approx(128 / 9.1)
    # inside it: the slowest rank's evaluation (0.75) and checkpoint (0.3) after step 5; the
    # evaluation after step 10 is after the window's end
    assert (w["eval_s"], w["save_s"]) == pytest.approx((0.75, 0.3))
    assert w["train_s"] == pytest.approx(9.1 - 1.05)
    assert w["train_samples_per_s"] == pytest.approx(128 / 8.05)
    without_evals = measured_window(steps).iloc[0]
    assert without_evals["train_s"] == pytest.approx(9.1 - 0.3)


def test_breakdown_with_between_steps_adds_up_to_each_ranks_window() -> None:
    steps, evals = _with_checkpoint_and_evaluation_after_step_5()
    b = phase_breakdown(steps, evals).set_index("rank")
    assert b["window_s"].tolist() == pytest.approx([9.1, 9.1])
    assert (b["wall_step_s"] * b["steps"]).tolist() == pytest.approx([9.1, 9.1])
    # per step over 8 measured steps; rank 0's gap taken from step 6's start (1.1 s)
    assert (b["save_s"] * 8).tolist() == pytest.approx([0.3, 0.25])
    assert (b["eval_s"] * 8).tolist() == pytest.approx([0.75, 0.65])
    assert (b["between_s"] * 8).tolist() == pytest.approx([0.05, 0.2])
    assert b["step_s"].tolist() == pytest.approx([1.0, 1.0])
    # without the evaluations they stay between steps
    plain = phase_breakdown(steps).set_index("rank")
    assert (plain["between_s"] * 8).tolist() == pytest.approx([0.8, 0.85])
