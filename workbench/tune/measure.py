"""A tune's short runs: the base's config made short, each candidate's interleaved pairs on
the warm pool, the gain's interval and verdict, the loss curves of both sides, and progress
(runs per minute, time left) before each run.

The gain of a candidate over the base is measured from ``repeats`` interleaved pairs (base,
candidate, base, candidate, ...: drift of a shared host hits both sides of a pair alike): per
pair the log of the throughput ratio, their mean and a Student t interval on it (95 %, n - 1
degrees of freedom), returned as ratios minus 1. A verdict is ``better`` only when the whole
interval is above 0 and the gain reaches :data:`~workbench.analysis.advice.candidates.NOISE`,
``worse`` the mirror image, ``same`` otherwise: a candidate must beat the noise, not only chance.
A change is confirmed before it is called: where the first set of pairs is ``better`` (or
``worse``), a second set of as many runs, and the verdict stands only when that set and all the
pairs together say the same (:func:`confirmed`). A 95 % interval alone calls a change that
changes nothing better once in forty tunes; a CI run saw it (+21 % for a setting the base
already had).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.advice.candidates import NOISE
from workbench.config.run_config import RunConfig
from workbench.run.launch import launch
from workbench.store.load import load_traces

#: Warm-up steps of a short run (left out of its throughput).
SHORT_WARMUP = 5

#: Student t's 97.5 % quantile by degrees of freedom (a 95 % two-sided interval); 1.96 past 30.
T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}
#: A tune's runs are compared at this quantile of their step times (see :func:`step_throughput`).
STEP_QUANTILE = 0.25
#: A run needs this many measured steps for a tune to start from it.
MIN_MEASURED_STEPS = 5


def t975(df: int) -> float:
    """Student t's 97.5 % quantile at ``df`` degrees of freedom (the next table entry below
    ``df``, so never too narrow)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be 1 or more, got {df}")
    if df > 30:
        return 1.96
    return T975[max(k for k in T975 if k <= df)]


def paired_gain(base: Sequence[float], candidate: Sequence[float]) -> tuple[float, float, float]:
    """``(gain, low, high)`` of ``candidate`` over ``base`` throughputs, paired in order: the
    mean log ratio and its 95 % t interval, as ratios minus 1. At least 2 pairs."""
    b = np.asarray(base, dtype="float64")
    c = np.asarray(candidate, dtype="float64")
    if len(b) != len(c) or len(b) < 2:
        raise ValueError(f"need 2 or more pairs of throughputs, got {len(b)} and {len(c)}")
    if not (np.all(b > 0) and np.all(c > 0)):
        raise ValueError("throughputs must be positive")
    logs = np.log(c / b)
    mean = float(logs.mean())
    half = t975(len(logs) - 1) * float(logs.std(ddof=1)) / math.sqrt(len(logs))
    return math.expm1(mean), math.expm1(mean - half), math.expm1(mean + half)


def verdict(gain: float, low: float, high: float, noise: float = NOISE) -> str:
    """``better`` (interval above 0 and gain >= noise), ``worse`` (the mirror image) or
    ``same`` (no significant change)."""
    if low > 0 and gain >= noise:
        return "better"
    if high < 0 and gain <= -noise:
        return "worse"
    return "same"


def short_run_rows(steps: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """A short run's measured rows: those after the warm-up the tune gave it (traced as
    ``warmup``: :data:`SHORT_WARMUP` steps, or a script's own), with ``rank``, ``step`` and
    those of ``columns`` it has. A short run has one attempt, no evaluation and no checkpoint:
    nothing else stands between its steps. A slow step after the warm-up (a forked worker's
    first, a descheduled rank's) stays in: the tune reads its runs at their faster steps
    (:data:`STEP_QUANTILE`), which such a step does not move; the analysis's detected warm-up
    (``workbench.analysis.measured.warmup``), made for a window's mean, is not needed here."""
    keep = [c for c in dict.fromkeys(["rank", "step", *columns]) if c in steps.columns]
    traced = steps["warmup"].fillna(False).astype(bool).to_numpy()
    return steps.loc[~traced, keep]


def step_throughput(steps: pd.DataFrame, quantile: float = STEP_QUANTILE) -> float:
    """One short run's samples per second at its faster steps: the samples of a step (all
    ranks, median over measured steps: :func:`short_run_rows`) over the ``quantile`` of the
    wall times from one measured step's start to the next (every rank's). Load on a shared host
    only ever slows a step: it moves the window's mean (``samples_per_s``) by tens of percent,
    a low quantile of the step times much less (as timing tools take the fastest of their
    repeats). NaN with fewer than two measured steps."""
    m = short_run_rows(steps, ["t_start_s", "samples"])
    if m["step"].nunique() < 2:
        return float("nan")
    wall = m.sort_values("step").groupby("rank")["t_start_s"].diff().dropna()
    samples = m.groupby("step")["samples"].sum(min_count=1).median()  # NaN: not counted
    step_s = float(np.quantile(wall, quantile))
    return float(samples) / step_s if step_s > 0 else float("nan")


@dataclass(frozen=True)
class Pairs:
    """How a tune measures: its base run's id (its short runs' sweep is ``tune-<id>``), pairs
    per candidate and the noise a gain must reach."""

    run_id: str
    repeats: int
    noise: float


def short_config(config: RunConfig, steps: int, sweep: str, change: Mapping[str, Any]) -> RunConfig:
    """The base's config as a short measuring run, with ``change``."""
    fields: dict[str, Any] = dict(change)
    fields.update(sweep=sweep, run_name=None, network_benchmark=False)
    if not config.is_script:
        fields.update(
            max_steps=steps,
            epochs=None,
            warmup_steps=SHORT_WARMUP,
            eval_every_epochs=0,
            eval_at_end=False,
            checkpoint_every_steps=0,
        )
    return config.replace(**fields)


def secs(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def measure(
    rows: list[dict[str, Any]],
    todo: list[int],
    config: RunConfig,
    short: int,
    budget_s: float,
    where: tuple[str, dict[str, Any]],
    progress: Callable[[str], None] | None,
    estimates: list[float],
    result: Pairs,
) -> None:
    """Run the pairs of each candidate in ``todo`` within the budget; fill in the rows (a
    ``pool`` executor takes its ranks from the warm pool the tune opened).
    ``where``: the executor and its ``launch`` options."""
    clock = _Clock(time.monotonic(), len(todo) * 2 * result.repeats, progress)
    for k, i in enumerate(todo):
        row = rows[i]
        per_run = clock.per_run(estimates[k])
        spent = time.monotonic() - clock.started
        if spent + per_run * 2 * result.repeats > budget_s:
            row["why"] = f"budget spent ({secs(spent)} of {secs(budget_s)})"
            clock.total -= 2 * result.repeats
            continue
        _measure_one(result, row, config, short, where, clock, per_run, budget_s)


@dataclass
class _Clock:
    """Progress over the short runs: how many, how long each took; a line before each."""

    started: float
    total: int
    say: Callable[[str], None] | None
    took: list[float] = field(default_factory=list)

    def per_run(self, estimate: float) -> float:
        return sum(self.took) / len(self.took) if self.took else estimate

    def tell(self, what: str, estimate: float) -> None:
        if self.say is None:
            return
        done = len(self.took)
        rate = done / sum(self.took) * 60 if self.took else float("nan")
        left = (self.total - done) * self.per_run(estimate)
        runs_per_min = f"{rate:.1f} runs/min, " if math.isfinite(rate) else ""
        self.say(
            f"tune: run {done + 1}/{self.total} ({what}): {runs_per_min}about {secs(left)} left"
        )


def pair_order(repeats: int, rng: random.Random | None = None) -> list[str]:
    """Which side runs first in each of ``repeats`` pairs: each side first in half of them (one
    more for the base when odd), in a random order. Half each cancels an order effect (the
    second run of a pair finding warmer caches); the random order keeps a host's slower moments
    from lining up with one side. A fixed base-candidate, candidate-base order puts the
    candidate at runs 2, 3, 6, 7: a shared 2-core host that slowed every other two runs favoured
    it in every pair alike, and a change that changes nothing came out 13 % better."""
    firsts = ["base", "candidate"] * (repeats // 2) + ["base"] * (repeats % 2)
    (rng or random.Random()).shuffle(firsts)
    return firsts


def _measure_one(
    result: Pairs,
    row: dict[str, Any],
    config: RunConfig,
    short: int,
    where: tuple[str, dict[str, Any]],
    clock: _Clock,
    per_run: float,
    budget_s: float,
) -> None:
    """One candidate's interleaved pairs, and a second set of as many where the first shows a
    change (within ``budget_s``); the gain and interval of all pairs, and the verdict."""
    sets = [_pair_set(result, row, config, short, where, clock, per_run)]
    if sets[0].verdict != "same":
        spent = time.monotonic() - clock.started
        if spent + clock.per_run(per_run) * 2 * result.repeats <= budget_s:
            clock.total += 2 * result.repeats
            sets.append(_pair_set(result, row, config, short, where, clock, per_run, second=True))
    base = [x for s in sets for x in s.thr["base"]]
    candidate = [x for s in sets for x in s.thr["candidate"]]
    gain, low, high = paired_gain(base, candidate)
    final, why = confirmed(sets, verdict(gain, low, high, result.noise), result.repeats)
    row.update(
        measured_gain=gain,
        low=low,
        high=high,
        verdict=final,
        why=why,
        base_samples_per_s=base,
        candidate_samples_per_s=candidate,
        run_ids=[i for s in sets for i in s.ids],
        first_in_pair=[f for s in sets for f in s.firsts],
        pair_sets=[
            {"gain": s.gain, "low": s.low, "high": s.high, "verdict": s.verdict} for s in sets
        ],
    )
    if row["changes_math"]:
        row["loss_curves"] = _loss_curves(sets[-1].last["base"], sets[-1].last["candidate"])


def confirmed(sets: Sequence[PairSet], pooled: str, repeats: int) -> tuple[str, str]:
    """The verdict of a candidate's pair sets and, where the first set's change was not
    confirmed, why: ``better`` or ``worse`` only when a second set of pairs says the same and
    so do all pairs together. One set alone calls a change that changes nothing better in
    about one tune in forty (its 95 % interval); two independent sets, in about one in 1,600."""
    first = sets[0].verdict
    if first == "same":
        return "same", ""
    told = f"{first} in its first {repeats} pairs ({sets[0].gain:+.1%})"
    if len(sets) < 2:
        return "same", f"{told}, not confirmed: the budget held no second set"
    if sets[1].verdict == first and pooled == first:
        return first, ""
    return "same", f"{told}, not in {repeats} more ({sets[1].gain:+.1%})"


@dataclass
class PairSet:
    """One set of interleaved pairs: the throughputs by side, the runs' ids, which side ran
    first in each pair, the last steps of each side, and the set's own gain and verdict."""

    thr: dict[str, list[float]]
    ids: list[str]
    firsts: list[str]
    last: dict[str, Any]
    gain: float
    low: float
    high: float
    verdict: str


def _pair_set(
    result: Pairs,
    row: dict[str, Any],
    config: RunConfig,
    short: int,
    where: tuple[str, dict[str, Any]],
    clock: _Clock,
    per_run: float,
    second: bool = False,
) -> PairSet:
    """``result.repeats`` interleaved pairs of the base and ``row``'s change."""
    thr: dict[str, list[float]] = {"base": [], "candidate": []}
    ids: list[str] = []
    last: dict[str, Any] = {}
    changes: dict[str, Mapping[str, Any]] = {"base": {}, "candidate": row["change"]}
    firsts = pair_order(result.repeats)
    offset = result.repeats if second else 0
    for r, first in enumerate(firsts):
        second_side = "candidate" if first == "base" else "base"
        for side in (first, second_side):
            what = f"pair {offset + r + 1}/{offset + result.repeats}"
            clock.tell(
                f"{row['label']}, {what}{' (to confirm)' if second else ''}, {side}", per_run
            )
            t0 = time.monotonic()
            short_run = short_config(config, short, f"tune-{result.run_id}", changes[side])
            handle = launch(short_run, executor=where[0], **where[1])
            handle.wait()
            clock.took.append(time.monotonic() - t0)
            steps = load_traces([handle.path], "steps")
            thr[side].append(step_throughput(steps))
            ids.append(str(handle.run_id))
            last[side] = steps
    gain, low, high = paired_gain(thr["base"], thr["candidate"])
    return PairSet(thr, ids, firsts, last, gain, low, high, verdict(gain, low, high, result.noise))


def _loss_curves(base: Any, candidate: Any) -> list[list[float]]:
    """``[step, base loss, candidate loss]`` per step both ran (the mean over ranks)."""
    a = base.groupby("step")["loss"].mean()
    b = candidate.groupby("step")["loss"].mean()
    both = a.to_frame("base").join(b.rename("candidate"), how="inner")
    return [[int(s), float(r.base), float(r.candidate)] for s, r in both.iterrows()]
