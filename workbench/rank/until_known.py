"""A rank measuring until its run's throughput is known (``RunConfig.until_known``): the host
time of each measured step (from its start to the next step's start; a step followed by an
evaluation or a checkpoint is left out), and the stop every rank agrees on
(:func:`workbench.rank.loop.agreed_stop`) by the rule of :mod:`workbench.trace.known`."""

from __future__ import annotations

import time
from typing import Any

from workbench.config.run_config import RunConfig
from workbench.trace import known


class UntilKnown:
    """One rank's measured step times and where its stopping rule stands."""

    def __init__(self, config: RunConfig) -> None:
        self.within = config.until_known
        self.cap_s = config.until_known_max_s
        self.cap_steps = int(config.total_steps or 0)
        self.cycles: list[float] = []
        self._from: float | None = None  # when the measured step in progress started
        self._t0: float | None = None
        self.stopped_by: str | None = None  # what the ranks agreed on, if they stopped early

    @property
    def on(self) -> bool:
        """Whether the run measures until known."""
        return self.within is not None

    def step_started(self, now: float, measured: bool) -> None:
        """A step starts at host time ``now``; ``measured``: not a warm-up step."""
        if self._t0 is None:
            self._t0 = now
        if self._from is not None:
            self.cycles.append(now - self._from)
        self._from = now if measured else None

    def interrupted(self) -> None:
        """An evaluation or a checkpoint after the step in progress: its time is not a step's."""
        self._from = None

    def due(self, step: int) -> bool:
        """Whether the ranks look at their intervals after ``step``."""
        return self.on and step % known.CHECK_EVERY == 0

    def look(self, last_step: bool = False) -> known.Verdict:
        """This rank's verdict now."""
        assert self.within is not None
        elapsed = time.perf_counter() - (self._t0 or time.perf_counter())
        return known.verdict(self.cycles, self.within, elapsed, self.cap_s, last_step)

    def record(self, steps: int) -> dict[str, Any] | None:
        """What the rank's summary (and run.json) keeps: the goal, how the run ended, how well
        its step time is known; None when not measuring until known."""
        if self.within is None:
            return None
        final = self.look(last_step=self.stopped_by is None)
        stop = self.stopped_by or final.stop
        out = known.Verdict(stop, final.estimate, final.warmup)
        return out.record(self.within, steps, self.cap_steps, self.cap_s)
