"""Measuring until known (``RunConfig.until_known``), against known answers.

The rule (``workbench.trace.known``) on step times drawn from a known distribution, so the true
mean is known and the interval's coverage can be counted: independent steps and steps
correlated as a first-order autoregression (a slow stretch lasts several steps), each stopped
at the first check where its interval is narrow enough, as a run does. A planted +10 % change is
resolved and a planted no-op is not. Then real runs through the CLI: every rank stops at the
same step, the step after which the interval was narrow enough, the evaluation after the loop
still runs, and the terminal says how well the run is known.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from workbench.store.load import load_traces
from workbench.trace import known

from .test_cli import workbench

TRUE_STEP_S = 0.05


def steps_drawn(rng: np.random.Generator, n: int, phi: float, cv: float = 0.2) -> np.ndarray:
    """``n`` step times of mean ``TRUE_STEP_S`` and spread ``cv`` of it; each step's noise
    ``phi`` times the previous one's plus a fresh part (an AR(1) process; 0: independent)."""
    fresh = rng.normal(0.0, 1.0, n)
    noise = np.empty(n)
    noise[0] = fresh[0]
    for i in range(1, n):
        noise[i] = phi * noise[i - 1] + np.sqrt(1 - phi**2) * fresh[i]
    return TRUE_STEP_S * (1 + cv * noise)


def run_until_known(times: np.ndarray, within: float) -> tuple[int, known.Verdict]:
    """The rule as a run applies it: a look every ``CHECK_EVERY`` steps, stop on "known"."""
    for n in range(known.CHECK_EVERY, len(times) + 1, known.CHECK_EVERY):
        v = known.verdict(times[:n], within, 0.0, 1e9, n == len(times))
        if v.stop:
            return n, v
    raise AssertionError("the step cap must stop it")


@pytest.mark.parametrize("phi", [0.0, 0.5], ids=["independent", "autocorrelated"])
def test_the_interval_a_run_stops_on_covers_the_true_mean(phi: float) -> None:
    """Over 100 runs each (a fixed seed), the 95 % interval at the stop holds the true mean
    step time in at least 90 % of them, and each stopped known to +-3 % as asked. The plain
    standard error of the steps would not do it for correlated steps: its coverage is counted
    too, and must be below the batch means' (so this test tells the methods apart)."""
    rng = np.random.default_rng(7)
    covered = naive_covered = 0
    runs = 100
    for _ in range(runs):
        times = steps_drawn(rng, 6000, phi)
        n, v = run_until_known(times, 0.03)
        e = v.estimate
        assert v.stop == "known" and e is not None and e.half_width <= 0.03, (n, v)
        covered += e.low_s <= TRUE_STEP_S <= e.high_s
        used = times[v.warmup : n]
        naive = 1.96 * used.std(ddof=1) / np.sqrt(len(used))
        naive_covered += abs(used.mean() - TRUE_STEP_S) <= naive
    assert covered >= 0.9 * runs, f"coverage {covered}/{runs} (phi {phi})"
    if phi:
        assert naive_covered < covered, (naive_covered, covered)


def test_a_planted_ten_percent_change_is_resolved_and_a_no_op_is_not() -> None:
    """Two runs each known to +-2 %: one 10 % slower is told apart in every one of 20 pairs;
    two of the same speed are not told apart in at least 18 of 20 (a 95 % interval)."""
    rng = np.random.default_rng(11)
    told_change = told_no_op = 0
    for _ in range(20):
        base = run_until_known(steps_drawn(rng, 8000, 0.5), 0.02)[1].estimate
        slower = run_until_known(steps_drawn(rng, 8000, 0.5) * 1.10, 0.02)[1].estimate
        same = run_until_known(steps_drawn(rng, 8000, 0.5), 0.02)[1].estimate
        assert base is not None and slower is not None and same is not None
        _, lo, hi = known.ratio_interval(
            slower.mean_s, slower.half_width, base.mean_s, base.half_width
        )
        told_change += known.resolved(lo, hi)
        _, lo, hi = known.ratio_interval(same.mean_s, same.half_width, base.mean_s, base.half_width)
        told_no_op += known.resolved(lo, hi)
    assert told_change == 20 and told_no_op <= 2, (told_change, told_no_op)


def test_warm_up_is_found_in_the_steps() -> None:
    """Ten steps three times the steady state, then steady: the ten are left out."""
    rng = np.random.default_rng(3)
    times = np.concatenate([np.full(10, 3 * TRUE_STEP_S), steps_drawn(rng, 300, 0.0, cv=0.05)])
    assert known.warmup_count(times) == 10
    v = known.verdict(times, 0.05, 0.0, 1e9, False)
    assert v.warmup == 10 and v.estimate is not None
    assert v.estimate.low_s <= TRUE_STEP_S <= v.estimate.high_s


PLANTED = ["run", "--model", "planted", "--world-size", "2", "--executor", "pool"]


@pytest.mark.slow
def test_a_run_stops_on_every_rank_once_known_and_says_how_well(tmp_path: Path) -> None:
    """The planted model at 2 ranks, until known to +-5 %: both ranks' last step is the one
    the run recorded, a multiple of the checks' spacing, before the 2,000-step cap; the run is
    known to +-5 % there; the evaluation after the loop ran at that step; the terminal gives the
    throughput's interval and how the run ended. The same run asked for +-0.1 % within 3 s
    stops at its time cap and says so."""
    done = workbench(
        *PLANTED, "--until-known", "5%", "--run-name", "k", "--output-dir", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "default" / "k"
    record = json.loads((run / "run.json").read_text())["until_known"]
    assert record["stopped_by"] == "known" and record["half_width"] <= 0.05, record
    assert record["steps"] < record["cap_steps"] == 2000
    assert record["steps"] % known.CHECK_EVERY == 0
    steps = load_traces(run, "steps")
    assert steps.groupby("rank")["step"].max().tolist() == [record["steps"]] * 2
    assert load_traces(run, "eval")["step"].max() == record["steps"]
    assert re.search(r"throughput: [\d,]+ samples/s \([\d,]+-[\d,]+, 95 %\)", done.stdout)
    line = "measured until known (+-5 %): known to +-"
    assert line in done.stdout and f"after {record['steps']:,} steps" in done.stdout

    capped = workbench(
        *PLANTED, "--until-known", "0.1%", "--until-known-max-s", "3", "--run-name", "cap",
        "--output-dir", str(tmp_path),
    )  # fmt: skip
    assert capped.returncode == 0, capped.stderr[-3000:]
    record = json.loads((tmp_path / "default" / "cap" / "run.json").read_text())["until_known"]
    assert record["stopped_by"] == "time cap" and record["half_width"] > 0.001, record
    assert "(+-0.1 %): known to +-" in capped.stdout
    assert "only: time cap of 3 s" in capped.stdout, capped.stdout


def test_launches_pool_their_own_intervals_or_their_spread() -> None:
    """Worked by hand: two launches that agree keep their own intervals in quadrature over
    their count; two that disagree take the Student t interval of their spread (12.71 for
    two); a point is launched again after one launch, not after two that agree within the
    goal, again after two that disagree, and never at the cap."""
    mean, half = known.pooled([100.0, 100.0], [0.02, 0.02])
    assert mean == 100.0 and half == pytest.approx((2 * 0.02**2) ** 0.5 / 2)
    mean, half = known.pooled([90.0, 110.0], [0.01, 0.01])
    assert half == pytest.approx(12.71 * (200**0.5) / 2**0.5 / 100)
    assert known.another_launch([100.0], [0.02], 0.05, 3)
    assert not known.another_launch([100.0, 100.0], [0.02, 0.02], 0.05, 3)
    assert known.another_launch([90.0, 110.0], [0.01, 0.01], 0.05, 3)
    assert not known.another_launch([90.0, 110.0, 100.0], [0.01] * 3, 0.05, 3)
    assert not known.another_launch([100.0], [0.02], 0.05, 1)


@pytest.mark.slow
def test_a_study_prints_each_speedup_with_its_interval(tmp_path: Path) -> None:
    """``workbench scale`` at 1 and 2 ranks, each run until known to +-5 % and each point
    launched twice (the cap: one launch cannot show the spread between launches): the finding's
    speedup is the mean training throughput (run.json) of the 2-rank launches over the 1-rank
    ones', its interval that ratio times 1 -+ both points' half-widths in quadrature, each
    point's the larger of its launches' own (in quadrature over 2) and the Student t interval
    of their spread (12.71 for two), all worked out here; and the verdict follows the interval
    (faster only when the interval is wholly above 1x)."""
    done = workbench(
        "scale", "--world-sizes", "1,2", "--model", "planted", "--until-known", "5%",
        "--until-known-launches", "2", "--executor", "pool", "--output-dir", str(tmp_path),
        "--sweep", "s",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    launches: dict[int, list[dict]] = {1: [], 2: []}
    for path in (tmp_path / "s").glob("*/run.json"):
        record = json.loads(path.read_text())
        assert record["until_known"]["stopped_by"] in ("known", "time cap"), record["until_known"]
        launches[record["config"]["world_size"]].append(record["summary"])
    assert [len(v) for v in launches.values()] == [2, 2]

    def point(runs: list[dict]) -> tuple[float, float]:
        rates = [r["train_samples_per_s"] for r in runs]
        mean = sum(rates) / 2
        own = (sum(r["samples_per_s_half_width"] ** 2 for r in runs)) ** 0.5 / 2
        spread = abs(rates[0] - rates[1]) / 2**0.5  # the standard deviation of two
        return mean, max(own, 12.71 * spread / 2**0.5 / mean)

    (one, h1), (two, h2) = point(launches[1]), point(launches[2])
    speedup, half = two / one, (h1**2 + h2**2) ** 0.5
    low, high = speedup * (1 - half), speedup * (1 + half)
    said = f"2 ranks: {speedup:.2f}x ({low:.2f}x-{high:.2f}x, 95 %, 2 launches against 2) the"
    assert said in done.stdout, done.stdout
    verdict = "faster than" if low > 1 else "slower than" if high < 1 else "not resolved"
    assert f"of ideal), {verdict}" in done.stdout, done.stdout
    assert "until known to +-5 %, at most 2,000 steps" in done.stdout


@pytest.mark.slow
def test_a_script_over_a_dataloader_stops_when_known_and_its_code_after_the_loop_runs(
    tmp_path: Path,
) -> None:
    """A torchrun-style script (DDP, a DataLoader, 40 epochs of 64 steps, then a checkpoint and
    its own print) at 2 ranks until known to +-10 %: its loop ends on every rank at the step the
    ranks agreed (a multiple of the looks' spacing, far before the 2,560 steps it asks for), its
    epochs after that are empty, its checkpoint is written and its lines are printed; the
    workbench's throughput is the script's own over the same steps within 2 % (the steps it
    measured: after its warm-up, and after any slow start it found in the steps)."""
    checkpoint, ends_file = tmp_path / "ckpt.pt", tmp_path / "ends.json"
    done = workbench(
        "run", "--script", "tests/scripts/epochs_then_checkpoint.py", "--world-size", "2",
        "--until-known", "10%", "--warmup-steps", "5", "--run-name", "s", "--output-dir",
        str(tmp_path), "--", "--epochs", "40", "--warmup", "5", "--checkpoint", str(checkpoint),
        "--step-ends", str(ends_file),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "default" / "s"
    record = json.loads((run / "run.json").read_text())
    until = record["until_known"]
    assert until["stopped_by"] == "known" and until["steps"] % known.CHECK_EVERY == 0, until
    logs = "".join(p.read_text() for p in (run / "logs").glob("*.out"))
    own_steps = re.search(r"^steps=(\d+)$", logs, re.M)
    assert own_steps and int(own_steps.group(1)) == until["steps"] < 2560, (until, logs[-2000:])
    assert checkpoint.exists() and f"checkpoint saved: {checkpoint}" in logs
    assert load_traces(run, "steps").groupby("rank")["step"].max().tolist() == [until["steps"]] * 2
    assert re.search(r"own_samples_per_s=[\d.]+", logs)
    # the script's own clock over the steps the workbench measured: its last `measured` ones
    ends, measured = json.loads(ends_file.read_text()), record["summary"]["measured_steps"]
    own = measured * 64 * 2 / (ends[-1] - ends[-1 - measured])
    assert record["summary"]["samples_per_s"] == pytest.approx(own, rel=0.02)
    assert "known to +-" in done.stdout and f"after {until['steps']:,} steps" in done.stdout
