"""The analysis's side of the run digests, which the store builds and opens
(:mod:`workbench.store.digests`): the passes a digest keeps (:func:`digest_frames`, over the runs'
rows through the engine), handed to the store with the warm-up rule as :data:`RULES`. A reader
asks the store for frames with them (``serve.open_frames(run_dirs, RULES, evals)``: from the
digests or the rows, the store decides and says which) and hands those to the analysis;
:func:`open_steps` does both for the report, the Dashboard and the terminal. No torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd

from workbench.analysis.measured.rank_cells import HEATMAP_BINS
from workbench.analysis.measured.stored import StoredSteps
from workbench.analysis.measured.warmup import detected_warmup
from workbench.analysis.stragglers.slow_ranks import DEFAULT_RULE, stragglers_in_store
from workbench.store.digests import serve
from workbench.store.digests.serve import Ranked, Rules, Stage
from workbench.store.load import load_traces

#: The binned values a digest keeps (the heatmap's step time, the spread's compute time).
BINNED_VALUES = ["step_s", "compute_s"]


def digest_frames(
    run_dirs: Iterable[str | Path],
    evals: pd.DataFrame | None = None,
    stage: Stage | None = None,
    ranked: Ranked | None = None,
) -> dict[str, dict[str, pd.DataFrame]]:
    """Each run's digest frames, by run id: the passes a report runs over the runs' rows
    through the engine, once for them all, their frames then split by run (each is per run).
    ``evals``: the runs' evaluation rows (read from their files when not given)."""
    runs = [Path(d) for d in run_dirs]
    tell = stage or (lambda name: None)
    if evals is None:
        evals = load_traces(runs, "eval")
    tell("steps, per step")
    with StoredSteps(serve.open_rows(runs, RULES, evals)) as steps:  # the rows, always
        tell("per rank and stragglers")
        steps.start_passes()  # the per-rank and DDP timers' passes beside the straggler pass
        found = stragglers_in_store(runs, *DEFAULT_RULE, stored=steps, ranked=ranked)
        tables = {
            "per_step": steps.digest.per_step,
            "cut": steps.digest.cut,
            "per_rank": steps.per_rank,
            "attempt_hosts": steps.digest.attempt_hosts,
            "byte_counts": steps.byte_counts,
            "comm_steps": steps.comm_steps,
            "comm_ranks": steps.comm_ranks,
            "backward_rows": steps.backward_rows,
            "single_rank_backward": steps.single_rank_backward,
            "stragglers": found,
        }
        out = {}
        split = {name: _by_run(frame) for name, frame in tables.items()}
        for run in runs:
            frames = {name: runs_of(run.name) for name, runs_of in split.items()}
            # as the figures ask for them: kept by the straggler pass (one measured attempt),
            # or binned by the engine
            steps.binned(run.name, BINNED_VALUES[0], HEATMAP_BINS)
            binned, size = steps.kept_binned(run.name, HEATMAP_BINS)
            binned = binned[["rank", "step", "host", *BINNED_VALUES]].reset_index(drop=True)
            binned.attrs.update(size=int(size), bins=HEATMAP_BINS)
            out[run.name] = {**frames, "binned": binned}
    return out


def _by_run(frame: pd.DataFrame) -> Callable[[str], pd.DataFrame]:
    """The rows of one run, in their order, by run id (the frame grouped once, not compared
    with each run id in turn: a million per-step rows at 102.3 M step rows)."""
    at = frame.groupby("run_id", sort=False).indices

    def rows_of(run_id: str) -> pd.DataFrame:
        return frame.take(at.get(run_id, [])).reset_index(drop=True)

    return rows_of


#: What the analysis hands the store to build and read digests: its passes and warm-up rule.
RULES = Rules(digest_frames, detected_warmup)


def build_run_digests(
    run_dirs: Iterable[str | Path],
    evals: pd.DataFrame | None = None,
    stage: Stage | None = None,
    ranked: Ranked | None = None,
) -> dict[str, dict[str, pd.DataFrame]]:
    """The store's :func:`workbench.store.digests.serve.build` with the analysis's passes: the
    runs that have ended digested and kept; their frames by run id."""
    return serve.build(run_dirs, digest_frames, evals, stage, ranked)


def digest_at_end(run_dir: str | Path) -> bool:
    """The launcher's digest of a run that has just ended
    (:func:`workbench.store.digests.serve.build_at_end` with the analysis's passes); whether
    one was written."""
    return serve.build_at_end(run_dir, digest_frames)


def open_steps(
    run_dirs: Iterable[str | Path],
    evals: pd.DataFrame | None = None,
    build: bool = True,
    stage: Stage | None = None,
    ranked: Ranked | None = None,
) -> StoredSteps:
    """The step rows of ``run_dirs`` for the analysis: the frames the store opens with
    :data:`RULES` (:func:`workbench.store.digests.serve.open_frames`: from the runs' digests,
    those missing built first unless ``build`` is False, else from the rows) as
    :class:`StoredSteps`. Its ``source`` is ``"digests"`` or ``"rows"``; ``note`` says why the
    rows were read. ``stage``, ``ranked``: told as the digests are built (a progress bar's)."""
    return StoredSteps(serve.open_frames(run_dirs, RULES, evals, build, stage, ranked))
