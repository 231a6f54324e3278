"""Preemption and time limits: turn the scheduler's warning signal into a clean, agreed stop.

submitit's own handler checkpoints and requeues from global rank 0 only, at whatever line the
signal interrupts, while the other ranks carry on. Instead each rank records the signal in a
flag; every few steps the ranks agree (one tiny allreduce) whether any of them got it; then all
stop at the same step, save one checkpoint together, and only then does rank 0 hand over to
submitit's handler, which calls ``RankTask.checkpoint()`` and requeues the job.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any, Callable

from workbench import jobs


class PreemptionSignal:
    """Records the scheduler's warning signal (USR2 by default) instead of acting on it at once."""

    def __init__(self) -> None:
        self.requested = False
        self._signum: int | None = None
        self._original: Callable[..., Any] | int | None = None

    def install(self) -> PreemptionSignal:
        """Record the job's preemption signal from now on (keeping submitit's handler, if any,
        for ``requeue``); returns self."""
        self._signum = jobs.preemption_signal()
        self._original = signal.getsignal(self._signum)
        signal.signal(self._signum, self._record)
        return self

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def requeue(self) -> bool:
        """On global rank 0, after the agreed stop: let submitit checkpoint the callable and
        requeue the job (it exits the process). False where no submitit handler was installed
        (the debug executor), so the caller reports the run as preempted and stops."""
        if callable(self._original) and self._signum is not None:
            self._original(self._signum, None)
            return True
        return False
