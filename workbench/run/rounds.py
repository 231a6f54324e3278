"""A study's launches in rounds: every point launched once, then, round after round, again
those whose launches still disagree (:mod:`workbench.run.launches`). A slow stretch of a
shared machine then falls on every point alike instead of on one point's launches, and each
point is measured once before any is measured again. Within a budget of device-seconds where
one is given: a launch starts only while some is left, a run measuring until known is capped
at what is left, and what the study stopped short of is said, point by point.

The one study loop of the package: ``run_study`` (notebooks), ``workbench scale`` and a
sweep's further launches all go through :func:`run_rounds`."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench import schema
from workbench.analysis.measured.units import percent
from workbench.config.run_config import RunConfig
from workbench.errors import RunFailedError
from workbench.run.backends import backend
from workbench.run.handle import RunHandle
from workbench.run.launch import launch, launch_array
from workbench.run.launches import known_to, launch_name, next_launch
from workbench.store.files import read_json

#: Waits for one launch (``label``: which, e.g. "run 2/4, launch 2"); raises RunFailedError
#: where it failed.
Wait = Callable[[RunHandle, str], object]


@dataclass(frozen=True)
class PointLeft:
    """A point the study stopped short of: launched ``launches`` times, its throughput known
    to +-``known_to`` (a fraction; NaN: not measured) against the +-``goal`` it asked for."""

    config: RunConfig
    launches: int
    known_to: float
    goal: float | None

    def text(self) -> str:
        """The point and how far it is from known, in words."""
        name = point_label(self.config)
        if self.launches == 0 or math.isnan(self.known_to):
            return f"{name}: not measured"
        runs = f"{self.launches} launch{'es' if self.launches != 1 else ''}"
        asked = "" if self.goal is None else f", +-{percent(self.goal)} asked"
        return f"{name}: known to +-{percent(self.known_to)} only ({runs}{asked})"


class StudyRuns(list[RunHandle]):
    """The handles of a study's launches, each point's together in launch order, with what the
    study spent (``spent_device_s``) against its ``budget_device_s`` and the points it stopped
    short of for the budget (``left``)."""

    budget_device_s: float | None = None
    spent_device_s: float = 0.0

    def __init__(self, handles: Iterable[RunHandle] = ()) -> None:
        super().__init__(handles)
        self.left: list[PointLeft] = []

    def budget_note(self) -> str | None:
        """What the budget left undone, in one paragraph; None where it was not reached."""
        return budget_note(self.spent_device_s, self.budget_device_s, self.left)


def budget_note(spent: float, budget: float | None, left: Sequence[PointLeft]) -> str | None:
    """``budget spent: 2,034 of 2,000 device-seconds; the study stopped short of: ...``, each
    point left in words; None where nothing was left."""
    if budget is None or not left:
        return None
    return (
        f"budget spent: {spent:,.0f} of {budget:,.0f} device-seconds; the study stopped short "
        "of: " + "; ".join(p.text() for p in left)
    )


def point_label(config: RunConfig) -> str:
    """A point as people say it: its run name where it has one (a sweep's point), else
    ``transformer at 2 ranks`` (a script by its file name)."""
    if config.run_name:
        return config.run_name
    what = Path(str(config.script)).name if config.is_script else config.model
    return f"{what} at {config.world_size} rank{'s' if config.world_size != 1 else ''}"


def device_seconds(handle: RunHandle) -> float:
    """What an ended launch held (run.json's ``device_s``); 0 where it was never recorded."""
    value = read_json(handle.path / schema.RUN_FILE).get("device_s")
    return 0.0 if value is None else float(value)


def _capped(config: RunConfig, left_s: float | None) -> RunConfig:
    """``config`` measuring until known for at most the budget left, shared by its devices."""
    if left_s is None or config.until_known is None:
        return config
    cap = left_s / config.processes
    return config if cap >= config.until_known_max_s else config.replace(until_known_max_s=cap)


class _Study:
    """The state of :func:`run_rounds`: each point's launches and the budget spent."""

    def __init__(
        self,
        points: Sequence[tuple[RunConfig, Sequence[RunHandle]]],
        executor: str,
        budget_device_s: float | None,
        repeat: bool,
        options: dict[str, Any],
    ) -> None:
        self.configs = [c for c, _ in points]
        self.done = [list(d) for _, d in points]
        self.executor, self.options = executor, options
        self.budget_device_s, self.spent = budget_device_s, 0.0
        self.repeat = repeat

    def left_s(self) -> float | None:
        """Device-seconds left of the budget (None: no budget)."""
        return None if self.budget_device_s is None else self.budget_device_s - self.spent

    def next_config(self, i: int) -> RunConfig:
        """Point ``i``'s next launch: its own config first, then under a launch name, capped
        at the budget left."""
        config, done = self.configs[i], self.done[i]
        if done:
            config = config.replace(run_name=launch_name(config.run_name, len(done) + 1))
        return _capped(config, self.left_s())

    def again(self) -> list[int]:
        """The points to launch again, in study order (none where told not to repeat)."""
        return (
            []
            if not self.repeat
            else [
                i
                for i, (c, d) in enumerate(zip(self.configs, self.done, strict=True))
                if d and next_launch(c, d) is not None
            ]
        )

    def launched(self, todo: Sequence[int]) -> Iterator[tuple[int, RunHandle]]:
        """A round's launches as they start: on a scheduler all at once (job arrays), here
        one at a time, each only while budget is left."""
        if backend(self.executor).submits_at_once:
            left = self.left_s()
            if left is None or left > 0:
                nexts = [self.next_config(i) for i in todo]
                yield from zip(todo, launch_array(nexts, **self.options), strict=True)
            return
        for i in todo:
            left = self.left_s()
            if left is not None and left <= 0:
                return
            yield i, launch(self.next_config(i), self.executor, **self.options)


def run_rounds(
    points: Sequence[tuple[RunConfig, Sequence[RunHandle]]],
    executor: str,
    wait: Wait,
    budget_device_s: float | None = None,
    again: bool = True,
    say: Callable[[str], object] = lambda text: print(text, file=sys.stderr),
    **executor_options: Any,
) -> StudyRuns:
    """Launch each point (its config and the launches it already has) in rounds until none
    asks for another (``again=False``: after the first round) or the budget is spent. A
    failed launch is said (``say``) and the study goes on; that point is not launched again."""
    study = _Study(points, executor, budget_device_s, again, executor_options)
    todo = [i for i, d in enumerate(study.done) if not d] or study.again()
    first = True
    while todo:
        for i, handle in study.launched(todo):
            launch_no = len(study.done[i]) + 1
            label = f"run {i + 1}/{len(study.configs)}" + (
                "" if first and launch_no == 1 else f", launch {launch_no}"
            )
            try:
                wait(handle, label)
            except RunFailedError as exc:
                say(f"run {handle.run_id} failed: {exc}")
            study.spent += device_seconds(handle)
            study.done[i].append(handle)
        first = False
        left = study.left_s()
        todo = [] if left is not None and left <= 0 else study.again()
    return _result(study)


def _result(study: _Study) -> StudyRuns:
    """The study's handles, point by point, with what the budget left undone: the points never
    launched and those that asked for another launch when it ran out."""
    out = StudyRuns(h for d in study.done for h in d)
    out.budget_device_s, out.spent_device_s = study.budget_device_s, study.spent
    left = study.left_s()
    short = [i for i, d in enumerate(study.done) if not d] + study.again()
    out.left = (
        [
            PointLeft(
                study.configs[i],
                len(study.done[i]),
                known_to(study.done[i]),
                study.configs[i].until_known,
            )
            for i in sorted(set(short))
        ]
        if left is not None and left <= 0
        else []
    )
    return out
