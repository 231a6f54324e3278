"""The clock of a step's phases: ``perf_counter`` stamps on CPU; on CUDA, events from a ring
allocated once, read only when the tracer flushes (or when the ring comes back to them), with
each step's start read on the device's clock too once the clock is anchored at t0."""

from __future__ import annotations

import time
from collections.abc import Sequence
from itertools import pairwise
from typing import Any, NamedTuple

import numpy as np
import torch

#: CUDA events in a PhaseClock's ring: about a dozen steps of one micro-batch.
EVENT_RING = 64
_NO_PHASES: tuple[None, ...] = (None,) * 5


class Phases(NamedTuple):
    """A step's phase durations (seconds), as the trace's columns."""

    data_s: float | None
    forward_s: float | None
    backward_s: float | None
    optimizer_s: float | None
    step_s: float | None


def split_phases(d: list[float]) -> tuple[float, float, float, float, float]:
    """(data, forward, backward, optimizer, step) seconds from the durations between the marks
    ``Trainer.step`` makes: per micro-batch data, forward, backward; then the optimizer."""
    return sum(d[0:-1:3]), sum(d[1:-1:3]), sum(d[2:-1:3]), d[-1], sum(d)


class CudaStep:
    """The CUDA events of one step, read when first needed (``phases``). ``anchor``: the
    reference event recorded at t0 and its offset from t0 (``PhaseClock.anchor``), so that the
    step's start is read on the device's clock too."""

    __slots__ = ("host_start", "events", "anchor", "_phases", "_start")

    def __init__(self, host_start: float, anchor: tuple[Any, float] | None = None) -> None:
        self.host_start = host_start
        self.events: list[Any] = []
        self.anchor = anchor
        self._phases: tuple[Any, ...] | None = None
        self._start: float | None = None

    @property
    def done(self) -> bool:
        return self._phases is not None

    def device_start(self) -> float | None:
        """Seconds from t0 to the step's first event on the device's clock; None without an
        anchor (or after a CUDA error). Waits for that first event only if it is not done."""
        if self._start is None and self.anchor is not None and self.events:
            reference, offset_s = self.anchor
            first = self.events[0]
            try:
                if not first.query():
                    first.synchronize()
                self._start = offset_s + reference.elapsed_time(first) / 1000.0
            except Exception:  # a CUDA error elsewhere: the row keeps its host start
                self.anchor = None
        return self._start

    def phases(self) -> tuple[Any, ...]:
        """The step's phase durations; waits for its last event only if it is not done yet."""
        if self._phases is None:
            try:
                if not self.events[-1].query():
                    self.events[-1].synchronize()
                self.device_start()  # before the ring may hand its events to another step
                events, self.events = self.events, []
                d = [a.elapsed_time(b) / 1000.0 for a, b in pairwise(events)]
                self._phases = split_phases(d)
            except Exception:  # a CUDA error elsewhere: the row keeps its other columns
                self._phases = _NO_PHASES
        return self._phases


class PhaseClock:
    """Stamps the phases of one step: perf_counter on CPU; on CUDA, events taken from a ring of
    ``ring_size`` created once and reused (a step still unread when the ring comes back to its
    events is read first; a step with more marks than the ring grows it)."""

    def __init__(self, device: torch.device, ring_size: int = EVENT_RING) -> None:
        self.cuda = device.type == "cuda"
        self.ring_size = ring_size
        self._marks: list[float] = []
        self._step = CudaStep(0.0)
        self._ring: list[Any] = []
        self._owners: list[CudaStep] = []
        self._pos = 0
        self._stream: Any = None  # the step's stream, looked up once: ~10 us a call on an H100 host
        self._anchor: tuple[Any, float] | None = None

    def anchor(self, t0: float) -> None:
        """On CUDA, put every later step's start on the device's clock: wait for the device,
        then record one reference event on it, idle, so the event runs when it is recorded;
        a step's ``t_start_s`` is then that moment (from ``t0``, host ``perf_counter``) plus
        the device's time from the reference to the step's first event. Its ``step_s`` and
        the ``gap_s`` between steps are then on one clock, the device's, though the host runs
        ahead of it. Call once, right after ``Tracer.set_t0``; a no-op on CPU."""
        if not self.cuda:
            return
        torch.cuda.synchronize()
        reference = torch.cuda.Event(enable_timing=True)
        recorded_at = time.perf_counter()
        reference.record()
        reference.synchronize()
        self._anchor = (reference, recorded_at - t0)

    def start(self) -> None:
        if self.cuda:
            self._step = CudaStep(time.perf_counter(), self._anchor)
            self._record()
        else:
            self._marks = [time.perf_counter()]

    def mark(self) -> None:
        if self.cuda:
            self._record()
        else:
            self._marks.append(time.perf_counter())

    def _record(self) -> None:
        step, ring, owners, pos = self._step, self._ring, self._owners, self._pos
        if pos < len(ring) and owners[pos] is not step:
            if not owners[pos].done:
                owners[pos].phases()  # the ring came back to a step not read yet
            owners[pos] = step
            event = ring[pos]
        else:  # the ring is still filling, or this step alone needs more events than it has
            event = torch.cuda.Event(enable_timing=True)
            ring.insert(pos, event)
            owners.insert(pos, step)
        if self._stream is None:
            self._stream = torch.cuda.current_stream()
        event.record(self._stream)
        step.events.append(event)
        self._pos = 0 if pos + 1 >= max(len(ring), self.ring_size) else pos + 1

    def stop(self) -> tuple[float, ...] | CudaStep:
        """The step's stamps (CPU) or events (CUDA), for ``Tracer.step(phases=...)``; turned
        into durations only when the tracer flushes. The stamps are a tuple of floats: the
        garbage collector stops tracking it (and the row holding it) at once, so buffered rows
        never reach the old generation, whose collections scan the whole heap."""
        return self._step if self.cuda else tuple(self._marks)

    @property
    def started_at(self) -> float:
        """perf_counter at the step's start (on CUDA, when its first event was queued)."""
        return self._step.host_start if self.cuda else self._marks[0]


def phase_values(phases: Any) -> tuple[Any, ...]:
    """(data_s, forward_s, backward_s, optimizer_s, step_s) of one row's ``phases``: CPU stamps
    (a tuple), a ``CudaStep``, or the five durations already
    (``Phases``)."""
    if type(phases) is tuple:
        return split_phases([b - a for a, b in pairwise(phases)])
    if isinstance(phases, CudaStep):
        return phases.phases()
    return Phases(*phases)


def phase_columns(items: Sequence[Any]) -> list[Sequence[Any]]:
    """The five phase columns of many rows (``phase_values`` of each); CPU stamps with as many
    marks in every row (the usual case) in one NumPy pass."""
    if (
        type(items[0]) is tuple
        and len(set(map(len, items))) == 1
        and {*map(type, items)} == {tuple}
    ):
        d = np.diff(np.array(items, dtype=np.float64), axis=1)
        return [d[:, 0:-1:3].sum(1), d[:, 1:-1:3].sum(1), d[:, 2:-1:3].sum(1), d[:, -1], d.sum(1)]
    return list(zip(*map(phase_values, items), strict=True))
