"""A script's steps as the hooks log them, and the trace's columns they become.

On the hot path an event is two appends (its kind, its clock reading) and what a step consumed
one tagged append beside them (a batch's shape, a loss tensor, DDP's timer figures, the
learning rate, a memory sample): no step is assembled while the script trains. Where one step
ends and the next begins, and each step's phases, are worked out when the tracer flushes
(``StepLog.take``), in one NumPy pass over every event logged since the last flush, with the
same rules and the same sums as :func:`workbench.trace.step_events.step_phases` (its oracle).

A step is every event from the first one after the previous step up to its last optimizer
step: it is closed by the first event that is not an optimizer's after an optimizer step's end.
Extras belong to the step of the event logged just before them (a loss noted after
``optimizer.step()`` is that step's).
"""

from __future__ import annotations

import bisect
import math
from typing import Any, NamedTuple

import numpy as np
import torch

from workbench.trace.comm_timing import CommFields
from workbench.trace.step_counts import shape_counts, step_loss
from workbench.trace.step_events import (
    BACKWARD,
    FETCH,
    FETCH_END,
    OPTIMIZER,
    OPTIMIZER_END,
    PHASE_OF,
    PREVIOUS_END,
)

# The tags of the extras: what each value is.
FORWARD_BATCH, FETCH_BATCH = 0, 1  # (shape, dtype) of the batch's first tensor
MODEL_LOSS, BACKWARD_LOSS = 2, 3  # a detached loss tensor
NOTE = 4  # (samples, tokens, loss) from ``workbench.trace.note``
COMM = 5  # CommFields of the primary DDP (NO_COMM: a step without them)
LR = 6  # the learning rate of the optimizer being stepped
MEMORY = 7  # a memory sample (the tracer's five memory columns)

NO_COMM = CommFields(None, None, None)
_PHASES = np.array(PHASE_OF, dtype=np.int64)


def _logged_after(extra: tuple[int, int, Any]) -> int:
    return extra[0]


def _objects(values: list[Any]) -> np.ndarray:
    """A 1-d object array of ``values`` (tuples stay elements, not rows)."""
    return np.fromiter(values, dtype=object, count=len(values))


def _filled(got: tuple[np.ndarray, list[Any]] | None, m: int, before: Any) -> list[Any]:
    """Per step, the last value logged in it or in an earlier step (``before``: the last one
    taken out already); the order they were logged in decides between a step's values."""
    if got is None:
        return [before] * m
    steps, values = got
    last = np.full(m, -1, dtype=np.int64)
    np.maximum.at(last, steps, np.arange(len(values)))  # a step's last value
    last = np.maximum.accumulate(last)  # then carried on to the steps without one
    return _objects([*values, before])[last].tolist()  # -1: before


def _or_minus(value: int | None) -> int:
    return -1 if value is None else int(value)


def _shape_pair(value: tuple[Any, Any]) -> tuple[int, int]:
    """A batch's (samples, tokens), -1 for one not known."""
    samples, tokens = shape_counts(*value)
    return _or_minus(samples), _or_minus(tokens)


class StepColumns(NamedTuple):
    """The closed steps taken out of a log: ``columns`` (every step column of the trace but
    ``epoch``, ``step``, ``warmup``, ``save_s`` and the memory ones) and each row's memory
    sample (None: none since the start)."""

    columns: dict[str, Any]  # lists, arrays, masked arrays (masked: null)
    memory: list[tuple[Any, ...] | None]


class StepLog:
    """Events and extras since the last closed step taken out (see the module docstring).
    ``kinds``, ``times`` and ``extras`` are appended to by the hooks directly and never
    replaced (``take`` trims them in place)."""

    def __init__(self) -> None:
        self.kinds: list[int] = []
        self.times: list[float] = []
        #: (events logged before it, tag, value)
        self.extras: list[tuple[int, int, Any]] = []
        self.previous_end: float | None = None  # the last step taken out ended here
        self.memory: tuple[Any, ...] | None = None  # the latest memory sample taken out
        self.lr: float | None = None  # the latest learning rate taken out
        self.comm = NO_COMM  # the latest communication figures taken out
        self._shapes: dict[Any, tuple[int, int]] = {}  # a shape's (samples, tokens), -1: none

    def last_is_optimizer_end(self) -> bool:
        kinds = self.kinds
        return bool(kinds) and kinds[-1] == OPTIMIZER_END

    def drop_fetches(self) -> None:
        """An evaluation forward: where every event since the last step is a fetch, those
        fetches fed it, not training. They are forgotten, with the batches they counted."""
        kinds = self.kinds
        i = len(kinds)
        while i and kinds[i - 1] in (FETCH, FETCH_END):
            i -= 1
        if i == len(kinds) or (i and kinds[i - 1] != OPTIMIZER_END):
            return
        del kinds[i:], self.times[i:]
        # What else was logged since (a note) stays, at the events that are left: the extras
        # stay in order of the events they follow.
        self.extras[:] = [
            (min(at, i), tag, value)
            for at, tag, value in self.extras
            if not (at > i and tag == FETCH_BATCH)
        ]

    def take(self, t0: float, final: bool = False) -> StepColumns | None:
        """Take the closed steps out of the log as columns (None: none closed yet), their
        starts since ``t0`` (the trace's zero on the event clock). ``final``: the run is over,
        so a step whose last event is an optimizer step's end is closed too (events after the
        last step, which no optimizer step ended, are dropped)."""
        kinds, times = self.kinds, self.times
        n = len(kinds)
        if not n:
            return None
        k = np.array(kinds, dtype=np.int64)
        t = np.array(times, dtype=np.float64)
        ends = np.flatnonzero((k[:-1] == OPTIMIZER_END) & (k[1:] < OPTIMIZER))
        if final and k[-1] == OPTIMIZER_END:
            ends = np.append(ends, n - 1)
        if not ends.size:
            if final:
                self._clear(n)
            return None
        cut = int(ends[-1]) + 1
        columns, start, step_s = self._phases(k[:cut], t[:cut], ends)
        # The next step's start, for the last one's gap: its first event, or this one's end
        # where it opens with a backward (no fetch or forward seen).
        following = math.nan
        if cut < n:
            following = float(t[cut - 1] if k[cut] == BACKWARD else t[cut]) - t0
        # On the trace's clock (since its zero), as the built-in loop's rows.
        start = start - t0
        gap = np.append(start[1:], following) - start - step_s
        columns["t_start_s"] = start
        columns["gap_s"] = np.ma.masked_invalid(gap)
        memory = self._extras(columns, ends, cut)
        self.previous_end = float(t[cut - 1])
        self._clear(cut if not final else n)
        return StepColumns(columns, memory)

    def _phases(
        self, k: np.ndarray, t: np.ndarray, ends: np.ndarray
    ) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
        """Each closed step's phases, start and duration from its events: ``step_phases`` of
        each, in one pass (the same intervals summed in the same order, so the same floats)."""
        m = len(ends)
        first = np.r_[0, ends[:-1] + 1]
        previous = np.r_[math.nan if self.previous_end is None else self.previous_end, t[ends[:-1]]]
        # A step that opens with a backward (and follows a step) starts at the previous end:
        # a synthetic first event, as step_phases puts it.
        synthetic = (k[first] == BACKWARD) & ~np.isnan(previous)
        if synthetic.any():
            at = first[synthetic]
            k = np.insert(k, at, PREVIOUS_END)
            t = np.insert(t, at, previous[synthetic])
            shift = np.cumsum(synthetic)  # events inserted up to and including each step
            first = first + shift - synthetic
            ends = ends + shift
        step_of = np.repeat(np.arange(m), ends - first + 1)
        same = step_of[:-1] == step_of[1:]
        phase = _PHASES[k[:-1], k[1:]]
        slot = (step_of[:-1] * 4 + phase)[same]
        duration = (t[1:] - t[:-1])[same]
        sums = np.bincount(slot, weights=duration, minlength=4 * m).reshape(m, 4)
        unseen = np.bincount(slot, minlength=4 * m).reshape(m, 4) == 0
        columns: dict[str, Any] = {
            name: np.ma.array(sums[:, j], mask=unseen[:, j])
            for j, name in enumerate(("data_s", "forward_s", "backward_s", "optimizer_s"))
        }
        start = t[first]
        step_s = t[ends] - start
        columns["step_s"] = step_s
        return columns, start, step_s

    def _extras(
        self, columns: dict[str, Any], ends: np.ndarray, cut: int
    ) -> list[tuple[Any, ...] | None]:
        """Fold the extras of the closed steps into their columns (each step's memory sample
        returned); keep the others. Extras are in the order they were logged, so the closed
        steps' are the first ones."""
        m = len(ends)
        extras = self.extras
        split = bisect.bisect_left(extras, cut + 1, key=_logged_after)
        taken, extras[:] = extras[:split], [(i - cut, g, v) for i, g, v in extras[split:]]
        got: dict[int, tuple[np.ndarray, list[Any]]] = {}
        if taken:
            at, tags, values = zip(*taken, strict=True)
            step_of = np.searchsorted(ends, np.array(at, dtype=np.int64) - 1)
            tag_of = np.array(tags, dtype=np.int64)
            for tag in np.unique(tag_of).tolist():
                where = np.flatnonzero(tag_of == tag)
                got[tag] = (step_of[where], [values[i] for i in where.tolist()])
        samples, tokens = self._counts(got, m)
        columns["samples"], columns["tokens"] = samples, tokens
        columns["loss"] = self._losses(got, m)
        lr = _filled(got.get(LR), m, self.lr)
        self.lr = lr[-1]
        columns["lr"] = lr
        comm = _filled(got.get(COMM), m, self.comm)
        self.comm = comm[-1]
        fields = list(zip(*comm, strict=True))
        for name, values in zip(CommFields._fields, fields, strict=True):
            columns[name] = values
        memory = _filled(got.get(MEMORY), m, self.memory)
        self.memory = memory[-1]
        return memory

    def _counts(self, got: dict[int, Any], m: int) -> tuple[Any, Any]:
        """Each step's samples and tokens: what the script noted, else the root's training
        forwards (``forward_hooks``), else the fetches (each summed over the step's
        micro-batches; null where none was counted)."""
        values = np.zeros((2, m), dtype=np.int64)
        counted = np.zeros((2, m), dtype=bool)
        for tag in (FETCH_BATCH, FORWARD_BATCH, NOTE):  # later ones win
            if tag not in got:
                continue
            steps, logged = got[tag]
            if tag == NOTE:
                pairs = [(_or_minus(v[0]), _or_minus(v[1])) for v in logged]
            else:
                cache = self._shapes
                pairs = [cache.get(v) or cache.setdefault(v, _shape_pair(v)) for v in logged]
            both = np.array(pairs, dtype=np.int64).reshape(-1, 2)
            for j in (0, 1):
                valid = both[:, j] >= 0
                has = np.bincount(steps[valid], minlength=m) > 0
                sums = np.bincount(steps[valid], weights=both[valid, j], minlength=m)
                values[j, has] = sums[has].astype(np.int64)
                counted[j, has] = True
        return (np.ma.array(values[0], mask=~counted[0]), np.ma.array(values[1], mask=~counted[1]))

    def _losses(self, got: dict[int, Any], m: int) -> list[Any]:
        """Each step's loss: the last one the script noted; else the mean of the model's
        losses over the micro-batches; else the sum of the backward roots."""
        loss: list[Any] = [None] * m
        for tag in (BACKWARD_LOSS, MODEL_LOSS):  # the model's win
            if tag not in got:
                continue
            steps, values = got[tag]
            if len(np.unique(steps)) == len(steps):  # one loss a step, the usual case
                for s, v in zip(steps.tolist(), values, strict=True):
                    loss[s] = v
                continue
            per_step: dict[int, list[Any]] = {}
            for s, v in zip(steps.tolist(), values, strict=True):
                per_step.setdefault(s, []).append(v)
            model = tag == MODEL_LOSS
            for s, losses in per_step.items():
                loss[s] = step_loss(losses if model else None, losses)
        if NOTE in got:
            steps, values = got[NOTE]
            for s, v in zip(steps.tolist(), values, strict=True):
                if v[2] is not None:
                    loss[s] = v[2]
        return loss

    def _clear(self, cut: int) -> None:
        del self.kinds[:cut], self.times[:cut]
        if not self.kinds:  # the run is over (``final``): nothing left to belong to
            self.extras.clear()

    def note(self, samples: int | None, tokens: int | None, loss: Any) -> None:
        """``workbench.trace.note`` while the script runs (what it notes wins over what the
        hooks counted; a loss tensor is detached now, read at the flush)."""
        if loss is not None:
            loss = loss.detach() if isinstance(loss, torch.Tensor) else float(loss)
        self.extras.append((len(self.kinds), NOTE, (samples, tokens, loss)))
