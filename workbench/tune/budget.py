"""What a tune's short runs cost against its budget: how many steps a short run takes, how long
one is expected to last, and whether the budget holds one candidate's pairs (a
:class:`~workbench.errors.TuneError` before anything starts where it does not)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from workbench.analysis.advice.candidates import ModelInputs
from workbench.config.run_config import RunConfig
from workbench.errors import TuneError
from workbench.tune.measure import SHORT_WARMUP, secs

#: Seconds a short run costs beyond its steps (start, import, teardown; warm pool, loaded host).
STARTUP_S = 6.0
#: A short run measures about this many seconds of steps, within the bounds below.
TARGET_WINDOW_S = 0.5
MIN_SHORT_STEPS, MAX_SHORT_STEPS = 30, 300


def short_steps(inputs: ModelInputs) -> int:
    """Steps of one short run: about :data:`TARGET_WINDOW_S` of the base's steps, within the
    bounds, after :data:`~workbench.tune.measure.SHORT_WARMUP` warm-up steps."""
    step = inputs.base.step_s
    want = math.ceil(TARGET_WINDOW_S / step) if step > 0 else MIN_SHORT_STEPS
    return SHORT_WARMUP + min(max(want, MIN_SHORT_STEPS), MAX_SHORT_STEPS)


def estimate(inputs: ModelInputs, steps: int, work: float) -> float:
    """Seconds one short run is expected to take (the mean of base and candidate)."""
    return STARTUP_S + steps * inputs.base.step_s * (1 + work) / 2


def check_budget(budget_s: float, run_s: float, repeats: int, short: int) -> None:
    """A :class:`TuneError` where ``budget_s`` does not hold ``repeats`` pairs of short runs of
    ``run_s`` each."""
    if budget_s < run_s * 2 * repeats:
        raise TuneError(
            f"budget {secs(budget_s)} is less than one candidate: {repeats} pairs of short "
            f"runs take about {secs(run_s * 2 * repeats)} ({short} steps each, "
            f"about {secs(STARTUP_S)} to start); give a budget of at least that, or fewer "
            "repeats"
        )


def room_for_probe(
    budget_s: float,
    inputs: ModelInputs,
    changes: Sequence[Mapping[str, Any]],
    config: RunConfig,
    short: int,
    repeats: int,
) -> float:
    """The seconds a probe may take: what one of ``changes`` (those to measure) leaves of the
    budget, all of it where there are none; a :class:`TuneError` where not even one fits."""
    if not changes:
        return budget_s
    estimates = [estimate(inputs, short, work(change, config)) for change in changes]
    check_budget(budget_s, min(estimates), repeats, short)
    return budget_s - min(estimates) * 2 * repeats


def work(change: Mapping[str, Any], config: RunConfig) -> float:
    """How many times the base's compute per step a change does (batch, accumulation)."""
    factor = 1.0
    if change.get("per_device_batch_size") and config.per_device_batch_size:
        factor *= float(change["per_device_batch_size"]) / config.per_device_batch_size
    if "gradient_accumulation_steps" in change:
        factor *= float(change["gradient_accumulation_steps"]) / config.gradient_accumulation_steps
    return factor
