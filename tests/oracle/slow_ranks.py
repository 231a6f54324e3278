"""The pandas straggler analysis as it was before the engine (issue 25): the test oracle that the
matrix core and the engine are compared with. Not used by the package.

(The module is not named ``stragglers``: the package exports :func:`stragglers`, and a function of
the submodule's own name would shadow the submodule.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.measured.windows import check_columns, measured_steps
from workbench.schema import STEP_COLUMNS

STRAGGLER_COLUMNS = [
    "run_id",
    "attempt",
    "rank",
    "host",
    "world_size",
    "start_step",
    "end_step",
    "slow_steps",
    "slow_fraction",
    "ratio",
    "value_s",
    "others_s",
    "extra_s",
    "slow_phase",
    "slow_phase_extra_s",
]
#: The traced phases a straggler's extra time is attributed to (backward compute: DDP's timer on
#: its sampled steps, never the backward that holds the wait for a slow rank).
SLOW_PHASES = ("data_s", "forward_s", "backward_compute_s", "optimizer_s")


def _median_of_others(a: np.ndarray) -> np.ndarray:
    """Row-wise median of the other columns for each cell of ``a`` (steps x ranks; NaN = absent).

    Sorting once per row and skipping the cell's own sorted position keeps this O(S n log n)
    instead of one median per rank.
    """
    rows, n = a.shape
    order = np.argsort(a, axis=1, kind="stable")  # NaN sorts last
    srt = np.take_along_axis(a, order, axis=1)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.broadcast_to(np.arange(n), (rows, n)), axis=1)
    others = np.sum(~np.isnan(a), axis=1, keepdims=True) - 1

    def pick(i: np.ndarray) -> np.ndarray:
        idx = np.clip(np.where(i < pos, i, i + 1), 0, n - 1)
        return np.take_along_axis(srt, idx, axis=1)

    med = (pick((others - 1) // 2) + pick(others // 2)) / 2
    med[np.broadcast_to(others < 1, med.shape) | np.isnan(a)] = np.nan
    return med


#: The phases every step times on its own rank (no waiting for the others in them).
HOST_PHASES = ("data_s", "forward_s", "optimizer_s")


def rank_compute(m: pd.DataFrame) -> pd.DataFrame:
    """``m`` (measured steps) with ``_backward_compute_s`` and ``compute_s`` added: what a
    rank computes itself in a step, the waits for the other ranks left out.

    Backward compute is DDP's ``backward_compute_s`` on the steps it sampled; where the trace
    has no such timer but times communication on that row (a comm hook), ``backward_s - comm_s``
    (backward less its communication, the wait for late gradients included); NaN on the other
    steps, never carried from a sample. ``compute_s`` is ``data_s + forward_s + optimizer_s``
    plus that backward compute; NaN where the backward compute is unknown."""
    nan = pd.Series(np.nan, index=m.index, dtype="float64")
    timer = m["backward_compute_s"] if "backward_compute_s" in m.columns else nan
    if "backward_s" in m.columns and "comm_s" in m.columns:
        hooked = (m["backward_s"] - m["comm_s"]).clip(lower=0)
        timer = timer.where(timer.notna(), hooked)
    host = sum((m[p] for p in HOST_PHASES if p in m.columns), start=nan.fillna(0.0))
    return m.assign(
        _backward_compute_s=timer.astype("float64"),
        _host_s=host.astype("float64"),
        compute_s=(host + timer).astype("float64"),
    )


def _measure(steps: pd.DataFrame, measure: str) -> pd.DataFrame:
    """Measured steps with the measure under ``_value`` (``compute_s``: :func:`rank_compute`,
    NaN where a step's backward compute was not sampled) and the host phases under
    ``_host_s``."""
    float_cols = [c for c, t in STEP_COLUMNS.items() if t == "float64" and c in steps.columns]
    if measure != "compute_s" and measure not in float_cols:
        valid = ", ".join(["compute_s", *float_cols])
        raise ValueError(f"unknown straggler measure {measure!r}; valid names: {valid}")
    check_columns(steps, ("world_size",) if measure == "compute_s" else ("world_size", measure))
    phases = ("data_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "backward_compute_s")
    m = rank_compute(measured_steps(steps, ["world_size", "host", measure, *phases]))
    return m.assign(_value=m[measure].astype("float64"))


def _slow_phase(g: pd.DataFrame, steps: pd.Index, rank: object) -> tuple[str, float]:
    """The traced phase in which ``rank`` exceeds the median of the other ranks the most over
    ``steps`` (median excess, seconds); ``("", nan)`` when no phase exceeds it."""
    best, best_extra = "", float("nan")
    for phase in SLOW_PHASES:
        column = "_backward_compute_s" if phase == "backward_compute_s" else phase
        if column not in g.columns:
            continue
        mat = g.groupby(["step", "rank"])[column].mean().unstack("rank").reindex(steps)
        a = mat.to_numpy(dtype="float64")
        j = list(mat.columns).index(rank)
        excess = a[:, j] - _median_of_others(a)[:, j]
        if not np.isfinite(excess).any():  # not measured on those steps (a sampled timer)
            continue
        extra = float(np.nanmedian(excess))
        if extra > 0 and not extra <= best_extra:
            best, best_extra = phase, extra
    return best, best_extra


def _attempt_stragglers(
    g: pd.DataFrame, threshold: float, min_steps: int, persistence: float, measure: str
) -> list[dict[str, Any]]:
    """The stragglers of one run attempt's measured steps (``_value`` holds the measure).

    ``compute_s`` with backward compute on some steps only (DDP's sampled timer): the host
    phases over every step, and the whole compute over the sampled steps alone (a rank slow
    in backward shows nowhere else); a rank found by both is reported from its earlier
    start."""
    if measure != "compute_s" or g["_value"].notna().all():
        rows = _found(g, "_value", threshold, min_steps, persistence)
    else:
        host = _found(g, "_host_s", threshold, min_steps, persistence)
        sampled = g.groupby("step")["_value"].transform(lambda v: v.notna().all())
        full = _found(g[sampled.astype(bool)], "_value", threshold, min_steps, persistence)
        best: dict[int, dict[str, Any]] = {}
        for row in (*host, *full):
            kept = best.get(row["rank"])
            if kept is None or row["start_step"] < kept["start_step"]:
                best[row["rank"]] = row
        rows = [best[r] for r in sorted(best)]
    if len(rows) > 1 and max(r["world_size"] for r in rows) == 2:  # at most one of two
        rows = [max(rows, key=lambda r: r["extra_s"] * r["slow_steps"])]
    return rows


def _interval_low(excess: np.ndarray) -> float:
    """The low end of the 95 % interval of the median of the medians of consecutive batches of
    ``floor(sqrt n)`` finite values (order statistics: the value of rank
    ``floor((k - 1.96 sqrt k) / 2)``, at least the first); NaN under 4 values."""
    x = excess[np.isfinite(excess)]
    size = int(np.sqrt(len(x)))
    if size < 2:
        return float("nan")
    medians = np.sort(np.median(x[: len(x) // size * size].reshape(-1, size), axis=1))
    k = len(medians)
    return float(medians[max(int(np.floor((k - 1.96 * np.sqrt(k)) / 2)), 1) - 1])


def _found(
    g: pd.DataFrame, column: str, threshold: float, min_steps: int, persistence: float
) -> list[dict[str, Any]]:
    """The ranks whose ``column`` is persistently above the median of the other ranks'."""
    if g.empty:
        return []
    mat = g.groupby(["step", "rank"])[column].mean().unstack("rank").sort_index()
    if mat.shape[1] < 2 or mat.shape[0] < min_steps:
        return []
    a = mat.to_numpy(dtype="float64")
    ref = _median_of_others(a)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(ref > 0, a / ref, np.nan)
    slow = np.nan_to_num(ratio, nan=0.0) > 1 + threshold
    csum = np.vstack([np.zeros((1, a.shape[1])), np.cumsum(slow, axis=0)])
    window = csum[min_steps:] - csum[:-min_steps]  # slow count in [i, i + min_steps)
    qualifies = slow[: window.shape[0]] & (window >= persistence * min_steps - 1e-9)
    hosts = g.groupby("rank")["host"].first() if "host" in g.columns else None
    found = []
    for j in np.flatnonzero(qualifies.any(axis=0)):
        i = int(np.argmax(qualifies[:, j]))
        tail = slow[i:, j]
        idx = i + np.flatnonzero(tail)
        # named only when resolved on the steps after the ``min_steps`` that found it, up to
        # its last slow one: the 95 % interval of their batch medians above 0
        after = a[i + min_steps : idx[-1] + 1, j] - ref[i + min_steps : idx[-1] + 1, j]
        if not _interval_low(after) > 0:
            continue
        rank = int(mat.columns[j])
        phase, phase_extra = _slow_phase(g, mat.index[idx], rank)
        found.append(
            {
                "rank": rank,
                "host": hosts.get(rank) if hosts is not None else None,
                "world_size": int(g["world_size"].max()),
                "start_step": int(mat.index[i]),
                "end_step": int(mat.index[idx[-1]]),
                "slow_steps": int(tail.sum()),
                "slow_fraction": float(tail.mean()),
                "ratio": float(np.median(ratio[idx, j])),
                "value_s": float(np.median(a[idx, j])),
                "others_s": float(np.median(ref[idx, j])),
                "extra_s": float(np.median(a[idx, j] - ref[idx, j])),
                "slow_phase": phase,
                "slow_phase_extra_s": phase_extra,
            }
        )
    return found


def stragglers(
    steps: pd.DataFrame,
    threshold: float = 0.1,
    min_steps: int = 10,
    persistence: float = 0.8,
    measure: str = "compute_s",
) -> pd.DataFrame:
    """Ranks persistently slower than the median of the other ranks; one row per straggler.

    In DDP every rank waits for the slowest at each allreduce, so ``step_s`` is nearly equal on
    all ranks and a rank that waits is not slow: the default measure is therefore what each
    rank computes itself, ``compute_s = data_s + forward_s + optimizer_s + backward compute``
    (:func:`rank_compute`: DDP's ``backward_compute_s`` on the steps it sampled, never carried
    to the steps between; the waits sit in ``comm_s`` and ``backward_s`` and are left out).
    With backward compute sampled on some steps only, the host phases are compared on every
    step and the whole compute on the sampled steps alone, ``min_steps`` of them: one sampled
    hiccup is no straggler. Any float step column (``forward_s``, ``data_s``, ...) can be used
    instead. Per measured step, a rank's ratio is its measure over the median of the other
    ranks' (NaN when that median is not positive); it is *slow* when ``ratio > 1 +
    threshold``. A rank is a straggler from the first slow step that starts ``min_steps``
    consecutive steps of which at least ``persistence`` are slow (a robust window: isolated
    spikes do not count). Reported: ``start_step``, ``end_step`` (last slow step),
    ``slow_steps`` and ``slow_fraction`` from the start on, ``ratio`` (median over those slow
    steps), ``value_s`` / ``others_s`` (medians of its measure and the others' median) and
    ``extra_s`` (their difference: seconds per step the run loses to it). ``slow_phase`` names
    the traced phase (:data:`SLOW_PHASES`; backward compute where measured) in which the rank
    exceeds the others' median the most over those steps, by ``slow_phase_extra_s`` (median
    seconds per step); empty when no traced phase is slower (the time is outside them).
    """
    if min_steps < 1 or not 0 < persistence <= 1 or threshold < 0:
        raise ValueError(
            f"need min_steps >= 1, 0 < persistence <= 1, threshold >= 0; got "
            f"min_steps={min_steps}, persistence={persistence}, threshold={threshold}"
        )
    m = _measure(steps, measure)
    found: list[dict[str, Any]] = []
    for (run_id, attempt), g in m.groupby(["run_id", "attempt"], sort=True):
        for row in _attempt_stragglers(g, threshold, min_steps, persistence, measure):
            found.append({"run_id": run_id, "attempt": int(attempt), **row})
    return pd.DataFrame(found, columns=STRAGGLER_COLUMNS)
