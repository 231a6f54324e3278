"""A sweep's step rows digested in the engine: the small frames every table and figure of the
analysis is computed from, so that no step row of a large sweep reaches pandas.

:class:`StepDigest` holds one engine connection over the runs' step rows (``steps``, see
:mod:`workbench.store.engine`) and the warm-up rule's answer (``cut``), from which a view
``measured`` (the rows that are neither traced nor detected warm-up) is made. Each method is one
pass over the files, reading only the columns it needs, and returns a small frame: per run and
rank (:meth:`per_rank`), per run, attempt and step (window parts, losses), the rows where DDP's
timers ran (:meth:`sampled`), one run's values binned for a heatmap (:meth:`binned`). The
analysis composes them into its tables (``workbench.analysis.digest``). No torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.store.engine import steps_view
from workbench.store.measured_query import BACKWARD_COMPUTE
from workbench.store.window_query import WindowParts, window_parts

if TYPE_CHECKING:
    import pandas as pd

#: A row is measured: not traced warm-up, and after its attempt's detected warm-up.
MEASURED = "NOT coalesce(warmup, false) AND (last_warmup_step IS NULL OR step > last_warmup_step)"
#: What a rank computes itself in a step (``workbench.analysis.slow_ranks.rank_compute``):
#: data, forward and optimizer, plus the backward compute where it is known.
COMPUTE = f"(data_s + forward_s + optimizer_s + {BACKWARD_COMPUTE})"
#: The columns whose mean and sample standard deviation per rank :meth:`StepDigest.per_rank`
#: gives (over measured rows): the phases, what follows a step, and the derived step parts.
PER_RANK_MOMENTS = (
    "data_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "comm_s",
    "step_s",
    "other_s",
    "between_s",
    "save_s",
    "eval_s",
    "wall_step_s",
)
#: Columns whose mean alone per rank is given (over measured rows, missing values left out).
PER_RANK_MEANS = ("comm_bytes", "comm_buckets", "comm_exposed_s", "backward_compute_s")
#: Columns of the rows where a DDP timer ran (:meth:`StepDigest.sampled`).
SAMPLED_COLUMNS = (
    "world_size",
    "step_s",
    "backward_s",
    "comm_s",
    "comm_exposed_s",
    "backward_compute_s",
    "comm_bytes",
    "comm_buckets",
)


class StepDigest:
    """The step rows of ``run_dirs`` in the engine, with the warm-up rule applied.

    ``warmup`` is the analysis's rule (given the per-step maxima of the rows that are not traced
    warm-up, it returns ``run_id, attempt, last_warmup_step, dropped``). The window's parts are
    computed on construction (:attr:`window`); every other frame on request. Close it (or use it
    as a context manager) to free the engine."""

    def __init__(
        self,
        run_dirs: Iterable[str | Path],
        warmup: Callable[[pd.DataFrame], pd.DataFrame],
        evals: pd.DataFrame | None = None,
    ) -> None:
        self.run_dirs = [Path(p) for p in run_dirs]
        self.window: WindowParts = window_parts(self.run_dirs, warmup)
        self.con = steps_view(self.run_dirs)
        cut = self.window.cut[["run_id", "attempt", "last_warmup_step"]]
        self.con.register("_cut", cut)
        self.con.execute(
            "CREATE VIEW rows AS SELECT s.* EXCLUDE (attempt), coalesce(s.attempt, 0) AS attempt, "
            "c.last_warmup_step FROM steps s LEFT JOIN _cut c "
            "ON s.run_id = c.run_id AND coalesce(s.attempt, 0) = c.attempt"
        )
        self.con.execute(f"CREATE VIEW measured AS SELECT * FROM rows WHERE {MEASURED}")
        self._evals = evals

    def close(self) -> None:
        """Free the engine's connection."""
        self.con.close()

    def __enter__(self) -> StepDigest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _df(self, sql: str, params: dict[str, object] | None = None) -> pd.DataFrame:
        return self.con.execute(sql, params or {}).df()

    def runs(self) -> pd.DataFrame:
        """Per run with step rows: ``world_size`` (the largest over all its rows), whether any
        row holds a loss (``has_loss``), and the rows (``rows``)."""
        return self._df(
            "SELECT run_id, max(world_size) AS world_size, bool_or(loss IS NOT NULL) AS has_loss, "
            "count(*) AS rows FROM rows GROUP BY run_id ORDER BY run_id"
        )

    def _hole_gaps(self) -> None:
        """Register ``_holes``: each measured row without a traced ``gap_s`` that has a next
        row (steps count consecutively in an attempt), its gap from that row's start (the
        arithmetic of :func:`workbench.analysis.windows.gap_filled`)."""
        self.con.execute(
            "CREATE OR REPLACE TEMP TABLE _holes AS "
            "SELECT h.run_id, h.attempt, h.rank, h.step, "
            "n.t_start_s - h.t_start_s - h.step_s AS gap "
            "FROM (SELECT run_id, attempt, rank, step, t_start_s, step_s FROM rows "
            "      WHERE gap_s IS NULL) h "
            "JOIN (SELECT run_id, attempt, rank, step, t_start_s FROM rows) n "
            "ON n.run_id = h.run_id AND n.attempt = h.attempt AND n.rank = h.rank "
            "AND n.step = h.step + 1"
        )

    def per_rank(self) -> pd.DataFrame:
        """Per run and rank, in one pass: over the measured rows ``measured_steps`` (rows),
        ``world_size`` (largest), ``host`` (the first traced), for each of
        :data:`PER_RANK_MOMENTS` the mean and ``<name>_std`` (ddof 1), for each of
        :data:`PER_RANK_MEANS` the mean (missing values left out), ``backward_s_n`` (rows with a
        backward time), ``hosts`` (every host the rank ran on) and ``window_s`` (the rank's own
        window, attempts added); over all rows ``all_world_size``, ``all_host``,
        ``rss_peak_bytes``, ``cuda_peak_bytes``, ``cuda_reserved_peak_bytes`` and
        ``device_peak_bytes`` (maxima, warm-up included).

        What follows a step (``workbench.analysis.breakdown``): ``gap`` is ``gap_s``, or the
        next row's start less this step's end where the trace has none; ``save_s`` and
        ``eval_s`` (the rank's evaluations after the step) are 0 where none; ``between_s`` is
        the gap less both; all three are 0 where the gap is unknown (an attempt's last step).
        ``other_s`` is the step less its traced phases (a missing phase counts 0), clipped at 0.
        """
        import pandas as pd

        self._hole_gaps()
        evals = self._evals
        if evals is not None and len(evals):
            e = evals if "attempt" in evals.columns else evals.assign(attempt=0)
            per_step = e.groupby(["run_id", "attempt", "rank", "step"], as_index=False)[
                "eval_s"
            ].sum()
        else:
            per_step = pd.DataFrame(
                {"run_id": [], "attempt": [], "rank": [], "step": [], "eval_s": []}
            ).astype({"run_id": "object", "attempt": "int64", "rank": "int64", "step": "int64"})
        self.con.register("_evals_after", per_step)
        order = "(attempt::BIGINT * 4294967296 + step)"
        moments = []
        for c in PER_RANK_MOMENTS:
            moments += [
                f"avg({c}) FILTER (WHERE m) AS {c}",
                f"stddev_samp({c}) FILTER (WHERE m) AS {c}_std",
            ]
        means = [f"avg({c}) FILTER (WHERE m) AS {c}" for c in PER_RANK_MEANS]
        per_rank = self._df(
            "WITH r AS ("
            "  SELECT s.run_id, s.rank, s.attempt, s.step, s.world_size, s.host, s.t_start_s, "
            "  s.step_s, s.data_s, s.forward_s, s.backward_s, s.optimizer_s, s.comm_s, "
            "  s.comm_bytes, s.comm_buckets, s.comm_exposed_s, s.backward_compute_s, "
            "  s.rss_bytes, s.mem_peak_bytes, s.mem_reserved_bytes, s.mem_device_bytes, "
            "  (NOT coalesce(s.warmup, false) AND (s.last_warmup_step IS NULL "
            "   OR s.step > s.last_warmup_step)) AS m, "
            "  coalesce(s.gap_s, h.gap) AS gap, "
            "  coalesce(s.save_s, 0) AS save0, coalesce(e.eval_s, 0) AS eval0 "
            "  FROM rows s "
            "  LEFT JOIN _holes h ON s.gap_s IS NULL AND h.run_id = s.run_id "
            "    AND h.attempt = s.attempt AND h.rank = s.rank AND h.step = s.step "
            "  LEFT JOIN _evals_after e ON e.run_id = s.run_id AND e.attempt = s.attempt "
            "    AND e.rank = s.rank AND e.step = s.step"
            "), p AS ("
            "  SELECT *, "
            "  CASE WHEN gap IS NULL THEN 0 ELSE save0 END AS save_s, "
            "  CASE WHEN gap IS NULL THEN 0 ELSE eval0 END AS eval_s, "
            "  CASE WHEN gap IS NULL THEN 0 ELSE gap - save0 - eval0 END AS between_s, "
            "  CASE WHEN step_s - (coalesce(data_s, 0) + coalesce(forward_s, 0) "
            "    + coalesce(backward_s, 0) + coalesce(optimizer_s, 0)) < 0 THEN 0 "
            "    ELSE step_s - (coalesce(data_s, 0) + coalesce(forward_s, 0) "
            "    + coalesce(backward_s, 0) + coalesce(optimizer_s, 0)) END AS other_s "
            "  FROM r"
            "), q AS (SELECT *, step_s + between_s + save_s + eval_s AS wall_step_s FROM p) "
            "SELECT run_id, rank, "
            "count(*) FILTER (WHERE m) AS measured_steps, "
            "max(world_size) FILTER (WHERE m) AS world_size, "
            f"arg_min(host, {order}) FILTER (WHERE m AND host IS NOT NULL) AS host, "
            f"{', '.join(moments)}, {', '.join(means)}, "
            "count(backward_s) FILTER (WHERE m) AS backward_s_n, "
            "list(DISTINCT host) FILTER (WHERE m AND host IS NOT NULL) AS hosts, "
            "max(world_size) AS all_world_size, "
            f"arg_min(host, {order}) FILTER (WHERE host IS NOT NULL) AS all_host, "
            "max(rss_bytes) AS rss_peak_bytes, max(mem_peak_bytes) AS cuda_peak_bytes, "
            "max(mem_reserved_bytes) AS cuda_reserved_peak_bytes, "
            "max(mem_device_bytes) AS device_peak_bytes "
            "FROM q GROUP BY run_id, rank ORDER BY run_id, rank"
        )
        spans = self._df(
            "SELECT run_id, rank, sum(e - s) AS window_s FROM ("
            "  SELECT run_id, rank, attempt, min(t_start_s) AS s, max(t_start_s + step_s) AS e "
            "  FROM measured GROUP BY ALL) GROUP BY ALL"
        )
        return per_rank.merge(spans, on=["run_id", "rank"], how="left")

    def sampled(self) -> pd.DataFrame:
        """The measured rows where one of DDP's timers ran (``comm_s``, ``comm_exposed_s`` or
        ``backward_compute_s`` not null): ``run_id, attempt, rank, step`` and
        :data:`SAMPLED_COLUMNS`. With ``trace_comm="sampled"`` one row in
        ``trace_comm_every_steps``."""
        return self._df(
            f"SELECT run_id, attempt, rank, step, {', '.join(SAMPLED_COLUMNS)} FROM measured "
            "WHERE comm_s IS NOT NULL OR comm_exposed_s IS NOT NULL "
            "OR backward_compute_s IS NOT NULL ORDER BY run_id, attempt, step, rank"
        )

    def median(
        self, column: str, run_ids: Sequence[str], min_world_size: int | None = None
    ) -> float:
        """The median of ``column`` over the measured rows of ``run_ids`` (rows of a world size
        above ``min_world_size`` only, when given); NaN without a value."""
        where = "run_id IN (SELECT unnest($ids))"
        if min_world_size is not None:
            where += f" AND world_size > {int(min_world_size)}"
        value = self.con.execute(
            f"SELECT median({column}::DOUBLE) FROM measured WHERE {where}", {"ids": list(run_ids)}
        ).fetchone()
        return float("nan") if value is None or value[0] is None else float(value[0])

    def last_step_loss(self) -> pd.DataFrame:
        """Per run with measured rows: the mean loss over ranks at the last step of its last
        attempt (``final_loss``; NaN when no rank traced a loss there)."""
        return self._df(
            "WITH last AS (SELECT run_id, max(attempt) AS attempt FROM measured GROUP BY run_id), "
            "last_step AS (SELECT m.run_id, m.attempt, max(m.step) AS step FROM measured m "
            "  JOIN last USING (run_id, attempt) GROUP BY ALL) "
            "SELECT m.run_id, avg(m.loss) AS final_loss FROM measured m "
            "JOIN last_step USING (run_id, attempt, step) GROUP BY m.run_id ORDER BY m.run_id"
        )

    def loss_per_step(self) -> pd.DataFrame:
        """Per run and step over all rows (warm-up included, attempts together): the mean loss
        over ranks, the largest world size and the samples of all ranks (``samples``)."""
        return self._df(
            "SELECT run_id, step, avg(loss) AS loss, max(world_size) AS world_size, "
            "coalesce(sum(samples), 0) AS samples FROM rows "
            "GROUP BY run_id, step ORDER BY run_id, step"
        )

    def attempt_ends(self) -> pd.DataFrame:
        """Per run and attempt over all rows: ``end_s``, the last step's end
        (``t_start_s + step_s``, largest over ranks)."""
        return self._df(
            "SELECT run_id, attempt, max(t_start_s + step_s) AS end_s FROM rows "
            "GROUP BY ALL ORDER BY ALL"
        )

    def attempt_ranks(self) -> pd.DataFrame:
        """Per run and attempt over all rows: the ranks with rows (``ranks``, a sorted list)
        and the run's largest world size (``world_size``)."""
        return self._df(
            "WITH a AS (SELECT run_id, attempt, list(DISTINCT rank ORDER BY rank) AS ranks "
            "  FROM rows GROUP BY ALL), "
            "w AS (SELECT run_id, max(world_size) AS world_size FROM rows GROUP BY run_id) "
            "SELECT a.run_id, a.attempt, a.ranks, w.world_size FROM a JOIN w USING (run_id) "
            "ORDER BY a.run_id, a.attempt"
        )

    def binned(self, run_id: str, value: str, max_bins: int) -> tuple[pd.DataFrame, int]:
        """One run's measured ``value`` (a step column, or ``compute_s``: :data:`COMPUTE`) per
        rank and bin of consecutive steps: the distinct measured steps (sorted) cut into bins of
        ``ceil(n / max_bins)``, each labelled by its first step, the median of the bin's values
        (missing ones left out; NaN when all are). Returns ``(frame of rank, step, v, host;
        steps per bin)``; ``host`` is each rank's first traced host (the same on its rows)."""
        expr = COMPUTE if value == "compute_s" else value
        n = self.con.execute(
            "SELECT count(DISTINCT step) FROM measured WHERE run_id = $run", {"run": run_id}
        ).fetchone()
        count = int(n[0]) if n else 0
        size = max(1, -(-count // max(1, max_bins)))
        frame = self._df(
            "WITH xs AS (SELECT step, (row_number() OVER (ORDER BY step) - 1) // $size AS b "
            "  FROM (SELECT DISTINCT step FROM measured WHERE run_id = $run)), "
            "labels AS (SELECT step, min(step) OVER (PARTITION BY b) AS bin FROM xs), "
            "hosts AS (SELECT rank, arg_min(host, attempt::BIGINT * 4294967296 + step) "
            "  FILTER (WHERE host IS NOT NULL) AS host FROM measured WHERE run_id = $run "
            "  GROUP BY rank) "
            f"SELECT m.rank, l.bin AS step, median(({expr})::DOUBLE) AS v, "
            "any_value(h.host) AS host "
            "FROM measured m JOIN labels l ON m.step = l.step "
            "LEFT JOIN hosts h ON h.rank = m.rank WHERE m.run_id = $run "
            "GROUP BY m.rank, l.bin ORDER BY m.rank, l.bin",
            {"run": run_id, "size": size},
        )
        return frame, size
