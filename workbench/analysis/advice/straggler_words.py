"""The finding's straggler lines: a line per rank found persistently slower than the others
(:func:`workbench.analysis.stragglers.slow_ranks.stragglers`), or that there is none."""

from __future__ import annotations

import pandas as pd

from workbench.analysis.measured.stored import StoredSteps, is_stored
from workbench.analysis.measured.units import ratio
from workbench.analysis.stragglers.slow_ranks import stragglers, stragglers_in_store

#: The straggler report's phases in words.
PHASE_WORDS = {
    "data_s": "data loading",
    "forward_s": "forward",
    "backward_compute_s": "backward compute",
    "optimizer_s": "the optimizer step",
}


def straggler_lines(steps: pd.DataFrame | StoredSteps, found: pd.DataFrame | None) -> list[str]:
    """A line per straggler (``found``, or ranked here), or ``no slow rank``."""
    if found is None:
        found = (
            stragglers_in_store(steps.run_dirs, stored=steps)
            if is_stored(steps)
            else stragglers(steps)
        )
    out = []
    for row in found.itertuples():
        words = PHASE_WORDS.get(str(row.slow_phase), str(row.slow_phase))
        phase = f", mostly in {words}" if row.slow_phase else ""
        out.append(
            f"rank {row.rank} of run {row.run_id} is a straggler from step {row.start_step}: "
            f"{ratio(row.ratio)} the others' compute time{phase}"
        )
    return out or ["no slow rank"]
