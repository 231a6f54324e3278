"""Step rows left in the store: what the analysis takes in place of a ``steps`` frame when a sweep
is too large for pandas.

:class:`StoredSteps` wraps the frames the store hands out for some runs
(:class:`workbench.store.digests.step_frames.StepFrames`: read from the runs' digests, or passes
over their rows in the engine; the store says which) and hands out their small frames, each
computed once; it never opens or builds a digest, nor reads a row, itself. The report's entry
points (the run and scaling tables, the phase breakdown, communication, memory, the network fit
and the scaling model, the finding, the figures' data) accept it wherever they accept ``steps``,
and give the same columns and values as with ``load_traces`` of the same runs
(``tests/test_stored_oracle.py``). No torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from typing import TypeVar

import numpy as np
import pandas as pd

from workbench.analysis.measured.rank_cells import HEATMAP_BINS
from workbench.schema import STEP_COLUMNS
from workbench.store.digests.step_frames import StepFrames
from workbench.store.measured_query import KnownSteps
from workbench.store.window_query import WindowParts

T = TypeVar("T")


class StoredSteps:
    """The step rows of some runs, as ``frames``: what the store opened for them
    (:func:`workbench.store.digests.serve.open_frames`, from their digests or their rows;
    :class:`workbench.store.digests.query.StepDigest`, the rows through the engine, with the
    runs' evaluation rows for the time each rank spends evaluating after a step). ``columns``
    lists the schema's step columns so that the checks of frame inputs pass; there are no rows
    to index. Closing it (or leaving it as a context manager) closes the frames."""

    columns = pd.Index(list(STEP_COLUMNS))

    def __init__(self, frames: StepFrames) -> None:
        if not isinstance(frames, StepFrames):
            raise TypeError(
                "StoredSteps takes the frames the store opened for some runs "
                "(workbench.store.digests.serve.open_frames, or open_rows for their rows), "
                f"not {type(frames).__name__}"
            )
        #: The frames, as the store opened them.
        self.digest = frames
        self.run_dirs = frames.run_dirs
        self._binned: dict[tuple[str, int], tuple[pd.DataFrame, int]] = {}
        # what :meth:`kept` holds: by key, the objects it was computed from and the result
        self._kept: dict[tuple[object, ...], tuple[tuple[object, ...], object]] = {}
        #: The step bins the straggler pass keeps each run's values at (the heatmaps').
        self.heatmap_bins = HEATMAP_BINS

    def kept(
        self, key: tuple[object, ...], given: tuple[object, ...], compute: Callable[[], T]
    ) -> T:
        """``compute()``, kept under ``key`` for these steps. ``given``: the objects whose
        ``id`` is in the key (the frames passed in), held with the result so that no other
        object takes their ids while it is kept. A report, a Dashboard's first screen and a
        prediction ask for the same tables of the same frames several times (the run table, the
        window, the scaling model's base and its error)."""
        if key not in self._kept:
            self._kept[key] = (given, compute())
        return self._kept[key][1]  # type: ignore[return-value]

    @property
    def source(self) -> str:
        """Where the frames came from, as the store says: ``"digests"`` or ``"rows"``."""
        return self.digest.source

    @property
    def note(self) -> str:
        """Why the rows were read where the runs' digests could not serve (empty otherwise)."""
        return self.digest.note

    def start_passes(self) -> None:
        """Start the passes over the rows that :attr:`per_rank` and DDP's timers' frames need,
        beside the straggler pass (:meth:`StepFrames.start_passes`: in a thread, on the
        engine's connection, where the frames come from the rows; nothing for digests)."""
        self.digest.start_passes()

    def close(self) -> None:
        """Free the engine (once the passes under way have ended)."""
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
    def known(self) -> KnownSteps:
        """What the per-step pass found that the straggler pass needs (the ranks and their
        hosts are left to it: :meth:`attempt_hosts`)."""
        return self.digest.known()

    def attempt_hosts(self, run_id: str, attempt: int) -> dict[int, object]:
        """Each rank of a run attempt with measured rows and its first traced host (None where
        it has none): the per-rank pass's."""
        _ = self.per_rank
        h = self.digest.attempt_hosts
        h = h[(h["run_id"] == str(run_id)) & (h["attempt"] == int(attempt))]
        pairs = zip(h["rank"], h["host"], strict=True)
        return {int(r): x if isinstance(x, str) else None for r, x in pairs}

    @cached_property
    def window_parts(self) -> WindowParts:
        """The measured window's parts (:meth:`StepDigest.window_parts`)."""
        attempts = self.measured_per_rank[["run_id", "rank", "attempts"]].explode("attempts")
        ranks = attempts.groupby(["run_id", "attempts"], sort=True)["rank"].nunique()
        ranks = ranks.rename("ranks").rename_axis(["run_id", "attempt"]).reset_index()
        return self.digest.window_parts(ranks.astype({"attempt": "int64"}))

    @cached_property
    def _comm(self) -> dict[str, pd.DataFrame]:
        """DDP's sampled timers as the analysis reads them (:mod:`comm_samples`): from the
        runs' digests, or computed in the engine from the measured rows where a timer ran."""
        return self.digest.comm_frames()

    @property
    def comm_steps(self) -> pd.DataFrame:
        """:func:`comm_samples.per_step`: a row per run, attempt and sampled step."""
        return self._comm["comm_steps"]

    @property
    def comm_ranks(self) -> pd.DataFrame:
        """:func:`comm_samples.per_rank`: each rank's wait and exposed transfer."""
        return self._comm["comm_ranks"]

    @property
    def backward_rows(self) -> pd.DataFrame:
        """:func:`comm_samples.backward_rows` of every run."""
        return self.backward_of(self.run_ids)

    @property
    def single_rank_backward(self) -> pd.DataFrame:
        """The backward times of the 1-rank runs' measured rows (``run_id, backward_s``; no
        DDP timer runs there), as the rows' passes give them: what a digest keeps of them."""
        return self._comm["single_rank_backward"]

    def comm_steps_of(self, run_ids: Sequence[object], min_world_size: int = 0) -> pd.DataFrame:
        """:attr:`comm_steps` of ``run_ids`` at a world size above ``min_world_size``."""
        c = self.comm_steps
        return c[c["run_id"].isin([str(r) for r in run_ids]) & (c["world_size"] > min_world_size)]

    def backward_of(self, run_ids: Sequence[object]) -> pd.DataFrame:
        """:attr:`backward_rows` of ``run_ids``."""
        return self.digest.backward_of([str(r) for r in run_ids])

    def median(
        self, column: str, run_ids: Sequence[object], min_world_size: int | None = None
    ) -> float:
        """:meth:`StepDigest.median` (one pass over the rows of ``run_ids``)."""
        return self.digest.median(column, [str(r) for r in run_ids], min_world_size)

    @cached_property
    def byte_counts(self) -> pd.DataFrame:
        """:meth:`StepDigest.byte_counts`."""
        return self.digest.byte_counts()

    def multi_rank_median(self, column: str, run_ids: Sequence[object]) -> float:
        """The median of ``comm_bytes`` or ``comm_buckets`` over the measured multi-rank rows of
        ``run_ids`` (as pandas takes it: missing values left out, the mean of the two middle
        values of an even count; NaN without a value), from :attr:`byte_counts`."""
        c = self.byte_counts
        c = c[c["run_id"].isin([str(r) for r in run_ids]) & c[column].notna()]
        per_value = c.groupby(column, sort=True)["rows"].sum()
        total = int(per_value.sum())
        if total == 0:
            return float("nan")
        ends = per_value.cumsum().to_numpy()
        values = per_value.index.to_numpy(dtype="float64")
        lower = values[np.searchsorted(ends, (total - 1) // 2 + 1)]
        upper = values[np.searchsorted(ends, total // 2 + 1)]
        return float((lower + upper) / 2)

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
        """Per run, attempt and rank with rows (any, warm-up included): ``run_id, attempt,
        rank, world_size`` (the run's largest)."""
        p = self.per_rank[["run_id", "rank", "all_attempts"]].explode("all_attempts")
        p = p.rename(columns={"all_attempts": "attempt"}).astype({"attempt": "int64"})
        world = self.runs.set_index("run_id")["world_size"]
        return p.assign(world_size=p["run_id"].map(world).to_numpy())

    def keep_binned(self, run_id: str, found: tuple[pd.DataFrame, int]) -> None:
        """Keep a run's step and compute time binned at :attr:`heatmap_bins` (``rank, step,
        host, step_s, compute_s`` and the bin size) from matrices the straggler pass built:
        :meth:`binned` then reads no row again."""
        self._binned[(run_id, self.heatmap_bins)] = found

    def kept_binned(self, run_id: str, max_bins: int) -> tuple[pd.DataFrame, int]:
        """The run's binned values kept at ``max_bins`` (after :meth:`binned` asked for them):
        ``rank, step, host`` and a column per value, and the steps per bin."""
        return self._binned[(run_id, max_bins)]

    def binned(self, run_id: str, value: str, max_bins: int) -> tuple[pd.DataFrame, int]:
        """One run's ``value`` per rank and step bin (:meth:`StepDigest.binned`) as ``rank,
        step, v, host``: the step time and the compute time, which the figures draw, come out
        of one pass and are kept."""
        key = (run_id, max_bins)
        if key not in self._binned:
            values = list(dict.fromkeys(["step_s", "compute_s", value]))
            self._binned[key] = self.digest.binned(run_id, values, max_bins)
        frame, size = self._binned[key]
        if value not in frame.columns:
            frame, size = self.digest.binned(run_id, [value], max_bins)
        return frame[["rank", "step", value, "host"]].rename(columns={value: "v"}), size

    @property
    def digested_stragglers(self) -> pd.DataFrame | None:
        """The stragglers the runs' digests hold (the rule with its defaults), or None when
        the frames come from the rows."""
        return self.digest.stragglers


def is_stored(steps: object) -> bool:
    """Whether ``steps`` is a :class:`StoredSteps` (not a frame)."""
    return isinstance(steps, StoredSteps)
