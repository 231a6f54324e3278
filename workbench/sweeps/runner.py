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
from workbench.run.handle import attach
from workbench.run.processes import kill_run
from workbench.store.files import read_json, update_run, write_json
from workbench.sweeps.execute import (
    NOTEBOOK_PARAMETERS,
    cell_timeout_s,
    check_notebook,
    execute_notebook,
)
from workbench.sweeps.run_ids import point_run_id
from workbench.sweeps.spec import SweepPoint, SweepSpec, load_spec

NOTEBOOK_FILE = "notebook.ipynb"
#: The executed notebook while it runs; renamed to NOTEBOOK_FILE only when the point succeeded.
PARTIAL_NOTEBOOK_FILE = "notebook.partial.ipynb"
#: The executed notebook of a point that failed (kept for its tracebacks; never counts as done).
FAILED_NOTEBOOK_FILE = "notebook.failed.ipynb"
POINT_FILE = "sweep_point.json"
SUMMARY_FILE = "summary.csv"
REPORT_FILE = "report.html"


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
        return (
            f"sweep {self.name}: {len(self.ran)} ran, {len(self.skipped)} skipped, "
            f"{len(self.failed)} failed ({self.sweep_dir})"
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


def _has_step_traces(run_paths: list[str]) -> bool:
    """Whether any of these runs wrote a step trace file with something in it."""
    pattern = schema.steps_file(0, "*").replace("00000", "*")  # any rank, Parquet or live
    return any(
        f.stat().st_size > 0
        for path in run_paths
        for f in (Path(path) / schema.TRACES_DIR).glob(pattern)
    )


def write_summary(spec: SweepSpec) -> tuple[Path | None, Path | None]:
    """``summary.csv`` (the scaling table) and ``report.html`` of every run in the sweep's
    folder, written by the report, which computes the table once; (None, None) when the folder
    holds no completed run with traces yet."""
    from workbench.store.load import load_runs
    from workbench.ui.report import report_from_store

    runs = load_runs(spec.sweep_dir.parent, [spec.name])
    if runs.empty or not (runs["status"] == "completed").any():
        return None, None
    if not _has_step_traces(list(runs.loc[runs["status"] == "completed", "path"])):
        return None, None
    summary = spec.sweep_dir / SUMMARY_FILE
    title = f"Sweep {spec.name}" + (f": {spec.description}" if spec.description else "")
    report = report_from_store(
        spec.sweep_dir, spec.sweep_dir / REPORT_FILE, title=title, summary_csv=summary
    )
    return summary, report


def _pool_for(spec: SweepSpec) -> contextlib.AbstractContextManager[Any]:
    """On the pool executor, one template that every point's kernel forks its ranks from
    (torch imported once a sweep, not once a rank), unless one already serves this process;
    else nothing."""
    from workbench.run.backends.pool import SHARED_TEMPLATE_ENV, shared_template

    served = os.environ.get(SHARED_TEMPLATE_ENV)
    if spec.executor != "pool" or (served and os.path.exists(served)):
        return contextlib.nullcontext()
    return shared_template()


def run_sweep(spec: SweepSpec, force: bool = False, progress: bool = True) -> SweepResult:
    """Run every point that is not complete (all of them with ``force``), one after another,
    each by executing the sweep notebook with papermill; then write the summary and report.

    A failed point does not stop the sweep (see ``SweepResult.failed``). Ctrl-C stops it at
    once: the current point's ranks are ended and its folder never looks complete; completed
    points stay, and running the sweep again goes on from there.
    """
    from tqdm.auto import tqdm

    points = spec.points()
    notebook = spec.notebook_path()
    check_notebook(notebook)
    outcomes: list[PointOutcome] = []
    with (
        _pool_for(spec),
        tqdm(points, desc=f"sweep {spec.name}", unit="point", disable=not progress) as bar,
    ):
        for point in bar:
            bar.set_postfix_str(point.run_id)
            if not force and point_state(point.path) == "complete":
                outcomes.append(
                    PointOutcome(
                        index=point.index, run_id=point.run_id, path=point.path, status="skipped"
                    )
                )
                continue
            outcome = run_point(spec, point, notebook)
            if outcome.status == "failed":
                bar.write(
                    f"point {point.index} ({point.run_id}) failed: {outcome.error}\n"
                    f"  notebook: {point.path / FAILED_NOTEBOOK_FILE}"
                )
            outcomes.append(outcome)
    summary = report = None
    summary_error = None
    try:
        summary, report = write_summary(spec)
    except Exception as exc:  # the points' results stand even when the summary cannot be made
        summary_error = f"{type(exc).__name__}: {exc}"
    from workbench.run.launches import point_run_id
    from workbench.store.load import iter_run_dirs

    ids = {p.run_id for p in points}
    others = [  # a point's further launches are its own (run.launches)
        d.name
        for d in iter_run_dirs(spec.sweep_dir.parent, [spec.name])
        if point_run_id(d.name) not in ids
    ]
    return SweepResult(
        name=spec.name,
        sweep_dir=spec.sweep_dir,
        outcomes=outcomes,
        summary_path=summary,
        report_path=report,
        summary_error=summary_error,
        other_runs=others,
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
