"""Step rows left in the store (:class:`workbench.analysis.stored.StoredSteps`, aggregated in
DuckDB) against the pandas frame of the same rows (``load_traces``): every report entry point that
accepts ``StoredSteps`` in place of ``steps`` must give the same result.

Compared: the measured window and the evaluation rows, the run and scaling tables, the phase
breakdown (with the evaluations and without), communication, memory, the network fit, the
scaling model, the per-run loss parts, the finding's sentences, the focus run and the figures'
data (the step-time heatmap, the rank spread and the loss curves). Frames must have the same
rows (sorted by their keys), the same columns in the same order, compatible dtypes, floats equal
to 1e-9 relative (NaN equals NaN) and every other value exactly. The point: the report of a sweep
too large for pandas says exactly what the frame path says of a small one.

Hypothesis generates small stores in the store's own layout with the strategy of
``tests/test_engine_oracle.py`` (ranks, steps, warm-up, NaNs, DDP's sampled timers, resumed
attempts, failed ranks, slow ranks, evaluations); a fixed sweep with evaluations, a resumed run,
a detected warm-up and a planted slow rank covers every entry point at once.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.frames import make_evals, make_runs, make_steps, room_for_evals
from tests.test_engine_oracle import _write, stores
from workbench import schema
from workbench.analysis.breakdown import phase_breakdown
from workbench.analysis.comm import communication
from workbench.analysis.finding import findings
from workbench.analysis.losses import run_parts
from workbench.analysis.memory import memory_by_rank
from workbench.analysis.network import fit_network
from workbench.analysis.scaling import run_table, scaling_table
from workbench.analysis.scaling_model import predicted_vs_measured
from workbench.analysis.slow_ranks import stragglers
from workbench.analysis.stored import StoredSteps
from workbench.analysis.windows import eval_rows, measured_window
from workbench.store.load import load_traces
from workbench.ui.catalogue import focus_run
from workbench.ui.plots import loss_curves_figure, rank_spread_figure, step_time_heatmap

SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
#: The groupings tried: the default (every config column and the scaling families) and one group.
GROUPINGS = st.sampled_from([None, []])


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


def _same_value(a: object, b: object) -> bool:
    """Exact equality, NaN and None equal to themselves; lists and arrays element by element."""
    if isinstance(a, (list, tuple, np.ndarray)) or isinstance(b, (list, tuple, np.ndarray)):
        if not isinstance(a, (list, tuple, np.ndarray)) or not isinstance(
            b, (list, tuple, np.ndarray)
        ):
            return False
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    a_missing = a is None or (isinstance(a, float) and np.isnan(a))
    b_missing = b is None or (isinstance(b, float) and np.isnan(b))
    if a_missing or b_missing:
        return a_missing and b_missing and type(a) is type(b)
    return bool(a == b)


def assert_floats(got: object, want: object, what: str) -> None:
    """Floats to 1e-9 relative, NaN equal to NaN, same shape."""
    a = np.asarray(got, dtype="float64")
    b = np.asarray(want, dtype="float64")
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=0, equal_nan=True, err_msg=what)


def assert_frames(got: pd.DataFrame, want: pd.DataFrame, keys: Sequence[str], what: str) -> None:
    """``got`` (the stored path) equals ``want`` (the frame path): same columns in the same
    order, same rows once both are sorted by ``keys`` (stable), dtypes of one family, floats to
    1e-9 relative, everything else exactly."""
    assert list(got.columns) == list(want.columns), (
        f"{what}: columns\n{list(got.columns)}\n!=\n{list(want.columns)}"
    )
    assert len(got) == len(want), f"{what}: {len(got)} rows != {len(want)}\n{got}\n!=\n{want}"
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
        assert _kind(a.dtype) == _kind(b.dtype), f"{where}: dtype {a.dtype} != {b.dtype}"
        if _kind(b.dtype) in ("float", "int"):
            assert_floats(a, b, f"{where}\n{got}\n!=\n{want}")
        else:
            same = [_same_value(x, y) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
            assert all(same), f"{where}: {a.tolist()} != {b.tolist()}"


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """What ``call`` gives: ``("ok", result)`` or ``("raised", (type, message))``: the two
    paths must refuse the same inputs the same way."""
    try:
        return "ok", call()
    except (ValueError, KeyError, IndexError) as error:
        return "raised", (type(error).__name__, str(error))


def _same_outcome(
    got: tuple[str, Any], want: tuple[str, Any], what: str
) -> tuple[Any, Any] | None:
    """Both raised alike (``None``) or both gave a result (the pair, to compare)."""
    assert got[0] == want[0], f"{what}: stored {got} != frame {want}"
    if want[0] == "raised":
        assert got[1] == want[1], f"{what}: stored raised {got[1]}, frame raised {want[1]}"
        return None
    return got[1], want[1]


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


def assert_figures(got: go.Figure, want: go.Figure, what: str, axes: str = "xy") -> None:
    """Same traces (type, name and ``axes`` data) and the same title and subtitle."""
    assert _texts(got) == _texts(want), f"{what}: layout text"
    assert len(got.data) == len(want.data), f"{what}: {len(got.data)} != {len(want.data)} traces"
    for i, (a, b) in enumerate(zip(got.data, want.data, strict=True)):
        assert (a.type, a.name) == (b.type, b.name), f"{what}: trace {i}"
        for axis in axes:
            kind_a, va = _values(getattr(a, axis))
            kind_b, vb = _values(getattr(b, axis))
            where = f"{what}: trace {i} ({b.name}) {axis}"
            assert kind_a == kind_b, f"{where}: {kind_a} != {kind_b}"
            if kind_b == "number":
                assert_floats(va, vb, where)
            else:
                assert _same_value(va, vb), f"{where}: {va} != {vb}"


# ---------------------------------------------------------------------------------------------
# Inputs


def runs_of(steps: pd.DataFrame) -> pd.DataFrame:
    """The runs frame of generated step rows: one completed run per run id, its largest world
    size, the other config columns at :func:`tests.frames.make_runs`' defaults."""
    sizes = steps.groupby("run_id", sort=True)["world_size"].max()
    return make_runs([{"run_id": str(r), "world_size": int(n)} for r, n in sizes.items()])


def _evals_or_none(evals: pd.DataFrame) -> pd.DataFrame | None:
    """The evaluation rows, ``None`` for none (as the report passes them)."""
    return evals if len(evals) else None


class Store:
    """One generated store: its run folders, both paths' step rows, its evaluations and runs."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs
        self.frame = load_traces(dirs)
        self.evals = _evals_or_none(load_traces(dirs, "eval"))
        self.runs = runs_of(self.frame)


def _with_store(runs: list[pd.DataFrame], evals: bool, check: Callable[[Store], None]) -> None:
    """Write ``runs`` in the store's layout (in a fresh temporary folder) and run ``check``."""
    with tempfile.TemporaryDirectory() as folder:
        check(Store(_write(Path(folder), runs, evals)))


# ---------------------------------------------------------------------------------------------
# The comparisons, one per group of entry points


def check_windows(s: Store, use_evals: bool) -> None:
    """measured_window, eval_rows and phase_breakdown (the stored steps built with the same
    evaluations as the frame path is given: ``None`` or the evaluation rows)."""
    evals = s.evals if use_evals else None
    with StoredSteps(s.dirs, evals) as stored:
        assert_frames(
            measured_window(stored, evals),
            measured_window(s.frame, evals),
            ["run_id"],
            "measured_window",
        )
        if s.evals is not None:
            assert_frames(
                eval_rows(s.evals, stored),
                eval_rows(s.evals, s.frame),
                ["run_id", "attempt", "step"],
                "eval_rows",
            )
        assert_frames(
            phase_breakdown(stored, evals),
            phase_breakdown(s.frame, evals),
            ["run_id", "rank"],
            f"phase_breakdown(evals={'rows' if evals is not None else None})",
        )


def check_tables(s: Store, group_by: list[str] | None) -> None:
    """run_table, scaling_table, communication, run_parts and memory_by_rank."""
    keys = ["run_id", "scaling"]
    with StoredSteps(s.dirs, s.evals) as stored:
        per_run = run_table(s.runs, s.frame, s.evals, group_by)
        assert_frames(run_table(s.runs, stored, s.evals, group_by), per_run, keys, "run_table")
        want = _outcome(lambda: scaling_table(s.runs, s.frame, s.evals, group_by))
        got = _outcome(lambda: scaling_table(s.runs, stored, s.evals, group_by))
        pair = _same_outcome(got, want, "scaling_table")
        if pair is not None:
            point = [*(group_by or []), "scaling", "world_size", "nodes"]
            assert_frames(*pair, point, "scaling_table")
        comm = communication(s.frame, s.runs, group_by)
        assert_frames(communication(stored, s.runs, group_by), comm, ["run_id", "rank"], "comm")
        assert_frames(
            communication(stored), communication(s.frame), ["run_id", "rank"], "comm(no runs)"
        )
        unique = per_run.drop_duplicates("run_id")
        assert_frames(
            run_parts(stored, comm, unique).reset_index(),
            run_parts(s.frame, comm, unique).reset_index(),
            ["run_id"],
            "run_parts",
        )
        assert_frames(
            memory_by_rank(stored), memory_by_rank(s.frame), ["run_id", "rank"], "memory_by_rank"
        )


def check_models(s: Store, group_by: list[str] | None) -> None:
    """fit_network, predicted_vs_measured, findings and focus_run."""
    found = stragglers(s.frame)
    with StoredSteps(s.dirs, s.evals) as stored:
        for runs in (s.runs, None):
            got, want = fit_network(stored, runs), fit_network(s.frame, runs)
            assert got.note == want.note, f"fit_network note: {got.note!r} != {want.note!r}"
            assert (got.model is None) == (want.model is None), "fit_network model"
            if want.model is not None and got.model is not None:
                assert (got.model.name, got.model.description) == (
                    want.model.name,
                    want.model.description,
                )
                assert_floats(
                    [got.model.bandwidth_bytes_per_s, got.model.latency_s],
                    [want.model.bandwidth_bytes_per_s, want.model.latency_s],
                    "fit_network model",
                )
            assert got.world_sizes == want.world_sizes, "fit_network world sizes"
            assert_floats(got.residual_s, want.residual_s, "fit_network residual")
        want_p = _outcome(lambda: predicted_vs_measured(s.runs, s.frame, None, group_by))
        got_p = _outcome(lambda: predicted_vs_measured(s.runs, stored, None, group_by))
        pair = _same_outcome(got_p, want_p, "predicted_vs_measured")
        if pair is not None:
            curve = [*(group_by or []), "scaling", "nodes", "world_size"]
            assert_frames(*pair, curve, "predicted_vs_measured")
        said = findings(s.runs, s.frame, group_by, s.evals, found=found)
        assert findings(s.runs, stored, group_by, s.evals, found=found) == said
        for straggling in (found, found.iloc[0:0]):
            assert focus_run(stored, straggling) == focus_run(s.frame, straggling)


def check_figures(s: Store) -> None:
    """The heatmap (both values) and the rank spread of every run, and the loss curves."""
    with StoredSteps(s.dirs, s.evals) as stored:
        for run_id in sorted(s.frame["run_id"].unique()):
            for value in ("step_s", "compute_s"):
                what = f"step_time_heatmap({run_id}, {value})"
                pair = _same_outcome(
                    _outcome(lambda r=run_id, v=value: step_time_heatmap(stored, r, v)),
                    _outcome(lambda r=run_id, v=value: step_time_heatmap(s.frame, r, v)),
                    what,
                )
                if pair is not None:
                    assert_figures(*pair, what, axes="zxy")
            what = f"rank_spread_figure({run_id})"
            pair = _same_outcome(
                _outcome(lambda r=run_id: rank_spread_figure(stored, r)),
                _outcome(lambda r=run_id: rank_spread_figure(s.frame, r)),
                what,
            )
            if pair is not None:
                assert_figures(*pair, what)
        assert_figures(loss_curves_figure(stored), loss_curves_figure(s.frame), "loss_curves")


# ---------------------------------------------------------------------------------------------
# Generated stores


@SETTINGS
@given(stores(), st.booleans(), st.booleans())
def test_windows_and_breakdown_equal_the_frames(
    runs: list[pd.DataFrame], evals: bool, use_evals: bool
) -> None:
    _with_store(runs, evals, lambda s: check_windows(s, use_evals))


@SETTINGS
@given(stores(), st.booleans(), GROUPINGS)
def test_tables_equal_the_frames(
    runs: list[pd.DataFrame], evals: bool, group_by: list[str] | None
) -> None:
    _with_store(runs, evals, lambda s: check_tables(s, group_by))


@SETTINGS
@given(stores(), st.booleans(), GROUPINGS)
def test_models_and_finding_equal_the_frames(
    runs: list[pd.DataFrame], evals: bool, group_by: list[str] | None
) -> None:
    _with_store(runs, evals, lambda s: check_models(s, group_by))


@SETTINGS
@given(stores(), st.booleans())
def test_figures_equal_the_frames(runs: list[pd.DataFrame], evals: bool) -> None:
    _with_store(runs, evals, check_figures)


# ---------------------------------------------------------------------------------------------
# A fixed sweep: every entry point at once

#: World size -> step time (s) of the fixed sweep; three multi-rank sizes for the network fit.
SWEEP = {1: 1.0, 2: 1.2, 3: 1.35, 4: 1.5}
SLOW_RUN, SLOW_RANK, SLOW_FROM = "ws4", 3, 5
SLOW_RUN_SIZE = int(SLOW_RUN.removeprefix("ws"))


def _sweep_run(n: int, step_s: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One run of the fixed sweep: 16 steps (2 traced warm-up), evaluations after steps 5 and
    10 in the window; DDP's timers on every other step; a ring-model allreduce; ws2's first
    measured step slow (detected warm-up); ws3 resumed from step 9 (attempt 1, its own clock);
    rank 3 of ws4 computes 1.8x from step 5 on."""
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
    s = Store(dirs)
    assert s.evals is not None and set(s.frame["attempt"]) == {0, 1}
    found = stragglers(s.frame)
    assert found[["run_id", "rank", "start_step"]].values.tolist() == [
        [SLOW_RUN, SLOW_RANK, SLOW_FROM]
    ]
    window = measured_window(s.frame, s.evals).set_index("run_id")
    assert window.loc["ws2", "warmup_detected_steps"] == 1
    assert window.loc["ws3", "attempts"] == 2
    assert fit_network(s.frame, s.runs).model is not None
    for use_evals in (True, False):
        check_windows(s, use_evals)
    for group_by in (None, []):
        check_tables(s, group_by)
        check_models(s, group_by)
    check_figures(s)
