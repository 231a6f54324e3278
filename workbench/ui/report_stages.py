"""How far a report from a store has got: its stages, each one's share of a large report's time,
and the callback that is told them (a progress bar's). No torch."""

from __future__ import annotations

from collections.abc import Callable

#: Told as :func:`workbench.ui.report.report_from_store` goes: what it does now, the share of its
#: work done (0 to 1) and the step rows it reads (from the files' footers, before any pass).
ReportProgress = Callable[[str, float, int], None]
#: Where each stage starts, as a share of a large report's time (at 102.3 M rows: the per-step
#: pass 17 %, the per-rank pass 32 %, the straggler pass 36 %, the figures and tables the rest;
#: the runs' digests, when the report builds them, are those passes run by run).
STAGE_STARTS = {
    "run digests": 0.0,  # each run's passes, once, as the first reader (or none: all kept)
    "steps, per step": 0.0,
    "steps, per rank": 0.17,
    "stragglers": 0.49,
    "figures and tables": 0.85,
    "written": 1.0,
}


class Stages:
    """Tells ``progress`` (when given) the stage a report from a store is in, the share of the
    report done (:data:`STAGE_STARTS`; within the straggler pass, by the cells of the run
    attempts ranked) and the step rows."""

    def __init__(self, progress: ReportProgress | None, rows: int, runs: int = 1) -> None:
        self.progress, self.rows, self.cells = progress, rows, 0
        self.runs, self.digests = runs, 0

    def __call__(self, stage: str, within: float = 0.0) -> None:
        if self.progress is not None:
            names = list(STAGE_STARTS)
            start = STAGE_STARTS[stage]
            later = [STAGE_STARTS[n] for n in names[names.index(stage) + 1 :]]
            end = next((t for t in later if t > start), 1.0)  # the digests span the passes
            self.progress(stage, start + (end - start) * min(1.0, within), self.rows)

    def digested(self, run_id: str) -> None:
        """One more run digested (its passes over its rows)."""
        self.digests += 1
        self("run digests", self.digests / max(1, self.runs))

    def ranked(self, cells: int) -> None:
        self.cells += cells
        self("stragglers", self.cells / max(1, self.rows))
