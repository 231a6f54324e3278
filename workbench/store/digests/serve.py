"""Run digests, built and opened: the analysis hands in its passes and its warm-up rule and gets
frames back, never knowing whether they came from the runs' digests or from their rows.

:func:`build` runs the analysis's passes (``passes``: the per-step pass, the warm-up rule, the
per-rank pass, DDP's sampled timers per step and rank, the straggler pass with its heatmap bins)
over the rows of the runs that have ended, once for them all, and keeps each run's frames
(:mod:`workbench.store.digests.on_disk`). :func:`open_frames` hands the frames of several runs
out: from their digests where every run has one or can get one (it builds those missing, as the
first reader), from the rows through the engine otherwise (a run still running), and says
which (the frames' ``source`` and ``note``). The analysis hands both its rules in one value,
:class:`Rules`. No torch.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workbench.store.digests.on_disk import (
    DigestFrames,
    digest_state,
    read_digest,
    trace_signature,
    write_digest,
)
from workbench.store.digests.query import StepDigest
from workbench.store.digests.step_frames import StepFrames
from workbench.store.engine import parquet_rows

#: A run of at least this many step rows is digested by its launcher as it ends, so that its
#: first report opens at once; a smaller one by its first reader, in about the time a report
#: reading its rows would take anyway.
AT_END_ROWS = int(os.environ.get("WORKBENCH_DIGEST_AT_END_ROWS", "100000"))

#: Told the pass that starts (``stage``) and the cells each run attempt's straggler pass ranked
#: (``ranked``): a report's progress bar.
Stage = Callable[[str], None]
Ranked = Callable[[int], None]
#: The analysis's passes: given the runs, their evaluation rows (None: read from their files),
#: ``stage`` and ``ranked``, each run's digest frames by run id
#: (:func:`workbench.analysis.run_digests.digest_frames`).
Passes = Callable[
    [list[Path], pd.DataFrame | None, Stage | None, Ranked | None],
    dict[str, dict[str, pd.DataFrame]],
]
#: The analysis's warm-up rule, as :class:`StepDigest` takes it.
Warmup = Callable[[pd.DataFrame], pd.DataFrame]


@dataclass(frozen=True)
class Rules:
    """What the analysis hands the store to build and read run digests: its ``passes`` (the
    frames a digest keeps) and its ``warmup`` rule (for reading the rows where no digest
    serves): :data:`workbench.analysis.run_digests.RULES`."""

    passes: Passes
    warmup: Warmup


def build(
    run_dirs: Iterable[str | Path],
    passes: Passes,
    evals: pd.DataFrame | None = None,
    stage: Stage | None = None,
    ranked: Ranked | None = None,
) -> dict[str, dict[str, pd.DataFrame]]:
    """Digest the rows of the runs that have ended, in one set of ``passes``, and keep each
    run's digest beside its traces; returns the frames by run id (a run that has not ended gets
    none). A digest that cannot be written (a store read-only to this user) is said in a
    warning and left to the next reader. ``stage``, ``ranked``: a progress bar's."""
    ended = [Path(d) for d in run_dirs if digest_state(d) != "running"]
    if not ended:
        return {}
    # each run's trace files before the passes: a change during them leaves the digest stale
    signatures = {run.name: trace_signature(run) for run in ended}
    frames = passes(ended, _of_runs(evals, [run.name for run in ended]), stage, ranked)
    for run in ended:
        try:
            write_digest(run, frames[run.name], signatures[run.name])
        except OSError as exc:
            warnings.warn(f"run {run.name}: its digest was not kept ({exc})", stacklevel=2)
    return frames


def build_at_end(run_dir: str | Path, passes: Passes) -> bool:
    """The launcher's digest of a run that has just ended, when the run has at least
    :data:`AT_END_ROWS` step rows (otherwise its first reader builds it); whether one was
    written."""
    if parquet_rows([run_dir]) < AT_END_ROWS:
        return False
    build([run_dir], passes)
    return digest_state(run_dir) == "valid"


def open_frames(
    run_dirs: Iterable[str | Path],
    rules: Rules,
    evals: pd.DataFrame | None = None,
    build_missing: bool = True,
    stage: Stage | None = None,
    ranked: Ranked | None = None,
) -> StepFrames:
    """The frames of ``run_dirs``: from the runs' digests when every run has a valid one (those
    missing or stale are built first with the ``rules``' passes, together, unless
    ``build_missing`` is False), else from the rows through the engine with the ``rules``'
    warm-up. Where a run is still running, nothing is built: its rows are read anyway. The
    frames' ``source`` says which (``"digests"`` or ``"rows"``), their ``note`` why the rows
    were read (empty from digests). ``evals``: the runs' evaluation rows. ``stage``,
    ``ranked``: told as the digests are built (a progress bar's). Close the frames (or use
    them as a context manager) to free the engine."""
    runs = [Path(p) for p in run_dirs]
    found = {run: read_digest(run) for run in runs}
    states = {run: digest_state(run) for run, d in found.items() if d is None}
    todo = [r for r, state in states.items() if state in ("missing", "stale")]
    if build_missing and todo and "running" not in states.values():
        built = build(todo, rules.passes, evals, stage, ranked)  # used whether or not kept
        found.update({run: built.get(run.name) for run in todo})
    note = ""
    for run, digest in found.items():
        if digest is None:
            state = digest_state(run)
            note = f"read from the step rows: run {run.name} {_WHY.get(state, state)}"
            break
    if note or not runs:
        return open_rows(runs, rules, evals, note)
    digests = [found[run] for run in runs]
    return DigestFrames(runs, [d for d in digests if d is not None], evals)


def open_rows(
    run_dirs: Iterable[str | Path],
    rules: Rules,
    evals: pd.DataFrame | None = None,
    note: str = "",
) -> StepFrames:
    """The frames of ``run_dirs`` from their step rows, through the engine with the ``rules``'
    warm-up, no digest read or built: what a digest's passes read, and the reference a digest
    is checked against. ``note``: why the rows are read (the frames' ``note``)."""
    frames = StepDigest(run_dirs, rules.warmup, evals)
    frames.note = note
    return frames


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
