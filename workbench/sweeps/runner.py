"""Reproducible sweeps: one papermill-executed notebook per point of a sweep spec
(:mod:`workbench.sweep_spec`).

A point is complete when its ``run.json`` says ``completed`` and its executed notebook sits
beside the results as ``notebook.ipynb``; that file is renamed into place last, so an interrupted
point (Ctrl-C, a dead kernel, a timeout) never looks complete. A re-run skips complete points and
runs the others again from an empty folder.

The only module that imports papermill.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench import schema
from workbench.config.run_config import RunConfig
from workbench.errors import ConfigError, Problem
from workbench.run.handle import _alive
from workbench.store.files import atomic_write_bytes, read_json, update_run, write_json
from workbench.sweeps.spec import SweepPoint, SweepSpec, load_spec, point_run_id

NOTEBOOK_FILE = "notebook.ipynb"
#: The executed notebook while it runs; renamed to NOTEBOOK_FILE only when the point succeeded.
PARTIAL_NOTEBOOK_FILE = "notebook.partial.ipynb"
#: The executed notebook of a point that failed (kept for its tracebacks; never counts as done).
FAILED_NOTEBOOK_FILE = "notebook.failed.ipynb"
POINT_FILE = "sweep_point.json"
SUMMARY_FILE = "summary.csv"
REPORT_FILE = "report.html"
#: The parameters the sweep passes to its notebook for each point.
NOTEBOOK_PARAMETERS = ("output_dir", "sweep", "run_name", "config", "executor", "executor_options")
#: Beyond the run's own time limit, what a notebook cell gets for imports, tables and figures.
CELL_TIMEOUT_MARGIN_S = 300.0
#: ...and, on a scheduler, for the job to wait in its queue (set ``cell_timeout_s`` to choose).
SCHEDULER_QUEUE_S = 24 * 3600.0


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


def check_notebook(notebook: str | Path) -> dict[str, Any]:
    """The notebook's parameters (papermill's ``inspect_notebook``); ConfigError listing them
    when it lacks one the sweep passes."""
    import papermill

    params = papermill.inspect_notebook(str(notebook))
    missing = [name for name in NOTEBOOK_PARAMETERS if name not in params]
    if missing:
        have = ", ".join(params) or "none: no cell is tagged 'parameters'"
        raise ConfigError(
            [
                Problem(
                    name,
                    None,
                    f"the sweep passes it but the notebook's parameters "
                    f"cell lacks it; the notebook has: {have}",
                )
                for name in missing
            ],
            what=f"notebook {str(notebook)!r}",
        )
    return dict(params)


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
        return not self.failed

    def __str__(self) -> str:
        return (
            f"sweep {self.name}: {len(self.ran)} run, {len(self.skipped)} skipped, "
            f"{len(self.failed)} failed ({self.sweep_dir})"
        )


def _cell_timeout_s(spec: SweepSpec, config: RunConfig) -> int:
    """Every cell gets a limit: nbclient can miss the end of a cell (one that fills an Output
    widget, say) and would then wait for ever."""
    if spec.cell_timeout_s is not None:
        return int(spec.cell_timeout_s)
    queue = 0.0 if spec.executor in ("local", "debug") else SCHEDULER_QUEUE_S
    return int(config.timeout_min * 60 + CELL_TIMEOUT_MARGIN_S + queue)


def _pids_of_run(run_path: Path) -> list[int]:
    """Live processes started for this run (submitit's controller and ranks name the run's
    logs folder on their command line)."""
    marker = str(run_path / schema.LOGS_DIR)
    pids: list[int] = []
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        return pids
    for proc in proc_root.iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        ours = any(a == marker or a.startswith(marker + os.sep) for a in args)
        if ours and _alive(int(proc.name)):
            pids.append(int(proc.name))
    return pids


def _stop_point(run_path: Path, reason: str) -> None:
    """After a point's kernel went away early: end what it launched and record the run as
    cancelled, so nothing keeps writing into the folder and nothing reads as still running.

    Local ranks run in a session of their own (they outlive the kernel by design), and ranks
    still importing torch have not yet recorded their pids; so they are found by the run's logs
    folder on their command line, and killed until none is left (the controller may still be
    starting one)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = _pids_of_run(run_path)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)
    run_file = run_path / schema.RUN_FILE
    try:
        run = read_json(run_file) if run_file.exists() else None
    except (OSError, ValueError):
        run = None
    if run is None or run.get("ended_at") is not None:
        return
    try:
        from workbench.run.handle import attach

        attach(run_path).cancel()  # a scheduler's job too, and the run's summary so far
    except Exception:  # the record below must be written whatever the handle could not do
        pass
    fields: dict[str, Any] = {"failure": {"rank": None, "exception": reason}}
    if read_json(run_file).get("ended_at") is None:
        fields.update(status="cancelled", ended_at=time.time())
    update_run(run_path, **fields)


def _parameters(spec: SweepSpec, point: SweepPoint) -> dict[str, Any]:
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
    import papermill

    start = time.monotonic()
    if point.path.exists():
        shutil.rmtree(point.path)  # a stale attempt: its files must not mix with the new ones
    point.path.mkdir(parents=True)
    _record_point(spec, point, notebook)
    partial = point.path / PARTIAL_NOTEBOOK_FILE
    error: str | None = None
    try:
        papermill.execute_notebook(
            str(notebook),
            str(partial),
            parameters=_parameters(spec, point),
            progress_bar=False,
            execution_timeout=_cell_timeout_s(spec, point.config),
            # The kernel's own start-up warnings (one per point) would bury the progress bar;
            # its errors still show, and the cells' output is in the executed notebook.
            extra_arguments=["--IPKernelApp.log_level=ERROR"],
            # Killed, not asked to stop: a kernel interrupted mid-cell would otherwise hold the
            # sweep for nbclient's grace period and print a traceback while going down.
            shutdown_kernel="immediate",
        )
    except KeyboardInterrupt:
        _stop_point(point.path, "sweep interrupted (KeyboardInterrupt)")
        raise
    except Exception as exc:  # a failed cell, a dead kernel, a timeout: this point only
        error = _describe(exc)
        _stop_point(point.path, f"the point's notebook did not finish: {error}")
    if error is None:
        state = point_state_after_run(point.path)
        if state is not None:
            error = state
    seconds = time.monotonic() - start
    if error is None:
        _commit_notebook(partial, point.path / NOTEBOOK_FILE)
        return PointOutcome(
            index=point.index,
            run_id=point.run_id,
            path=point.path,
            status="completed",
            seconds=seconds,
        )
    if partial.exists():
        os.replace(partial, point.path / FAILED_NOTEBOOK_FILE)
    return PointOutcome(
        index=point.index,
        run_id=point.run_id,
        path=point.path,
        status="failed",
        error=error,
        seconds=seconds,
    )


def _describe(exc: Exception) -> str:
    # papermill's own message is a whole traceback; the cell's exception is what to show.
    if hasattr(exc, "ename") and hasattr(exc, "evalue"):
        return f"{exc.ename}: {exc.evalue}".strip()
    lines = str(exc).strip().splitlines()  # a timeout's first line says it; then the cell
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()


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


def write_summary(spec: SweepSpec) -> tuple[Path | None, Path | None]:
    """``summary.csv`` (the scaling table) and ``report.html`` of every run in the sweep's
    folder; (None, None) when it holds no completed run with traces yet."""
    from workbench.analysis.tables import scaling_table
    from workbench.store.load import load_runs, load_traces
    from workbench.ui.report import report_from_store

    runs = load_runs(spec.sweep_dir.parent, [spec.name])
    if runs.empty or not (runs["status"] == "completed").any():
        return None, None
    paths = list(runs.loc[runs["status"] == "completed", "path"])
    steps = load_traces(paths, "steps")
    if steps.empty:
        return None, None
    table = scaling_table(runs, steps, load_traces(paths, "eval"))
    summary = spec.sweep_dir / SUMMARY_FILE
    atomic_write_bytes(summary, table.to_csv(index=False).encode())
    title = f"Sweep {spec.name}" + (f": {spec.description}" if spec.description else "")
    report = report_from_store(spec.sweep_dir, spec.sweep_dir / REPORT_FILE, title=title)
    return summary, report


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
    with tqdm(points, desc=f"sweep {spec.name}", unit="point", disable=not progress) as bar:
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
    from workbench.store.load import iter_run_dirs

    ids = {p.run_id for p in points}
    others = [
        d.name for d in iter_run_dirs(spec.sweep_dir.parent, [spec.name]) if d.name not in ids
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
