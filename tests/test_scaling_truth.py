"""Issue 11, "every number true": scaling groups and families, the speedup's error, the slowest
rank's evaluation, time to quality across attempts and the scaling model, on hand-built frames
with the answers worked out by hand in each test."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.analysis import (
    ScalingFamilyWarning,
    config_columns,
    eval_breakdown,
    eval_rows,
    resolve_group_by,
    run_table,
    scaling_table,
)
from workbench.analysis.model.scaling_model import (
    NetworkModel,
    fit_network,
    predict_scaling,
    predicted_vs_measured,
)
from workbench.schema import EVAL_COLUMNS
from workbench.store.load import load_runs, load_traces

from .frames import make_evals, make_runs, make_steps, write_run

SLOW_NET = NetworkModel(name="slow", bandwidth_bytes_per_s=1e6, latency_s=0.0)


def study(rows: list[dict[str, object]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """runs and steps: each row gives run_id, world_size, step_s (default 1) and the samples per
    rank per step (default: its per_device_batch_size, else 8); the rest are config columns."""
    runs, parts = [], []
    for row in rows:
        row = dict(row)
        step_s = float(row.pop("step_s", 1.0))  # type: ignore[arg-type]
        samples = int(row.get("per_device_batch_size", 8))  # type: ignore[arg-type]
        runs.append(row)
        n = int(row["world_size"])  # type: ignore[arg-type]
        parts.append(make_steps(str(row["run_id"]), world_size=n, step_s=step_s, samples=samples))
    return make_runs(runs), pd.concat(parts, ignore_index=True)


# --- 1. repeats agree on every config field but the axis, seeds, names and timeouts -------------


def test_allreduce_and_fp16_hook_at_the_same_size_are_two_points() -> None:
    runs, steps = study(
        [
            {"run_id": "ar-a", "world_size": 4, "comm_hook": "allreduce", "seed": 0},
            {
                "run_id": "ar-b",
                "world_size": 4,
                "comm_hook": "allreduce",
                "seed": 1,
                "master_port": 29600,
                "sweep": "other",
                "step_s": 2.0,
            },
            {"run_id": "fp16", "world_size": 4, "comm_hook": "fp16", "step_s": 0.5},
        ]
    )
    # The store's summary figures differ per run and are no config: they never split a point.
    runs["samples_per_s"] = [1.0, 2.0, 3.0]
    runs["profile_steps"] = [[3, 4], [3, 4], [3, 4]]  # a list, as JSON gives it back
    t = scaling_table(runs, steps).set_index("comm_hook")
    assert t["runs"].to_dict() == {"allreduce": 2, "fp16": 1}
    # 4 ranks x 8 samples = 32 per step: 32 and 16 samples/s (mean 24), and 64 for fp16.
    assert t.loc["allreduce", "samples_per_s"] == pytest.approx(24.0)
    assert t.loc["fp16", "samples_per_s"] == pytest.approx(64.0)
    keys = resolve_group_by(runs)
    assert "comm_hook" in keys and "profile_steps" in keys
    assert not {"seed", "master_port", "sweep", "run_id", "samples_per_s"} & set(keys)


def test_acceptance_hooks_are_two_points_and_a_mixed_study_keeps_both_families(
    tmp_path: Path,
) -> None:
    """Issue 11's acceptance item, through the store (RunConfig records, load_runs). Weak, 8
    per device: allreduce at N=1 (1.0 s steps: 8 samples/s) and N=4 (1.6 s: 32/1.6 = 20), the
    fp16 hook at N=1 (8) and N=4 (1.25 s: 25.6). Strong, global batch 64 given: N=1 (4.0 s:
    16 samples/s) and N=4 (16 per device, 1.6 s: 40)."""
    no_evals = pd.DataFrame(columns=list(EVAL_COLUMNS)).astype(EVAL_COLUMNS)
    points = [  # run, world size, hook, batch given, samples per rank, step seconds
        ("ar1", 1, "allreduce", {"per_device_batch_size": 8}, 8, 1.0),
        ("ar4", 4, "allreduce", {"per_device_batch_size": 8}, 8, 1.6),
        ("fp1", 1, "fp16", {"per_device_batch_size": 8}, 8, 1.0),
        ("fp4", 4, "fp16", {"per_device_batch_size": 8}, 8, 1.25),
        ("g1", 1, "allreduce", {"global_batch_size": 64}, 64, 4.0),
        ("g4", 4, "allreduce", {"global_batch_size": 64}, 16, 1.6),
    ]
    for run, n, hook, batch, samples, step_s in points:
        steps = make_steps(run, world_size=n, samples=samples, step_s=step_s)
        write_run(tmp_path, "acc", run, steps, no_evals, world_size=n, comm_hook=hook, **batch)
    runs = load_runs(tmp_path, ["acc"])
    steps = load_traces(runs["path"], "steps")
    with pytest.warns(ScalingFamilyWarning, match=r"weak scaling .*8.* strong scaling .*64"):
        t = scaling_table(runs, steps)
    assert t["runs"].tolist() == [1] * 6  # never one point with runs=2
    got = {
        (s, hook, n): (thr, speedup)
        for s, hook, n, thr, speedup in zip(
            t["scaling"],
            t["comm_hook"],
            t["world_size"],
            t["samples_per_s"],
            t["speedup"],
            strict=True,
        )
    }
    assert got.keys() == {
        ("weak", "allreduce", 1),
        ("weak", "allreduce", 4),
        ("weak", "fp16", 1),
        ("weak", "fp16", 4),
        ("strong", "allreduce", 1),
        ("strong", "allreduce", 4),
    }
    assert got[("weak", "allreduce", 4)] == pytest.approx((20.0, 2.5))
    assert got[("weak", "fp16", 4)] == pytest.approx((25.6, 3.2))
    assert got[("strong", "allreduce", 1)] == pytest.approx((16.0, 1.0))
    assert got[("strong", "allreduce", 4)] == pytest.approx((40.0, 2.5))


def test_a_strong_grid_from_the_store_is_strong_only(tmp_path: Path) -> None:
    # Global batches 64 and 128 at N=1 and 2: 128 at N=2 has the per-device batch (64) of 64 at
    # N=1, a weak curve by coincidence. The configs gave the global batch (RunConfig records the
    # per-device one as derived), so there are two strong curves and nothing else.
    no_evals = pd.DataFrame(columns=list(EVAL_COLUMNS)).astype(EVAL_COLUMNS)
    for g in (64, 128):
        for n in (1, 2):
            name = f"g{g}-n{n}"
            steps = make_steps(name, world_size=n, samples=g // n)
            write_run(tmp_path, "s", name, steps, no_evals, world_size=n, global_batch_size=g)
    runs = load_runs(tmp_path, ["s"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = scaling_table(runs, load_traces(runs["path"], "steps"))
    assert sorted(zip(t["scaling"], t["fixed_batch_size"], t["world_size"], strict=True)) == [
        ("strong", 64, 1),
        ("strong", 64, 2),
        ("strong", 128, 1),
        ("strong", 128, 2),
    ]


def test_every_speed_or_maths_field_splits_groups() -> None:
    runs = make_runs([{"run_id": "r", "world_size": 1}])
    for name, value in {
        "strategy": "ddp",
        "gradient_accumulation_steps": 1,
        "model_options.d_model": 64,
        "dataset_options.path": "x",
        "bucket_cap_mb": 25.0,
        "static_graph": False,
        "gradient_as_bucket_view": False,
        "find_unused_parameters": False,
        "lr_scaling": "none",
        "threads_per_rank": 1,
        "device": "cpu",
        "backend": "gloo",
        "trace_comm": "sampled",
        "checkpoint_every_steps": 0,
        "eval_every_epochs": 1,
        "timeout_min": 60.0,
        "seed": 3,
        "tasks_per_node": 1,
    }.items():
        runs[name] = value
    cols = config_columns(runs)
    assert cols[:5] == ["model", "precision", "optimizer", "learning_rate", "train_samples"]
    for name in ("strategy", "model_options.d_model", "dataset_options.path", "trace_comm"):
        assert name in cols
    assert not {"timeout_min", "seed", "tasks_per_node", "world_size", "nodes"} & set(cols)


def test_a_field_that_differs_splits_even_when_rarely_varied() -> None:
    runs, steps = study(
        [
            {"run_id": "a", "world_size": 2, "bucket_cap_mb": 25.0},
            {"run_id": "b", "world_size": 2, "bucket_cap_mb": 1.0},
        ]
    )
    assert scaling_table(runs, steps)["runs"].tolist() == [1, 1]


# --- 2. weak and strong families ----------------------------------------------------------------


def mixed_study() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Weak: per-device batch 32 at N=1, 2, 4 (32, 51.2 and 80 samples/s). Strong: global batch
    128 at N=1 (per-device 128, 3.2 s: 40 samples/s), N=2 (per-device 64, 2 s: 64 samples/s) and
    N=4, which is the weak family's N=4 run (per-device 32, global 128)."""
    return study(
        [
            {"run_id": "w1", "world_size": 1, "per_device_batch_size": 32, "step_s": 1.0},
            {"run_id": "w2", "world_size": 2, "per_device_batch_size": 32, "step_s": 1.25},
            {"run_id": "w4", "world_size": 4, "per_device_batch_size": 32, "step_s": 1.6},
            {"run_id": "s1", "world_size": 1, "per_device_batch_size": 128, "step_s": 3.2},
            {"run_id": "s2", "world_size": 2, "per_device_batch_size": 64, "step_s": 2.0},
        ]
    )


def test_a_mixed_study_keeps_both_families_and_warns() -> None:
    runs, steps = mixed_study()
    with pytest.warns(ScalingFamilyWarning, match=r"weak scaling .*32.* strong scaling .*128"):
        t = scaling_table(runs, steps)
    weak = t[t["scaling"] == "weak"].set_index("world_size")
    strong = t[t["scaling"] == "strong"].set_index("world_size")
    assert weak["fixed_batch_size"].tolist() == [32] * 3
    assert weak["samples_per_s"].tolist() == pytest.approx([32.0, 51.2, 80.0])
    assert weak["speedup"].tolist() == pytest.approx([1.0, 1.6, 2.5])
    assert strong["fixed_batch_size"].tolist() == [128] * 3
    assert strong["per_device_batch_size"].tolist() == [128, 64, 32]
    assert strong["samples_per_s"].tolist() == pytest.approx([40.0, 64.0, 80.0])
    assert strong["speedup"].tolist() == pytest.approx([1.0, 1.6, 2.0])
    assert strong.loc[4, "runs"] == 1  # the crossing run counts once in each family
    with pytest.warns(ScalingFamilyWarning):
        per_run = run_table(runs, steps)
    assert sorted(per_run.loc[per_run["run_id"] == "w4", "scaling"]) == ["strong", "weak"]


def test_missing_config_values_group_as_themselves() -> None:
    # A store's runs frame holds None (no fault) and NaN (an unset option) on every run: the
    # families are those of the mixed study, unchanged.
    runs, steps = mixed_study()
    runs["fault"] = None
    runs["lr_reference_batch"] = np.nan
    with pytest.warns(ScalingFamilyWarning):
        t = scaling_table(runs, steps)
    assert sorted(zip(t["scaling"], t["world_size"], strict=True)) == [
        ("strong", 1),
        ("strong", 2),
        ("strong", 4),
        ("weak", 1),
        ("weak", 2),
        ("weak", 4),
    ]


def test_a_grid_of_sizes_and_per_device_batches_is_weak_only() -> None:
    # 32 per device at N=2 has the global batch (64) of 64 per device at N=1: by coincidence,
    # not a strong-scaling study. Every run already lies on a weak curve: no strong one, no warning.
    runs, steps = study(
        [
            {"run_id": f"b{b}-n{n}", "world_size": n, "per_device_batch_size": b}
            for b in (32, 64)
            for n in (1, 2)
        ]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = scaling_table(runs, steps)
    assert set(t["scaling"]) == {"weak"} and len(t) == 4
    assert sorted(t["fixed_batch_size"]) == [32, 32, 64, 64]


def test_the_family_a_config_asked_for_wins() -> None:
    # derived (as RunConfig records it): the global batch was derived, so the per-device batch
    # was given (weak), or the other way round (strong).
    runs, steps = study(
        [
            {"run_id": f"b{b}-n{n}", "world_size": n, "per_device_batch_size": b}
            for b in (32, 64)
            for n in (1, 2)
        ]
    )
    runs["derived"] = [["global_batch_size"]] * 4
    assert set(scaling_table(runs, steps)["scaling"]) == {"weak"}
    runs["derived"] = [["per_device_batch_size"]] * 4  # all asked for strong scaling
    t = scaling_table(runs, steps)
    # global batch 32 (N=1 only), 64 (N=1 with 64, N=2 with 32), 128 (N=2 only)
    assert sorted(zip(t["fixed_batch_size"], t["world_size"], strict=True)) == [
        (32, 1),
        (64, 1),
        (64, 2),
        (128, 2),
    ]
    assert set(t["scaling"]) == {"strong"}
    curve = t[t["fixed_batch_size"] == 64].set_index("world_size")
    # 64 samples per 1 s step at both sizes (64 x 1 rank, 32 x 2 ranks): speedup 1, ideal 2
    assert curve.loc[2, "speedup"] == pytest.approx(1.0)
    assert curve.loc[2, "efficiency"] == pytest.approx(0.5)


def test_one_family_does_not_warn() -> None:
    runs, steps = mixed_study()
    weak_only = runs[runs["run_id"].str.startswith("w")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = scaling_table(weak_only, steps)
    assert set(t["scaling"]) == {"weak"}


def test_an_explicit_grouping_that_mixes_batches_is_labelled_and_warns() -> None:
    runs, steps = mixed_study()
    with pytest.warns(ScalingFamilyWarning, match="mixed"):
        t = scaling_table(runs, steps, group_by=["model"])
    assert set(t["scaling"]) == {"mixed"}
    one = runs[runs["run_id"].isin(["s1", "s2"])]
    assert scaling_table(one, steps, group_by=["model"])["scaling"].tolist() == ["strong"] * 2


# --- 3. the speedup's error, from both ends ---------------------------------------------------


def test_speedup_error_propagates_both_ends() -> None:
    # N=1: 8 samples per step in 1.0 and 0.8 s: 8 and 10 samples/s (mean 9, std sqrt(2)).
    # N=2: 16 samples per step in 16/14 and 16/18 s: 14 and 18 samples/s (mean 16, std sqrt(8)).
    runs, steps = study(
        [
            {"run_id": "a1", "world_size": 1, "step_s": 1.0, "seed": 0},
            {"run_id": "b1", "world_size": 1, "step_s": 0.8, "seed": 1},
            {"run_id": "a2", "world_size": 2, "step_s": 16 / 14, "seed": 0},
            {"run_id": "b2", "world_size": 2, "step_s": 16 / 18, "seed": 1},
        ]
    )
    t = scaling_table(runs, steps).set_index("world_size")
    assert t.loc[2, "speedup"] == pytest.approx(16 / 9)
    # speedup * sqrt((sN/mN)^2 + (sB/mB)^2) = 16/9 * sqrt(8/256 + 2/81)
    want = 16 / 9 * np.sqrt(1 / 32 + 2 / 81)
    assert t.loc[2, "speedup_std"] == pytest.approx(want)
    assert t.loc[2, "efficiency_std"] == pytest.approx(want / 2)
    assert np.isnan(t.loc[1, "speedup_std"])  # the base: 1 by definition


# --- 4. the slowest rank's evaluation ------------------------------------------------------------


def one_evaluation(rank1_broadcast: float) -> pd.DataFrame:
    """Rank 0 predicts everything (1.0 s) and computes the metric (0.01 s); rank 1 waits in the
    broadcast for ``rank1_broadcast`` seconds (eval_on="rank0")."""
    base = {"run_id": "e", "world_size": 2, "attempt": 0, "epoch": 0, "step": 5, "t_start_s": 5.0}
    base.update(samples=0, metric_name="accuracy", metric_value=0.5, loss=0.5, gather_s=0.0)
    base.update(wait_s=0.0)
    rows = [
        {**base, "rank": 0, "predict_s": 1.0, "metric_s": 0.01, "broadcast_s": 0.0, "samples": 64},
        {**base, "rank": 1, "predict_s": 0.0, "metric_s": 0.0, "broadcast_s": rank1_broadcast},
    ]
    for row in rows:
        row["eval_s"] = row["predict_s"] + row["gather_s"] + row["metric_s"] + row["broadcast_s"]
        row["eval_s"] += row["wait_s"]
    return pd.DataFrame(rows).astype(EVAL_COLUMNS)


def test_slowest_rank_stack_comes_from_one_rank() -> None:
    e = eval_breakdown(one_evaluation(1.02)).iloc[0]
    # Maxima of different ranks would stack 1.0 + 0.01 + 1.02 = 2.03 s for a 1.02 s evaluation.
    assert e["slowest_rank"] == 1
    parts = [e[f"{p}_slowest"] for p in ("predict_s", "gather_s", "metric_s", "broadcast_s")]
    assert parts == pytest.approx([0.0, 0.0, 0.0, 1.02])
    assert sum(parts) == pytest.approx(e["eval_s_slowest"]) and e["eval_s_slowest"] == 1.02
    assert e["samples"] == 64  # rank 0 predicted all 64; rank 1 none: counted once
    tie = eval_breakdown(one_evaluation(1.01)).iloc[0]
    assert tie["slowest_rank"] == 0  # equal: the lowest rank
    assert tie["predict_s_slowest"] + tie["metric_s_slowest"] == pytest.approx(1.01)
    assert tie["broadcast_s_slowest"] == 0.0


# --- 5. time to quality across attempts -------------------------------------------------------


def resumed_run() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Attempt 0: steps 1-6 of 1 s, rank 1 running 0.5 s behind, so its last step ends at
    5 + 1 + 0.5 = 6.5 s; an evaluation after step 4 (starts 4.0 s, 0.75 s on rank 0: ends 4.75)
    reaches 0.5. Attempt 1 (its own clock from 0): steps 7-10, and an evaluation after its fourth
    step (starts 4.0 s, ends 4.75 s) reaching 0.8."""
    first = make_steps("r", world_size=2, n_steps=6)
    first.loc[first["rank"] == 1, "t_start_s"] += 0.5
    second = make_steps("r", world_size=2, n_steps=4, warmup_steps=1, attempt=1)
    second["step"] += 6
    e0 = make_evals("r", 2, eval_steps=(4,), metric_values=(0.5,))
    e1 = make_evals("r", 2, eval_steps=(4,), metric_values=(0.8,)).assign(step=10, attempt=1)
    runs = make_runs([{"run_id": "r", "world_size": 2}])
    return runs, pd.concat([first, second]), pd.concat([e0, e1], ignore_index=True)


def test_time_to_quality_offsets_attempts_by_their_last_step_end() -> None:
    runs, steps, evals = resumed_run()
    rows = eval_rows(evals, steps)
    # 4.75 + 6.5 (attempt 0's last step end), not 4.75 + 4.75 (its last evaluation's end)
    assert rows["time_s"].tolist() == pytest.approx([4.75, 11.25])
    assert np.isnan(eval_rows(evals)["time_s"].iloc[1])  # without steps: unknown, not guessed
    t = scaling_table(runs, steps, evals, target_metric=0.8)
    assert t["time_to_quality_s"].tolist() == pytest.approx([11.25])


def test_an_evaluation_after_an_attempts_last_step_moves_the_next_attempt() -> None:
    runs, steps, evals = resumed_run()
    # Attempt 0 also evaluates after step 6: starts 6.0 s, ends 6.75 s, after its last step's
    # end (6.5 s). Attempt 1 starts at 6.75, so its evaluation ends at 6.75 + 4.75 = 11.5 s,
    # never before one of attempt 0's.
    late = make_evals("r", 2, eval_steps=(6,), metric_values=(0.6,))
    evals = pd.concat([evals, late], ignore_index=True)
    rows = eval_rows(evals, steps)
    assert rows["time_s"].tolist() == pytest.approx([4.75, 6.75, 11.5])


def test_an_attempt_without_evaluations_still_counts() -> None:
    runs, steps, evals = resumed_run()
    third = make_steps("r", world_size=2, n_steps=3, warmup_steps=0, attempt=2)  # ends at 3.0
    third["step"] += 10
    evals = evals.copy()
    evals.loc[evals["attempt"] == 1, "attempt"] = 2  # the evaluation moves to attempt 2
    steps = pd.concat([steps, third])
    # attempt 2 starts after 6.5 (attempt 0) + 4.0 (attempt 1, no evaluation) = 10.5 s
    assert eval_rows(evals, steps)["time_s"].tolist() == pytest.approx([4.75, 15.25])


# --- 6. the scaling model ----------------------------------------------------------------------


def model_study() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Weak family, per-device batch 8: N=1 twice (1.0 and 1.2 s per step: 8 and 20/3
    samples/s, mean 22/3), N=2 (1.25 s, 1e6 gradient bytes). Strong family, global batch 16:
    N=1 (per-device 16, 2.0 s) and the same N=2 run. A failed N=2 run with absurd traces must
    change nothing."""
    runs, steps = study(
        [
            {"run_id": "w1a", "world_size": 1, "step_s": 1.0, "seed": 0},
            {"run_id": "w1b", "world_size": 1, "step_s": 1.2, "seed": 1},
            {"run_id": "x2", "world_size": 2, "step_s": 1.25},
            {"run_id": "s1", "world_size": 1, "per_device_batch_size": 16, "step_s": 2.0},
            {"run_id": "bad", "world_size": 2, "step_s": 10.0, "seed": 9},
        ]
    )
    runs.loc[runs["run_id"] == "bad", "status"] = "failed"
    steps.loc[steps["run_id"] == "bad", "comm_bytes"] = 10**12
    return runs, steps


def test_model_weak_and_strong_from_the_mean_base() -> None:
    runs, steps = model_study()
    with pytest.warns(ScalingFamilyWarning):
        pvm = predicted_vs_measured(runs, steps, SLOW_NET, world_sizes=[4])
    weak = pvm[pvm["scaling"] == "weak"].set_index("world_size")
    strong = pvm[pvm["scaling"] == "strong"].set_index("world_size")
    # Weak: the base is the mean of its two repeats, 22/3 samples/s, i.e. 8 / (22/3) = 12/11 s
    # of compute per step (not one run's 1.0 s). Ring 2 (N-1)/N * 1e6 B / 1e6 B/s: 1 s at N=2,
    # 1.5 s at N=4, so steps of 12/11, 23/11 and 57/22 s. Throughput 8 N / step: 22/3, 176/23,
    # 704/57; speedup over 22/3: 1, 24/23, 32/19.
    assert weak["base_run_id"].iloc[0] == "w1a, w1b"
    assert weak["predicted_step_s"].tolist() == pytest.approx([12 / 11, 23 / 11, 57 / 22])
    assert weak["predicted_speedup"].tolist() == pytest.approx([1.0, 24 / 23, 32 / 19])
    # measured: N=2 at 16 / 1.25 = 12.8 samples/s over the same base 22/3: 96/55
    assert weak.loc[2, "measured_speedup"] == pytest.approx(96 / 55)
    assert weak.loc[1, "relative_error"] == pytest.approx(0.0, abs=1e-12)
    assert weak.loc[2, "relative_error"] == pytest.approx((176 / 23) / 12.8 - 1)
    # Strong: compute 2.0 s at N=1 shrinks as 1/N: 1.0 + 1.0 at N=2, 0.5 + 1.5 at N=4; 16
    # samples per step throughout, so 8 samples/s everywhere: speedup 1.
    assert strong["predicted_step_s"].tolist() == pytest.approx([2.0, 2.0, 2.0])
    assert strong["predicted_samples_per_s"].tolist() == pytest.approx([8.0, 8.0, 8.0])
    assert strong["predicted_speedup"].tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert strong.loc[2, "measured_speedup"] == pytest.approx(12.8 / 8)
    assert "bad" not in " ".join(pvm["base_run_id"])


def test_model_time_basis_is_the_wall_step() -> None:
    # Steps start 1 s apart but trace 0.8 s each: the window runs from step 3's start (2 s) to
    # step 10's end (9.8 s), 7.8 s for 8 measured steps: 0.975 s per step, not 0.8.
    steps = make_steps("gap", world_size=1, step_s=1.0).assign(step_s=0.8)
    pred = predict_scaling(steps, SLOW_NET, [1, 2], gradient_bytes=1e6)
    assert pred["step_s"].tolist() == pytest.approx([0.975, 1.975])
    assert pred["samples_per_s"].tolist() == pytest.approx([8 / 0.975, 16 / 1.975])


def test_model_without_a_network_fit_says_why() -> None:
    runs, steps = model_study()
    runs = runs[runs["run_id"] != "s1"]
    pvm = predicted_vs_measured(runs, steps)  # one multi-rank size: no fit
    assert pvm["predicted_speedup"].isna().all() and pvm["network"].isna().all()
    assert pvm["note"].str.contains("3 or more world sizes").all()
    assert pvm["measured_speedup"].notna().all()


def test_network_fit_pools_only_completed_runs_of_one_node_count() -> None:
    parts, rows = [], []
    for n in (2, 4, 8):  # ring time at 1e9 B/s, no latency: 2 (n-1)/n * 1e8 B
        comm = 2 * (n - 1) / n * 1e8 / 1e9
        parts.append(make_steps(f"n{n}", world_size=n, comm_s=comm, comm_bytes=100_000_000))
        rows.append({"run_id": f"n{n}", "world_size": n})
    parts.append(make_steps("bad", world_size=16, comm_s=50.0, comm_bytes=100_000_000))
    rows.append({"run_id": "bad", "world_size": 16, "status": "failed"})
    runs, steps = make_runs(rows), pd.concat(parts)
    fit = fit_network(steps, runs)
    assert fit.model is not None and fit.world_sizes == (2, 4, 8)
    assert fit.model.bandwidth_bytes_per_s == pytest.approx(1e9)
    assert fit_network(steps).world_sizes == (2, 4, 8, 16)  # no runs frame: no status known
    runs.loc[runs["run_id"] == "n8", "nodes"] = 2
    split = fit_network(steps, runs)
    assert split.model is None and "span 1, 2 nodes" in split.note


def test_network_fit_reports_its_residual() -> None:
    # N = 2, 4, 8, 1e8 bytes, 1 bucket: columns u = 2 (N-1)/N * 1e8 = 1e8 * (1, 1.5, 1.75) and
    # v = 2 (N-1) = (2, 6, 14). r = (1, 1.5, 1.75) x (2, 6, 14) = (10.5, -10.5, 3) is orthogonal
    # to both, so comm = u / 1e9 + v * 1e-4 + 1e-4 r fits back to 1e9 B/s and 1e-4 s, and the
    # residual is 1e-4 r: RMS sqrt((2 * 1.05e-3^2 + 3e-4^2) / 3).
    extra = {2: 1.05e-3, 4: -1.05e-3, 8: 3e-4}
    parts = []
    for n, r in extra.items():
        comm = 2 * (n - 1) / n * 1e8 / 1e9 + 2 * (n - 1) * 1e-4 + r
        steps = make_steps(f"n{n}", world_size=n, comm_s=comm, comm_bytes=100_000_000)
        steps.loc[steps["rank"] == 1, "comm_s"] += 0.05  # waits: the fit takes the smallest
        parts.append(steps)
    fit = fit_network(pd.concat(parts))
    assert fit.model is not None
    assert fit.model.bandwidth_bytes_per_s == pytest.approx(1e9)
    assert fit.model.latency_s == pytest.approx(1e-4)
    assert fit.residual_s == pytest.approx(np.sqrt((2 * 1.05e-3**2 + 3e-4**2) / 3))


def three_sizes(comm: dict[int, float], nbytes: int) -> pd.DataFrame:
    """One run per world size in ``comm`` (its comm_s), ``nbytes`` of gradients, one bucket."""
    return pd.concat(
        [make_steps(f"n{n}", world_size=n, comm_s=c, comm_bytes=nbytes) for n, c in comm.items()]
    )


def test_network_fit_fixes_a_negative_latency_at_zero() -> None:
    # comm = u / 1e9 - 1e-4 v (u = 2 (N-1)/N * 1e8, v = 2 (N-1)): 0.0998, 0.1494, 0.1736 s at
    # N = 2, 4, 8. The free fit says latency -1e-4 s; with it fixed at 0, seconds per byte
    # = sum(u y) / sum(u^2) = (0.0998 + 1.5 * 0.1494 + 1.75 * 0.1736) / (6.3125e8).
    fit = fit_network(three_sizes({2: 0.0998, 4: 0.1494, 8: 0.1736}, 100_000_000))
    assert fit.model is not None and fit.model.latency_s == 0.0
    per_byte = (0.0998 + 1.5 * 0.1494 + 1.75 * 0.1736) / 6.3125e8
    assert fit.model.bandwidth_bytes_per_s == pytest.approx(1 / per_byte)
    assert "latency came out negative" in fit.note and np.isfinite(fit.residual_s)


def test_network_fit_refuses_a_non_positive_bandwidth() -> None:
    # 1e6 bytes: comm = -1e-8 u + 1e-2 v = 0.01, 0.045, 0.1225 s fits exactly with a negative
    # seconds-per-byte: more bytes taking no longer is no ring, so there is no fit.
    fit = fit_network(three_sizes({2: 0.01, 4: 0.045, 8: 0.1225}, 1_000_000))
    assert fit.model is None and "non-positive" in fit.note and fit.world_sizes == (2, 4, 8)


def test_a_configs_node_counts_are_one_model_curve() -> None:
    # One config at 1 rank, 2 ranks on one node and 4 ranks on 2 nodes: one curve, based on the
    # 1-rank run (compute 1.0 s), each point with its link class. On a 1e6 B/s network with no
    # exposed timer (no overlap): 1e6 bytes take 2 (N-1)/N s, 1.0 s at N=2 and 1.5 s at N=4:
    # steps 2.0 and 2.5 s, speedups 16 / 2 / 8 = 1.0 and 32 / 2.5 / 8 = 1.6; measured 4 ranks
    # at 2.0 s: 16/s, speedup 2.0 over the same base.
    runs, steps = study(
        [
            {"run_id": "a1", "world_size": 1},
            {"run_id": "a2", "world_size": 2, "step_s": 1.25},
            {"run_id": "b4", "world_size": 4, "nodes": 2, "step_s": 2.0},
        ]
    )
    pvm = predicted_vs_measured(runs, steps, SLOW_NET).set_index(["nodes", "world_size"])
    assert set(pvm["base_world_size"]) == {1} and set(pvm["base_run_id"]) == {"a1"}
    assert pvm["link_class"].tolist() == ["none", "intra-node", "inter-node"]
    assert pvm["predicted_step_s"].tolist() == pytest.approx([1.0, 2.0, 2.5])
    assert pvm["predicted_speedup"].tolist() == pytest.approx([1.0, 1.0, 1.6])
    assert pvm.loc[(2, 4), "measured_speedup"] == pytest.approx(2.0)
    table = scaling_table(runs, steps)
    assert table["link_class"].tolist() == ["none", "intra-node", "inter-node"]
    assert set(table["base_world_size"]) == {1}
    assert table["speedup"].tolist() == pytest.approx([1.0, 16 / 1.25 / 8, 2.0])


def test_no_evaluations_frame_is_fine() -> None:
    runs, steps = study([{"run_id": "a", "world_size": 1}])
    empty = pd.DataFrame(columns=list(EVAL_COLUMNS))
    assert scaling_table(runs, steps, empty)["runs"].tolist() == [1]
