"""A sweep's step rows digested in the engine: the small frames every table and figure of the
analysis is computed from, so that no step row of a large sweep reaches pandas.

:class:`StepDigest` holds one engine connection over the runs' step rows (``steps``, see
:mod:`workbench.store.engine`) and the warm-up rule's answer (``cut``), from which a view
``measured`` (the rows that are neither traced nor detected warm-up) is made. A pass over the
files reads only the columns it needs and returns a small frame: per run, attempt and step
(:attr:`per_step`, on construction: the window's parts, losses, attempt ends), per run and rank
(:meth:`per_rank`), DDP's sampled timers per step and rank (:meth:`comm_frames`), a histogram
of gradient bytes (:meth:`byte_counts`), one run's values binned for a heatmap (:meth:`binned`). The
analysis composes them into its tables (``workbench.analysis.measured.stored``). No torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from workbench.store.digests.attempts import merge_attempts
from workbench.store.digests.rank_pass import ORDER, PER_RANK_SQL, split_groups
from workbench.store.digests.step_frames import StepFrames
from workbench.store.engine import steps_view
from workbench.store.measured_query import BACKWARD_COMPUTE, TIMED

if TYPE_CHECKING:
    import duckdb

#: A row is measured: not traced warm-up, and after its attempt's detected warm-up.
MEASURED = "NOT coalesce(warmup, false) AND (last_warmup_step IS NULL OR step > last_warmup_step)"
#: What a rank computes itself in a step
#: (``workbench.analysis.stragglers.slow_ranks.rank_compute``): data, forward and optimizer,
#: plus the backward compute where it is known.
COMPUTE = f"(data_s + forward_s + optimizer_s + {BACKWARD_COMPUTE})"
#: The frames of DDP's sampled timers (:meth:`StepDigest.comm_frames`,
#: :mod:`workbench.analysis.measured.comm_samples`): each column's type beside ``run_id`` (a
#: string).
COMM_TYPES = {
    "comm_steps": {
        "attempt": "int64",
        "step": "int64",
        "world_size": "int64",
        **dict.fromkeys(
            ["step_s", "comm_s", "comm_exposed_s", "fit_comm_s", "fit_bytes", "fit_buckets"],
            "float64",
        ),
    },
    "comm_ranks": {"rank": "int64", "wait_s": "float64", "exposed_transfer_s": "float64"},
    "backward_rows": {"world_size": "int64", "backward_compute_s": "float64"},
    "single_rank_backward": {"backward_s": "float64"},
}


def empty_comm(name: str) -> pd.DataFrame:
    """One of :data:`COMM_TYPES`' frames without rows, its columns typed."""
    types = {"run_id": "object", **COMM_TYPES[name]}
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in types.items()})


#: Columns of the rows where a DDP timer ran (:meth:`StepDigest.comm_frames`).
TIMED_COLUMNS = (
    "run_id, attempt, rank, step, world_size, step_s, comm_s, comm_exposed_s, "
    "backward_compute_s, comm_bytes, comm_buckets"
)


class StepDigest(StepFrames):
    """The step rows of ``run_dirs`` in the engine, with the warm-up rule applied.

    ``warmup`` is the analysis's rule (given the per-step maxima of the rows that are not traced
    warm-up, it returns ``run_id, attempt, last_warmup_step, dropped``). The per-step pass
    (:attr:`per_step`) runs on construction, since the rule needs it; every other frame on
    request. ``evals``: the runs' evaluation rows, for the evaluations after each step. Close it
    (or use it as a context manager) to free the engine."""

    source = "rows"

    def __init__(
        self,
        run_dirs: Iterable[str | Path],
        warmup: Callable[[pd.DataFrame], pd.DataFrame],
        evals: pd.DataFrame | None = None,
    ) -> None:
        self.run_dirs = [Path(p) for p in run_dirs]
        self.con = steps_view(self.run_dirs)
        self.per_step = self._per_step()
        rule_input = self.per_step[self.per_step["measured"]]
        rule_input = rule_input[["run_id", "attempt", "step", "step_s"]].assign(warmup=False)
        self.cut = warmup(rule_input.reset_index(drop=True))
        self.con.register("_cut", self.cut[["run_id", "attempt", "last_warmup_step"]])
        self.con.execute(
            "CREATE VIEW rows AS SELECT s.* EXCLUDE (attempt), coalesce(s.attempt, 0) AS attempt, "
            "c.last_warmup_step FROM steps s LEFT JOIN _cut c "
            "ON s.run_id = c.run_id AND coalesce(s.attempt, 0) = c.attempt"
        )
        self.con.execute(f"CREATE VIEW measured AS SELECT * FROM rows WHERE {MEASURED}")
        self._evals = evals
        #: :meth:`per_rank`'s counts of gradient bytes and buckets (for :meth:`byte_counts`).
        self._byte_groups: pd.DataFrame | None = None
        #: The per-rank pass and DDP's timers' pass under way in a thread (:meth:`start_passes`).
        self._passes: Future[tuple[pd.DataFrame, dict[str, pd.DataFrame]]] | None = None
        self._comm: dict[str, pd.DataFrame] | None = None

    def start_passes(self) -> None:
        """Start the per-rank pass and DDP's sampled timers' pass in a thread, on this digest's
        connection, so that the straggler pass (which reads the rows through connections of its
        own, and takes the per-step pass's :meth:`known`) runs beside them: the engine and NumPy
        release the GIL, and each alone keeps two cores busy only part of the time.
        :meth:`per_rank` and :meth:`comm_frames` wait for them; nothing else may use the
        connection before."""
        if self._passes is None:
            pool = ThreadPoolExecutor(1, thread_name_prefix="workbench-engine")
            self._passes = pool.submit(lambda: (self._per_rank(), self._comm_frames()))
            pool.shutdown(wait=False)

    def close(self) -> None:
        """Free the engine's connection (once the passes under way have ended)."""
        if self._passes is not None:
            wait([self._passes])
        self.con.close()

    def _df(self, sql: str, params: dict[str, object] | None = None) -> pd.DataFrame:
        return query_frame(self.con, sql, params)

    def _per_step(self) -> pd.DataFrame:
        """Per run, attempt and step, one pass over all rows. Over the rows that are not traced
        warm-up (``measured``: whether there are any): ``step_s`` (largest), ``start_s`` (first
        start), ``end_s`` (last ``t_start_s + step_s``), ``samples`` (sum), ``save_s``
        (largest), ``world_size`` (largest) and ``loss`` (mean over ranks). Over all rows:
        ``all_world_size``, ``all_end_s``, ``all_samples``, ``loss_sum`` and ``loss_n`` (for
        means over attempts), ``rows``, ``open_gaps`` (rows without a traced ``gap_s``) and
        ``timed`` (rows not traced warm-up where a DDP timer or comm hook ran: ``TIMED``)."""
        # Two levels: the rows per step and warm-up flag with plain aggregates (one pass, no
        # filter per aggregate: a third less time), then those few rows per step combined.
        nw = "FILTER (WHERE NOT w)"
        return self._df(
            "WITH g AS (SELECT run_id, coalesce(attempt, 0) AS attempt, step, "
            "coalesce(warmup, false) AS w, max(step_s) AS step_s, min(t_start_s) AS start_s, "
            "max(t_start_s + step_s) AS end_s, sum(samples) AS samples, max(save_s) AS save_s, "
            "max(world_size) AS world_size, sum(loss) AS loss_sum, count(loss) AS loss_n, "
            "count(*) AS rows, count(*) FILTER (WHERE gap_s IS NULL) AS open_gaps, "
            f"count(*) FILTER (WHERE {TIMED}) AS timed FROM steps GROUP BY ALL) "
            "SELECT run_id, attempt, step, coalesce(bool_or(NOT w), false) AS measured, "
            f"max(step_s) {nw} AS step_s, min(start_s) {nw} AS start_s, "
            f"max(end_s) {nw} AS end_s, sum(samples) {nw} AS samples, "
            f"max(save_s) {nw} AS save_s, max(world_size) {nw} AS world_size, "
            f"sum(loss_sum) {nw} / nullif(sum(loss_n) {nw}, 0) AS loss, "
            "max(world_size) AS all_world_size, max(end_s) AS all_end_s, "
            "coalesce(sum(samples), 0) AS all_samples, sum(loss_sum) AS loss_sum, "
            "sum(loss_n)::BIGINT AS loss_n, sum(rows)::BIGINT AS rows, "
            "sum(open_gaps)::BIGINT AS open_gaps, "
            f"coalesce(sum(timed) {nw}, 0)::BIGINT AS timed "
            "FROM g GROUP BY ALL ORDER BY ALL"
        )

    def _register_evals_after(self) -> None:
        """Register ``_evals_after``: per run, attempt, rank and step, the evaluation time the
        rank spent after that step (from the evaluations the digest was given)."""
        evals = self._evals
        if evals is not None and len(evals):
            e = evals if "attempt" in evals.columns else evals.assign(attempt=0)
            keys = ["run_id", "attempt", "rank", "step"]
            per_step = e.groupby(keys, as_index=False)["eval_s"].sum()
        else:
            per_step = pd.DataFrame(
                {"run_id": [], "attempt": [], "rank": [], "step": [], "eval_s": []}
            ).astype({"run_id": "object", "attempt": "int64", "rank": "int64", "step": "int64"})
        self.con.register("_evals_after", per_step)

    def _hole_gaps(self) -> None:
        """Register ``_holes``: each row without a traced ``gap_s`` that has a next row (steps
        count consecutively in an attempt), its gap from that row's start (the arithmetic of
        :func:`workbench.analysis.measured.windows.gap_filled`). Skipped (an empty table) when every
        open gap is on its attempt's last step, where nothing follows."""
        p = self.per_step
        last = p.groupby(["run_id", "attempt"])["step"].transform("max")
        inner = bool(((p["open_gaps"] > 0) & (p["step"] < last)).any())
        source = "rows" if inner else "(SELECT * FROM rows WHERE false)"
        self.con.execute(
            "CREATE OR REPLACE TEMP TABLE _holes AS "
            "SELECT h.run_id, h.attempt, h.rank, h.step, "
            "n.t_start_s - h.t_start_s - h.step_s AS gap "
            f"FROM (SELECT run_id, attempt, rank, step, t_start_s, step_s FROM {source} "
            "      WHERE gap_s IS NULL) h "
            f"JOIN (SELECT run_id, attempt, rank, step, t_start_s FROM {source}) n "
            "ON n.run_id = h.run_id AND n.attempt = h.attempt AND n.rank = h.rank "
            "AND n.step = h.step + 1"
        )

    def per_rank(self) -> pd.DataFrame:
        """:meth:`_per_rank`, the pass started by :meth:`start_passes` where it was."""
        if self._passes is not None:
            return self._passes.result()[0]
        return self._per_rank()

    def comm_frames(self) -> dict[str, pd.DataFrame]:
        """:meth:`_comm_frames`, computed once (by :meth:`start_passes` where it ran)."""
        if self._passes is not None:
            return self._passes.result()[1]
        if self._comm is None:
            self._comm = self._comm_frames()
        return self._comm

    def _per_rank(self) -> pd.DataFrame:
        """Per run and rank: over the measured rows ``measured_steps`` (rows), ``world_size``
        (largest), ``host`` (the first traced), for each of ``attempts.MOMENTS`` the mean and
        ``<name>_std`` (ddof 1), for each of ``attempts.MEANS`` the mean (missing values left
        out), ``backward_s_n`` (rows with a backward time), ``hosts`` (every host
        the rank ran on), ``attempts`` (those with measured rows) and ``window_s`` (the rank's
        own window, attempts added); over all rows ``all_world_size``, ``all_host``,
        ``all_attempts``, ``rss_peak_bytes``, ``cuda_peak_bytes``, ``cuda_reserved_peak_bytes``,
        ``device_peak_bytes`` and ``multi_rank_bytes`` (the most gradient bytes of a row at a
        world size above 1) (maxima, warm-up included). One pass over all rows, per attempt
        and whether a row is measured (attempts merged here); it also counts the gradient bytes
        and buckets that :meth:`byte_counts` hands out.

        What follows a step (``workbench.analysis.throughput.breakdown``): ``gap`` is ``gap_s``, or
        the next row's start less this step's end where the trace has none; ``save_s`` and
        ``eval_s`` (the rank's evaluations after the step) are 0 where none; ``between_s`` is
        the gap less both; all three are 0 where the gap is unknown (an attempt's last step).
        ``other_s`` is the step less its traced phases (a missing phase counts 0), clipped at 0.
        """
        self._hole_gaps()
        self._register_evals_after()
        groups = self._df(PER_RANK_SQL)
        every, per_attempt, self._byte_groups = split_groups(groups)
        self.attempt_hosts = per_attempt[["run_id", "attempt", "rank", "host"]]
        measured = merge_attempts(per_attempt)
        merged = every.merge(measured, on=["run_id", "rank"], how="left")
        return merged.fillna({"measured_steps": 0})

    def _comm_frames(self) -> dict[str, pd.DataFrame]:
        """DDP's sampled timers as the analysis reads them, computed in the engine (the SQL of
        :mod:`workbench.analysis.measured.comm_samples`' three frames, whose docstrings define
        them): ``comm_steps`` a row per run, attempt and sampled step, ``comm_ranks`` a row per run
        and rank, ``backward_rows`` the backward timer's values; and ``single_rank_backward``,
        the backward times of the 1-rank runs' measured rows (no timer runs there: a 1-rank
        base's backward compute is their median). The measured rows where a timer
        ran are read once into the engine's memory (one in ``trace_comm_every_steps``), never
        into pandas."""
        self.con.execute(
            f"CREATE OR REPLACE TEMP TABLE _timed AS SELECT {TIMED_COLUMNS} FROM measured "
            "WHERE comm_s IS NOT NULL OR backward_compute_s IS NOT NULL"
        )
        fit = "FILTER (WHERE world_size > 1 AND comm_s > 0 AND comm_bytes > 0)"
        try:
            steps = self._df(
                "SELECT run_id, attempt, step, max(world_size) AS world_size, "
                "max(step_s) AS step_s, min(comm_s) AS comm_s, "
                f"min(comm_exposed_s) AS comm_exposed_s, min(comm_s) {fit} AS fit_comm_s, "
                f"median(comm_bytes) {fit} AS fit_bytes, median(comm_buckets) {fit} AS fit_buckets "
                "FROM _timed WHERE comm_s IS NOT NULL GROUP BY ALL ORDER BY ALL"
            )
            ranks = self._df(
                "WITH m AS (SELECT run_id, attempt, step, min(comm_s) AS fastest, "
                "min(comm_exposed_s) AS tail FROM _timed WHERE comm_s IS NOT NULL GROUP BY ALL) "
                "SELECT t.run_id, t.rank, avg(t.comm_s - m.fastest) AS wait_s, "
                "avg(greatest(m.tail, 0)) FILTER (WHERE t.comm_exposed_s IS NOT NULL) "
                "AS exposed_transfer_s FROM _timed t JOIN m USING (run_id, attempt, step) "
                "WHERE t.comm_s IS NOT NULL GROUP BY ALL ORDER BY ALL"
            )
            backward = self._df(
                "SELECT run_id, world_size, backward_compute_s FROM _timed "
                "WHERE backward_compute_s IS NOT NULL"
            )
            # where no timer runs (one rank), the backward is its compute: a 1-rank base's
            alone = self._df(
                "SELECT run_id, backward_s::DOUBLE AS backward_s FROM measured "
                "WHERE world_size = 1 AND backward_s IS NOT NULL"
            )
        finally:
            self.con.execute("DROP TABLE IF EXISTS _timed")
        found = {"comm_steps": steps, "comm_ranks": ranks, "backward_rows": backward}
        found["single_rank_backward"] = alone
        return {name: frame.astype(COMM_TYPES[name]) for name, frame in found.items()}

    def median(
        self, column: str, run_ids: Sequence[str], min_world_size: int | None = None
    ) -> float:
        """:func:`median_measured` over this digest's rows."""
        return median_measured(self.con, column, run_ids, min_world_size)

    def binned(self, run_id: str, values: Sequence[str], max_bins: int) -> tuple[pd.DataFrame, int]:
        """:func:`binned_measured` of ``run_id`` over this digest's measured rows."""
        return binned_measured(self.con, run_id, values, max_bins)


def median_measured(
    con: duckdb.DuckDBPyConnection,
    column: str,
    run_ids: Sequence[str],
    min_world_size: int | None = None,
) -> float:
    """The median of ``column`` over the rows of the view ``measured`` of ``con`` of
    ``run_ids`` (rows of a world size above ``min_world_size`` only, when given); NaN without a
    value."""
    where = "run_id IN (SELECT unnest($ids))"
    if min_world_size is not None:
        where += f" AND world_size > {int(min_world_size)}"
    value = con.execute(
        f"SELECT median({column}::DOUBLE) FROM measured WHERE {where}", {"ids": list(run_ids)}
    ).fetchone()
    return float("nan") if value is None or value[0] is None else float(value[0])


def query_frame(
    con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, object] | None = None
) -> pd.DataFrame:
    """The result of ``sql`` as a pandas frame, its strings plain objects (pandas' Arrow
    strings are slow in ``isin``), made through categories: one string object per distinct
    value, not one per row."""
    frame = con.execute(sql, params or {}).df()
    for c in frame.columns:
        if pd.api.types.is_string_dtype(frame[c].dtype) and frame[c].dtype != object:
            frame[c] = frame[c].astype("category").astype(object)
    return frame


def binned_measured(
    con: duckdb.DuckDBPyConnection, run_id: str, values: Sequence[str], max_bins: int
) -> tuple[pd.DataFrame, int]:
    """One run's measured ``values`` (step columns, or ``compute_s``: :data:`COMPUTE`) per
    rank and bin of consecutive steps, in one pass over the view ``measured`` of ``con``: the
    distinct measured steps (sorted) cut into bins of ``ceil(n / max_bins)``, each labelled by
    its first step, the median of the bin's values (missing ones left out; NaN when all are).
    Returns ``(frame of rank, step, host and one column per value; steps per bin)``; ``host``
    is each rank's first traced host."""
    n = con.execute(
        "SELECT count(DISTINCT step) FROM measured WHERE run_id = $run", {"run": run_id}
    ).fetchone()
    count = int(n[0]) if n else 0
    size = max(1, -(-count // max(1, max_bins)))
    medians = ", ".join(
        f"median(({COMPUTE if v == 'compute_s' else v})::DOUBLE) AS {v}" for v in values
    )
    frame = query_frame(
        con,
        "WITH xs AS (SELECT step, (row_number() OVER (ORDER BY step) - 1) // $size AS b "
        "  FROM (SELECT DISTINCT step FROM measured WHERE run_id = $run)), "
        "labels AS (SELECT step, min(step) OVER (PARTITION BY b) AS bin FROM xs), "
        f"hosts AS (SELECT rank, arg_min(host, {ORDER}) "
        "  FILTER (WHERE host IS NOT NULL) AS host FROM measured WHERE run_id = $run "
        "  GROUP BY rank) "
        f"SELECT m.rank, l.bin AS step, any_value(h.host) AS host, {medians} "
        "FROM measured m JOIN labels l ON m.step = l.step "
        "LEFT JOIN hosts h ON h.rank = m.rank WHERE m.run_id = $run "
        "GROUP BY m.rank, l.bin ORDER BY m.rank, l.bin",
        {"run": run_id, "size": size},
    )
    return frame, size
