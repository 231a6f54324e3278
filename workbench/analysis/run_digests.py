"""Run digests, built and read: a finished run's step rows are digested once
(:mod:`workbench.store.run_digest`), and every report, dashboard, ``predict`` and ``tune`` after
reads the digest instead of the rows.

:func:`build_run_digest` runs the engine's passes over one run's rows (the per-step pass, the
warm-up rule, the per-rank pass, DDP's sampled rows, the straggler pass with its heatmap bins)
and keeps their frames. :func:`open_steps` hands a :class:`workbench.analysis.stored.StoredSteps`
over several runs: from their digests where every run has one or can get one (it builds those
missing, as the first reader), from the rows otherwise (a run still running), and says which in
``source`` and ``note``. No torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd

from workbench.analysis.rank_cells import HEATMAP_BINS
from workbench.analysis.slow_ranks import DEFAULT_RULE, stragglers_in_store
from workbench.analysis.stored import StoredSteps
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


def digest_frames(
    run_dir: str | Path, evals: pd.DataFrame | None = None
) -> dict[str, pd.DataFrame]:
    """The frames of one run's digest, computed from its rows through the engine, as a report
    of that run computes them (``evals``: the run's evaluation rows; read when not given)."""
    run = Path(run_dir)
    run_id = run.name
    if evals is None:
        evals = load_traces(run, "eval")
    with StoredSteps([run], evals) as steps:
        _ = steps.known  # the per-rank pass first, as a report runs it
        threshold, min_steps, persistence, measure = DEFAULT_RULE
        found = stragglers_in_store([run], threshold, min_steps, persistence, measure, stored=steps)
        # as the figures ask for them: kept by the straggler pass (one measured attempt), or
        # binned by the engine
        steps.binned(run_id, BINNED_VALUES[0], HEATMAP_BINS)
        binned, size = steps.kept_binned(run_id, HEATMAP_BINS)
        binned = binned[["rank", "step", "host", *BINNED_VALUES]].reset_index(drop=True)
        binned.attrs.update(size=int(size), bins=HEATMAP_BINS)
        frames = {
            "per_step": steps.digest.per_step,
            "cut": steps.digest.cut.reset_index(drop=True),
            "per_rank": steps.per_rank,
            "attempt_hosts": steps.digest.attempt_hosts.reset_index(drop=True),
            "byte_counts": steps.byte_counts,
            "sampled": steps.sampled,
            "binned": binned,
            "stragglers": found,
        }
    return frames


def build_run_digest(run_dir: str | Path, evals: pd.DataFrame | None = None) -> Path | None:
    """Digest a finished run's rows and keep the digest beside its traces; returns its
    manifest's path (None for a run that has not ended: it gets none)."""
    run = Path(run_dir)
    if digest_state(run) == "running":
        return None
    signature = trace_signature(run)  # before the passes: a change during them leaves it stale
    return write_digest(run, digest_frames(run, evals), signature)


def digest_at_end(run_dir: str | Path) -> Path | None:
    """The launcher's digest of a run that has just ended, when the run has at least
    :data:`AT_END_ROWS` step rows (None otherwise: its first reader builds it)."""
    if parquet_rows([run_dir]) < AT_END_ROWS:
        return None
    return build_run_digest(run_dir)


def open_steps(
    run_dirs: Iterable[str | Path],
    evals: pd.DataFrame | None = None,
    build: bool = True,
    progress: Callable[[str], None] | None = None,
) -> StoredSteps:
    """The step rows of ``run_dirs`` for the analysis: from the runs' digests when every run
    has a valid one (those missing or stale are built first unless ``build`` is False), else
    from the rows through the engine. The result's ``source`` is ``"digests"`` or ``"rows"``;
    ``note`` says why the rows were read (empty from digests). ``progress``: told of each run
    digested."""
    runs = [Path(p) for p in run_dirs]
    digests = []
    note = ""
    for run in runs:
        state = digest_state(run)
        if state in ("missing", "stale") and build:
            build_run_digest(run, _run_evals(evals, run.name))
            if progress is not None:
                progress(run.name)
        found = read_digest(run)
        if found is None:
            state = digest_state(run)
            note = f"read from the step rows: run {run.name} {_WHY.get(state, state)}"
            break
        digests.append(found)
    if note or not runs:
        steps = StoredSteps(runs, evals)
    else:
        steps = StoredSteps(runs, evals, frames=DigestFrames(runs, digests, evals))
    steps.note = note
    return steps


_WHY = {
    "running": "has not ended (a digest is written once it has)",
    "missing": "has no digest",
    "stale": "has changed since its digest was written",
}


def _run_evals(evals: pd.DataFrame | None, run_id: str) -> pd.DataFrame | None:
    """The evaluation rows of one run out of a sweep's (None: read them from its files)."""
    if evals is None or "run_id" not in evals.columns:
        return None
    return evals[evals["run_id"] == run_id].reset_index(drop=True)
