"""The per-rank pass of :meth:`workbench.store.digests.query.StepDigest.per_rank`: its SQL (one
pass over all step rows, grouped by run, rank, attempt and whether a row is measured) and how its
groups combine into the figures over all rows, the measured rows per attempt, and the counts of
gradient bytes and buckets. No torch.
"""

from __future__ import annotations

import pandas as pd

from workbench.store.digests.attempts import MEANS, MOMENTS

#: Rows in order within a rank: by attempt, then step.
ORDER = "(attempt::BIGINT * 4294967296 + step)"
_PHASES = (
    "(coalesce(data_s, 0) + coalesce(forward_s, 0) + coalesce(backward_s, 0) "
    "+ coalesce(optimizer_s, 0))"
)
_STATS = ", ".join(
    [f"count({c}) AS {c}_n, avg({c}) AS {c}, var_samp({c}) AS {c}_var" for c in MOMENTS]
    + [f"count({c}) AS {c}_n, avg({c}) AS {c}" for c in MEANS]
)
#: The pass over all rows, per run, rank, attempt and whether the row is measured (``m``; the
#: open gaps ``_holes`` and the evaluations ``_evals_after`` joined): the measured figures come
#: from the ``m`` groups, the maxima over all rows from both.
PER_RANK_SQL = (
    "WITH r AS ("
    "  SELECT s.run_id, s.rank, s.attempt, s.step, s.world_size, s.host, s.t_start_s, "
    "  s.step_s, s.data_s, s.forward_s, s.backward_s, s.optimizer_s, s.comm_s, "
    "  s.comm_bytes, s.comm_buckets, s.comm_exposed_s, s.backward_compute_s, "
    "  s.rss_bytes, s.mem_peak_bytes, s.mem_reserved_bytes, s.mem_device_bytes, "
    "  NOT coalesce(s.warmup, false) "
    "  AND (s.last_warmup_step IS NULL OR s.step > s.last_warmup_step) AS m, "
    "  coalesce(s.gap_s, h.gap) AS gap, "
    "  coalesce(s.save_s, 0) AS save0, coalesce(e.eval_s, 0) AS eval0 "
    "  FROM rows s "
    "  LEFT JOIN _holes h ON h.run_id = s.run_id "
    "    AND h.attempt = s.attempt AND h.rank = s.rank AND h.step = s.step "
    "  LEFT JOIN _evals_after e ON e.run_id = s.run_id AND e.attempt = s.attempt "
    "    AND e.rank = s.rank AND e.step = s.step"
    "), p AS ("
    "  SELECT *, "
    "  CASE WHEN gap IS NULL THEN 0 ELSE save0 END AS save_s, "
    "  CASE WHEN gap IS NULL THEN 0 ELSE eval0 END AS eval_s, "
    "  CASE WHEN gap IS NULL THEN 0 ELSE gap - save0 - eval0 END AS between_s, "
    f"  CASE WHEN step_s - {_PHASES} < 0 THEN 0 ELSE step_s - {_PHASES} END AS other_s "
    "  FROM r"
    "), q AS (SELECT *, step_s + between_s + save_s + eval_s AS wall_step_s FROM p) "
    "SELECT run_id, rank, attempt, m, count(*) AS measured_steps, "
    "max(world_size) AS world_size, "
    f"arg_min(host, {ORDER}) FILTER (WHERE host IS NOT NULL) AS host, "
    f"min({ORDER}) FILTER (WHERE host IS NOT NULL) AS host_order, {_STATS}, "
    "list(DISTINCT host) FILTER (WHERE host IS NOT NULL) AS hosts, "
    "max(t_start_s + step_s) - min(t_start_s) AS window_s, "
    "max(rss_bytes) AS rss_peak_bytes, max(mem_peak_bytes) AS cuda_peak_bytes, "
    "max(mem_reserved_bytes) AS cuda_reserved_peak_bytes, "
    "max(mem_device_bytes) AS device_peak_bytes, "
    "max(comm_bytes) FILTER (WHERE world_size > 1) AS multi_rank_bytes, "
    "histogram(comm_bytes::DOUBLE) FILTER (WHERE world_size > 1) AS _bytes, "
    "histogram(comm_buckets::DOUBLE) FILTER (WHERE world_size > 1) AS _buckets "
    "FROM q GROUP BY run_id, rank, attempt, m ORDER BY run_id, rank, attempt, m"
)
#: The maxima taken over all rows (warm-up included).
PEAKS = (
    "rss_peak_bytes",
    "cuda_peak_bytes",
    "cuda_reserved_peak_bytes",
    "device_peak_bytes",
    "multi_rank_bytes",
)


def split_groups(groups: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """:data:`PER_RANK_SQL`'s groups as ``(every, per_attempt, byte_groups)``: per run and rank
    over all rows ``all_world_size``, ``all_host`` (the first traced), ``all_attempts`` and the
    :data:`PEAKS`; the measured groups, one per run, rank and attempt, in the columns
    :func:`workbench.store.digests.attempts.merge_attempts` takes; and of those, ``run_id`` with the
    histograms of gradient bytes and buckets (``_bytes``, ``_buckets``: value to rows)."""
    keys = ["run_id", "rank"]
    g = groups.groupby(keys, sort=True)
    order = groups["host_order"].fillna(float("inf"))
    first = groups.loc[order.groupby([groups[k] for k in keys]).idxmin()].set_index(keys)
    every = pd.DataFrame(
        {
            "all_world_size": g["world_size"].max(),
            "all_host": first["host"].where(first["host_order"].notna()),
            "all_attempts": g["attempt"].agg(lambda a: sorted({int(x) for x in a})),
            **{c: g[c].max() for c in PEAKS},
        }
    ).reset_index()
    every = every.astype({"run_id": object, "all_host": object})
    measured = groups[groups["m"]].drop(columns=["m", "host_order", *PEAKS])
    byte_groups = measured[["run_id", "_bytes", "_buckets"]]
    per_attempt = measured.drop(columns=["_bytes", "_buckets"]).reset_index(drop=True)
    return every, per_attempt, byte_groups
