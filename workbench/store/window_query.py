"""Each run's measured window out of the engine: small per-step and per-attempt frames from one
pass or two over the runs' step and evaluation files, the warm-up rule applied by the analysis on
the per-step maxima (:func:`workbench.analysis.measured.windows.measured_window_in_store` composes
them into the window as :func:`workbench.analysis.measured.windows.measured_window` does from
frames). No torch."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.store.engine import steps_view

if TYPE_CHECKING:
    import pandas as pd

_MEASURED = (
    "NOT coalesce(s.warmup, false) AND (b.last_warmup_step IS NULL OR s.step > b.last_warmup_step)"
)


@dataclass
class WindowParts:
    """The small frames a window is made of.

    ``per_step``: per run, attempt and step with rows that are not traced warm-up, the slowest
    ``step_s`` (``warmup`` False; the warm-up rule's input). ``run_world``: each run's largest
    world size over all its rows. ``steps``: per run, attempt and measured step, ``start_s``
    (first start), ``end_s`` (last ``t_start_s + step_s``), ``samples`` (sum), ``save_s`` and
    ``world_size`` (largest). ``ranks``: per run and attempt, the ranks with measured rows.
    ``evals``: per run, attempt and step, the longest ``eval_s``. ``cut``: the warm-up rule's
    answer (``run_id, attempt, last_warmup_step, dropped``)."""

    per_step: pd.DataFrame
    run_world: pd.DataFrame
    steps: pd.DataFrame
    ranks: pd.DataFrame
    evals: pd.DataFrame
    cut: pd.DataFrame


def window_parts(
    run_dirs: Iterable[str | Path], warmup: Callable[[pd.DataFrame], pd.DataFrame]
) -> WindowParts:
    """The window's parts of the runs in ``run_dirs``; ``warmup`` is the analysis's warm-up rule
    (given ``per_step``, it returns ``run_id, attempt, last_warmup_step, dropped``)."""
    dirs = list(run_dirs)
    con = steps_view(dirs)
    try:
        first = con.execute(
            "SELECT run_id, coalesce(attempt, 0) AS attempt, step, "
            "max(step_s) FILTER (WHERE NOT coalesce(warmup, false)) AS step_s, "
            "bool_or(NOT coalesce(warmup, false)) AS measured, "
            "max(world_size) AS world_size FROM steps GROUP BY ALL ORDER BY ALL"
        ).df()
        run_world = first.groupby("run_id", sort=True)["world_size"].max().reset_index()
        per_step = first[first["measured"]].drop(columns=["measured", "world_size"])
        per_step = per_step.assign(warmup=False).reset_index(drop=True)
        cut = warmup(per_step)
        con.register("cut", cut[["run_id", "attempt", "last_warmup_step"]])
        join = (
            "FROM steps s LEFT JOIN cut b "
            "ON s.run_id = b.run_id AND coalesce(s.attempt, 0) = b.attempt"
        )
        steps = con.execute(
            "SELECT s.run_id, coalesce(s.attempt, 0) AS attempt, s.step, "
            "min(s.t_start_s) AS start_s, max(s.t_start_s + s.step_s) AS end_s, "
            "sum(s.samples) AS samples, max(s.save_s) AS save_s, max(s.world_size) AS world_size "
            f"{join} WHERE {_MEASURED} GROUP BY ALL ORDER BY ALL"
        ).df()
        ranks = con.execute(
            "SELECT s.run_id, coalesce(s.attempt, 0) AS attempt, count(DISTINCT s.rank) AS ranks "
            f"{join} WHERE {_MEASURED} GROUP BY ALL ORDER BY ALL"
        ).df()
    finally:
        con.close()
    con = steps_view(dirs, "eval")
    try:
        evals = con.execute(
            "SELECT run_id, coalesce(attempt, 0) AS attempt, step, max(eval_s) AS eval_s "
            "FROM eval GROUP BY ALL ORDER BY ALL"
        ).df()
    finally:
        con.close()
    return WindowParts(per_step, run_world, steps, ranks, evals, cut)
