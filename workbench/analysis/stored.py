"""Step rows left in the store: what the analysis takes in place of a ``steps`` frame when a sweep
is too large for pandas.

:class:`StoredSteps` wraps the engine's digest of the runs' step rows
(:class:`workbench.store.digest_query.StepDigest`, the warm-up rule of
:func:`workbench.analysis.windows.detected_warmup` applied in it) and hands out its small
frames, each computed once. The report's entry points (the run and scaling tables, the phase
breakdown, communication, memory, the network fit and the scaling model, the finding, the
figures' data) accept it wherever they accept ``steps``, and give the same columns and values as
with ``load_traces`` of the same runs (``tests/test_stored_oracle.py``). No torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path

import pandas as pd

from workbench.schema import STEP_COLUMNS
from workbench.store.digest_query import StepDigest


class StoredSteps:
    """The step rows of ``run_dirs`` (run folders), aggregated in the engine on request.

    ``evals``: the runs' evaluation rows (small: one per rank and evaluation), for the time
    each rank spends evaluating after a step. ``columns`` lists the schema's step columns so
    that the checks of frame inputs pass; there are no rows to index. Close it (or use it as a
    context manager) to free the engine."""

    columns = pd.Index(list(STEP_COLUMNS))

    def __init__(self, run_dirs: Iterable[str | Path], evals: pd.DataFrame | None = None) -> None:
        from workbench.analysis.windows import detected_warmup

        self.run_dirs = [Path(p) for p in run_dirs]
        self.digest = StepDigest(self.run_dirs, detected_warmup, evals)

    def close(self) -> None:
        """Free the engine."""
        self.digest.close()

    def __enter__(self) -> StoredSteps:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @cached_property
    def runs(self) -> pd.DataFrame:
        """Per run with rows: ``run_id, world_size, has_loss, rows``."""
        return self.digest.runs()

    @property
    def empty(self) -> bool:
        """Whether no run has a step row."""
        return self.runs.empty

    @property
    def run_ids(self) -> list[str]:
        """The runs with step rows, sorted."""
        return [str(r) for r in self.runs["run_id"]]

    @cached_property
    def per_rank(self) -> pd.DataFrame:
        """:meth:`StepDigest.per_rank`."""
        return self.digest.per_rank()

    @cached_property
    def measured_per_rank(self) -> pd.DataFrame:
        """:attr:`per_rank` of the ranks with measured rows."""
        return self.per_rank[self.per_rank["measured_steps"] > 0].reset_index(drop=True)

    @cached_property
    def sampled(self) -> pd.DataFrame:
        """:meth:`StepDigest.sampled`: the measured rows where a DDP timer ran."""
        return self.digest.sampled()

    def sampled_of(self, run_ids: Sequence[object], min_world_size: int = 0) -> pd.DataFrame:
        """:attr:`sampled` of ``run_ids`` at a world size above ``min_world_size``."""
        s = self.sampled
        return s[s["run_id"].isin(list(run_ids)) & (s["world_size"] > min_world_size)]

    def median(
        self, column: str, run_ids: Sequence[object], min_world_size: int | None = None
    ) -> float:
        """:meth:`StepDigest.median` (one pass over the rows of ``run_ids``)."""
        return self.digest.median(column, [str(r) for r in run_ids], min_world_size)

    @cached_property
    def final_loss(self) -> pd.DataFrame:
        """:meth:`StepDigest.last_step_loss`."""
        return self.digest.last_step_loss()

    @cached_property
    def loss_per_step(self) -> pd.DataFrame:
        """:meth:`StepDigest.loss_per_step`."""
        return self.digest.loss_per_step()

    @cached_property
    def attempt_ends(self) -> pd.Series:
        """Per run and attempt, the last step's end over all rows."""
        return self.digest.attempt_ends().set_index(["run_id", "attempt"])["end_s"]

    @cached_property
    def attempt_ranks(self) -> pd.DataFrame:
        """:meth:`StepDigest.attempt_ranks`."""
        return self.digest.attempt_ranks()

    def binned(self, run_id: str, value: str, max_bins: int) -> tuple[pd.DataFrame, int]:
        """:meth:`StepDigest.binned`."""
        return self.digest.binned(run_id, value, max_bins)


def is_stored(steps: object) -> bool:
    """Whether ``steps`` is a :class:`StoredSteps` (not a frame)."""
    return isinstance(steps, StoredSteps)
