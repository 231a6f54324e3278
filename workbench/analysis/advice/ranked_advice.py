"""What to change first: the changes a curve's largest cause calls for, ranked by the gain the
scaling model predicts for each, best first
(:func:`~workbench.analysis.advice.candidates.prediction_order`: the order ``workbench tune`` tries
them in).

A cause with knobs (communication:
:func:`~workbench.analysis.advice.candidates.candidates_for`) gets each change's predicted gain
(:func:`~workbench.analysis.advice.candidates.predicted_gain`, the model fed by the point's own
measurements): the median of the gains predicted from each sampled step on its own (its wall
step and exposed communication), with the 95 % interval of that median (order statistics, no
distribution assumed); under 2 sampled steps, the gain at the mean step and no interval. A
cause no knob reaches gets the finding's words for it
(:data:`~workbench.analysis.advice.candidates.SAID`) and a bound, not a prediction: the gain
if that cause went back to its ideal, ``share / (1 - share)`` of the step.
Pure pandas; no torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.analysis.advice.candidates import (
    SAID,
    ModelInputs,
    as_measured,
    candidates_for,
    predicted_gain,
    prediction_order,
)
from workbench.analysis.measured.intervals import median_interval

#: The changes the finding names besides the most promising one.
MORE = 3


@dataclass(frozen=True)
class Change:
    """One change and what it is expected to gain (ratio minus 1): ``gain`` predicted by the
    model with its interval ``low`` to ``high`` (NaN: none), or, where ``bound``, the most it
    can gain. ``in_script``: a script's own setting, which the workbench cannot apply.
    ``partial``: the cost the prediction leaves out; ``assumes``: what it assumes."""

    label: str
    gain: float = float("nan")
    low: float = float("nan")
    high: float = float("nan")
    bound: bool = False
    in_script: bool = False
    partial: str = ""
    assumes: str = ""

    def words(self) -> str:
        """``per-device batch 32 -> 128: predicted +21 % (+15 % to +27 %)``."""
        label = self.label + (" (in the script)" if self.in_script else "")
        if not math.isfinite(self.gain):
            return label
        if self.bound:
            return f"{label}: up to {_pct(self.gain)}"
        spread = ""
        if math.isfinite(self.low) and math.isfinite(self.high):
            spread = f" ({_pct(self.low)} to {_pct(self.high)})"
        said = "".join(f" {text}" for text in (self.partial, self.assumes) if text)
        return f"{label}: predicted {_pct(self.gain)}{spread}{said}"


def _pct(value: float) -> str:
    """A gain in percent with its sign: ``+21 %``, ``-3 %``, ``+0 %``."""
    rounded = round(value * 100)
    return f"{'+' if rounded >= 0 else '-'}{abs(rounded)} %"


def _at_step(inputs: ModelInputs, step_s: float, exposed_s: float) -> ModelInputs:
    """``inputs`` with one sampled step's wall step and exposed communication."""
    base = dataclasses.replace(inputs.base, step_s=step_s, exposed_comm_s=exposed_s)
    return dataclasses.replace(inputs, base=base)


def ranked_changes(
    cause: str,
    share: float,
    config: Mapping[str, Any],
    inputs: ModelInputs | None,
    sampled: Sequence[tuple[float, float]] = (),
    script: bool = False,
) -> list[Change]:
    """The changes ``cause`` (taking ``share`` of the step) calls for, best first (changes
    without a prediction last, in the candidate list's order); see the module docstring.
    ``inputs``: the model's view of the point (``None``: no prediction); ``config``: its
    RunConfig fields; ``sampled``: its sampled steps' (wall step, exposed communication)."""
    listed = candidates_for(cause, config, script)
    if not listed:
        words = SAID.get(cause, SAID["unexplained"])
        known = cause != "unexplained" and math.isfinite(share) and 0 < share < 1
        return [Change(words, share / (1 - share), bound=True) if known else Change(words)]
    out = []
    for c in listed:
        if not c.change or inputs is None:
            out.append(Change(c.label, in_script=not c.reachable, partial=c.partial))
            continue
        c = as_measured(c, inputs)
        each = [predicted_gain(c.change, _at_step(inputs, t, e))[0] for t, e in sampled]
        each = [g for g in each if math.isfinite(g)]
        low, high = median_interval(each)
        # The figure its interval is of: the median over the sampled steps (the gain at the
        # mean step can lie outside the median's interval), else the gain at the mean step.
        gain = float(np.median(each)) if len(each) >= 2 else predicted_gain(c.change, inputs)[0]
        out.append(Change(c.label, gain, low, high, False, not c.reachable, c.partial, c.assumes))
    return sorted(out, key=lambda c: prediction_order(c.gain, c.partial))
