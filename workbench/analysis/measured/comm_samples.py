"""DDP's sampled timers, reduced to what the analysis reads of them: per sampled step the order
statistics over its ranks (:func:`per_step`), per rank its wait and exposed transfer
(:func:`per_rank`), and the values of DDP's backward-compute timer (:func:`backward_rows`).

A run's digest keeps these three instead of the sampled rows (a row a sampled step, not a row a
rank and step). The engine computes them in SQL
(:meth:`workbench.store.digests.query.StepDigest.comm_frames`), the frames path with these
functions from its rows; the oracle tests hold the two to one answer. Every
figure read from them is a minimum, maximum or median over a step's rows, a mean over a rank's
rows, or a median over the backward timer's values: none needs the rows again. No torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.store.digests.query import COMM_TYPES, empty_comm

#: A sampled step: its run, attempt and step.
STEP_KEYS = ["run_id", "attempt", "step"]


def _timed(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows where DDP's allreduce span was timed (``comm_s`` not null), with ``attempt``."""
    s = rows if "attempt" in rows.columns else rows.assign(attempt=0)
    return s[s["comm_s"].notna()]


def per_step(rows: pd.DataFrame) -> pd.DataFrame:
    """Per run, attempt and sampled step (``comm_s`` timed): the largest ``world_size`` and
    ``step_s``, the smallest ``comm_s`` and ``comm_exposed_s`` over its ranks; and over its
    rows that a network fit takes (a multi-rank world, ``comm_s`` and ``comm_bytes`` above 0)
    the smallest ``comm_s`` (``fit_comm_s``, NaN without such a row) and the medians of
    ``comm_bytes`` and ``comm_buckets`` (``fit_bytes``, ``fit_buckets``; 1 bucket where the
    traces have no bucket count). A min, max or median over one such row is the row's own, so
    what :func:`workbench.analysis.measured.windows.sampled_comm` and the network fit take of these
    is what they take of the rows."""
    s = _timed(rows)
    s = s.assign(
        _exposed=s["comm_exposed_s"] if "comm_exposed_s" in s.columns else np.nan,
        _step=s["step_s"] if "step_s" in s.columns else np.nan,
        _buckets=s["comm_buckets"] if "comm_buckets" in s.columns else 1,
    )
    out = s.groupby(STEP_KEYS, sort=True).agg(
        world_size=("world_size", "max"),
        step_s=("_step", "max"),
        comm_s=("comm_s", "min"),
        comm_exposed_s=("_exposed", "min"),
    )
    f = s[(s["world_size"] > 1) & (s["comm_s"] > 0) & (s["comm_bytes"] > 0)]
    fit = f.groupby(STEP_KEYS, sort=True).agg(
        fit_comm_s=("comm_s", "min"),
        fit_bytes=("comm_bytes", "median"),
        fit_buckets=("_buckets", "median"),
    )
    return out.join(fit, how="left").reset_index().astype(COMM_TYPES["comm_steps"])


def per_rank(rows: pd.DataFrame) -> pd.DataFrame:
    """Per run and rank with timed steps: ``wait_s``, the mean over its sampled steps of its
    ``comm_s`` less the smallest over the step's ranks (the rank that came last to the
    allreduce waited for no one); ``exposed_transfer_s``, the mean over its steps where DDP's
    exposed timer ran of the smallest ``comm_exposed_s`` over the step's ranks, clipped at 0
    (what even the last rank could not hide; NaN without the timer)."""
    s = _timed(rows)
    fastest = s.groupby(STEP_KEYS)["comm_s"].transform("min")
    out = (s["comm_s"] - fastest).groupby([s["run_id"], s["rank"]]).mean().rename("wait_s")
    out = out.to_frame()
    out["exposed_transfer_s"] = np.nan
    if "comm_exposed_s" in s.columns and s["comm_exposed_s"].notna().any():
        e = s[s["comm_exposed_s"].notna()]
        tail = e.groupby(STEP_KEYS)["comm_exposed_s"].transform("min").clip(lower=0)
        out["exposed_transfer_s"] = tail.groupby([e["run_id"], e["rank"]]).mean()
    return out.reset_index().astype(COMM_TYPES["comm_ranks"])


def backward_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows where DDP's backward-compute timer ran: ``run_id, world_size,
    backward_compute_s`` (a median over any set of runs is a median over these)."""
    if "backward_compute_s" not in rows.columns:
        return empty_comm("backward_rows")
    b = rows[rows["backward_compute_s"].notna()]
    columns = ["run_id", *COMM_TYPES["backward_rows"]]
    return b[columns].reset_index(drop=True).astype(COMM_TYPES["backward_rows"])
