"""The straggler ranking in the engine: one pass over each run's measured step rows, linear in
rows, the per-(step, rank) cells never leaving the engine. Returns one small row per straggler.

The rule is :func:`workbench.analysis.stragglers`' (its docstring states it; the analysis passes
its parameters here). Per step, a rank's *median of the others* comes from the order statistics of
the step's values around their middle (sorted once per step): with ``n`` values sorted as
``v[0..n-1]`` and the rank's value at position ``p``, the others' median is the mean of
``pick((n - 2) // 2)`` and ``pick((n - 1) // 2)``, where ``pick(i)`` is ``v[i]`` below ``p`` and
``v[i + 1]`` from it on: three values per step serve every rank. Persistence is a sliding count
over the step index. The slow phase is the same median over the phases at the slow steps of the
stragglers found, all phases in one pass. No torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.store.engine import steps_view

if TYPE_CHECKING:
    import pandas as pd

#: The straggler's phases, in the order that breaks a tie (the first phase wins).
PHASE_COLUMNS = {"data_s": "data_s", "forward_s": "forward_s",
                 "backward_compute_s": "bc", "optimizer_s": "optimizer_s"}


def _others_median(source: str, keys: str, value: str) -> str:
    """SQL: ``source`` with ``ref`` (the median of the other cells' ``value`` of the same
    ``keys`` group; NULL when the cell's value is NULL or no other cell has one)."""
    return f"""
    (WITH ord AS (
        SELECT *, row_number() OVER (PARTITION BY {keys} ORDER BY {value}, rank) - 1 AS _p,
               count({value}) OVER (PARTITION BY {keys}) AS _n
        FROM {source} WHERE {value} IS NOT NULL),
    os AS (
        SELECT {keys}, any_value(_n) AS _n,
               max({value}) FILTER (WHERE _p = (_n - 2) // 2) AS _v0,
               max({value}) FILTER (WHERE _p = (_n - 2) // 2 + 1) AS _v1,
               max({value}) FILTER (WHERE _p = (_n - 2) // 2 + 2) AS _v2
        FROM ord WHERE _n >= 2 GROUP BY {keys})
    SELECT ord.* EXCLUDE (_p, _n),
        CASE WHEN os._n >= 2 THEN (
            (CASE WHEN (os._n - 2) // 2 < ord._p THEN os._v0 ELSE os._v1 END)
            + (CASE WHEN (os._n - 1) // 2 = (os._n - 2) // 2 THEN
                   (CASE WHEN (os._n - 2) // 2 < ord._p THEN os._v0 ELSE os._v1 END)
               ELSE (CASE WHEN (os._n - 1) // 2 < ord._p THEN os._v1 ELSE os._v2 END) END)
        ) / 2 END AS ref
    FROM ord LEFT JOIN os USING ({keys}))"""


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


def straggler_rows(
    run_dirs: Iterable[str | Path],
    threshold: float,
    min_steps: int,
    persistence: float,
    measure: str,
    warmup_tolerance: float,
    warmup_min_steps: int,
) -> pd.DataFrame:
    """Per straggler: ``run_id, attempt, rank, host, world_size, start_step, end_step,
    slow_steps, slow_fraction, ratio, value_s, others_s, extra_s, slow_phase,
    slow_phase_extra_s`` (see :func:`workbench.analysis.stragglers`), ordered by run, attempt
    and rank. ``measure`` is ``compute_s`` or a float step column (checked by the caller)."""
    con = steps_view(run_dirs)
    try:
        return _query(con, threshold, min_steps, persistence, measure,
                      warmup_tolerance, warmup_min_steps)
    finally:
        con.close()


def _query(con, threshold, min_steps, persistence, measure, tolerance, min_warmup):  # type: ignore[no-untyped-def]
    value = "data_s + forward_s + optimizer_s + bc" if measure == "compute_s" else measure
    need = persistence * min_steps - 1e-9
    hooked = "CASE WHEN backward_s - comm_s < 0 THEN 0 ELSE backward_s - comm_s END"
    keys = "run_id, attempt, mode, step"
    sql = f"""
    WITH {_measured_sql(tolerance, min_warmup)},
    rows AS (SELECT *, coalesce(backward_compute_s, {hooked}) AS bc FROM m),
    cells AS (
        SELECT run_id, attempt, step, rank,
               arg_min(host, step) FILTER (WHERE host IS NOT NULL) AS host,
               max(world_size) AS world_size,
               avg(data_s + forward_s + optimizer_s) AS host_v, avg({value}) AS full_v,
               avg(data_s) AS data_s, avg(forward_s) AS forward_s, avg(bc) AS bc,
               avg(optimizer_s) AS optimizer_s
        FROM rows GROUP BY ALL),
    kind AS (
        SELECT run_id, attempt,
               {"true" if measure != "compute_s" else "bool_and(full_v IS NOT NULL)"} AS whole
        FROM cells GROUP BY ALL),
    sampled AS (SELECT run_id, attempt, step FROM cells GROUP BY ALL
                HAVING bool_and(full_v IS NOT NULL)),
    vc AS (
        SELECT c.*, 1 AS mode, c.full_v AS v FROM cells c JOIN kind k USING (run_id, attempt)
        WHERE k.whole
        UNION ALL
        SELECT c.*, 0 AS mode, c.host_v AS v FROM cells c JOIN kind k USING (run_id, attempt)
        WHERE NOT k.whole
        UNION ALL
        SELECT c.*, 1 AS mode, c.full_v AS v FROM cells c JOIN kind k USING (run_id, attempt)
        JOIN sampled USING (run_id, attempt, step) WHERE NOT k.whole),
    grp AS (
        SELECT run_id, attempt, mode, count(DISTINCT step) AS rows_, count(DISTINCT rank) AS ranks,
               max(world_size) AS world_size
        FROM vc GROUP BY ALL
        HAVING count(DISTINCT rank) >= 2 AND count(DISTINCT step) >= {int(min_steps)}),
    vg AS (SELECT vc.* FROM vc SEMI JOIN grp USING (run_id, attempt, mode)),
    idx AS (SELECT *, dense_rank() OVER (PARTITION BY run_id, attempt, mode ORDER BY step) - 1
                      AS si FROM vg),
    withref AS (
        SELECT i.*, r.ref FROM idx i LEFT JOIN
            (SELECT run_id, attempt, mode, step, rank, ref
             FROM {_others_median("vg", keys, "v")}) r
            USING (run_id, attempt, mode, step, rank)),
    flags AS (
        SELECT *, CASE WHEN ref > 0 THEN v / ref END AS ratio,
               coalesce(ref > 0 AND v / ref > {1 + threshold!r}, false) AS slow
        FROM withref),
    win AS (
        SELECT f.*, g.rows_, sum(slow::INTEGER) OVER (
                   PARTITION BY run_id, attempt, mode, rank ORDER BY si
                   RANGE BETWEEN CURRENT ROW AND {int(min_steps) - 1} FOLLOWING) AS cnt
        FROM flags f JOIN grp g USING (run_id, attempt, mode)),
    starts AS (
        SELECT run_id, attempt, mode, rank, min(si) AS i0 FROM win
        WHERE slow AND cnt >= {need!r} AND si <= rows_ - {int(min_steps)}
        GROUP BY ALL),
    tail AS (SELECT w.*, s.i0 FROM win w JOIN starts s USING (run_id, attempt, mode, rank)
             WHERE w.si >= s.i0),
    found AS (
        SELECT run_id, attempt, mode, rank, any_value(rows_) AS rows_, any_value(i0) AS i0,
               min(step) FILTER (WHERE si = i0) AS start_step,
               max(step) FILTER (WHERE slow) AS end_step,
               count(*) FILTER (WHERE slow) AS slow_steps,
               quantile_cont(ratio, 0.5) FILTER (WHERE slow) AS ratio,
               quantile_cont(v, 0.5) FILTER (WHERE slow) AS value_s,
               quantile_cont(ref, 0.5) FILTER (WHERE slow) AS others_s,
               quantile_cont(v - ref, 0.5) FILTER (WHERE slow) AS extra_s
        FROM tail GROUP BY ALL),
    hosts AS (SELECT run_id, attempt, mode, rank,
                     arg_min(host, step) FILTER (WHERE host IS NOT NULL) AS host
              FROM vg SEMI JOIN found USING (run_id, attempt, mode, rank) GROUP BY ALL),
    slow_at AS (SELECT DISTINCT t.run_id, t.attempt, t.mode, t.step FROM tail t WHERE t.slow),
    ph AS (
        UNPIVOT (SELECT vg.run_id, vg.attempt, vg.mode, vg.step, vg.rank,
                        vg.data_s, vg.forward_s, vg.bc, vg.optimizer_s
                 FROM vg SEMI JOIN slow_at USING (run_id, attempt, mode, step))
        ON data_s, forward_s, bc, optimizer_s INTO NAME phase VALUE pv),
    phref AS (SELECT * FROM {_others_median("ph", "run_id, attempt, mode, phase, step", "pv")}),
    excess AS (
        SELECT p.run_id, p.attempt, p.mode, p.rank, p.phase,
               quantile_cont(p.pv - p.ref, 0.5) AS extra, count(p.pv - p.ref) AS finite
        FROM phref p JOIN tail t USING (run_id, attempt, mode, step, rank)
        WHERE t.slow GROUP BY ALL),
    best AS (
        SELECT run_id, attempt, mode, rank, phase AS slow_phase, extra AS slow_phase_extra_s
        FROM excess WHERE finite > 0 AND extra > 0
        QUALIFY row_number() OVER (
            PARTITION BY run_id, attempt, mode, rank ORDER BY extra DESC,
            CASE phase WHEN 'data_s' THEN 0 WHEN 'forward_s' THEN 1 WHEN 'bc' THEN 2 ELSE 3 END
        ) = 1)
    SELECT f.run_id, f.attempt, f.mode, f.rank, h.host, g.world_size, f.start_step,
           f.end_step, f.slow_steps, f.slow_steps / (f.rows_ - f.i0) AS slow_fraction,
           f.ratio, f.value_s, f.others_s, f.extra_s,
           coalesce(CASE b.slow_phase WHEN 'bc' THEN 'backward_compute_s'
                    ELSE b.slow_phase END, '') AS slow_phase,
           b.slow_phase_extra_s
    FROM found f JOIN grp g USING (run_id, attempt, mode)
    LEFT JOIN hosts h USING (run_id, attempt, mode, rank)
    LEFT JOIN best b USING (run_id, attempt, mode, rank)
    ORDER BY f.run_id, f.attempt, f.rank, f.start_step, f.mode
    """
    frame = con.execute(sql).df()
    # A rank found by both (host phases on every step, the whole compute on the sampled ones)
    # is reported from its earlier start; the host phases' row on a tie.
    frame = frame.drop_duplicates(["run_id", "attempt", "rank"], keep="first")
    return frame.drop(columns="mode").reset_index(drop=True)
