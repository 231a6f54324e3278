"""Where the time goes: per-rank phase times of the training step and per-run evaluation parts."""

from __future__ import annotations

import pandas as pd

from workbench.analysis.measured.stored import StoredSteps, is_stored
from workbench.analysis.measured.windows import check_columns, eval_rows, gap_filled, measured_steps

#: Timed phases of a training step, in order; ``comm_s`` overlaps ``backward_s`` so is not a phase.
PHASES = ("data_s", "forward_s", "backward_s", "optimizer_s")
#: What follows a step until the next one starts, in order: the untraced time between steps,
#: the checkpoint and the evaluation after it. With the phases and ``other_s`` they add up to
#: ``wall_step_s``.
BETWEEN = ("between_s", "save_s", "eval_s")
#: Timed parts of an evaluation, in order.
EVAL_PARTS = ("predict_s", "wait_s", "gather_s", "metric_s", "broadcast_s")


def _after_steps(steps: pd.DataFrame, evals: pd.DataFrame | None) -> pd.DataFrame:
    """``steps`` with what follows each step on its rank: ``save_s`` and ``eval_s`` (this
    rank's evaluation after the step) as 0 where none, and ``between_s`` = ``gap_s`` minus
    both; all three 0 on each attempt's last step, whose gap (if any) is outside the window."""
    gap = gap_filled(steps)
    inside = gap.notna()
    has_save = "save_s" in steps.columns
    save = steps["save_s"].fillna(0.0) if has_save else pd.Series(0.0, index=steps.index)
    evaluation = pd.Series(0.0, index=steps.index)
    if evals is not None and len(evals):
        keys = ["run_id", "attempt", "rank", "step"]
        s = steps if "attempt" in steps.columns else steps.assign(attempt=0)
        e = evals if "attempt" in evals.columns else evals.assign(attempt=0)
        per_step = e.groupby(keys)["eval_s"].sum()
        found = per_step.reindex(pd.MultiIndex.from_frame(s[keys])).to_numpy()
        evaluation = pd.Series(found, index=steps.index).fillna(0.0)
    save, evaluation = save.where(inside, 0.0), evaluation.where(inside, 0.0)
    return steps.assign(
        between_s=(gap - save - evaluation).where(inside, 0.0), save_s=save, eval_s=evaluation
    )


def phase_breakdown(steps: pd.DataFrame, evals: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per run and rank, mean and std over measured steps of each phase, comm and step time,
    and of what follows each step, so that the columns add up to the rank's wall time.

    ``other_s = step_s - (data_s + forward_s + backward_s + optimizer_s)``, clipped at 0: the
    untimed rest inside the step. ``comm_s`` is reported but not subtracted, since DDP's
    allreduce runs inside ``backward_s``. After the step (see :data:`BETWEEN`): ``save_s``
    (its checkpoint), ``eval_s`` (this rank's evaluation after it, from ``evals``; without
    ``evals`` it stays inside ``between_s``) and ``between_s`` ("between steps": the rest of
    ``gap_s``, the loop's own work); 0 after each attempt's last step, which ends the window.
    ``wall_step_s = step_s + between_s + save_s + eval_s``, and ``window_s`` is the rank's
    own window (first measured step's start to last step's end, attempts added):
    ``wall_step_s * steps == window_s``.
    """
    cols = [*PHASES, "comm_s", "step_s"]
    if is_stored(steps):
        return _stored_breakdown(steps, [*cols, "other_s", *BETWEEN, "wall_step_s"])
    check_columns(steps, ["world_size", "t_start_s", *cols], "steps")
    # The few columns needed first: copying a wide frame of a million rows costs far more.
    narrow = ["run_id", "rank", "step", "warmup", "attempt", "host", "gap_s", "save_s"]
    narrow = [c for c in narrow if c in steps.columns] + ["world_size", "t_start_s", *cols]
    columns = ["world_size", "host", "t_start_s", *cols, *BETWEEN]
    m = measured_steps(_after_steps(steps[narrow], evals), columns)
    # in the order traced (a restart before the first checkpoint traces step 1 again): the host
    # is the rank's first
    m = m.sort_values(["run_id", "rank", "attempt", "step"], kind="stable")
    m = m.assign(
        other_s=(m["step_s"] - m[list(PHASES)].sum(axis=1)).clip(lower=0),
        wall_step_s=m["step_s"] + m[list(BETWEEN)].sum(axis=1),
        _end=m["t_start_s"] + m["step_s"],
    )
    aggs: dict[str, tuple[str, str]] = {
        "world_size": ("world_size", "max"),
        "steps": ("step", "count"),
    }
    if "host" in m.columns:
        aggs["host"] = ("host", "first")
    for c in [*cols, "other_s", *BETWEEN, "wall_step_s"]:
        aggs[c] = (c, "mean")
        aggs[f"{c}_std"] = (c, "std")
    keys = ["run_id", "rank"]
    out = m.groupby(keys, sort=True).agg(**aggs)
    spans = m.groupby([*keys, "attempt"]).agg(start=("t_start_s", "min"), end=("_end", "max"))
    out["window_s"] = (spans["end"] - spans["start"]).groupby(level=keys).sum()
    return out.reset_index()


def _stored_breakdown(steps: StoredSteps, moments: list[str]) -> pd.DataFrame:
    """:func:`phase_breakdown` from the engine's per-rank aggregates (the evaluations the
    digest was given count as ``eval_s``)."""
    p = steps.measured_per_rank.rename(columns={"measured_steps": "steps"})
    columns = ["run_id", "rank", "world_size", "steps", "host"]
    for c in moments:
        columns += [c, f"{c}_std"]
    return p[[*columns, "window_s"]].astype({"world_size": "int64", "steps": "int64"})


def _slowest_rank(e: pd.DataFrame, keys: list[str], parts: list[str]) -> pd.DataFrame:
    """Per evaluation, the parts of ONE rank: the one whose ``eval_s`` is largest (the lowest
    such rank on a tie), suffixed ``_slowest``, and that rank as ``slowest_rank``."""
    order = e.sort_values([*keys, "eval_s", "rank"], ascending=[*(True for _ in keys), False, True])
    slowest = order.drop_duplicates(keys, keep="first").set_index(keys)
    out = slowest[parts].add_suffix("_slowest")
    out["slowest_rank"] = slowest["rank"]
    return out


def eval_breakdown(evals: pd.DataFrame) -> pd.DataFrame:
    """Per run, mean over evaluations of predict / gather / metric / broadcast / eval times.

    The plain names are rank 0's times (rank 0 gathers and computes the metric).
    ``<part>_slowest`` are the times of the slowest rank of each evaluation (the rank with the
    largest ``eval_s``), all from that one rank, so they stack to at most its ``eval_s``: the
    maxima of different ranks would count one wait twice (rank 0 predicting while another rank
    waits in the broadcast). ``slowest_rank`` is the rank most often slowest. Also
    ``evaluations``, ``samples`` (what the ranks predicted, summed over ranks, per evaluation;
    the sampler's padding left out, as the ranks trace it) and the last evaluation's
    ``metric_name`` / ``metric_value``.
    """
    parts = [*EVAL_PARTS, "eval_s"]
    check_columns(evals, ["run_id", "rank", "world_size", "step", "samples", *parts], "evals")
    e = evals if "attempt" in evals.columns else evals.assign(attempt=0)
    per_eval_keys = ["run_id", "attempt", "step"]
    slowest = _slowest_rank(e, per_eval_keys, parts)
    samples = e.groupby(per_eval_keys)["samples"].sum()
    rank0 = eval_rows(e).set_index(per_eval_keys)
    per_eval = rank0[["world_size", *parts]].join(slowest).join(samples)
    if "metric_value" in rank0.columns:
        per_eval["metric_value"] = rank0["metric_value"]
    if "metric_name" in rank0.columns:
        per_eval["metric_name"] = rank0["metric_name"]
    aggs: dict[str, tuple[str, object]] = {
        "world_size": ("world_size", "max"),
        "evaluations": ("eval_s", "size"),
    }
    for c in [*parts, *(f"{p}_slowest" for p in parts), "samples"]:
        aggs[c] = (c, "mean")
    aggs["slowest_rank"] = ("slowest_rank", lambda s: s.mode().iloc[0])
    for c in ("metric_name", "metric_value"):
        if c in per_eval.columns:
            aggs[c] = (c, "last")
    return per_eval.groupby(level="run_id", sort=True).agg(**aggs).reset_index()
