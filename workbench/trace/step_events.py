"""A script's training step from the events the hooks saw, as the trace's phase columns.

The hooks (``torch_hooks``) stamp events: a DataLoader fetch starts and ends, a DDP training
forward starts and ends, a backward starts and ends, an optimizer step starts and ends. A step
is every event from the first one after the previous step up to its last optimizer step. Each
interval between two consecutive events goes to one phase, chosen by the event that opens it
(and, for the ends of a fetch or a backward, by the one that closes it):

======================  =========================================================================
opened by               phase
======================  =========================================================================
fetch start             data: the DataLoader's ``__next__`` (loading, collating, pinning)
fetch end               data (moving the batch, until the forward); forward when the next event
                        is a backward (no DDP forward seen: the model ran in between); optimizer
                        when it is an optimizer step
forward start / end     forward: DDP's forward, then the loss computed from its output
backward start          backward: ``torch.autograd.backward`` (``loss.backward()``)
backward end            optimizer when an optimizer step follows (unscaling, clipping); backward
                        when another backward follows; else data (on to the next micro-batch)
optimizer start / end   optimizer: every optimizer step of the step (several optimizers)
previous step's end     forward, only when a step's first event is a backward: no fetch and no
                        DDP forward was seen, so the model ran since the last step
======================  =========================================================================

The four phases add up to the step (its first event to its last optimizer step's end). A phase
no interval went to is None (not measured), never 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

FETCH, FETCH_END, FORWARD, FORWARD_END, BACKWARD, BACKWARD_END, OPTIMIZER, OPTIMIZER_END = range(8)
#: A synthetic event: the previous step's end, put first when a step starts with a backward.
PREVIOUS_END = 8
DATA_PHASE, FORWARD_PHASE, BACKWARD_PHASE, OPTIMIZER_PHASE = range(4)

Event = tuple[int, float]


class StepPhases(NamedTuple):
    """A step's start (the clock's seconds) and its phases in seconds (None: not observed)."""

    start: float
    data_s: float | None
    forward_s: float | None
    backward_s: float | None
    optimizer_s: float | None
    step_s: float


def interval_phase(opened_by: int, closed_by: int) -> int:
    """The phase of the time between two consecutive events (see the module's table)."""
    if opened_by == FETCH:
        return DATA_PHASE
    if opened_by == FETCH_END:
        if closed_by == BACKWARD:
            return FORWARD_PHASE
        return OPTIMIZER_PHASE if closed_by == OPTIMIZER else DATA_PHASE
    if opened_by in (FORWARD, FORWARD_END, PREVIOUS_END):
        return FORWARD_PHASE
    if opened_by == BACKWARD:
        return BACKWARD_PHASE
    if opened_by == BACKWARD_END:
        if closed_by in (OPTIMIZER, OPTIMIZER_END):
            return OPTIMIZER_PHASE
        return BACKWARD_PHASE if closed_by == BACKWARD else DATA_PHASE
    return OPTIMIZER_PHASE


#: ``PHASE_OF[opened_by][closed_by]``: :func:`interval_phase` of every pair, as a table
#: (``step_log`` looks every interval of a flush up in it at once).
PHASE_OF = tuple(tuple(interval_phase(a, b) for b in range(9)) for a in range(9))


def step_phases(events: Sequence[Event], previous_end: float | None) -> StepPhases:
    """The phases of one step's ``events`` (in time order, ending with an optimizer step's
    end); ``previous_end``: when the step before it ended (None for the first step). The
    definition, one step at a time: ``step_log.StepLog.take`` computes the same for every
    step of a flush at once."""
    if events[0][0] == BACKWARD and previous_end is not None:
        events = [(PREVIOUS_END, previous_end), *events]
    sums: list[float | None] = [None, None, None, None]
    a, t_a = start = events[0]
    for b, t_b in events[1:]:
        phase = PHASE_OF[a][b]
        so_far = sums[phase]
        sums[phase] = t_b - t_a if so_far is None else so_far + (t_b - t_a)
        a, t_a = b, t_b
    return StepPhases(start[1], sums[0], sums[1], sums[2], sums[3], t_a - start[1])
