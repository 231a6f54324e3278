"""A script's rank measuring until known (``RunConfig.until_known``), by the rule of
:mod:`workbench.trace.known`: the time between the starts of consecutive steps' optimizer steps
(after the warm-up), a look every ``known.CHECK_EVERY`` steps agreed by every rank (one small
allreduce on the hooks' own gloo group). Once agreed, the script's training
loop is ended the way an epoch ends: its next training fetch from a DataLoader (one under
autograd; an evaluation under ``no_grad`` is untouched) raises StopIteration, so a ``for batch
in loader`` ends cleanly, its later epochs are empty, and its code after the loop (a checkpoint,
its own print) runs. A loop that is not over a DataLoader cannot be ended from outside: it runs
to its own end, and the record says so."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from workbench.trace import known

#: Each flag true on every rank where it is true on any (the rank sets it: an allreduce on the
#: hooks' own gloo group once the script has a process group).
Agree = Callable[[list[bool]], list[bool]]


class ScriptUntilKnown:
    """One script rank's measured steps and the stop its ranks agree on."""

    def __init__(self, within: float, cap_s: float, warmup_steps: int) -> None:
        self.within, self.cap_s, self.warmup_steps = within, cap_s, warmup_steps
        self.cycles: list[float] = []
        self.steps = 0
        self._last: float | None = None
        self._t0: float | None = None
        self.stopped_by: str | None = None  # what the ranks agreed on
        self.refused = 0  # training fetches refused after the agreement
        self.agree: Agree = lambda flags: flags  # one process until the script joins a group

    def step(self, now: float) -> None:
        """A step's optimizer phase starts at ``now``; every ``CHECK_EVERY`` steps the ranks
        look (collectively) whether they are done."""
        self.steps += 1
        if self.steps > self.warmup_steps:
            if self._last is not None:
                self.cycles.append(now - self._last)
            self._t0 = self._t0 if self._t0 is not None else now
            self._last = now
        if self.stopped_by is None and self.steps % known.CHECK_EVERY == 0:
            self._agree(now)

    def _agree(self, now: float) -> None:
        elapsed = now - self._t0 if self._t0 is not None else 0.0
        stop = known.verdict(self.cycles, self.within, elapsed, self.cap_s, False).stop
        unknown, time_up = self.agree([stop != "known", stop == "time cap"])
        if not unknown or time_up:
            self.stopped_by = "known" if not unknown else "time cap"

    def refuse(self) -> bool:
        """Whether a training fetch is refused now (the ranks agreed to stop)."""
        if self.stopped_by is None:
            return False
        self.refused += 1
        return True

    def record(self) -> dict[str, Any]:
        """What the rank's summary keeps (as a built-in run's, :mod:`workbench.rank.until_known`);
        ``stopped_by`` "end" where the script's loop could not be ended (no DataLoader fetch
        was refused) or was not known by its own end."""
        elapsed = time.perf_counter() - (self._t0 or time.perf_counter())
        final = known.verdict(self.cycles, self.within, elapsed, self.cap_s, False)
        stop = self.stopped_by if self.refused else None
        out = known.Verdict(stop, final.estimate, final.warmup)
        record = out.record(self.within, self.steps, 0, self.cap_s)
        if self.stopped_by is not None and not self.refused:
            said = "known" if self.stopped_by == "known" else "its time cap reached"
            record["note"] = (
                f"{said}, but the script's training loop is not over a DataLoader: it ran to "
                "its own end"
            )
        return record
