"""Per-attempt aggregates of a rank pooled into one row per rank: counts added, means weighted,
variances pooled. The engine groups a rank's measured rows by attempt (a window is per attempt);
the analysis reports each rank over all its attempts. No torch."""

from __future__ import annotations

import pandas as pd

#: The columns pooled with their mean and sample standard deviation (``<name>_std``).
MOMENTS = (
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
#: The columns pooled with their mean alone (missing values left out).
MEANS = ("comm_bytes", "comm_buckets", "comm_exposed_s", "backward_compute_s")


def merge_attempts(per_attempt: pd.DataFrame) -> pd.DataFrame:
    """:meth:`workbench.store.digests.query.StepDigest.per_rank`'s measured columns from its
    per-attempt rows: counts added, means weighted by their counts, variances pooled (each
    attempt's sum of squared deviations plus its count times its mean's squared distance to the
    pooled mean; ddof 1), hosts joined, the first attempt's first host, windows added. A rank
    with one attempt keeps its row's values as they are."""
    keys = ["run_id", "rank"]
    g = per_attempt.groupby(keys, sort=True)
    out = g.agg(
        measured_steps=("measured_steps", "sum"),
        world_size=("world_size", "max"),
        host=("host", "first"),
        window_s=("window_s", "sum"),
        attempts=("attempt", list),
        hosts=("hosts", lambda h: sorted({x for part in h if part is not None for x in part})),
    )
    if g.ngroups == len(per_attempt):  # one attempt a rank (no resumed run): nothing to pool
        own = per_attempt.set_index(keys).loc[out.index]
        for c in (*MOMENTS, *MEANS):
            out[c] = own[c].astype("float64")
            if c == "backward_s":
                out["backward_s_n"] = own[f"{c}_n"].astype("int64")
            if c in MOMENTS:
                out[f"{c}_std"] = own[f"{c}_var"].astype("float64") ** 0.5
        return out.reset_index()
    for c in (*MOMENTS, *MEANS):
        n = per_attempt[f"{c}_n"].astype("float64")
        mean = per_attempt[c].astype("float64")
        total = n.groupby([per_attempt[k] for k in keys]).sum()
        weighted = (mean * n).groupby([per_attempt[k] for k in keys]).sum(min_count=1)
        pooled = weighted / total.where(total > 0)
        out[c] = pooled
        if c == "backward_s":
            out["backward_s_n"] = total.astype("int64")
        if c in MOMENTS:
            var = per_attempt[f"{c}_var"].astype("float64").fillna(0.0)
            mine = pooled.reindex(pd.MultiIndex.from_frame(per_attempt[keys])).to_numpy()
            m2 = var * (n - 1).clip(lower=0) + n * (mean - mine) ** 2
            m2 = m2.where(n > 0, 0.0).groupby([per_attempt[k] for k in keys]).sum()
            out[f"{c}_std"] = (m2 / (total - 1).where(total > 1)) ** 0.5
    single = g.size() == 1  # one attempt: its own figures, not re-derived
    if single.any():
        own = per_attempt.set_index(keys)
        for c in (*MOMENTS, *MEANS):
            out.loc[single, c] = own.loc[single[single].index, c]
            if c in MOMENTS:
                std = own.loc[single[single].index, f"{c}_var"] ** 0.5
                out.loc[single, f"{c}_std"] = std
    return out.reset_index()
