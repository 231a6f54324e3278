"""Where a tune starts, in one call: everything ``workbench tune`` needs from its base run's frames
(:func:`base_plan`, given the frames the store opened: the run's row and its step frames, from its
digest or its rows): the run's diagnosis, the scaling model's inputs, and the candidates the
diagnosis calls for (:func:`~workbench.analysis.advice.candidates.candidates_for`) or those asked
for, each marked when it changes the training's mathematics. The tune's own measurement (its
short runs, their throughput and the gain's interval) is :mod:`workbench.tune.measure`'s. Pure
pandas/numpy; no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from workbench.analysis.advice.candidates import SAID, Candidate, ModelInputs, candidates_for
from workbench.analysis.advice.diagnosis import model_inputs, run_diagnosis
from workbench.analysis.measured.stored import StoredSteps
from workbench.store.digests.step_frames import StepFrames

#: Fields whose change alters what the training computes (batch, accumulation, compression).
MATH_FIELDS = ("per_device_batch_size", "global_batch_size", "gradient_accumulation_steps")


@dataclass(frozen=True)
class BasePlan:
    """What a tune takes from its base run: ``diagnosis`` (:func:`run_diagnosis`, with
    ``measured_steps``), ``inputs`` (:func:`model_inputs`; None without measured steps),
    ``candidates`` (what to try) and ``said`` (the advice no knob reaches, where the diagnosis
    calls for no candidate)."""

    diagnosis: dict[str, Any]
    inputs: ModelInputs | None
    candidates: list[Candidate]
    said: str = ""


def base_plan(
    runs: pd.DataFrame,
    steps: pd.DataFrame | StoredSteps | StepFrames,
    config: Mapping[str, Any],
    script: bool = False,
    changes: Sequence[Mapping[str, Any]] | None = None,
    min_steps: int = 1,
) -> BasePlan:
    """The tune's start from one run's frames (``runs``: its row; ``steps``: its step rows,
    a frame, or stored: the frames the store opened for it, which the caller closes;
    ``config``: its RunConfig as a dict, ``script``: whether it runs a user's script): its
    diagnosis and the model's inputs, and the candidates its cause calls
    for, or ``changes`` where given (each a RunConfig change, kept in the words of the
    communication-bound list where that list knows it). The model's inputs need ``min_steps``
    measured steps (None with fewer)."""
    if isinstance(steps, StepFrames):
        steps = StoredSteps(steps)
    if steps.empty:
        return BasePlan({"measured_steps": 0}, None, [])
    diagnosis = run_diagnosis(runs, steps)
    measured = int(diagnosis.get("measured_steps", 0))
    inputs = model_inputs(runs, steps, dict(config)) if measured >= max(min_steps, 1) else None
    cause = str(diagnosis.get("cause", "unexplained"))
    candidates = plan_for(cause, config, script, changes)
    said = SAID.get(cause, SAID["unexplained"]) if changes is None and not candidates else ""
    return BasePlan(diagnosis, inputs, candidates, said)


def label(change: Mapping[str, Any]) -> str:
    """A change in words: ``field=value, ...``."""
    return ", ".join(f"{k}={v}" for k, v in change.items()) or "no change"


def plan_for(
    cause: str,
    config: Mapping[str, Any],
    script: bool = False,
    changes: Sequence[Mapping[str, Any]] | None = None,
) -> list[Candidate]:
    """The candidates ``cause`` calls for, or ``changes`` as candidates where given."""
    if changes is None:
        return candidates_for(cause, config, script)
    # a change the communication-bound list knows keeps its words there
    known = {
        str(sorted(c.change.items())): c for c in candidates_for("exposed_transfer", config, script)
    }
    return [
        known.get(str(sorted(dict(c).items())))
        or Candidate(
            dict(c),
            label(c),
            changes_math=bool(set(c) & set(MATH_FIELDS))
            or c.get("comm_hook", "allreduce") != "allreduce",
        )
        for c in changes
    ]
