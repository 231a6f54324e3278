"""How far a report from a store has got: its stages, each one's share of a large report's time,
and the callback that is told them (a progress bar's). No torch."""

from __future__ import annotations

from collections.abc import Callable

#: Told as :func:`workbench.ui.report.report_from_store` goes: what it does now, the share of its
#: work done (0 to 1) and the step rows it reads (from the files' footers, before any pass).
ReportProgress = Callable[[str, float, int], None]
#: Where each stage starts, as a share of a large report's time (at 102.3 M rows: the per-step
#: pass 17 %, the per-rank pass and the straggler pass, which run side by side, 68 %, the
#: figures and tables the rest: the passes run where the report builds the runs' digests, or
#: reads a running run's rows).
STAGE_STARTS = {
    "steps, per step": 0.0,
    "per rank and stragglers": 0.17,
    "figures and tables": 0.85,
    "written": 1.0,
}


class Stages:
    """Tells ``progress`` (when given) the stage a report from a store is in, the share of the
    report done (:data:`STAGE_STARTS`; within the straggler pass, by the cells of the run
    attempts ranked) and the step rows."""

    def __init__(self, progress: ReportProgress | None, rows: int) -> None:
        self.progress, self.rows, self.cells = progress, rows, 0

    def __call__(self, stage: str, within: float = 0.0) -> None:
        if self.progress is not None:
            names = list(STAGE_STARTS)
            start = STAGE_STARTS[stage]
            end = STAGE_STARTS[names[min(names.index(stage) + 1, len(names) - 1)]]
            self.progress(stage, start + (end - start) * min(1.0, within), self.rows)

    def ranked(self, cells: int) -> None:
        self.cells += cells
        self("per rank and stragglers", self.cells / max(1, self.rows))
