"""Each run's measured step rows as the straggler analysis reads them, out of the engine: only
the columns it needs, the warm-up rows filtered in the engine (the rule of
:func:`workbench.analysis.measured.windows.detected_warmup`, computed on the per-step maxima), one
run folder and one attempt at a time, as NumPy arrays. The analysis lays them out as step x rank
matrices once per run (``workbench.analysis.stragglers.slow_ranks``). No torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.schema import RUN_FILE
from workbench.store.engine import steps_view
from workbench.store.files import read_json

if TYPE_CHECKING:
    import duckdb
    import numpy as np
    import pandas as pd

#: A row where DDP's timers or a comm hook ran: where :data:`BACKWARD_COMPUTE` can be known (its
#: columns are null on the other rows of a sampled trace, so this reads almost nothing).
TIMED = "comm_s IS NOT NULL OR backward_compute_s IS NOT NULL"
#: Backward compute: DDP's timer where it sampled, else backward less its timed communication.
BACKWARD_COMPUTE = (
    "coalesce(backward_compute_s, CASE WHEN backward_s - comm_s < 0 THEN 0 "
    "ELSE backward_s - comm_s END)"
)


@dataclass
class AttemptRows:
    """One run attempt's measured rows: every ``steps`` and ``ranks`` they hold (sorted; None:
    the ranks are found as the rows are read), the largest world size by step, each rank's host
    (its first step's; empty when the ranks are found as read), and the rows themselves,
    read from the engine as they are consumed, while the attempt is current: ``read`` (columns
    by name: their SQL; ``only``: an SQL condition the rows must meet) streams batches (dicts
    of NumPy arrays: ``step``, ``rank`` and the asked columns, NaN where null).
    ``timed_steps``: the steps with a row where DDP's timers or a comm hook ran
    (:data:`TIMED`)."""

    run_id: str
    attempt: int
    steps: np.ndarray
    ranks: np.ndarray | None
    step_world: pd.Series
    hosts: dict[int, object]
    read: Callable[..., Iterator[dict[str, np.ndarray]]]
    timed_steps: np.ndarray


#: Rows per batch handed out of the engine (a batch of seven columns is about 14 MB; the engine
#: reads ahead, so a larger batch costs several times its size in memory).
BATCH_ROWS = 1 << 18


def _per_step_and_cut(
    con: duckdb.DuckDBPyConnection,
    run_id: str | None,
    warmup: Callable[[pd.DataFrame], pd.DataFrame],
    known: KnownSteps | None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each step's slowest ``step_s``, largest ``world_size`` and ``timed`` rows (:data:`TIMED`)
    over the rows that are not traced warm-up, and the warm-up rule's answer: from ``known``,
    or one pass. ``run_id``: the one its ``run.json`` gives (None: none readable, the run ids
    are then read from the rows)."""
    if known is not None:
        mine = {run_id} if run_id in known.run_ids else _run_ids(con)
        return known.per_step[known.per_step["run_id"].isin(mine)], known.cut
    per_step = con.execute(
        "SELECT run_id, coalesce(attempt, 0) AS attempt, step, false AS warmup, "
        "max(step_s) AS step_s, max(world_size) AS world_size, "
        f"count(*) FILTER (WHERE {TIMED}) AS timed FROM steps "
        "WHERE NOT coalesce(warmup, false) GROUP BY ALL ORDER BY ALL"
    ).df()
    return per_step, warmup(per_step)


def _run_ids(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The run ids of the rows of ``con``'s view ``steps`` (a pass over one column)."""
    return set(con.execute("SELECT DISTINCT run_id FROM steps").df()["run_id"])


def _folder_run_id(run_dir: Path) -> str | None:
    """The run id the run folder's ``run.json`` gives; None where it cannot be read."""
    try:
        run_id = read_json(run_dir / RUN_FILE).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return run_id if isinstance(run_id, str) else None


def _hosts(
    con: duckdb.DuckDBPyConnection,
    where: str,
    args: dict[str, object],
    known: KnownSteps | None,
) -> list[tuple[int, object]] | None:
    """Each rank of an attempt's measured rows (``where``) and its first traced host; None
    after an earlier pass (``known``): the ranks are then found as the rows are read, and
    their hosts taken from that pass's per-rank frame by the caller."""
    if known is not None:
        return None
    return con.execute(
        "SELECT rank::BIGINT, arg_min(host, step) FILTER (WHERE host IS NOT NULL) "
        f"FROM steps {where} GROUP BY rank ORDER BY rank",
        args,
    ).fetchall()


@dataclass
class KnownSteps:
    """What an earlier pass over the same runs found, so that :func:`measured_rows` reads only
    the rows: ``per_step`` (per run, attempt and step with rows that are not traced warm-up:
    ``step_s`` and ``world_size``, the largest) and ``cut`` (the warm-up rule's answer). The
    ranks are found as the rows are read, and their hosts left to the caller."""

    per_step: pd.DataFrame
    cut: pd.DataFrame

    @functools.cached_property
    def run_ids(self) -> frozenset[str]:
        """The runs of :attr:`per_step`."""
        return frozenset(self.per_step["run_id"].astype(str))

    def measured_attempts(self, run_id: str) -> list[int]:
        """The attempts of ``run_id`` with measured rows (a step after the warm-up), in order."""
        p = after_warmup(self.per_step[self.per_step["run_id"] == run_id], self.cut)
        return sorted({int(a) for a in p["attempt"]})


def after_warmup(per_step: pd.DataFrame, cut: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``per_step`` (``run_id, attempt, step``) after their attempt's detected
    warm-up (``cut``: ``last_warmup_step`` per run and attempt; none there: no cut)."""
    bound = per_step.merge(cut, on=["run_id", "attempt"], how="left")["last_warmup_step"]
    return per_step[~(per_step["step"].to_numpy() <= bound.to_numpy(dtype="float64"))]


def measured_rows(
    run_dir: str | Path,
    warmup: Callable[[pd.DataFrame], pd.DataFrame],
    known: KnownSteps | None = None,
) -> Iterator[AttemptRows]:
    """The measured rows of the run folder, per run and attempt (:class:`AttemptRows`: the
    columns asked of it are SQL over the step columns, ``BACKWARD_COMPUTE`` among them,
    evaluated in the engine).

    Passes over the files: each step's slowest ``step_s`` and largest ``world_size`` over
    the rows that are not traced warm-up (a small frame, handed to ``warmup``: the analysis's
    rule, :func:`workbench.analysis.measured.windows.detected_warmup`, which returns ``run_id,
    attempt, last_warmup_step`` for the attempts whose first measured steps are still warm-up),
    then each rank's host, then the rows as they are asked for, streamed. With ``known`` (from a
    pass over these runs) only the rows are read."""
    con = steps_view([run_dir])
    try:
        run_id = None if known is None else _folder_run_id(Path(run_dir))
        per_step, found = _per_step_and_cut(con, run_id, warmup, known)
        yield from _attempts(con, per_step, found, known)
    finally:
        con.close()


def _attempts(
    con: duckdb.DuckDBPyConnection,
    per_step: pd.DataFrame,
    found: pd.DataFrame,
    known: KnownSteps | None,
) -> Iterator[AttemptRows]:
    """The attempts of ``per_step`` (after the warm-up cut ``found``) as :class:`AttemptRows`."""
    import numpy as np

    cut = found.set_index(["run_id", "attempt"])["last_warmup_step"]

    def rows(
        columns: dict[str, str], where: str, args: dict[str, object], only: str | None = None
    ) -> Iterator[dict[str, np.ndarray]]:
        select = ", ".join(  # NaN, not NULL: plain arrays, no masks
            f"coalesce(({expr})::DOUBLE, 'NaN'::DOUBLE) AS {name}" for name, expr in columns.items()
        )
        where = where if only is None else f"{where} AND ({only})"
        reader = con.sql(  # a relation streams its rows (no copy of the whole result)
            f"SELECT step::BIGINT AS step, rank::BIGINT AS rank, {select} FROM steps {where}",
            params=args,
        ).to_arrow_reader(BATCH_ROWS)
        return ({c: b.column(c).to_numpy() for c in b.schema.names} for b in reader)

    for (run_id, attempt), part in per_step.groupby(["run_id", "attempt"], sort=True):
        bound = int(cut.get((run_id, attempt), np.iinfo("int64").min))
        part = part[part["step"] > bound]
        if part.empty:
            continue
        where = (
            "WHERE run_id = $run AND coalesce(attempt, 0) = $attempt "
            "AND NOT coalesce(warmup, false) AND step > $bound"
        )
        args = {"run": run_id, "attempt": int(attempt), "bound": bound}
        hosts = _hosts(con, where, args, known)
        yield AttemptRows(
            str(run_id),
            int(attempt),
            part["step"].to_numpy(dtype="int64"),
            None if hosts is None else np.array([r for r, _ in hosts], dtype="int64"),
            part.set_index("step")["world_size"].astype("int64"),
            {} if hosts is None else {int(r): h for r, h in hosts if h is not None},
            functools.partial(rows, where=where, args=args),
            part.loc[part["timed"] > 0, "step"].to_numpy(dtype="int64"),
        )
