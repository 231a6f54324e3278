"""A sweep's further launches: each point's notebook runs its first launch, then the points
whose launches disagree are launched again in rounds (:func:`workbench.run.rounds.run_rounds`,
the study loop of ``run_study`` and ``workbench scale``), so a slow stretch of the machine
falls on every point alike. A further launch is a run of its own, ``<point>-launch<k>``,
beside the point (no notebook of its own: the point's notebook and the sweep's report cover
it). Running the sweep again goes on where the launches stopped."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

from workbench import schema
from workbench.run.handle import RunHandle, attach
from workbench.run.rounds import StudyRuns, run_rounds
from workbench.store.files import read_json
from workbench.sweeps.spec import SweepPoint, SweepSpec


def launch_dirs(point: SweepPoint) -> list[Path]:
    """The point's further launches in its sweep's folder, in launch order."""
    pattern = re.compile(re.escape(point.run_id) + r"-launch(\d+)$")
    found = [
        (int(m.group(1)), d) for d in point.path.parent.iterdir() if (m := pattern.match(d.name))
    ]
    return [d for _, d in sorted(found)]


def forget_launches(point: SweepPoint) -> None:
    """Remove the point's further launches (its first is run again from an empty folder: the
    others must not be pooled with it)."""
    if point.path.parent.exists():
        for d in launch_dirs(point):
            shutil.rmtree(d)


def _run_dirs(point: SweepPoint) -> list[Path]:
    """The point's launches that got as far as a run record, its own first."""
    dirs = [point.path, *launch_dirs(point)]
    return [d for d in dirs if (d / schema.RUN_FILE).exists()]


def launches_of(point: SweepPoint) -> list[RunHandle]:
    """The point's launches so far (its own run first) as handles."""
    return [attach(d) for d in _run_dirs(point)]


def spent_by(point: SweepPoint) -> float:
    """Device-seconds the point's ended launches held."""
    held = (read_json(d / schema.RUN_FILE).get("device_s") for d in _run_dirs(point))
    return sum(float(h) for h in held if h is not None)


def launch_again(
    spec: SweepSpec,
    points: list[SweepPoint],
    budget_left_s: float | None,
    wait: Callable[[RunHandle, str], object],
    say: Callable[[str], object],
) -> StudyRuns:
    """Launch ``points`` (completed ones) again, round after round, while their launches
    disagree, within the budget left."""
    return run_rounds(
        [(p.config, launches_of(p)) for p in points],
        spec.executor,
        wait,
        budget_device_s=budget_left_s,
        say=say,
        **spec.executor_options,
    )
