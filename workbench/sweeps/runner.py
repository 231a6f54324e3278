"""Reproducible sweeps: one papermill-executed notebook per point of a sweep spec
(:mod:`workbench.sweeps.spec`).

A point is complete when its ``run.json`` says ``completed`` and its executed notebook sits
beside the results as ``notebook.ipynb``; that file is renamed into place last, so an interrupted
point (Ctrl-C, a dead kernel, a timeout) never looks complete. A re-run skips complete points and
runs the others again from an empty folder. Executing a notebook is
:mod:`workbench.sweeps.execute` (the only module that imports papermill).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench import schema
from workbench.run.backends import backend
from workbench.run.handle import attach
from workbench.run.processes import kill_run
from workbench.run.rounds import PointLeft, StudyRuns, budget_note
from workbench.store.files import read_json, update_run, write_json
from workbench.sweeps.execute import (
    NOTEBOOK_PARAMETERS,
    cell_timeout_s,
    check_notebook,
    execute_notebook,
)
from workbench.sweeps.launch_again import forget_launches, launch_again, spent_by
from workbench.sweeps.run_ids import point_run_id
from workbench.sweeps.spec import SweepPoint, SweepSpec, load_spec
from workbench.sweeps.summary import other_runs, write_summary

NOTEBOOK_FILE = "notebook.ipynb"
#: The executed notebook while it runs; renamed to NOTEBOOK_FILE only when the point succeeded.
PARTIAL_NOTEBOOK_FILE = "notebook.partial.ipynb"
#: The executed notebook of a point that failed (kept for its tracebacks; never counts as done).
FAILED_NOTEBOOK_FILE = "notebook.failed.ipynb"
POINT_FILE = "sweep_point.json"


# -- state of a point in the store


def point_state(path: Path) -> str:
    """``complete`` (run.json completed and notebook.ipynb present), ``missing`` (no folder) or
    ``stale`` (anything else: failed, interrupted, half-written)."""
    if not path.exists():
        return "missing"
    try:
        run = read_json(path / schema.RUN_FILE)
    except (OSError, ValueError):
        return "stale"
    done = run.get("ended_at") is not None and run.get("status") == "completed"
    return "complete" if done and (path / NOTEBOOK_FILE).is_file() else "stale"


def plan(spec: SweepSpec, force: bool = False) -> list[tuple[SweepPoint, str]]:
    """Each point and what ``run_sweep`` would do with it: ``skip`` or ``run``."""
    return [
        (p, "run" if force or point_state(p.path) != "complete" else "skip") for p in spec.points()
    ]


# -- running


@dataclass(frozen=True, kw_only=True)
class PointOutcome:
    """What happened to one point in this call: ``completed``, ``skipped`` or ``failed``."""

    index: int
    run_id: str
    path: Path
    status: str
    error: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class SweepResult:
    """The outcome of :func:`run_sweep`: per point, and where the summary and report are."""

    name: str
    sweep_dir: Path
    outcomes: list[PointOutcome]
    summary_path: Path | None
    report_path: Path | None
    summary_error: str | None = None
    budget_note: str | None = None
    """what the budget left undone (points not run, points known less well than asked)"""
    other_runs: list[str] = field(default_factory=list)
    """runs in the sweep's folder that are not points of this spec (an older version of it,
    say); the summary and report include them"""

    def _ids(self, status: str) -> list[str]:
        """Run ids of the points that ended with ``status``."""
        return [o.run_id for o in self.outcomes if o.status == status]

    @property
    def ran(self) -> list[str]:
        """Run ids executed (and completed) by this call."""
        return self._ids("completed")

    @property
    def skipped(self) -> list[str]:
        """Run ids already complete, left as they were."""
        return self._ids("skipped")

    @property
    def failed(self) -> dict[str, str]:
        """Run id -> why it failed."""
        return {o.run_id: o.error or "" for o in self.outcomes if o.status == "failed"}

    @property
    def ok(self) -> bool:
        """Whether no point failed."""
        return not self.failed

    def __str__(self) -> str:
        left = len(self._ids("left"))
        return (
            f"sweep {self.name}: {len(self.ran)} ran, {len(self.skipped)} skipped, "
            f"{len(self.failed)} failed"
            + (f", {left} left for the budget" * bool(left))
            + f" ({self.sweep_dir})"
        )


def _stop_point(run_path: Path, reason: str) -> None:
    """After a point's kernel went away early: end what it launched and record the run as
    cancelled, so nothing keeps writing into the folder and nothing reads as still running.

    Local ranks run in a session of their own (they outlive the kernel by design), and ranks
    still importing torch have not yet recorded their pids; so they are found by the run's logs
    folder on their command line, and killed until none is left (the controller may still be
    starting one)."""
    kill_run(run_path)
    run_file = run_path / schema.RUN_FILE
    try:
        run = read_json(run_file) if run_file.exists() else None
    except (OSError, ValueError):
        run = None
    if run is None or run.get("ended_at") is not None:
        return
    try:
        attach(run_path).cancel()  # a scheduler's job too, and the run's summary so far
    except Exception:  # the record below must be written whatever the handle could not do
        pass
    fields: dict[str, Any] = {"failure": {"rank": None, "exception": reason}}
    if read_json(run_file).get("ended_at") is None:
        fields.update(status="cancelled", ended_at=time.time())
    update_run(run_path, **fields)


def _parameters(spec: SweepSpec, point: SweepPoint) -> dict[str, Any]:
    """The values passed to the notebook's parameters cell for this point."""
    # JSON round trip: papermill writes the values as Python literals, and JSON types are the
    # ones it renders faithfully (tuples, for one, are not).
    config = json.loads(point.config.to_json())
    return {
        "output_dir": str(point.config.output_dir),
        "sweep": spec.name,
        "run_name": point.run_id,
        "config": config,
        "executor": spec.executor,
        "executor_options": json.loads(json.dumps(spec.executor_options, default=str)),
    }


def _record_point(spec: SweepSpec, point: SweepPoint, notebook: Path) -> None:
    """Write ``sweep_point.json``: the point, its spec and the notebook it is run with."""
    write_json(
        point.path / POINT_FILE,
        {
            "sweep": spec.name,
            "index": point.index,
            "points": len(spec.points()),
            "run_id": point.run_id,
            "values": point.values,
            "spec": spec.to_dict(),
            "spec_path": spec.source,
            "notebook": str(notebook),
            "notebook_sha256": hashlib.sha256(notebook.read_bytes()).hexdigest(),
            "parameters": _parameters(spec, point),
        },
    )


def _commit_notebook(partial: Path, final: Path) -> None:
    """Make the executed notebook durable, then rename it into place (the point's last write)."""
    with open(partial, "rb") as f:
        os.fsync(f.fileno())
    os.replace(partial, final)


def run_point(spec: SweepSpec, point: SweepPoint, notebook: Path) -> PointOutcome:
    """Execute the notebook for one point in an emptied run folder. Failures are returned as a
    ``failed`` outcome; KeyboardInterrupt stops the point's ranks and propagates."""
    start = time.monotonic()
    if point.path.exists():
        shutil.rmtree(point.path)  # a stale attempt: its files must not mix with the new ones
    forget_launches(point)  # nor its further launches with the new first one
    point.path.mkdir(parents=True)
    _record_point(spec, point, notebook)
    partial = point.path / PARTIAL_NOTEBOOK_FILE
    try:
        error = execute_notebook(
            notebook, partial, _parameters(spec, point), cell_timeout_s(spec, point.config)
        )
    except KeyboardInterrupt:
        _stop_point(point.path, "sweep interrupted (KeyboardInterrupt)")
        raise
    if error is not None:
        _stop_point(point.path, f"the point's notebook did not finish: {error}")
    else:
        error = point_state_after_run(point.path)
    if error is None:
        _commit_notebook(partial, point.path / NOTEBOOK_FILE)
    elif partial.exists():
        os.replace(partial, point.path / FAILED_NOTEBOOK_FILE)
    return PointOutcome(
        index=point.index,
        run_id=point.run_id,
        path=point.path,
        status="completed" if error is None else "failed",
        error=error,
        seconds=time.monotonic() - start,
    )


def point_state_after_run(path: Path) -> str | None:
    """None when the notebook left a completed run in ``path``; else what is wrong."""
    run_file = path / schema.RUN_FILE
    if not run_file.exists():
        return (
            f"the notebook finished but left no run at {path} (does it pass run_name and "
            "output_dir to launch?)"
        )
    run = read_json(run_file)
    if run.get("ended_at") is None or run.get("status") != "completed":
        return f"the notebook finished but the run is {run.get('status')!r}"
    return None


def _pool_for(spec: SweepSpec) -> contextlib.AbstractContextManager[Any]:
    """On the pool executor, one template that every point's kernel forks its ranks from
    (torch imported once a sweep, not once a rank), unless one already serves this process;
    else nothing."""
    from workbench.run.backends.pool import SHARED_TEMPLATE_ENV, shared_template

    served = os.environ.get(SHARED_TEMPLATE_ENV)
    if not backend(spec.executor).warm_workers or (served and os.path.exists(served)):
        return contextlib.nullcontext()
    return shared_template()


def _run_points(
    spec: SweepSpec, force: bool, budget_s: float | None, bar: Any
) -> tuple[list[PointOutcome], float]:
    """Each point's notebook (its first launch) unless complete, while the budget lasts; the
    outcomes and the device-seconds spent."""
    notebook = spec.notebook_path()
    outcomes: list[PointOutcome] = []
    used = 0.0
    for point in bar:
        bar.set_postfix_str(point.run_id)
        where = {"index": point.index, "run_id": point.run_id, "path": point.path}
        if not force and point_state(point.path) == "complete":
            outcomes.append(PointOutcome(**where, status="skipped"))
            continue
        if budget_s is not None and used >= budget_s:
            outcomes.append(PointOutcome(**where, status="left", error="budget spent"))
            continue
        outcome = run_point(spec, point, notebook)
        used += spent_by(point)
        if outcome.status == "failed":
            bar.write(
                f"point {point.index} ({point.run_id}) failed: {outcome.error}\n"
                f"  notebook: {point.path / FAILED_NOTEBOOK_FILE}"
            )
        outcomes.append(outcome)
    return outcomes, used


def _budget_note(
    points: list[SweepPoint],
    outcomes: list[PointOutcome],
    budget: float | None,
    used: float,
    again: StudyRuns,
) -> str | None:
    """What the budget left undone: the points whose notebook never ran, and those known less
    well than asked when it ran out (``again.left``)."""
    never = [
        PointLeft(p.config, 0, float("nan"), p.config.until_known)
        for p, o in zip(points, outcomes, strict=True)
        if o.status == "left"
    ]
    return budget_note(used + again.spent_device_s, budget, never + again.left)


def run_sweep(
    spec: SweepSpec,
    force: bool = False,
    progress: bool = True,
    budget_device_s: float | None = None,
) -> SweepResult:
    """Run every point that is not complete (all of them with ``force``), one after another,
    each by executing the sweep notebook with papermill (its first launch); then launch again,
    round after round, the points whose launches disagree (measuring until known:
    :mod:`workbench.sweeps.launch_again`); then write the summary and report.
    ``budget_device_s`` (else the spec's ``budget_device_s``): no launch starts once this
    call has held that many device-seconds; ``SweepResult.budget_note`` says what was left.

    A failed point does not stop the sweep (see ``SweepResult.failed``). Ctrl-C stops it at
    once: the current point's ranks are ended and its folder never looks complete; completed
    points stay, and running the sweep again goes on from there.
    """
    from tqdm.auto import tqdm

    from workbench.config.budget import budget_seconds

    budget = budget_device_s
    if budget is None and spec.budget_device_s is not None:
        budget = budget_seconds(spec.budget_device_s)
    points = spec.points()
    check_notebook(spec.notebook_path())
    with (
        _pool_for(spec),
        tqdm(points, desc=f"sweep {spec.name}", unit="point", disable=not progress) as bar,
    ):
        outcomes, used = _run_points(spec, force, budget, bar)
        done = [p for p in points if point_state(p.path) == "complete"]

        def wait(handle: Any, label: str) -> None:
            bar.set_postfix_str(f"{handle.run_id} ({label})")
            try:
                handle.wait()
            except KeyboardInterrupt:  # as a point's: its ranks ended, recorded as cancelled
                _stop_point(handle.path, "sweep interrupted (KeyboardInterrupt)")
                raise

        again = launch_again(
            spec, done, None if budget is None else budget - used, wait, say=bar.write
        )
    summary = report = None
    summary_error = None
    try:
        summary, report = write_summary(spec)
    except Exception as exc:  # the points' results stand even when the summary cannot be made
        summary_error = f"{type(exc).__name__}: {exc}"
    return SweepResult(
        name=spec.name,
        sweep_dir=spec.sweep_dir,
        outcomes=outcomes,
        summary_path=summary,
        report_path=report,
        summary_error=summary_error,
        budget_note=_budget_note(points, outcomes, budget, used, again),
        other_runs=other_runs(spec, points),
    )


__all__ = [
    "NOTEBOOK_PARAMETERS",
    "PointOutcome",
    "SweepPoint",
    "SweepResult",
    "SweepSpec",
    "check_notebook",
    "load_spec",
    "plan",
    "point_run_id",
    "point_state",
    "run_point",
    "run_sweep",
    "write_summary",
]
