"""Measured steps and windows: which rows count, how long a run trained, and evaluations on a
run-wide clock. The building blocks the other analysis modules share.

The inputs are the store's frames: ``steps`` (:data:`workbench.schema.STEP_COLUMNS`, all runs
concatenated) and ``evals`` (:data:`workbench.schema.EVAL_COLUMNS`). Unknown column names raise
``ValueError`` with the valid names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.analysis.measured.stored import is_stored
from workbench.analysis.measured.warmup import (  # noqa: F401  (re-exported: the window's rule)
    detected_warmup,
    warmup_once,
)
from workbench.store.window_query import WindowParts, window_parts

# Metric names for which lower is better; anything else (accuracy, f1, ...) counts as higher.
_LOWER_IS_BETTER = ("loss", "error", "perplexity", "mse", "mae", "rmse", "wer", "cer")


def check_columns(frame: pd.DataFrame, names: Iterable[str], what: str = "frame") -> None:
    """Raise ValueError naming the missing columns and listing the valid ones."""
    missing = [n for n in names if n not in frame.columns]
    if missing:
        valid = ", ".join(sorted(str(c) for c in frame.columns))
        raise ValueError(f"unknown {what} column(s) {missing}; valid names: {valid}")


def measured_steps(steps: pd.DataFrame, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """The measured (non-warm-up) step rows, with an ``attempt`` column (0 when absent).

    Warm-up is the traced ``warmup`` flag and the steps :func:`detected_warmup` finds after it
    (still much slower than the steady state). ``columns`` keeps only those (when present)
    besides the keys: filtering a wide frame of a million rows costs far more than filtering
    the few columns a table needs.
    """
    check_columns(steps, ("run_id", "rank", "step", "warmup"), "steps")
    extra = detected_warmup(steps)
    if columns is not None:
        keep = ["run_id", "rank", "step", "warmup", "attempt", *columns]
        steps = steps[[c for c in dict.fromkeys(keep) if c in steps.columns]]
    out = steps[~steps["warmup"].fillna(False).astype(bool).to_numpy()]
    if "attempt" not in out.columns:
        out = out.assign(attempt=0)
    if len(extra):
        last = extra.set_index(["run_id", "attempt"])["last_warmup_step"]
        keys = pd.MultiIndex.from_arrays([out["run_id"], out["attempt"]])
        bound = last.reindex(keys).to_numpy(dtype="float64")
        out = out[~(out["step"].to_numpy(dtype="float64") <= bound)]
    return out


def comm_filled(steps: pd.DataFrame) -> pd.Series:
    """``comm_s`` on every row, for display only (a timeline that draws a line through the
    samples): no figure or table may count the carried values as measurements (use
    :func:`sampled_comm`, the sampled steps alone). With ``trace_comm='sampled'``
    communication is timed on sampled steps only; in between, each rank's latest sample stands
    for the steps after it (its first for the steps before).
    NaN for a rank with no sample at all."""
    if steps["comm_s"].notna().all():  # timed on every step: nothing to carry
        return steps["comm_s"]
    keys = [k for k in ("run_id", "attempt", "rank") if k in steps.columns]
    ordered = steps[[*keys, "step", "comm_s"]].reset_index(drop=True)
    ordered = ordered.sort_values([*keys, "step"], kind="stable")
    filled = ordered.groupby(keys, sort=False)["comm_s"].ffill()
    filled = filled.groupby([ordered[k] for k in keys], sort=False).bfill()
    return pd.Series(filled.sort_index().to_numpy(), index=steps.index, name="comm_s")


def sampled_comm(steps: pd.DataFrame) -> pd.DataFrame:
    """Per run, attempt and sampled step (a step where DDP's timer ran: ``comm_s`` not null, as
    with ``trace_comm='sampled'`` only every ``trace_comm_every_steps``-th step is): the
    smallest ``comm_s`` (span) and ``comm_exposed_s`` over the ranks that timed it (the rank
    that waited least for the others, so the closest to the transfer itself) and the world
    size. Never filled: the steps between samples have no row. ``comm_exposed_s`` is NaN where
    the trace has no exposed timer."""
    check_columns(steps, ("run_id", "step", "world_size", "comm_s"), "steps")
    s = steps if "attempt" in steps.columns else steps.assign(attempt=0)
    s = s[s["comm_s"].notna()]
    exposed = s["comm_exposed_s"] if "comm_exposed_s" in s.columns else np.nan
    s = s.assign(_exposed=exposed)
    out = s.groupby(["run_id", "attempt", "step"], sort=True).agg(
        world_size=("world_size", "max"),
        comm_s=("comm_s", "min"),
        comm_exposed_s=("_exposed", "min"),
    )
    return out.reset_index()


def gap_filled(steps: pd.DataFrame) -> pd.Series:
    """``gap_s`` on every row: the next step's start minus this step's end, on the same rank in
    the same attempt. Where the trace has none (a row written before the next step started,
    or a trace from before ``gap_s`` existed), the same arithmetic on the next row's
    ``t_start_s``; NaN on each attempt's last step (nothing follows it)."""
    check_columns(steps, ("run_id", "rank", "step", "t_start_s", "step_s"), "steps")
    traced = steps["gap_s"] if "gap_s" in steps.columns else None
    if traced is not None and traced.notna().all():
        return traced
    keys = [k for k in ("run_id", "attempt", "rank") if k in steps.columns]
    ordered = steps[[*keys, "step", "t_start_s", "step_s"]].reset_index(drop=True)
    ordered = ordered.sort_values([*keys, "step"], kind="stable")
    following = ordered.groupby(keys, sort=False)["t_start_s"].shift(-1)
    computed = (following - ordered["t_start_s"] - ordered["step_s"]).sort_index().to_numpy()
    out = pd.Series(computed, index=steps.index, name="gap_s")
    return out if traced is None else traced.fillna(out)


def lower_is_better(metric_name: str | None) -> bool:
    """Whether a smaller value of the named metric is better (loss, error, perplexity, ...)."""
    name = (metric_name or "").lower()
    return any(word in name for word in _LOWER_IS_BETTER)


def _longest_inside(
    frame: pd.DataFrame | None, value: str, bounds: pd.DataFrame, index: pd.Index
) -> pd.Series:
    """Per run and attempt: the sum over steps inside the window (from its first measured
    step up to, not including, its last step) of the largest ``value`` over ranks at that
    step. The intervals (evaluations, checkpoints) run after their step, so the last step's
    are outside the window."""
    if frame is None or value not in frame.columns or not len(frame):
        return pd.Series(0.0, index=index)
    f = frame if "attempt" in frame.columns else frame.assign(attempt=0)
    f = f[["run_id", "attempt", "rank", "step", value]].join(bounds, on=["run_id", "attempt"])
    f = f[(f["step"] >= f["first_step"]) & (f["step"] < f["last_step"])]
    longest = f.groupby(["run_id", "attempt", "step"])[value].max()
    total = longest.groupby(level=["run_id", "attempt"]).sum()
    return total.reindex(index, fill_value=0.0).fillna(0.0)


def _per_attempt(steps: pd.DataFrame, evals: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per run and attempt: ranks, measured steps, window start, end and length, samples, and
    the evaluation and checkpoint time inside the window (``eval_s``, ``save_s``)."""
    extra = ["save_s"] if "save_s" in steps.columns else []
    m = measured_steps(steps, ["world_size", "t_start_s", "step_s", "samples", *extra])
    m = m.assign(_end=m["t_start_s"] + m["step_s"])
    per_attempt = m.groupby(["run_id", "attempt"], sort=True).agg(
        world_size=("world_size", "max"),
        ranks=("rank", "nunique"),
        steps=("step", "nunique"),
        start_s=("t_start_s", "min"),
        end_s=("_end", "max"),
        samples=("samples", "sum"),
        samples_counted=("samples", "count"),
        first_step=("step", "min"),
        last_step=("step", "max"),
    )
    per_attempt["measured_s"] = per_attempt["end_s"] - per_attempt["start_s"]
    bounds = per_attempt[["first_step", "last_step"]]
    per_attempt["eval_s"] = _longest_inside(evals, "eval_s", bounds, per_attempt.index)
    per_attempt["save_s"] = _longest_inside(m, "save_s", bounds, per_attempt.index)
    return per_attempt.drop(columns=["first_step", "last_step"])


def measured_window(steps: pd.DataFrame, evals: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per run: the measured window and the samples in it, end to end and training alone.

    The window of one attempt runs from the first measured step's start to the last step's end
    (``t_start_s + step_s``), across ranks. A resumed run (several ``attempt`` values) adds its
    attempts' windows, since the time between them is not training; ``start_s`` is the first
    attempt's start and ``end_s`` the last attempt's end. Columns: ``run_id, world_size, ranks,
    attempts, steps`` (measured steps), ``start_s, end_s, measured_s, samples`` (all ranks),
    ``samples_per_s`` (end to end: samples / measured_s, never a sum of per-rank rates) and
    ``wall_step_s`` (measured_s / steps: the wall time of a step, what happens between
    steps included; the traced phases' ``step_s`` leaves that out).

    Training alone: ``eval_s`` and ``save_s`` are the evaluations (from ``evals``; 0 without
    it) and checkpoints (the steps' ``save_s``) inside the window, each the slowest rank's;
    ``train_s = measured_s - eval_s - save_s``, ``train_samples_per_s = samples /
    train_s`` and ``train_step_s = train_s / steps``. A run with only warm-up steps gets NaN rates.
    """
    if is_stored(steps):  # a report asks for it several times: computed once per evals
        key = ("measured_window", id(evals))
        kept = steps.kept(key, (evals,), lambda: _window_of_parts(steps.window_parts, evals))
        return kept.copy()
    check_columns(steps, ("world_size", "t_start_s", "step_s", "samples"), "steps")
    return _window(
        _per_attempt(steps, evals),
        steps.groupby("run_id", sort=False)["world_size"].max().reindex(pd.unique(steps["run_id"])),
        detected_warmup(steps).groupby("run_id")["dropped"].sum(),
    )


def measured_window_in_store(run_dirs: Iterable[str | Path]) -> pd.DataFrame:
    """:func:`measured_window` of the runs in ``run_dirs`` (run folders, their evaluations
    included), aggregated in the engine: only small per-step and per-attempt frames reach
    pandas. The same columns and values as ``measured_window(load_traces(run_dirs),
    load_traces(run_dirs, "eval"))``."""
    parts = window_parts(run_dirs, detected_warmup)
    return _window_of_parts(parts, parts.evals)


def _window_of_parts(parts: WindowParts, evals: pd.DataFrame | None) -> pd.DataFrame:
    """:func:`measured_window` from the engine's window parts; ``evals``: per run, attempt and
    step the longest ``eval_s`` (or the evaluation rows themselves), ``None`` for none."""
    keys = ["run_id", "attempt"]
    per_attempt = parts.steps.groupby(keys, sort=True).agg(
        world_size=("world_size", "max"),
        steps=("step", "nunique"),
        start_s=("start_s", "min"),
        end_s=("end_s", "max"),
        samples=("samples", "sum"),
        samples_counted=("samples", "count"),
        first_step=("step", "min"),
        last_step=("step", "max"),
    )
    per_attempt.insert(1, "ranks", parts.ranks.set_index(keys)["ranks"].reindex(per_attempt.index))
    per_attempt["measured_s"] = per_attempt["end_s"] - per_attempt["start_s"]
    bounds = per_attempt[["first_step", "last_step"]]
    per_step = parts.steps.assign(rank=0)
    if evals is not None and "rank" not in evals.columns:
        evals = evals.assign(rank=0)
    per_attempt["eval_s"] = _longest_inside(evals, "eval_s", bounds, per_attempt.index)
    per_attempt["save_s"] = _longest_inside(per_step, "save_s", bounds, per_attempt.index)
    world = parts.run_world.set_index("run_id")["world_size"]
    return _window(
        per_attempt.drop(columns=["first_step", "last_step"]),
        world,
        parts.cut.groupby("run_id")["dropped"].sum(),
    )


def _window(per_attempt: pd.DataFrame, run_world: pd.Series, dropped: pd.Series) -> pd.DataFrame:
    """:func:`measured_window` from its per-attempt parts (:func:`_per_attempt`), each run's
    largest world size (by run, in the order the runs come: every run with step rows) and the
    warm-up steps detected per run."""
    out = per_attempt.groupby(level="run_id").agg(
        world_size=("world_size", "max"),
        ranks=("ranks", "max"),
        attempts=("steps", "size"),
        steps=("steps", "sum"),
        start_s=("start_s", "first"),
        end_s=("end_s", "last"),
        measured_s=("measured_s", "sum"),
        samples=("samples", "sum"),
        samples_counted=("samples_counted", "sum"),
        eval_s=("eval_s", "sum"),
        save_s=("save_s", "sum"),
    )
    all_runs = pd.Index(run_world.index, name="run_id")
    out = out.reindex(all_runs)
    counts = ["ranks", "attempts", "steps", "samples"]
    if out["world_size"].isna().any():  # runs with warm-up steps only
        out["world_size"] = out["world_size"].fillna(run_world)
        out[counts] = out[counts].fillna(0)
    out = out.astype({c: "int64" for c in ("world_size", *counts)})
    out["warmup_detected_steps"] = dropped.reindex(out.index, fill_value=0).astype("int64")
    with np.errstate(divide="ignore", invalid="ignore"):
        out["samples_per_s"] = out["samples"] / out["measured_s"].where(out["measured_s"] > 0)
        out["wall_step_s"] = out["measured_s"] / out["steps"].where(out["steps"] > 0)
        out["train_s"] = out["measured_s"] - out["eval_s"] - out["save_s"]
        out["train_samples_per_s"] = out["samples"] / out["train_s"].where(out["train_s"] > 0)
        out["train_step_s"] = out["train_s"] / out["steps"].where(out["steps"] > 0)
    # No measured step had its samples counted (a script the hooks could not count): the
    # throughput is unknown, not 0 (its measurement warnings say how to tell it).
    uncounted = out.pop("samples_counted").fillna(0) == 0
    out.loc[uncounted & (out["steps"] > 0), ["samples_per_s", "train_samples_per_s"]] = np.nan
    return out.reset_index()


def _attempt_ends(steps: pd.DataFrame, evals: pd.DataFrame) -> pd.Series:
    """Per run and attempt: where it stopped on its own clock, the later of its last step's end
    (``t_start_s + step_s``, max over ranks; warm-up steps count, the run trained through them)
    and its last evaluation's end (an evaluation after the last step is on the clock too)."""
    if is_stored(steps):
        step_end = steps.attempt_ends
    else:
        check_columns(steps, ("run_id", "t_start_s", "step_s"), "steps")
        s = steps if "attempt" in steps.columns else steps.assign(attempt=0)
        step_end = (s["t_start_s"] + s["step_s"]).groupby([s["run_id"], s["attempt"]]).max()
    eval_end = (
        (evals["t_start_s"] + evals["eval_s"]).groupby([evals["run_id"], evals["attempt"]]).max()
    )
    both = pd.concat([step_end, eval_end], axis=1)
    return both.max(axis=1).sort_index()


def eval_rows(evals: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per run and evaluation: rank 0's (lowest rank's) values, with a run-wide clock.

    ``time_s`` is the evaluation's end on the run's training clock: seconds since the first
    attempt's t0, where a resumed attempt starts where the previous attempt stopped: its last
    training step's end (the largest ``t_start_s + step_s`` over its ranks, from ``steps``), or
    its last evaluation's end when that came later; the training after an attempt's last
    evaluation counts. The time between attempts (the wait, the restart, reading the
    checkpoint) is not training. Without ``steps`` a later attempt's ``time_s`` is NaN
    (unknown). ``attempt`` is added (0) when absent.
    """
    check_columns(evals, ("run_id", "rank", "step", "t_start_s", "eval_s", "metric_value"), "evals")
    e_all = evals if "attempt" in evals.columns else evals.assign(attempt=0)
    first = e_all.groupby(["run_id", "attempt", "step"])["rank"].transform("min")
    e = e_all[e_all["rank"] == first].sort_values(["run_id", "attempt", "step"])
    end = (e["t_start_s"] + e["eval_s"]).to_numpy()
    later = e["attempt"].to_numpy() > 0
    if steps is None:
        return e.assign(time_s=np.where(later, np.nan, end))
    ends = _attempt_ends(steps, e_all)
    offset = ends.groupby(level="run_id").transform(lambda s: s.cumsum().shift(fill_value=0))
    keys = pd.MultiIndex.from_arrays([e["run_id"], e["attempt"]])
    shift = np.where(later, offset.reindex(keys).to_numpy(), 0.0)
    return e.assign(time_s=end + shift)
