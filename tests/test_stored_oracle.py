"""Step rows left in the store (:class:`workbench.analysis.measured.stored.StoredSteps`, aggregated
in DuckDB) against the pandas frame of the same rows (``load_traces``): every report entry point
that accepts ``StoredSteps`` in place of ``steps`` must give the same result.

Compared: the measured window and the evaluation rows, the run and scaling tables, the phase
breakdown (with the evaluations and without), communication, memory, the network fit, the
scaling model, the per-run loss parts, the finding's sentences, the focus run and the figures'
data (the step-time heatmap, the rank spread and the loss curves). Frames must have the same
rows (sorted by their keys), the same columns in the same order, compatible dtypes, floats equal
to 1e-9 relative (NaN equals NaN; within 1e-12 of an exact 0, round-off) and every other value
exactly. The point: the report of a sweep
too large for pandas says exactly what the frame path says of a small one.

Hypothesis generates small stores in the store's own layout with the strategy of
``tests/test_engine_oracle.py`` (ranks, steps, warm-up, NaNs, DDP's sampled timers, resumed
attempts, failed ranks, slow ranks, evaluations); a fixed sweep with evaluations, a resumed run,
a detected warm-up and a planted slow rank covers every entry point at once.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.frames import make_evals, make_runs, make_steps, room_for_evals
from tests.test_engine_oracle import _write, stores
from workbench import schema
from workbench.analysis.advice.base_plan import base_plan
from workbench.analysis.advice.finding import findings
from workbench.analysis.advice.losses import run_parts
from workbench.analysis.measured.stored import StoredSteps
from workbench.analysis.measured.windows import eval_rows, measured_window
from workbench.analysis.model.network import fit_network
from workbench.analysis.model.scaling_model import predicted_vs_measured
from workbench.analysis.run_digests import RULES, build_run_digests, open_steps
from workbench.analysis.stragglers.slow_ranks import stragglers, stragglers_in_store
from workbench.analysis.throughput.breakdown import phase_breakdown
from workbench.analysis.throughput.comm import communication
from workbench.analysis.throughput.memory import memory_by_rank
from workbench.analysis.throughput.scaling import run_table, scaling_table
from workbench.store.digests import serve
from workbench.store.digests.on_disk import DIGEST_DIR
from workbench.store.files import update_run
from workbench.store.load import load_traces
from workbench.ui.catalogue import focus_run
from workbench.ui.plots import loss_curves_figure, rank_spread_figure, step_time_heatmap

#: No shrinking: every example writes and reads a store, so shrinking a failure takes minutes;
#: the failure lists every difference of the example hypothesis prints instead.
#: 15 examples a run (was 30): each clean clone draws new ones (it has no example database), so
#: the stores tried add up across runs.
SETTINGS = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
)
#: The groupings tried: the default (every config column and the scaling families), one group
#: for all runs, and one named column.
GROUPINGS = st.sampled_from([None, [], ["model"]])


# ---------------------------------------------------------------------------------------------
# Comparing results


def _kind(dtype: Any) -> str:
    """A dtype's family: results of the two paths may differ within one (int64 and Int64, object
    and string), never across (an int count that comes back as float, a number as text)."""
    if pd.api.types.is_bool_dtype(dtype):
        return "bool"
    if pd.api.types.is_integer_dtype(dtype):
        return "int"
    if pd.api.types.is_float_dtype(dtype):
        return "float"
    if pd.api.types.is_datetime64_any_dtype(dtype):
        return "datetime"
    return "object"


def _is_list(value: object) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def _same_value(a: object, b: object) -> bool:
    """Exact equality; a missing value (None, NaN, NA) equals only the same kind of missing
    value; lists and arrays element by element."""
    if _is_list(a) or _is_list(b):
        if not (_is_list(a) and _is_list(b)) or len(a) != len(b):  # type: ignore[arg-type]
            return False
        return all(_same_value(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[call-overload]
    a_missing, b_missing = bool(pd.isna(a)), bool(pd.isna(b))
    if a_missing or b_missing:
        return a_missing and b_missing and type(a) is type(b)
    return bool(a == b)


#: Beside 1e-9 relative, how far from an exact 0 a float may be: the standard deviation of a
#: constant column pooled over attempts, or a difference of equal sums, is 0 in one path and
#: round-off (1e-17 .. 1e-15) in the other; every value compared is seconds, bytes or a count.
ATOL = 1e-12


def _float_diff(got: object, want: object) -> str | None:
    """Why ``got`` is not ``want`` to 1e-9 relative (NaN equal to NaN; :data:`ATOL` near 0), or
    ``None``."""
    a = np.asarray(got, dtype="float64")
    b = np.asarray(want, dtype="float64")
    if a.shape != b.shape:
        return f"shape {a.shape} != {b.shape}"
    try:
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=ATOL, equal_nan=True)
    except AssertionError:
        bad = ~(np.isclose(a, b, rtol=1e-9, atol=ATOL) | (np.isnan(a) & np.isnan(b)))
        where = np.argwhere(bad)[:5].tolist()
        pairs = [f"at {i}: stored {a[tuple(i)]!r}, frame {b[tuple(i)]!r}" for i in where]
        return f"{int(bad.sum())} of {a.size} differ; " + "; ".join(pairs)
    return None


class Diffs:
    """Every difference between the stored path (``got``) and the frame path (``want``) of one
    store, collected so that one failure shows them all; :meth:`done` fails with the list."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def add(self, what: str, why: str) -> None:
        self.found.append(f"{self.prefix}{what}: {why}")

    prefix = ""

    def under(self, path: str) -> Diffs:
        """These differences, each named as found on ``path`` (the digests)."""
        other = Diffs()
        other.found, other.prefix = self.found, f"[{path}] "
        return other

    def done(self) -> None:
        assert not self.found, "stored != frames:\n" + "\n".join(self.found)

    def equal(self, got: object, want: object, what: str) -> None:
        """Exactly equal (missing values as in :func:`_same_value`)."""
        if not _same_value(got, want):
            self.add(what, f"stored {got!r} != frame {want!r}")

    def floats(self, got: object, want: object, what: str) -> None:
        why = _float_diff(got, want)
        if why is not None:
            self.add(what, why)

    def frames(self, got: pd.DataFrame, want: pd.DataFrame, keys: Sequence[str], what: str) -> None:
        """Same columns in the same order, same rows once both are sorted by ``keys`` (stable),
        dtypes of one family, floats to 1e-9 relative, everything else exactly."""
        if list(got.columns) != list(want.columns):
            self.add(what, f"columns\n  stored {list(got.columns)}\n  frame  {list(want.columns)}")
            return
        if len(got) != len(want):
            self.add(what, f"{len(got)} rows != {len(want)}\n{got}\n!=\n{want}")
            return
        by = [k for k in keys if k in want.columns]
        if by:
            got = got.sort_values(by, kind="stable")
            want = want.sort_values(by, kind="stable")
        got, want = got.reset_index(drop=True), want.reset_index(drop=True)
        for column in want.columns:
            a, b = got[column], want[column]
            where = f"{what}.{column}"
            if not len(b):
                continue
            kinds = {_kind(a.dtype), _kind(b.dtype)}
            if len(kinds) > 1:
                self.add(where, f"dtype stored {a.dtype} != frame {b.dtype}")
            if kinds <= {"float", "int"}:  # the values too, whatever the dtypes
                self.floats(a, b, where)
            elif len(kinds) == 1:
                same = [_same_value(x, y) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
                if not all(same):
                    self.add(where, f"stored {a.tolist()} != frame {b.tolist()}")

    def outcomes(
        self, got: Callable[[], Any], want: tuple[str, Any], what: str
    ) -> tuple[Any, Any] | None:
        """Both refused alike (``None``) or both gave a result (the pair, to compare); ``want``
        is the frame path's :func:`_outcome`, computed once for every stored path."""
        a, b = _outcome(got), want
        if a[0] != b[0] or (b[0] == "raised" and a[1] != b[1]):
            self.add(what, f"stored {_short(a)} != frame {_short(b)}")
            return None
        return (a[1], b[1]) if b[0] == "ok" else None

    def figures(self, got: go.Figure, want: go.Figure, what: str, axes: str = "xy") -> None:
        """Same traces (type, name and ``axes`` data) and the same title and subtitle."""
        self.equal(_texts(got), _texts(want), f"{what} layout text")
        if len(got.data) != len(want.data):
            self.add(what, f"{len(got.data)} != {len(want.data)} traces")
            return
        for i, (a, b) in enumerate(zip(got.data, want.data, strict=True)):
            self.equal((a.type, a.name), (b.type, b.name), f"{what} trace {i}")
            for axis in axes:
                kind_a, va = _values(getattr(a, axis))
                kind_b, vb = _values(getattr(b, axis))
                where = f"{what} trace {i} ({b.name}) {axis}"
                if kind_a != kind_b:
                    self.add(where, f"stored {kind_a} {va} != frame {kind_b} {vb}")
                elif kind_b == "number":
                    self.floats(va, vb, where)
                else:
                    self.equal(va, vb, where)


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """What ``call`` gives: ``("ok", result)`` or ``("raised", (type, message))``: the two
    paths must refuse the same inputs the same way."""
    try:
        return "ok", call()
    except (ValueError, KeyError, IndexError, TypeError) as error:
        return "raised", (type(error).__name__, str(error))


def _short(outcome: tuple[str, Any]) -> str:
    kind, value = outcome
    return f"raised {value}" if kind == "raised" else f"gave {type(value).__name__}"


def _texts(fig: go.Figure) -> tuple[str | None, list[str | None]]:
    """A figure's title and its annotations' texts (the subtitle)."""
    return fig.layout.title.text, [a.text for a in fig.layout.annotations]


def _values(values: object) -> tuple[str, list[object]]:
    """A trace's x, y or z as a kind and a list (numbers as floats)."""
    if values is None:
        return "none", []
    array = np.asarray(values)
    if array.dtype.kind in "iufb":
        return "number", array.astype("float64").tolist()
    return "other", array.tolist()


# ---------------------------------------------------------------------------------------------
# Inputs


def runs_of(steps: pd.DataFrame) -> pd.DataFrame:
    """The runs frame of generated step rows: one completed run per run id, its largest world
    size, the other config columns at :func:`tests.frames.make_runs`' defaults."""
    sizes = steps.groupby("run_id", sort=True)["world_size"].max()
    return make_runs([{"run_id": str(r), "world_size": int(n)} for r, n in sizes.items()])


def mark_ended(dirs: Sequence[Path]) -> None:
    """Record each run's end in its run.json, as the launcher does (a digest is kept only for
    a run that has ended)."""
    for run in dirs:
        update_run(run, status="completed", ended_at=1.0)


class Store:
    """One written store: its run folders, the frame path's step rows (``frame``), its runs
    frame, its evaluations (``evals``: ``None`` for none, as the report passes them), the
    evaluations both paths are given (``given``: ``evals``, or ``None`` with ``use_evals``
    false) and the stored paths, each built with ``given`` (close the store). Each check
    computes the frame path's answer once and compares every stored path with it:

    - ``engine``: the engine over the rows (:class:`StoredSteps`);
    - ``digests``: the runs' digests as read back from their files (built here first, from
      each run's own evaluations);
    - ``digests, first reader``: none on disk, :func:`open_steps` builds them and uses them;
    - ``digests, read back``: :func:`open_steps` on the digests already on disk.
    """

    def __init__(
        self, dirs: list[Path], use_evals: bool = True, paths: Sequence[str] = ("engine",)
    ) -> None:
        self.dirs = dirs
        self.frame = load_traces(dirs)
        self.runs = runs_of(self.frame)
        evals = load_traces(dirs, "eval")
        self.evals = evals if len(evals) else None
        self.given = self.evals if use_evals else None
        self.paths: list[tuple[str, StoredSteps]] = []
        for path in paths:
            self.paths.append((path, self._open(path)))

    def _open(self, path: str) -> StoredSteps:
        if path == "engine":
            return StoredSteps(serve.open_rows(self.dirs, RULES, self.given))
        mark_ended(self.dirs)
        if path == "digests":
            build_run_digests(self.dirs, self.given)
            stored = open_steps(self.dirs, self.given, build=False)
        else:
            if path == "digests, first reader":
                for run in self.dirs:
                    shutil.rmtree(run / DIGEST_DIR, ignore_errors=True)
            stored = open_steps(self.dirs, self.given)
        assert stored.source == "digests", stored.note
        return stored

    def each(self, d: Diffs) -> Iterator[tuple[StoredSteps, Diffs]]:
        """Every stored path, with the differences named by it (the engine's unnamed)."""
        for path, stored in self.paths:
            yield stored, d if path == "engine" else d.under(path)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        for _, stored in self.paths:
            stored.close()


def want(call: Callable[[], Any]) -> tuple[str, Any]:
    """The frame path's outcome (see :meth:`Diffs.outcomes`)."""
    return _outcome(call)


def _with_store(
    runs: list[pd.DataFrame],
    evals: bool,
    checks: Sequence[Callable[[Store, Diffs], None]],
    use_evals: bool = True,
) -> None:
    """Write ``runs`` in the store's layout (in a fresh temporary folder), run every check on it
    through the engine and from the runs' digests, and fail with every difference found. A
    digest counts each run's evaluations, so the digest path is compared where the frame path
    is given them too (or there are none)."""
    diffs = Diffs()
    paths = ("engine", "digests") if use_evals or not evals else ("engine",)
    with tempfile.TemporaryDirectory() as folder:
        dirs = _write(Path(folder), runs, evals)
        with Store(dirs, use_evals, paths) as store:
            for check in checks:
                check(store, diffs)
    diffs.done()


# ---------------------------------------------------------------------------------------------
# The comparisons, one per group of entry points (three tests below share them out: one
# store written and one digest computed per example serves several, which keeps the file's run
# time near a minute; a difference in one test does not stop hypothesis exploring the others).
# Each computes the frame path's answer once and compares every stored path with it.


def check_window(s: Store, d: Diffs) -> None:
    """measured_window and eval_rows (the stored steps built with the evaluations the frame
    path is given: ``None`` or the evaluation rows)."""
    evals = s.given
    window = measured_window(s.frame, evals)
    rows = eval_rows(s.evals, s.frame) if s.evals is not None else None
    for stored, dd in s.each(d):
        dd.frames(measured_window(stored, evals), window, ["run_id"], "window")
        if rows is not None:
            keys = ["run_id", "attempt", "step"]
            dd.frames(eval_rows(s.evals, stored), rows, keys, "eval_rows")


def check_breakdown(s: Store, d: Diffs) -> None:
    """phase_breakdown: ``StoredSteps`` counts the evaluations it was built with, so both
    paths get the same (``None`` or the evaluation rows)."""
    evals = s.given
    what = f"phase_breakdown(evals={'rows' if evals is not None else None})"
    frame = phase_breakdown(s.frame, evals)
    for stored, dd in s.each(d):
        dd.frames(phase_breakdown(stored, evals), frame, ["run_id", "rank"], what)


def check_tables(s: Store, d: Diffs, group_by: list[str] | None) -> None:
    """run_table and scaling_table."""
    table = run_table(s.runs, s.frame, s.given, group_by)
    scaling = want(lambda: scaling_table(s.runs, s.frame, s.given, group_by))
    for stored, dd in s.each(d):
        got = run_table(s.runs, stored, s.given, group_by)
        dd.frames(got, table, ["run_id", "scaling"], "run_table")
        pair = dd.outcomes(
            lambda st=stored: scaling_table(s.runs, st, s.given, group_by),
            scaling,
            "scaling_table",
        )
        if pair is not None:
            keys = [*(group_by or []), "scaling", "world_size", "nodes"]
            dd.frames(*pair, keys, "scaling_table")


def check_comm(s: Store, d: Diffs, group_by: list[str] | None) -> None:
    """communication (with and without runs) and run_parts (given the frame path's
    communication and run table, so that only its steps input differs)."""
    comm = communication(s.frame, s.runs, group_by)
    comm_alone = communication(s.frame)
    per_run = run_table(s.runs, s.frame, s.given, group_by).drop_duplicates("run_id")
    parts = run_parts(s.frame, comm, per_run).reset_index()
    for stored, dd in s.each(d):
        dd.frames(communication(stored, s.runs, group_by), comm, ["run_id", "rank"], "comm")
        dd.frames(communication(stored), comm_alone, ["run_id", "rank"], "comm()")
        got = run_parts(stored, comm, per_run).reset_index()
        dd.frames(got, parts, ["run_id"], "run_parts")


def check_memory(s: Store, d: Diffs) -> None:
    """memory_by_rank."""
    memory = memory_by_rank(s.frame)
    for stored, dd in s.each(d):
        dd.frames(memory_by_rank(stored), memory, ["run_id", "rank"], "memory")


def check_network(s: Store, d: Diffs, group_by: list[str] | None) -> None:
    """fit_network (with and without runs) and predicted_vs_measured."""
    fits = {runs is None: fit_network(s.frame, runs) for runs in (s.runs, None)}
    predicted = want(lambda: predicted_vs_measured(s.runs, s.frame, None, group_by))
    for stored, dd in s.each(d):
        for runs in (s.runs, None):
            what = f"fit_network(runs={'runs' if runs is not None else None})"
            got, fit = fit_network(stored, runs), fits[runs is None]
            dd.equal(got.note, fit.note, f"{what} note")
            dd.equal(got.world_sizes, fit.world_sizes, f"{what} world sizes")
            dd.floats(got.residual_s, fit.residual_s, f"{what} residual")
            dd.equal(got.model is None, fit.model is None, f"{what} model is None")
            if fit.model is not None and got.model is not None:
                dd.equal(got.model.name, fit.model.name, f"{what} model name")
                dd.equal(got.model.description, fit.model.description, f"{what} description")
                dd.floats(
                    [got.model.bandwidth_bytes_per_s, got.model.latency_s],
                    [fit.model.bandwidth_bytes_per_s, fit.model.latency_s],
                    f"{what} bandwidth, latency",
                )
        pair = dd.outcomes(
            lambda st=stored: predicted_vs_measured(s.runs, st, None, group_by),
            predicted,
            "predicted_vs_measured",
        )
        if pair is not None:
            curve = [*(group_by or []), "scaling", "nodes", "world_size"]
            dd.frames(*pair, curve, "predicted_vs_measured")


def check_finding(s: Store, d: Diffs, group_by: list[str] | None) -> None:
    """The stragglers named, findings (given the frame path's stragglers) and focus_run (with
    them and with none)."""
    found = stragglers(s.frame)
    said = want(lambda: findings(s.runs, s.frame, group_by, s.given, found=found))
    straggling = {len(f): (f, focus_run(s.frame, f)) for f in (found, found.iloc[0:0])}
    for stored, dd in s.each(d):
        named = stragglers_in_store(s.dirs, stored=stored)
        dd.frames(named, found, ["run_id", "attempt", "rank"], "stragglers")
        pair = dd.outcomes(
            lambda st=stored: findings(s.runs, st, group_by, s.given, found=found),
            said,
            "findings",
        )
        if pair is not None:
            dd.equal(*pair, "findings")
        for n, (some, focus) in straggling.items():
            dd.equal(focus_run(stored, some), focus, f"focus_run({n} stragglers)")


def check_figures(s: Store, d: Diffs) -> None:
    """The heatmap (both values) and the rank spread of every run, and the loss curves."""
    drawn: dict[str, tuple[Callable[[Any], Any], tuple[str, Any], str]] = {}
    for run_id in sorted(s.frame["run_id"].unique()):
        for value in ("step_s", "compute_s"):
            what = f"step_time_heatmap({run_id}, {value})"
            drawn[what] = (
                lambda st, r=run_id, v=value: step_time_heatmap(st, r, v),
                want(lambda r=run_id, v=value: step_time_heatmap(s.frame, r, v)),
                "zxy",
            )
        what = f"rank_spread_figure({run_id})"
        drawn[what] = (
            lambda st, r=run_id: rank_spread_figure(st, r),
            want(lambda r=run_id: rank_spread_figure(s.frame, r)),
            "xy",
        )
    curves = loss_curves_figure(s.frame)
    for stored, dd in s.each(d):
        for what, (draw, figure, axes) in drawn.items():
            pair = dd.outcomes(lambda st=stored, f=draw: f(st), figure, what)
            if pair is not None:
                dd.figures(*pair, what, axes=axes)
        dd.figures(loss_curves_figure(stored), curves, "loss_curves")


# ---------------------------------------------------------------------------------------------
# Generated stores


@SETTINGS
@given(stores(), st.booleans(), st.booleans())
def test_window_breakdown_memory_and_figures_equal_the_frames(
    runs: list[pd.DataFrame], evals: bool, use_evals: bool
) -> None:
    _with_store(
        runs, evals, [check_window, check_breakdown, check_memory, check_figures], use_evals
    )


@SETTINGS
@given(stores(), st.booleans(), GROUPINGS)
def test_tables_and_communication_equal_the_frames(
    runs: list[pd.DataFrame], evals: bool, group_by: list[str] | None
) -> None:
    _with_store(
        runs,
        evals,
        [lambda s, d: check_tables(s, d, group_by), lambda s, d: check_comm(s, d, group_by)],
    )


@SETTINGS
@given(stores(), st.booleans(), GROUPINGS)
def test_network_fit_scaling_model_and_finding_equal_the_frames(
    runs: list[pd.DataFrame], evals: bool, group_by: list[str] | None
) -> None:
    _with_store(
        runs,
        evals,
        [lambda s, d: check_network(s, d, group_by), lambda s, d: check_finding(s, d, group_by)],
    )


# ---------------------------------------------------------------------------------------------
# A fixed sweep: every entry point at once

#: World size -> step time (s) of the fixed sweep; three multi-rank sizes for the network fit.
SWEEP = {1: 1.0, 2: 1.2, 3: 1.35, 4: 1.5}
SLOW_RUN, SLOW_RANK, SLOW_FROM = "ws4", 3, 3
SLOW_RUN_SIZE = int(SLOW_RUN.removeprefix("ws"))


def _sweep_run(n: int, step_s: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One run of the fixed sweep: 16 steps (2 traced warm-up), evaluations after steps 5 and
    10 in the window; DDP's timers on every other step; a ring-model allreduce; ws2's first
    measured step slow (detected warm-up); ws3 resumed from step 9 (attempt 1, its own clock);
    rank 3 of ws4 computes 1.8x from step 3 on (its first measured step)."""
    run_id = f"ws{n}"
    steps = make_steps(
        run_id, world_size=n, n_steps=16, step_s=step_s, backward_s=0.5 + (step_s - 1.0)
    )
    steps["comm_bytes"] = 4_000_000 if n > 1 else 0
    steps["comm_buckets"] = 2
    ring = 2 * (n - 1) / n * 4e6 / 2e9 + 2 * (n - 1) * 2 * 1e-4
    sampled = steps["step"] % 2 == 0
    steps["comm_s"] = np.where(sampled, ring + 0.01 * steps["rank"], np.nan) if n > 1 else 0.0
    steps["backward_compute_s"] = np.where(sampled, 0.45, np.nan)
    steps["comm_exposed_s"] = np.where(sampled & (n > 2), ring * 0.5, np.nan)
    steps["mem_peak_bytes"] = 2.5e9 + 1e6 * steps["rank"]
    if n == 2:
        steps.loc[steps["step"] == 3, "step_s"] = 3 * step_s
    if n == SLOW_RUN_SIZE:
        hit = (steps["rank"] == SLOW_RANK) & (steps["step"] >= SLOW_FROM)
        steps.loc[hit, "forward_s"] *= 1.8
        steps.loc[hit, "backward_compute_s"] *= 1.8
    evals = make_evals(run_id, world_size=n, eval_steps=(5, 10), step_s=step_s)
    evals["metric_value"] = [0.5 + 0.02 * n if k == 5 else 0.8 - 0.03 * n for k in evals["step"]]
    steps, evals = room_for_evals(steps, evals)
    if n == 3:  # resumed: attempt 1 from step 9 on, its clock from 0 again
        again = steps["step"] >= 9
        start = steps.loc[again, "t_start_s"].min()
        steps.loc[again, "attempt"] = 1
        steps.loc[again, "warmup"] = steps.loc[again, "step"] == 9
        steps.loc[again, "t_start_s"] -= start
        later = evals["step"] >= 9
        evals.loc[later, "attempt"] = 1
        evals.loc[later, "t_start_s"] -= start
    return steps.astype(schema.STEP_COLUMNS), evals.astype(schema.EVAL_COLUMNS)


def test_a_fixed_sweep_equals_the_frames_everywhere(tmp_path: Path) -> None:
    """Worlds 1 to 4 with evaluations, a resumed run, a detected warm-up and a planted slow
    rank: every entry point gives the same with the rows left in the store."""
    for n, step_s in SWEEP.items():
        steps, evals = _sweep_run(n, step_s)
        traces = tmp_path / "sweep" / f"ws{n}" / schema.TRACES_DIR
        traces.mkdir(parents=True)
        for rank, rows in steps.groupby("rank"):
            rows.to_parquet(traces / schema.steps_file(int(rank)))
        for rank, rows in evals.groupby("rank"):
            rows.to_parquet(traces / schema.eval_file(int(rank)))
    dirs = [tmp_path / "sweep" / f"ws{n}" for n in SWEEP]
    d = Diffs()
    with Store(dirs, paths=("engine", "digests, first reader", "digests, read back")) as s:
        assert s.evals is not None and set(s.frame["attempt"]) == {0, 1}
        found = stragglers(s.frame)
        assert found[["run_id", "rank", "start_step"]].values.tolist() == [
            [SLOW_RUN, SLOW_RANK, SLOW_FROM]
        ]
        window = measured_window(s.frame, s.evals).set_index("run_id")
        assert window.loc["ws2", "warmup_detected_steps"] == 1
        assert window.loc["ws3", "attempts"] == 2
        assert fit_network(s.frame, s.runs).model is not None
        check_everything(s, d)
        for path, stored in s.paths[1:]:  # a report's whole analysis, no row read
            assert stored.digest.row_reads == 0, path
    with Store(dirs, use_evals=False) as s:
        check_window(s, d)
        check_breakdown(s, d)
    check_tune_base(dirs, d.under("digests, tune"))
    d.done()


def check_tune_base(dirs: list[Path], d: Diffs) -> None:
    """What ``workbench tune`` reads of a base run, each run of the fixed sweep in turn: its
    plan (diagnosis, the scaling model's inputs, the candidates) from the frames the store
    opens, the run's digest, as the tune asks for it, against the plan from the run's rows."""
    for run in dirs:
        frame = load_traces([run])
        evals = load_traces([run], "eval")
        runs = runs_of(frame)
        want = base_plan(runs, frame, {})
        with serve.open_frames([run], RULES, evals if len(evals) else None) as frames:
            assert frames.source == "digests", frames.note
            got = base_plan(runs, frames, {})
        _same_record(d, got.diagnosis, want.diagnosis, f"{run.name} diagnosis")
        inputs = [asdict(p.inputs) if p.inputs is not None else {} for p in (got, want)]
        _same_record(d, inputs[0], inputs[1], f"{run.name} model inputs")
        labels = [[c.label for c in p.candidates] for p in (got, want)]
        d.equal(labels[0], labels[1], f"{run.name} candidates")


def _same_record(d: Diffs, got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    """Two flat or nested records: the same keys, numbers to 1e-9, the rest exactly."""
    d.equal(sorted(got), sorted(want), f"{what} keys")
    for key, value in want.items():
        where = f"{what}.{key}"
        if isinstance(value, dict):
            _same_record(d, got.get(key, {}), value, where)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            d.floats([got.get(key)], [value], where)
        else:
            d.equal(got.get(key), value, where)


def check_everything(s: Store, d: Diffs) -> None:
    """Every entry point of the fixed sweep, with the default grouping and with one group."""
    check_window(s, d)
    check_breakdown(s, d)
    for group_by in (None, []):
        check_tables(s, d, group_by)
        check_comm(s, d, group_by)
        check_network(s, d, group_by)
        check_finding(s, d, group_by)
    check_memory(s, d)
    check_figures(s, d)
