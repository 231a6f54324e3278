"""A tune's batch probe: what of the base's compute grows with the batch, measured where nothing
fitted it (a study's runs at several batches: :mod:`workbench.analysis.model.batch_cost`). Short
runs at the base's per-device batch and the candidate's; each one's compute a step (forward,
backward's own compute, optimizer) gives a point, and the line through the two splits the
compute into a per-step and a per-sample part (:func:`probe_split`). Each batch runs twice, in
turns (base, candidate, candidate, base), and each point is the less disturbed of its two runs,
each run's compute taken at its faster steps (:func:`_compute_per_step`). The larger batch's
gain is then predicted from that split instead of assuming all of the compute grows with it: on
a small step, most of it is per-step cost (Python, kernel launches, the optimizer), so the
assumption underestimates the gain several times over. The probe is the tune's own measurement:
its runs, its points and its line; the split is kept as the analysis's
:class:`~workbench.analysis.model.batch_cost.BatchCost`, which the finding's study fit gives too.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.advice.candidates import Candidate, ModelInputs
from workbench.analysis.model.batch_cost import BatchCost
from workbench.config.run_config import RunConfig
from workbench.run.launch import launch
from workbench.store.load import load_traces
from workbench.tune.measure import SHORT_WARMUP, STEP_QUANTILE, short_config, short_run_rows

#: Measured steps of each probe run (after :data:`SHORT_WARMUP`).
PROBE_STEPS = 20
#: Probe runs: each of the two batches twice, in turns.
PROBE_RUNS = 4
#: How the probe's points were got, in :meth:`BatchCost.words`.
PROBED = "probed by four short runs, in turns, at"


def with_batch_probe(
    plan: Sequence[Candidate],
    config: RunConfig,
    inputs: ModelInputs,
    sweep: str,
    where: tuple[str, Mapping[str, Any]],
    progress: Callable[[str], None] | None = None,
) -> tuple[ModelInputs, dict[str, Any], float]:
    """``inputs`` with the compute split the probe measured (its runs in ``sweep``), the split
    as a dict and the probe's seconds; ``inputs``, ``{}`` and the seconds spent where no probe
    is called for (:func:`batch_to_probe`) or it found no split."""
    batch = batch_to_probe(plan, config, inputs)
    if not batch:
        return inputs, {}, 0.0
    started = time.monotonic()
    cost = probe_batch_cost(config, batch, sweep, where, progress)
    spent = time.monotonic() - started
    if cost is None:
        return inputs, {}, spent
    return dataclasses.replace(inputs, batch_cost=cost), dataclasses.asdict(cost), spent


def batch_to_probe(plan: Sequence[Candidate], config: RunConfig, inputs: ModelInputs) -> int:
    """The per-device batch of the plan's larger-batch candidate, where nothing measured what
    of the compute grows with the batch and the batch is the config's to change (0: no
    probe)."""
    if inputs.batch_split or config.is_script or not config.per_device_batch_size:
        return 0
    for c in plan:
        batch = c.change.get("per_device_batch_size")
        if c.reachable and batch and int(batch) != config.per_device_batch_size:
            return int(batch)
    return 0


def probe_batch_cost(
    config: RunConfig,
    batch: int,
    sweep: str,
    where: tuple[str, Mapping[str, Any]],
    progress: Callable[[str], None] | None = None,
) -> BatchCost | None:
    """The compute split of ``config`` measured at its per-device batch and at ``batch``, by
    :data:`PROBE_RUNS` short runs in ``sweep`` on ``where`` (the executor and its ``launch``
    options); ``None`` when a probe run did not complete or measured no compute."""
    base = int(config.per_device_batch_size or 0)
    accumulation = int(config.gradient_accumulation_steps)
    compute: dict[int, list[float]] = {base: [], batch: []}
    # in turns, base first and last: a slower spell of a shared host falls on both batches,
    # and each point is the less disturbed of its two runs (load only ever slows a run)
    for size in (base, batch, batch, base):
        if progress is not None:
            progress(f"tune: batch probe, per-device batch {size} ({PROBE_STEPS} steps)")
        # DDP's timer on every step: each step's backward compute, apart from its allreduce
        change = {"per_device_batch_size": size, "trace_comm_every_steps": 1}
        short = short_config(config, SHORT_WARMUP + PROBE_STEPS, sweep, change)
        handle = launch(short, executor=where[0], **dict(where[1]))
        if handle.wait() != "completed":
            return None
        compute[size].append(_compute_per_step(Path(handle.path)))
    points = [
        min(compute[size], key=lambda c: c if math.isfinite(c) else math.inf)
        for size in (base, batch)
    ]
    if not all(math.isfinite(c) for c in points):
        return None
    samples = (base * accumulation, batch * accumulation)
    return probe_split(samples, (points[0], points[1]), (base, batch), int(config.processes))


def probe_split(
    samples: tuple[float, float],
    compute: tuple[float, float],
    batches: tuple[int, int],
    world_size: int,
) -> BatchCost | None:
    """The probe's split from its two points (``samples`` a rank computes a step at the base's
    batch and at the candidate's, and the ``compute`` seconds a step measured at each): the
    line through them, ``per_sample_s`` its slope and ``per_step_s`` what is left at no
    sample. Where the compute did not grow with the samples (the larger batch measured within
    its noise), all of it is per-step: the two points' mean (as a study's fit takes it,
    :func:`workbench.analysis.model.batch_cost.fit_batch_cost`). ``None`` for one sample
    count or a compute not measured."""
    (s0, s1), (c0, c1) = samples, compute
    if s0 == s1 or not (math.isfinite(c0) and math.isfinite(c1)):
        return None
    per_sample = (c1 - c0) / (s1 - s0)
    if not per_sample > 0:
        per_sample, per_step = 0.0, (c0 + c1) / 2
    else:
        per_step = c0 - per_sample * s0
    return BatchCost(max(per_step, 0.0), per_sample, tuple(batches), world_size, PROBED)


def _compute_per_step(path: Path) -> float:
    """A finished probe run's compute seconds a step: forward, backward's own compute (DDP's
    timer, on every step of a probe run; the backward less its exposed allreduce where the timer
    did not run) and optimizer, on each rank's measured steps; their :data:`STEP_QUANTILE`,
    the faster steps, as the tune measures throughput: a rank descheduled for a step on a shared
    host moves a mean by milliseconds, a low quantile much less."""
    columns = ["forward_s", "backward_s", "optimizer_s", "backward_compute_s", "comm_exposed_s"]
    m = short_run_rows(load_traces([path], "steps"), columns)
    if m.empty:
        return float("nan")
    exposed = m.get("comm_exposed_s", pd.Series(0.0, index=m.index)).fillna(0.0)
    backward = m["backward_s"] - exposed
    if "backward_compute_s" in m.columns:
        backward = m["backward_compute_s"].where(m["backward_compute_s"].notna(), backward)
    compute = (m["forward_s"] + backward + m["optimizer_s"]).dropna()
    return float(np.quantile(compute, STEP_QUANTILE)) if len(compute) else float("nan")
