"""A tune's batch probe: what of the base's compute grows with the batch, measured where nothing
fitted it (:mod:`workbench.analysis.batch_cost`). Two short runs, the base's per-device batch and
the candidate's, one after the other; each one's compute a step (forward, backward's own compute,
optimizer: :func:`~workbench.analysis.losses.run_parts`) gives a point, and the line through the
two splits the compute into a per-step and a per-sample part. The larger batch's gain is then
predicted from that split instead of assuming all of the compute grows with it: on a small step,
most of it is per-step cost (Python, kernel launches, the optimizer), so the assumption
underestimates the gain several times over.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.analysis.batch_cost import BatchCost, fit_batch_cost
from workbench.analysis.tune_measure import run_diagnosis
from workbench.analysis.tune_plan import Candidate, ModelInputs
from workbench.config.run_config import RunConfig
from workbench.run.launch import launch
from workbench.store.load import load_runs, load_traces
from workbench.tune.measure import SHORT_WARMUP, short_config

#: Measured steps of each probe run (after :data:`SHORT_WARMUP`).
PROBE_STEPS = 20
#: How the probe's points were got, in :meth:`BatchCost.words`.
PROBED = "probed by two short runs at"


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
    samples = inputs.per_device_batch_size * inputs.gradient_accumulation_steps
    share = cost.per_step_share(samples)
    probed = dataclasses.replace(inputs, per_step_share=share, batch_split=cost.words())
    return probed, dataclasses.asdict(cost), spent


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
    """The compute split of ``config`` measured at its per-device batch and at ``batch``, by two
    short runs in ``sweep`` on ``where`` (the executor and its ``launch`` options); ``None``
    when a probe run did not complete or its compute did not grow with the batch."""
    base = int(config.per_device_batch_size or 0)
    accumulation = int(config.gradient_accumulation_steps)
    compute = []
    for size in (base, batch):
        if progress is not None:
            progress(f"tune: batch probe, per-device batch {size} ({PROBE_STEPS} steps)")
        short = short_config(
            config, SHORT_WARMUP + PROBE_STEPS, sweep, {"per_device_batch_size": size}
        )
        handle = launch(short, executor=where[0], **dict(where[1]))
        if handle.wait() != "completed":
            return None
        compute.append(_compute_per_step(Path(handle.path), str(handle.run_id)))
    if not all(math.isfinite(c) for c in compute):
        return None
    samples = [base * accumulation, batch * accumulation]
    return fit_batch_cost(samples, compute, (base, batch), int(config.processes), PROBED)


def _compute_per_step(path: Path, run_id: str) -> float:
    """A finished run's compute seconds a step (its measured steps, the ranks' mean)."""
    runs = load_runs(path.parent.parent, [path.parent.name])
    runs = runs[runs["run_id"] == run_id]
    steps = load_traces([path], "steps")
    return float(run_diagnosis(runs, steps).get("compute", float("nan")))
