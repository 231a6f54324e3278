"""A sweep's summary and report (``summary.csv``, ``report.html``) over every run in its
folder, and the runs there that are no launch of its points."""

from __future__ import annotations

from pathlib import Path

from workbench import schema
from workbench.sweeps.spec import SweepPoint, SweepSpec

SUMMARY_FILE = "summary.csv"
REPORT_FILE = "report.html"


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


def other_runs(spec: SweepSpec, points: list[SweepPoint]) -> list[str]:
    """Runs in the sweep's folder that are no launch of this spec's points."""
    from workbench.run.launches import point_run_id
    from workbench.store.load import iter_run_dirs

    ids = {p.run_id for p in points}
    return [  # a point's further launches are its own (run.launches)
        d.name
        for d in iter_run_dirs(spec.sweep_dir.parent, [spec.name])
        if point_run_id(d.name) not in ids
    ]
