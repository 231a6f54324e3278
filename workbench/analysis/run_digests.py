"""Run digests, built and read: a finished run's step rows are digested once
(:mod:`workbench.store.run_digest`), and every report, Dashboard, ``predict`` and printed finding
after reads the digest instead of the rows (a tune reads its one base run's rows as a frame).

:func:`build_run_digests` runs the engine's passes over the runs' rows once (the per-step pass,
the warm-up rule, the per-rank pass, DDP's sampled timers per step and rank, the straggler pass
with its heatmap bins) and keeps each run's frames. :func:`open_steps` hands a
:class:`workbench.analysis.measured.stored.StoredSteps` over several runs: from their digests where
every run has one or can get one (it builds those missing, as the first reader), from the rows
otherwise (a run still running), and says which in ``source`` and ``note``. No torch.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd

from workbench.analysis.measured.rank_cells import HEATMAP_BINS
from workbench.analysis.measured.stored import StoredSteps
from workbench.analysis.stragglers.slow_ranks import DEFAULT_RULE, stragglers_in_store
from workbench.store.engine import parquet_rows
from workbench.store.load import load_traces
from workbench.store.run_digest import (
    DigestFrames,
    digest_state,
    read_digest,
    trace_signature,
    write_digest,
)

#: A run of at least this many step rows is digested by its launcher as it ends, so that its
#: first report opens at once; a smaller one by its first reader, in about the time a report
#: reading its rows would take anyway.
AT_END_ROWS = int(os.environ.get("WORKBENCH_DIGEST_AT_END_ROWS", "100000"))
#: The binned values a digest keeps (the heatmap's step time, the spread's compute time).
BINNED_VALUES = ["step_s", "compute_s"]


#: Told the pass that starts (``stage``) and the cells each run attempt's straggler pass ranked
#: (``ranked``): a report's progress bar.
Stage = Callable[[str], None]
Ranked = Callable[[int], None]


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
    with StoredSteps(runs, evals) as steps:
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


def build_run_digests(
    run_dirs: Iterable[str | Path],
    evals: pd.DataFrame | None = None,
    stage: Stage | None = None,
    ranked: Ranked | None = None,
) -> dict[str, dict[str, pd.DataFrame]]:
    """Digest the rows of the runs that have ended, in one set of passes, and keep each run's
    digest beside its traces; returns the frames by run id (a run that has not ended gets
    none). A digest that cannot be written (a store read-only to this user) is said in a
    warning and left to the next reader. ``stage``, ``ranked``: a progress bar's."""
    ended = [Path(d) for d in run_dirs if digest_state(d) != "running"]
    if not ended:
        return {}
    # each run's trace files before the passes: a change during them leaves the digest stale
    signatures = {run.name: trace_signature(run) for run in ended}
    frames = digest_frames(ended, _of_runs(evals, [run.name for run in ended]), stage, ranked)
    for run in ended:
        try:
            write_digest(run, frames[run.name], signatures[run.name])
        except OSError as exc:
            warnings.warn(f"run {run.name}: its digest was not kept ({exc})", stacklevel=2)
    return frames


def digest_at_end(run_dir: str | Path) -> bool:
    """The launcher's digest of a run that has just ended, when the run has at least
    :data:`AT_END_ROWS` step rows (otherwise its first reader builds it); whether one was
    written."""
    if parquet_rows([run_dir]) < AT_END_ROWS:
        return False
    build_run_digests([run_dir])
    return digest_state(run_dir) == "valid"


def open_steps(
    run_dirs: Iterable[str | Path],
    evals: pd.DataFrame | None = None,
    build: bool = True,
    stage: Stage | None = None,
    ranked: Ranked | None = None,
) -> StoredSteps:
    """The step rows of ``run_dirs`` for the analysis: from the runs' digests when every run
    has a valid one (those missing or stale are built first, together, unless ``build`` is
    False), else from the rows through the engine. The result's ``source`` is ``"digests"`` or
    ``"rows"``; ``note`` says why the rows were read (empty from digests). Where a run is
    still running, nothing is built: its rows are read anyway. ``stage``, ``ranked``: told
    as the digests are built (a progress bar's)."""
    runs = [Path(p) for p in run_dirs]
    found = {run: read_digest(run) for run in runs}
    states = {run: digest_state(run) for run, d in found.items() if d is None}
    todo = [r for r, state in states.items() if state in ("missing", "stale")]
    if build and todo and "running" not in states.values():
        built = build_run_digests(todo, evals, stage, ranked)  # used whether or not kept
        found.update({run: built.get(run.name) for run in todo})
    note = ""
    for run, digest in found.items():
        if digest is None:
            state = digest_state(run)
            note = f"read from the step rows: run {run.name} {_WHY.get(state, state)}"
            break
    if note or not runs:
        steps = StoredSteps(runs, evals)
    else:
        digests = [found[run] for run in runs]
        frames = DigestFrames(runs, [d for d in digests if d is not None], evals)
        steps = StoredSteps(runs, evals, frames=frames)
    steps.note = note
    return steps


_WHY = {
    "running": "has not ended (a digest is written once it has)",
    "missing": "has no digest",
    "stale": "has changed since its digest was written",
}


def _of_runs(evals: pd.DataFrame | None, run_ids: list[str]) -> pd.DataFrame | None:
    """The evaluation rows of some runs out of a sweep's (None: read them from their files)."""
    if evals is None or "run_id" not in evals.columns:
        return None
    return evals[evals["run_id"].isin(run_ids)].reset_index(drop=True)
