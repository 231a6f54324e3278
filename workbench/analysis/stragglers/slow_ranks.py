"""Stragglers: ranks persistently slower than the median of the other ranks.

(The module is not named ``stragglers``: the package exports :func:`stragglers`, and a function of
the submodule's own name would shadow the submodule.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.measured.rank_cells import (
    HEATMAP_BINS,
    RankCells,
    RowSparse,
    binned_medians,
    rank_cells,
    scattered_cells,
)
from workbench.analysis.measured.stored import StoredSteps
from workbench.analysis.measured.windows import check_columns, detected_warmup, measured_steps
from workbench.analysis.stragglers.ahead import built_ahead
from workbench.analysis.stragglers.straggler_rule import attempt_stragglers
from workbench.schema import STEP_COLUMNS
from workbench.store.measured_query import (
    BACKWARD_COMPUTE,
    TIMED,
    AttemptRows,
    measured_rows,
)

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


#: The rule's defaults (threshold, min_steps, persistence, measure): a run's digest keeps its
#: answer with them.
DEFAULT_RULE = (0.1, 10, 0.8, "compute_s")

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


def _cells_of_frame(g: pd.DataFrame, names: Sequence[str]) -> RankCells:
    """:func:`rank_cells` of one run attempt's rows of a frame (``_measure``'s columns)."""
    hosts = g.groupby("rank")["host"].first().dropna() if "host" in g.columns else {}
    return rank_cells(
        g["step"].to_numpy(dtype="int64"),
        g["rank"].to_numpy(dtype="int64"),
        {n: g[n].to_numpy(dtype="float64") for n in names if n in g.columns},
        g.groupby("step")["world_size"].max(),
        {int(r): h for r, h in dict(hosts).items()},
    )


def stragglers(
    steps: pd.DataFrame,
    threshold: float = 0.1,
    min_steps: int = 10,
    persistence: float = 0.8,
    measure: str = "compute_s",
) -> pd.DataFrame:
    """Ranks persistently slower than the median of the other ranks; one row per straggler.

    In DDP every rank waits for the slowest at each allreduce, so ``step_s`` is nearly equal on
    all ranks and a rank that waits is not slow: the default measure is therefore what each rank
    computes itself, ``compute_s = data_s + forward_s + optimizer_s + backward compute``
    (:func:`rank_compute`: DDP's ``backward_compute_s`` on the steps it sampled, never carried
    to the steps between; the waits sit in ``comm_s`` and ``backward_s`` and are left out). With
    backward compute sampled on some steps only, the host phases are compared on every step and
    the whole compute on the sampled steps alone, ``min_steps`` of them: one sampled hiccup is
    no straggler. Any float step column (``forward_s``, ``data_s``, ...) can be used instead.
    Per measured step, a rank's ratio is its measure over the median of the other ranks' (NaN
    when that median is not positive); it is *slow* when ``ratio > 1 + threshold``. A rank is a
    straggler from the first slow step that starts ``min_steps`` consecutive steps of which at
    least ``persistence`` are slow (a robust window: isolated spikes do not count), named only
    when its excess is resolved on the steps after those ``min_steps`` up to its last slow one
    (the 95 % interval of their batch medians above 0: a stretch of noisy steps that passed the
    window by chance does not continue); of two ranks, each the other's median, at most one is
    named (the one that costs more). Reported: ``start_step``, ``end_step`` (last slow step),
    ``slow_steps`` and ``slow_fraction`` from the start on, ``ratio`` (median over those slow
    steps), ``value_s`` / ``others_s`` (medians of its measure and the others' median) and
    ``extra_s`` (their difference: seconds per step the run loses to it). ``slow_phase`` names
    the traced phase (``straggler_rule.SLOW_PHASES``; backward compute where measured) in which
    the rank exceeds the others' median the most over those steps, by ``slow_phase_extra_s``
    (median seconds per step); empty when no traced phase is slower (the time is outside them).
    """
    _check_rule(threshold, min_steps, persistence)
    m = _measure(steps, measure)
    names = ("_value", "_host_s", *HOST_PHASES, "_backward_compute_s")
    found: list[dict[str, Any]] = []
    for (run_id, attempt), g in m.groupby(["run_id", "attempt"], sort=True):
        cells = _cells_of_frame(g, names)
        for row in attempt_stragglers(cells, threshold, min_steps, persistence, measure):
            found.append({"run_id": run_id, "attempt": int(attempt), **row})
    return pd.DataFrame(found, columns=STRAGGLER_COLUMNS)


def _check_rule(threshold: float, min_steps: int, persistence: float) -> None:
    if min_steps < 1 or not 0 < persistence <= 1 or threshold < 0:
        raise ValueError(
            f"need min_steps >= 1, 0 < persistence <= 1, threshold >= 0; got "
            f"min_steps={min_steps}, persistence={persistence}, threshold={threshold}"
        )


#: Cells of a run attempt past which the straggler pass holds as few matrices as it can (64
#: MiB each): their phases summed by the engine and read again one at a time when a straggler
#: needs them, a sampled timer held on its sampled steps alone, the step time read last.
ONE_AT_A_TIME = 1 << 23


def _rule_cells(part: AttemptRows, measure: str, heatmap: bool) -> tuple[RankCells, bool]:
    """One attempt's matrices for the rule (the host phases, backward compute, ``_value`` for
    another measure than ``compute_s``, and the step time when it is to be binned), and
    whether it is a large one (:data:`ONE_AT_A_TIME`): then the host phases come summed
    (``_host_s``), the backward compute only on the steps that have it when those are few
    (DDP's sampled timer: one step in fifty), and no step time."""
    ranks = len(part.ranks) if part.ranks is not None else int(part.step_world.max())
    big = len(part.steps) * ranks > ONE_AT_A_TIME
    sparse = big and 2 * len(part.timed_steps) <= len(part.steps)
    columns = {"_host_s": " + ".join(HOST_PHASES)} if big else {p: p for p in HOST_PHASES}
    if not sparse:
        columns["_backward_compute_s"] = BACKWARD_COMPUTE
    if measure != "compute_s":
        columns["_value"] = measure
    if heatmap and not big:
        columns["step_s"] = "step_s"
    cells = scattered_cells(part.steps, part.ranks, part.read(columns), part.step_world, part.hosts)
    if sparse:
        held = part.timed_steps
        some = np.full((len(held), len(cells.ranks)), np.nan)
        if len(held):
            rows = part.read({"_backward_compute_s": BACKWARD_COMPUTE}, only=TIMED)
            got = scattered_cells(held, cells.ranks, rows, part.step_world, {})
            some = got.values.get("_backward_compute_s", some)
        at = np.searchsorted(cells.steps, held)
        cells.values["_backward_compute_s"] = RowSparse(len(cells.steps), at, some)
    return cells, big


def _reader(part: AttemptRows, cells: RankCells) -> Callable[[str], Any]:
    """Reads one matrix of the attempt again (the straggler's phases, the step time), alone; a
    sparse one the cells hold (a sampled timer) is handed over as it is."""
    kept = {n: m for n, m in cells.values.items() if isinstance(m, RowSparse)}

    def read(name: str) -> Any:
        if name in kept:
            return kept.pop(name)
        sql = BACKWARD_COMPUTE if name == "_backward_compute_s" else name
        rows = part.read({name: sql})
        return scattered_cells(cells.steps, cells.ranks, rows, part.step_world, {}).values[name]

    return read


def _attempt_rows(
    run_dirs: Iterable[str | Path], stored: StoredSteps | None
) -> Iterator[AttemptRows]:
    """Each run attempt's measured rows, a run folder at a time (with what the passes of
    ``stored`` found: the warm-up, the steps and the hosts)."""
    known = None if stored is None else stored.known
    for run_dir in run_dirs:
        yield from measured_rows(run_dir, detected_warmup, known)


def stragglers_in_store(
    run_dirs: Iterable[str | Path],
    threshold: float = 0.1,
    min_steps: int = 10,
    persistence: float = 0.8,
    measure: str = "compute_s",
    stored: StoredSteps | None = None,
    ranked: Callable[[int], None] | None = None,
) -> pd.DataFrame:
    """:func:`stragglers` of the runs in ``run_dirs`` (run folders), read through the engine:
    each run's measured rows come out of its files with only the columns the rule needs (warm-up
    filtered in the engine), one run at a time, and are laid out as step x rank matrices once.
    The same rule and columns as :func:`stragglers` of ``load_traces(run_dirs)``, in a fraction
    of its time and memory on a large sweep. ``stored``: the same runs' step rows in the
    engine, whose passes already found the warm-up and the hosts (only the rows are read).
    ``ranked``: called with the cells (steps x ranks) of each run attempt once it is ranked, for
    a progress bar."""
    _check_rule(threshold, min_steps, persistence)
    float_cols = [c for c, t in STEP_COLUMNS.items() if t == "float64"]
    if measure != "compute_s" and measure not in float_cols:
        valid = ", ".join(["compute_s", *float_cols])
        raise ValueError(f"unknown straggler measure {measure!r}; valid names: {valid}")
    held = None if stored is None else stored.digested_stragglers
    if held is not None and (threshold, min_steps, persistence, measure) == DEFAULT_RULE:
        wanted = [Path(d).name for d in run_dirs]
        held = held[held["run_id"].isin(wanted)]
        return held[STRAGGLER_COLUMNS].reset_index(drop=True)  # the digests' answer
    found: list[dict[str, Any]] = []
    known = None if stored is None else stored.known
    kept: list[tuple[str, int, tuple[pd.DataFrame, int]]] = []  # heatmap bins, hosts to come

    def build(part: AttemptRows) -> tuple[AttemptRows, RankCells, bool, bool]:
        heatmap = known is not None and known.measured_attempts(part.run_id) == [part.attempt]
        return (part, *_rule_cells(part, measure, heatmap), heatmap)

    # the next attempt read while this one is ranked (after a large one, which reads again)
    for part, cells, big, heatmap in built_ahead(_attempt_rows(run_dirs, stored), build, _big):
        run_id, attempt = part.run_id, part.attempt
        bins = HEATMAP_BINS if stored is None else stored.heatmap_bins
        binned = {"step_s": "step_s"} if "step_s" in cells.values else {}
        binned["compute_s"] = "_compute_s"
        compute = binned_medians(cells, binned, bins) if heatmap else None
        cells.values.pop("step_s", None)
        read = _reader(part, cells)
        rule = (threshold, min_steps, persistence, measure, read if big else None)
        for row in attempt_stragglers(cells, *rule):
            found.append({"run_id": run_id, "attempt": attempt, **row})
        if stored is not None and compute is not None:
            if big:  # the heatmaps' step time, read last and alone
                cells.values = {"step_s": read("step_s")}
                step_s = binned_medians(cells, {"step_s": "step_s"}, bins)[0]["step_s"]
                compute[0].insert(3, "step_s", step_s.to_numpy())
            kept.append((run_id, attempt, compute))
        if ranked is not None:
            ranked(len(part.steps) * len(cells.ranks))
        del cells, part, read
    frame = pd.DataFrame(found, columns=STRAGGLER_COLUMNS)
    if stored is not None:
        _hosts_found(stored, frame, kept)
    return frame.sort_values(["run_id", "attempt", "rank"], ignore_index=True)


def _hosts_found(
    stored: StoredSteps,
    found: pd.DataFrame,
    kept: list[tuple[str, int, tuple[pd.DataFrame, int]]],
) -> None:
    """The hosts of the stragglers ``found`` and of the heatmaps' bins ``kept`` (by run and
    attempt), whose ranks the straggler pass found as it read their rows: the per-rank
    pass's; the bins are then kept in ``stored``."""
    found["host"] = [
        stored.attempt_hosts(r, a).get(k)
        for r, a, k in found[["run_id", "attempt", "rank"]].itertuples(index=False)
    ]
    for run_id, attempt, (binned, size) in kept:
        hosts = stored.attempt_hosts(run_id, attempt)
        binned["host"] = pd.Series([hosts.get(int(k)) for k in binned["rank"]], dtype=object)
        stored.keep_binned(run_id, (binned, size))


def _big(built: tuple[AttemptRows, RankCells, bool, bool]) -> bool:
    """Whether an attempt's cells were built as a large one's (:data:`ONE_AT_A_TIME`)."""
    return built[2]
