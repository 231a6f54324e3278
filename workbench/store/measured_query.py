"""Each run's measured step rows as the straggler analysis reads them, out of the engine: only
the columns it needs, the warm-up rows filtered in the engine (the rule of
:func:`workbench.analysis.windows.detected_warmup`, computed on the per-step maxima), one run
folder and one attempt at a time, as NumPy arrays. The analysis lays them out as step x rank
matrices once per run (``workbench.analysis.slow_ranks``). No torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.store.engine import steps_view

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

#: Backward compute: DDP's timer where it sampled, else backward less its timed communication.
BACKWARD_COMPUTE = (
    "coalesce(backward_compute_s, CASE WHEN backward_s - comm_s < 0 THEN 0 "
    "ELSE backward_s - comm_s END)"
)


def _measured_sql(tolerance: float, min_warmup_steps: int) -> str:
    """SQL of the measured rows (the traced warm-up and the detected one left out: the rule of
    :func:`workbench.analysis.windows.detected_warmup`), each with ``attempt`` 0 when null."""
    return f"""
    s AS (SELECT * REPLACE (coalesce(attempt, 0) AS attempt, coalesce(warmup, false) AS warmup)
          FROM steps),
    ps AS (SELECT run_id, attempt, step, max(step_s) AS t FROM s WHERE NOT warmup
           GROUP BY ALL),
    psi AS (SELECT *, row_number() OVER (PARTITION BY run_id, attempt ORDER BY step) - 1 AS i,
                   count(*) OVER (PARTITION BY run_id, attempt) AS n FROM ps),
    steady AS (SELECT run_id, attempt, any_value(n) AS n,
                      quantile_cont(t, 0.5) FILTER (WHERE i >= n // 2) AS steady,
                      count(t) AS timed
               FROM psi GROUP BY ALL),
    cut AS (SELECT p.run_id, p.attempt,
                   least(coalesce(min(p.i) FILTER (WHERE NOT coalesce(
                       p.t > st.steady * (1 + {tolerance!r}), false)), any_value(st.n)),
                         any_value(st.n) // 2) AS dropped
            FROM psi p JOIN steady st USING (run_id, attempt)
            WHERE st.n >= {int(min_warmup_steps)} AND st.timed > 0 AND st.steady > 0
            GROUP BY ALL),
    bound AS (SELECT c.run_id, c.attempt, p.step AS last_warmup_step
              FROM cut c JOIN psi p ON p.run_id = c.run_id AND p.attempt = c.attempt
                   AND p.i = c.dropped - 1
              WHERE c.dropped > 0),
    m AS (SELECT s.* FROM s LEFT JOIN bound b USING (run_id, attempt)
          WHERE NOT s.warmup AND (b.last_warmup_step IS NULL OR s.step > b.last_warmup_step))"""


@dataclass
class AttemptRows:
    """One run attempt's measured rows: every ``steps`` and ``ranks`` they hold (sorted), the
    largest world size by step, each rank's host (its first step's), and the rows themselves as
    ``batches`` (dicts of NumPy arrays: ``step``, ``rank`` and the asked columns, NaN where
    null), read from the engine as they are consumed: take them before the next attempt."""

    run_id: str
    attempt: int
    steps: np.ndarray
    ranks: np.ndarray
    step_world: pd.Series
    hosts: dict[int, object]
    batches: Iterator[dict[str, np.ndarray]]


#: Rows per batch handed out of the engine (a batch of six columns is about 50 MB).
BATCH_ROWS = 1 << 20


def measured_rows(
    run_dir: str | Path,
    columns: dict[str, str],
    warmup_tolerance: float,
    warmup_min_steps: int,
) -> Iterator[AttemptRows]:
    """The measured rows of the run folder, per run and attempt: ``columns`` maps each name to
    its SQL over the step columns (``BACKWARD_COMPUTE`` among them), evaluated in the engine."""
    import numpy as np

    con = steps_view([run_dir])
    try:
        measured = _measured_sql(warmup_tolerance, warmup_min_steps)
        bound = measured[: measured.index("    m AS")].rstrip().rstrip(",")
        con.execute(f"CREATE TEMP TABLE bound AS WITH {bound} SELECT * FROM bound")
        con.execute(
            "CREATE TEMP VIEW m AS SELECT s.* FROM (SELECT * REPLACE (coalesce(attempt, 0) AS "
            "attempt, coalesce(warmup, false) AS warmup) FROM steps) s LEFT JOIN bound b "
            "USING (run_id, attempt) WHERE NOT s.warmup AND "
            "(b.last_warmup_step IS NULL OR s.step > b.last_warmup_step)"
        )
        keys = con.execute("SELECT DISTINCT run_id, attempt FROM m ORDER BY ALL").fetchall()
        select = ", ".join(  # NaN, not NULL: plain arrays, no masks
            f"coalesce(({expr})::DOUBLE, 'NaN'::DOUBLE) AS {name}" for name, expr in columns.items()
        )
        for run_id, attempt in keys:
            where = "WHERE run_id = $run AND attempt = $attempt"
            args = {"run": run_id, "attempt": attempt}
            world = con.execute(
                f"SELECT step::BIGINT AS step, max(world_size) AS world FROM m {where} "
                "GROUP BY step ORDER BY step",
                args,
            ).df()
            hosts = con.execute(
                "SELECT rank::BIGINT, arg_min(host, step) FILTER (WHERE host IS NOT NULL) "
                f"FROM m {where} GROUP BY rank ORDER BY rank",
                args,
            ).fetchall()
            reader = con.sql(  # a relation streams its rows (no copy of the whole result)
                f"SELECT step::BIGINT AS step, rank::BIGINT AS rank, {select} FROM m {where}",
                params=args,
            ).to_arrow_reader(BATCH_ROWS)
            yield AttemptRows(
                run_id,
                int(attempt),
                world["step"].to_numpy(dtype="int64"),
                np.array([r for r, _ in hosts], dtype="int64"),
                world.set_index("step")["world"],
                {int(r): h for r, h in hosts if h is not None},
                ({c: batch.column(c).to_numpy() for c in batch.schema.names} for batch in reader),
            )
    finally:
        con.close()
