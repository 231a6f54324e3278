"""Warm-up that outlasts the traced warm-up steps (DDP's bucket rebuild, the allocator growing)
is found in the data and left out of the window, and the window says how many steps it dropped."""

from __future__ import annotations

import pytest

from workbench.analysis import measured_window
from workbench.analysis.measured.windows import detected_warmup, warmup_once
from workbench.analysis.throughput.summary import per_rank_table, run_summary

from .frames import make_evals, make_steps


def test_a_slow_first_measured_step_is_warm_up_still() -> None:
    # 2 ranks, 10 steps of 1 s, 2 traced warm-up; step 3 takes 3 s (steps 4 on start 2 s
    # later). Steady state 1 s: step 3 is 200 % above, warm-up still. The window then runs
    # from step 4's start (5 s) to step 10's end (12 s): 7 steps x 16 samples in 7 s, 16/s
    # (the traced flag alone: 128 samples in 10 s, 12.8/s).
    steps = make_steps("r", world_size=2)
    steps.loc[steps["step"] == 3, "step_s"] = 3.0
    steps.loc[steps["step"] > 3, "t_start_s"] += 2.0
    w = measured_window(steps).iloc[0]
    assert w["steps"] == 7 and w["warmup_detected_steps"] == 1
    assert w["measured_s"] == pytest.approx(7.0)
    assert w["samples_per_s"] == pytest.approx(16.0)
    found = detected_warmup(steps)
    assert found[["run_id", "last_warmup_step", "dropped"]].values.tolist() == [["r", 3, 1]]


def test_steady_runs_and_noise_drop_nothing() -> None:
    steps = make_steps("r", world_size=2)
    steps.loc[steps["step"] == 3, "step_s"] = 1.4  # 40 % slower: within the tolerance (50 %)
    assert detected_warmup(steps).empty
    assert measured_window(steps).iloc[0]["warmup_detected_steps"] == 0
    # measured steps 3-10; steps 3-7 at 5 s: the steady state is the median of steps 7-10
    # (5, 1, 1, 1 s: 1 s), five leading steps are slow, and at most half of the eight (4) go
    slow = make_steps("s", world_size=1, n_steps=10)
    slow.loc[slow["step"] <= 7, "step_s"] = 5.0
    assert detected_warmup(slow)["dropped"].tolist() == [4]


def test_inside_warmup_once_each_frame_is_detected_once_and_by_itself() -> None:
    # r: step 3 at 3 s, warm-up still (dropped 1); s: steady, drops none. Inside the block the
    # same frame gets the same result object back; another frame (a slice of r's rows) its own.
    r = make_steps("r", world_size=2)
    r.loc[r["step"] == 3, "step_s"] = 3.0
    steady = r[r["step"] != 3]  # without the slow step: nothing to drop
    with warmup_once():
        first = detected_warmup(r)
        assert detected_warmup(r) is first
        assert first[["run_id", "last_warmup_step", "dropped"]].values.tolist() == [["r", 3, 1]]
        assert detected_warmup(steady).empty
        assert measured_window(r).iloc[0]["warmup_detected_steps"] == 1
    assert detected_warmup(r) is not first  # outside the block: computed again
    assert detected_warmup(r).equals(first)


def test_per_rank_samples_per_s_includes_the_gaps_like_the_run() -> None:
    # Steps start 1 s apart but trace 0.8 s each: a rank's window runs from step 3's start
    # (2 s) to step 10's end (9.8 s), 7.8 s for 8 steps x 8 samples: 64 / 7.8 per rank, and
    # the two ranks add up to the run's 128 / 7.8 (step_s alone would say 64 / 6.4 = 10/s).
    steps = make_steps("g", world_size=2).assign(step_s=0.8)
    table = per_rank_table(steps)
    assert table["samples_per_s"].tolist() == pytest.approx([64 / 7.8, 64 / 7.8])
    summary = run_summary(steps, make_evals("g", world_size=2).iloc[0:0])
    assert table["samples_per_s"].sum() == pytest.approx(summary["samples_per_s"])
