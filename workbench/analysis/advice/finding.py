"""The finding of a study in plain words, from the tables the report shows. Per scaling curve, a
:class:`Finding`: one line (how the largest world size compares with the smallest, the largest
cause of the lost efficiency, the most promising change with its predicted gain), the next
changes ranked (:mod:`workbench.analysis.advice.ranked_advice`), and the loss table.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from workbench.analysis.advice.candidates import NOISE, verified
from workbench.analysis.advice.cost import cost_line
from workbench.analysis.advice.diagnosis import inputs_of
from workbench.analysis.advice.losses import CAUSE_WORDS, efficiency_loss, run_parts
from workbench.analysis.advice.ranked_advice import MORE, Change, ranked_changes
from workbench.analysis.advice.straggler_words import straggler_lines
from workbench.analysis.measured.stored import StoredSteps
from workbench.analysis.measured.units import gib, percent, rate, ratio, seconds
from workbench.analysis.model.batch_cost import batch_cost
from workbench.analysis.throughput.comm import communication
from workbench.analysis.throughput.fsdp_comm import size
from workbench.analysis.throughput.groups import curve_words, resolve_group_by
from workbench.analysis.throughput.memory import MEMORY_WORDS, memory_by_rank
from workbench.analysis.throughput.scaling import points_table, run_table
from workbench.schema import SAMPLES_NOT_COUNTED

#: Speedups within this of 1 read as "no faster" rather than faster or slower.
SAME = 0.05


def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


def _label(curve: pd.Series, keys: Sequence[str]) -> str:
    """What tells this curve from the others: ``model=mlp, per-device batch 32``; a strategy by
    its name (``FSDP``)."""
    parts = []
    for key in keys:
        if key == "fixed_batch_size":  # the batch a family holds fixed (see throughput.groups)
            strong = curve.get("scaling") == "strong"
            parts.append(f"{'global' if strong else 'per-device'} batch {curve[key]}")
        else:
            parts.append(curve_words(key, curve[key]))
    return ", ".join(parts)


def _spread(top: pd.Series, base: pd.Series) -> str:
    """`` ± 0.12 (3 runs against 3)``: the speedup's standard deviation, from both ends'
    repeats; nothing without repeats (one run has no spread)."""
    std = float(top.get("speedup_std", float("nan")))
    if not math.isfinite(std):
        return ""
    return f" ± {std:.2f} ({int(top['runs'])} runs against {int(base['runs'])})"


def _bounds(top: pd.Series) -> tuple[float, float]:
    """The speedup's 95 % interval (NaN where the runs gave none)."""
    return float(top.get("speedup_low", math.nan)), float(top.get("speedup_high", math.nan))


def _interval(top: pd.Series, base: pd.Series) -> str:
    """`` (1.31x-1.73x, 95 %)``: the speedup's interval, where its runs give one, with the
    launches pooled at each end where there were several (`` ..., 3 launches against 2``)."""
    low, high = _bounds(top)
    if not (math.isfinite(low) and math.isfinite(high)):
        return ""
    runs, base_runs = int(top.get("runs", 1)), int(base.get("runs", 1))
    word = "launch" if runs == 1 else "launches"
    launches = f", {runs} {word} against {base_runs}" if max(runs, base_runs) > 1 else ""
    return f" ({ratio(low)}-{ratio(high)}, 95 %{launches})"


def _verdict(top: pd.Series) -> str:
    """Faster, slower or no faster than the base: by the speedup's interval where there is one
    (a difference it does not resolve is said to be unresolved, never ranked), else within
    :data:`SAME` of 1 reads as no faster."""
    low, high = _bounds(top)
    if not (math.isfinite(low) and math.isfinite(high)):
        speedup = float(top["speedup"])
        if abs(speedup - 1) < SAME:
            return "no faster than"
        return "faster than" if speedup > 1 else "slower than"
    if low > 1 or high < 1:
        return "faster than" if low > 1 else "slower than"
    return "not resolved (run longer or repeat) from"


def _why_no_speedup(per_run: pd.DataFrame, runs: pd.DataFrame, sizes: tuple[int, int]) -> str:
    """Why a point's speedup is unknown: a run whose samples were not counted (its measurement
    warnings say how to tell them), a run whose traces are incomplete, or neither known."""
    at = per_run[per_run["world_size"].isin(sizes)]
    if "measurement_warnings" in runs.columns:
        said = runs.set_index("run_id")["measurement_warnings"].reindex(at["run_id"])
        uncounted = [str(r) for r, w in said.items() if SAMPLES_NOT_COUNTED in str(w or "")]
        if uncounted:
            return (
                f"the samples of {', '.join(uncounted)} were not counted: its measurement "
                "warnings say how to tell them, workbench.trace.note(samples=...)"
            )
    if "incomplete" in at.columns and (at["incomplete"].fillna("") != "").any():
        return "a run of this point or of the base is incomplete"
    return "the throughput of this point or of the base is not known"


def _curve_sentence(
    points: pd.DataFrame,
    per_run: pd.DataFrame,
    parts: pd.DataFrame,
    steps: pd.DataFrame | StoredSteps,
    runs: pd.DataFrame,
    every_run: pd.DataFrame,
    keys: Sequence[str],
) -> str:
    """One curve (``per_run``: its runs; ``every_run``: the study's, which a larger batch's
    prediction is fitted on): its largest world size against its base, why, and what to try."""
    base = points.iloc[0]
    top = points.iloc[-1]
    n0, n = int(base["world_size"]), int(top["world_size"])
    if n == n0:
        return (
            f"only {_ranks(n)} measured: no speedup to report; add a run at a smaller world "
            f"size (1 rank) as the baseline"
        )
    speedup, efficiency = float(top["speedup"]), float(top["efficiency"])
    if not math.isfinite(speedup):
        return f"{_ranks(n)}: no speedup ({_why_no_speedup(per_run, runs, (n0, n))})"
    text = (
        f"{_ranks(n)}: {ratio(speedup)}{_interval(top, base) or _spread(top, base)} the "
        f"throughput of "
        f"{_ranks(n0)} ({percent(efficiency)} of ideal), {_verdict(top)} {_ranks(n0)} "
        f"({rate(float(top['samples_per_s']))} against {rate(float(base['samples_per_s']))})"
    )
    at_top = per_run.loc[per_run["world_size"] == n, "run_id"]
    at_base = per_run.loc[per_run["world_size"] == n0, "run_id"]
    causes = efficiency_loss(
        parts,
        list(at_base),
        list(at_top),
        n0,
        n,
        float(base["samples_per_s"]),
        float(top["samples_per_s"]),
    )
    if causes.empty:
        return text + "; the traces cannot say where the time went"
    top_parts = parts.loc[parts.index.isin(at_top)]
    model = functools.partial(
        _changes, steps=steps, runs=runs, study=(every_run, parts, keys), top=list(at_top)
    )
    return _causes_finding(text, causes, top_parts, per_run, n, model)


def _changes(
    cause: str,
    share: float,
    config: Mapping[str, Any],
    *,
    steps: pd.DataFrame | StoredSteps,
    runs: pd.DataFrame,
    study: tuple[pd.DataFrame, pd.DataFrame, Sequence[str]],
    top: list[Any],
) -> list[Change]:
    """The changes ``cause`` calls for at the point of runs ``top``, ranked: predicted from the
    point's measurements (and a larger batch from the compute fitted on the ``study``'s runs:
    its run table, parts and curve keys) where the cause has knobs."""
    every_run, parts, keys = study
    inputs, sampled = None, []
    if cause == "exposed_transfer":  # the only cause with knobs to predict
        mine = parts.loc[parts.index.isin(top)]
        spans = float(mine["samples_per_step"].mean()), float(mine["step_s"].mean())
        inputs, sampled = inputs_of(steps, runs, top, config, *spans)
        cost = batch_cost(every_run, parts, top, keys)
        if cost is not None:
            inputs = dataclasses.replace(inputs, batch_cost=cost)
    script = _is_script(every_run[every_run["run_id"].isin(top)])
    return ranked_changes(cause, share, config, inputs, sampled, script)


def _labelled(label: str, sentence: str) -> str:
    """``label: sentence``, a :class:`Finding` kept one."""
    if not label:
        return sentence
    if isinstance(sentence, Finding):
        return Finding(
            f"{label}: {sentence.lead}", sentence.more, sentence.heading, sentence.losses
        )
    return f"{label}: {sentence}"


def _time(value: float) -> str:
    """Seconds for people; a part that is not there is 0."""
    return "0" if value == 0 else seconds(value)


def _shared_cores(top: pd.DataFrame, per_run: pd.DataFrame) -> bool:
    """Whether the point's ranks ran on CPUs, several to a host: they compete for its cores."""
    hosts = top["ranks_per_host"].max() if "ranks_per_host" in top.columns else float("nan")
    if not (math.isfinite(hosts) and hosts > 1):
        return False
    mine = per_run[per_run["run_id"].isin(top.index)]
    names = [str(v) for c in ("device_name", "device") if c in mine.columns for v in mine[c]]
    return any(v.startswith("cpu") for v in names)


def _is_script(runs: pd.DataFrame) -> bool:
    """Whether the runs are a user's script (``model`` is ``script:<name>``)."""
    return "model" in runs.columns and runs["model"].astype(str).str.startswith("script:").all()


class Finding(str):
    """One curve's finding: its text, a line each (the lead, the changes after the most
    promising one, the loss table's heading and rows), and those parts for a page to lay
    out: ``lead``, ``more`` (the next changes, ranked), ``heading`` and ``losses`` (rows of
    cause, share, base -> top per step)."""

    lead: str
    more: str
    heading: str
    losses: list[tuple[str, str, str]]

    def __new__(
        cls,
        lead: str,
        more: str = "",
        heading: str = "",
        losses: Sequence[tuple[str, str, str]] = (),
    ) -> Finding:
        lines = [lead] + ([f"  next: {more}"] if more else [])
        if losses:
            width = max(len(cause) for cause, _, _ in losses)
            lines.append(f"  {heading}")
            lines += [f"    {c:<{width}}  {s:>6}  {d}".rstrip() for c, s, d in losses]
        self = super().__new__(cls, "\n".join(lines))
        self.lead, self.more, self.heading = lead, more, heading
        self.losses = list(losses)
        return self


def _share(value: float) -> str:
    """A share of the step, no ``-0.0 %`` for a share under half a tenth of a percent."""
    return percent(0.0 if abs(value) < 0.0005 else value)


def _losses(causes: pd.DataFrame, contention: bool) -> list[tuple[str, str, str]]:
    """The loss table's rows: each cause's words, its share of the step and its seconds per
    step at the base and at N (shares under half a percent left out, except unexplained)."""
    rows = []
    for row in causes.itertuples():
        if not math.isfinite(row.share) or (abs(row.share) < 0.005 and row.cause != "unexplained"):
            continue
        words = CAUSE_WORDS[row.cause]
        if row.cause == "compute" and contention:
            words = "compute grown (contention: the ranks share the host's CPU cores)"
        detail = ""
        if row.cause != "unexplained":
            detail = f"{_time(row.base_s)} -> {_time(row.top_s)} per step"
        if math.isfinite(row.share_low):  # over the launches at each end
            detail += f"; 95 %: {_share(row.share_low)} to {_share(row.share_high)}"
        rows.append((words, _share(row.share), detail))
    return rows


def _causes_finding(
    text: str, causes: pd.DataFrame, top: pd.DataFrame, per_run: pd.DataFrame, n: int, model: Any
) -> Finding:
    """The lead (``text``, then the largest cause and the most promising change with its
    predicted gain), the next changes, ranked, and the loss table. ``model``: called with the
    cause, its share and the top point's config, it returns the ranked changes."""
    loss = float(causes["loss"].iloc[0])
    if loss <= SAME / 2:
        return Finding(text + "; no efficiency lost to explain")
    contention = _shared_cores(top, per_run)
    named = causes[causes["cause"] != "unexplained"]
    largest = causes.loc[causes["share"].fillna(-math.inf).idxmax()]
    if named["share"].fillna(0).max() <= 0:
        largest = causes[causes["cause"] == "unexplained"].iloc[0]
    cause = str(largest["cause"])
    words = CAUSE_WORDS[cause]
    if cause == "compute" and contention:
        cause, words = "contention", "compute grown (contention)"
    mine = per_run[per_run["world_size"] == n]
    config = mine.iloc[0].to_dict() if len(mine) else {}
    changes = model(cause, float(largest["share"]), config)
    # the next changes worth a measurement: those tune would try (a gain over the noise)
    worth = [c for c in changes[1:] if math.isfinite(c.gain) and c.gain >= NOISE]
    first, rest = changes[0], worth[:MORE]
    tuned = len(changes) > 1 or not first.bound and math.isfinite(first.gain)
    how = "; workbench tune RUN measures them in this order" if tuned else ""
    lead = (
        f"{text}; largest cause: {words}, {percent(float(largest['share']))} of the {n}-rank "
        f"step; most promising: {first.words()}"
    )
    more = "; ".join(c.words() for c in rest)
    if more:
        more += how
    else:
        lead += how
    heading = f"of the {percent(loss)} lost, as shares of the {n}-rank step:"
    return Finding(lead, more, heading, _losses(causes, contention))


def _memory_parts(per_run: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """The curve's memory per rank at its largest world size, in its parts as counted (the
    largest rank's, the runs' largest), with FSDP's gathered parameters where sharded; nothing
    where the runs did not count them."""
    n = int(per_run["world_size"].max())
    ids = per_run.loc[per_run["world_size"] == n, "run_id"]
    mine = runs[runs["run_id"].isin(ids)] if "run_id" in runs.columns else runs.iloc[:0]

    def largest(part: str) -> float:
        column = f"memory_{part}_max"
        if column not in mine.columns:
            return float("nan")
        return float(pd.to_numeric(mine[column], errors="coerce").max())

    parts = [f"{words} {size(largest(p))}" for p, words in MEMORY_WORDS.items()]
    total = largest("total_bytes")
    if not math.isfinite(total):
        return []
    saved, batch = largest("activation_bytes"), largest("activation_samples")
    if math.isfinite(saved) and math.isfinite(batch):  # the forward's, at its micro-batch
        total += saved
        parts.append(f"activations {size(saved)} at a micro-batch of {batch:,.0f}")
    gathered = largest("gathered_param_bytes")
    more = f"; parameters gathered: {size(gathered)}" if math.isfinite(gathered) else ""
    return [f"memory per rank at {_ranks(n)}: {size(total)} ({', '.join(parts)}){more}"]


def findings(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    group_by: Sequence[str] | None = None,
    evals: pd.DataFrame | None = None,
    found: pd.DataFrame | None = None,
    comm: pd.DataFrame | None = None,
    tunes: Sequence[Mapping[str, Any]] = (),
) -> list[str]:
    """The study's finding, a :class:`Finding` per scaling curve (``label: ...`` when there
    are several), then what each of ``tunes`` (``workbench tune``'s records of these runs)
    verified, the stragglers and the peak memory; after each curve, its memory per rank in
    its parts where counted. Empty without measured steps.
    ``found``: the stragglers when the caller has them (:func:`stragglers` of ``steps``, or
    ``stragglers_in_store`` of their runs); computed from ``steps`` when None. ``comm``:
    :func:`workbench.analysis.throughput.comm.communication` of these steps and runs with these
    ``group_by`` keys, when the caller has it; computed when None."""
    if steps.empty:
        return []
    keys = resolve_group_by(runs, group_by)
    per_run = run_table(runs, steps, evals, group_by=keys)  # training throughput
    if per_run.empty:
        return ["no completed run with measured steps yet"]
    comm = communication(steps, runs, group_by=keys) if comm is None else comm
    parts = run_parts(steps, comm, per_run.drop_duplicates("run_id"))
    curve_keys = [k for k in keys if k in per_run.columns]
    varying = [k for k in curve_keys if per_run[k].map(str).nunique() > 1]
    out = []
    # a group id, not a merge on the key columns (None and NaN keys do not merge reliably)
    curve_id = (
        per_run.groupby(curve_keys, dropna=False, sort=False).ngroup()
        if curve_keys
        else pd.Series(0, index=per_run.index)  # one curve (a bare 0 would name a column)
    )
    for _, mine in per_run.groupby(curve_id, sort=True):
        points = points_table(mine, keys).sort_values("world_size")
        sentence = _curve_sentence(points, mine, parts, steps, runs, per_run, keys)
        label = _label(mine.iloc[0], varying)
        out.append(_labelled(label, sentence))
        out += [_labelled(label, line) for line in _memory_parts(mine, runs)]
    out += [verified(t) for t in tunes] + [c for c in [cost_line(runs)] if c]
    out += straggler_lines(steps, found)
    memory = memory_by_rank(steps)
    peak = memory["cuda_peak_bytes"].max()
    if not math.isfinite(peak):
        out.append(f"peak memory {gib(float(memory['rss_peak_bytes'].max()))} per process (RSS)")
    else:
        out.append(f"peak GPU memory {gib(float(peak))} per rank (allocator)")
    return out
