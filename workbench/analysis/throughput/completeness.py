"""Runs whose step traces do not cover every rank: named, and never reported as the run's figures.

A rank's trace can be missing (the rank was killed before its first flush, the file was deleted)
or unreadable (the store skips a corrupt file with a warning). A window built from the other
ranks would count fewer samples over the same time and report a lower throughput as the run's,
so the tables mark such a run ``incomplete`` (which attempt, which ranks, which files) and blank
its throughput instead.
"""

from __future__ import annotations

import pandas as pd

from workbench import schema
from workbench.analysis.measured.stored import is_stored
from workbench.analysis.measured.windows import check_columns

#: Statuses of runs still writing: a rank that has not flushed yet is not missing.
LIVE_STATUSES = ("pending", "running")
#: Per-run figures left empty for an incomplete run (a part of its ranks' samples is missing).
THROUGHPUT_COLUMNS = (
    "samples",
    "samples_per_s",
    "samples_per_s_per_device",
    "wall_step_s",
    "epoch_s",
)
THROUGHPUT_COLUMNS += ("train_s", "train_samples_per_s", "train_step_s", "end_to_end_samples_per_s")


def _trace_file(rank: int) -> str:
    return f"{schema.TRACES_DIR}/steps-rank{rank:05d}.*"


def missing_ranks(steps: pd.DataFrame, writers: int) -> str:
    """What one run's ``steps`` lack when ``writers`` ranks (0 .. writers-1) each trace every
    attempt, e.g. ``"attempt 0: rank 1 (traces/steps-rank00001.*) has no readable rows"``;
    ``""`` when nothing is missing."""
    notes = []
    for attempt, rows in steps.groupby("attempt", sort=True):
        missing = sorted(set(range(writers)) - set(rows["rank"].astype(int)))
        if missing:
            files = ", ".join(f"rank {r} ({_trace_file(r)})" for r in missing)
            verb = "has" if len(missing) == 1 else "have"
            notes.append(f"attempt {attempt}: {files} {verb} no readable rows")
    return "; ".join(notes)


def incomplete_traces(runs: pd.DataFrame, steps: pd.DataFrame) -> pd.Series:
    """Per run (index ``run_id``) whose attempts lack some rank's step rows: what is missing
    (see :func:`missing_ranks`). Runs still pending or running, and runs without any rows, are
    not listed; DataParallel runs trace from one process."""
    info = runs.set_index("run_id") if "run_id" in runs.columns else pd.DataFrame()
    notes: dict[str, str] = {}
    if is_stored(steps):  # the ranks of each attempt, from the engine
        ranks = steps.attempt_ranks
    else:
        check_columns(steps, ("run_id", "rank", "attempt", "world_size"), "steps")
        ranks = steps
    # a run whose every attempt has ranks 0 .. N-1, N its largest world size, lacks nothing:
    # only the others are looked at rank by rank
    each = ranks.groupby(["run_id", "attempt"], sort=False).agg(
        ranks=("rank", "nunique"), low=("rank", "min"), high=("rank", "max")
    )
    world = ranks.groupby("run_id", sort=False)["world_size"].max()
    full = each["ranks"].eq(each["high"] + 1) & each["low"].eq(0)
    full &= each["ranks"].eq(each.index.get_level_values("run_id").map(world).to_numpy())
    whole = full.groupby(level="run_id", sort=False).all()
    suspect = ranks["run_id"].isin(whole.index[~whole])
    for run_id, rows in ranks[suspect].groupby("run_id", sort=True):
        if "status" in info.columns and info["status"].get(run_id) in LIVE_STATUSES:
            continue
        strategy = info["strategy"].get(run_id) if "strategy" in info.columns else None
        note = missing_ranks(rows, 1 if strategy == "dp" else int(rows["world_size"].max()))
        if note:
            notes[str(run_id)] = note
    return pd.Series(notes, dtype="string", name="incomplete").rename_axis("run_id")


def mark_incomplete(table: pd.DataFrame, runs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """``table`` (one row per run, ``run_id``) with an ``incomplete`` column (empty when every
    rank's rows are there) and, for incomplete runs, :data:`THROUGHPUT_COLUMNS` blanked."""
    notes = incomplete_traces(runs, steps).to_dict()
    table = table.assign(incomplete=[notes.get(str(r), "") for r in table["run_id"]])
    partial = table["incomplete"] != ""
    for column in THROUGHPUT_COLUMNS:
        if column in table.columns:
            table[column] = table[column].astype("float64").where(~partial)
    return table
