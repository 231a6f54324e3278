"""The engine's straggler analysis and the matrix core against the pandas oracle (the analysis as
it was before the engine, tests/oracle/): hypothesis generates small stores (ranks, steps,
warm-up, NaNs, DDP's sampled timers, failed ranks, slow ranks) written in the store's own layout
(one Parquet file per rank under ``traces/``), and every result must equal the oracle's, floats to
1e-9 relative."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.frames import make_evals, make_steps
from tests.oracle.slow_ranks import stragglers as oracle_stragglers
from workbench import schema
from workbench.analysis.measured.stored import StoredSteps
from workbench.analysis.measured.windows import measured_window, measured_window_in_store
from workbench.analysis.run_digests import RULES
from workbench.analysis.stragglers import slow_ranks
from workbench.analysis.stragglers.slow_ranks import stragglers, stragglers_in_store
from workbench.store.digests import serve
from workbench.store.load import load_traces


@st.composite
def stores(draw: st.DrawFn) -> list[pd.DataFrame]:
    """One to two runs' step frames with the schema's columns."""
    runs = []
    for r in range(draw(st.integers(1, 2))):
        ranks = draw(st.integers(1, 5))
        n = draw(st.integers(1, 30))
        steps = make_steps(
            f"run{r}", world_size=ranks, n_steps=n, warmup_steps=draw(st.integers(0, 3))
        )
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        compute = 0.1 * (1 + 0.05 * rng.standard_normal(len(steps)))
        slow = draw(st.integers(-1, ranks - 1))
        factor = draw(st.sampled_from([1.0, 1.3, 2.0]))
        hit = (steps["rank"] == slow) & (steps["step"] > draw(st.integers(0, n)))
        compute = np.where(hit, compute * factor, compute)
        for k, phase in enumerate(("data_s", "forward_s", "optimizer_s")):
            steps[phase] = compute * (0.2 + 0.1 * k)
        timer = draw(st.sampled_from(["every", "sampled", "none", "hook"]))
        every = draw(st.integers(2, 4))
        sampled = (steps["step"] % every == 0) if timer == "sampled" else timer == "every"
        steps["backward_compute_s"] = np.where(sampled, compute * 0.4, np.nan)
        steps["comm_s"] = np.where(sampled | (timer == "hook"), 0.05, np.nan)
        steps["backward_s"] = compute * 0.4 + 0.05
        steps["step_s"] = steps.groupby("step")["forward_s"].transform("max") * 5
        nan_share = draw(st.sampled_from([0.0, 0.1]))
        for phase in ("data_s", "forward_s", "backward_compute_s"):
            steps.loc[rng.random(len(steps)) < nan_share, phase] = np.nan
        saves = steps["step"] % draw(st.integers(2, 7)) == 0
        steps["save_s"] = np.where(saves & draw(st.booleans()), 0.3, np.nan)
        if draw(st.booleans()) and n > 4:  # resumed: a second attempt from a later step on
            again = steps["step"] > draw(st.integers(2, n - 1))
            steps.loc[again, "attempt"] = 1
            steps.loc[again, "warmup"] = steps.loc[again, "step"] == steps.loc[again, "step"].min()
        if draw(st.booleans()) and ranks > 1:  # a failed rank: its rows stop early
            last = draw(st.integers(0, n))
            steps = steps[~((steps["rank"] == ranks - 1) & (steps["step"] > last))]
        runs.append(steps.reset_index(drop=True))
    return runs


def _parquet_keeping_nan(rows: pd.DataFrame, path: Path) -> None:
    """``rows`` as Parquet with a missing float as NaN, not null: as the store consolidated a
    traced NaN before it wrote nulls, and as other writers do. pyarrow's min/max statistics
    leave NaN out, which a reader folding comparisons with them must not trust."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrays = {
        c: pa.array(rows[c].to_numpy(), from_pandas=not pd.api.types.is_float_dtype(rows[c]))
        for c in rows.columns
    }
    pq.write_table(pa.table(arrays), path)


def _write(root: Path, runs: list[pd.DataFrame], evals: bool = False) -> list[Path]:
    """Each run's rows as the ranks leave them: one Parquet file per rank and kind, a missing
    float null (even ranks) or NaN (odd ranks: :func:`_parquet_keeping_nan`); with ``evals``, an
    evaluation after every 4th step (rank r's lasting 0.4 + 0.1 r s)."""
    dirs = []
    for steps in runs:
        run_id = str(steps["run_id"].iloc[0])
        traces = root / "sweep" / run_id / schema.TRACES_DIR
        traces.mkdir(parents=True)
        for rank, rows in steps.groupby("rank"):
            path = traces / schema.steps_file(int(rank))
            rows.to_parquet(path) if rank % 2 == 0 else _parquet_keeping_nan(rows, path)
        if evals:
            ranks = int(steps["rank"].max()) + 1
            at = [int(k) for k in steps["step"].unique() if k % 4 == 0]
            ev = make_evals(run_id, ranks, at, [0.5] * len(at)) if at else None
            for rank, rows in ev.groupby("rank") if ev is not None else ():
                rows.to_parquet(traces / schema.eval_file(int(rank)))
        dirs.append(traces.parent)
    return dirs


def assert_same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert list(got.columns) == list(want.columns)
    assert len(got) == len(want), f"\n{got}\n!=\n{want}"
    for column in want.columns:
        a, b = got[column].reset_index(drop=True), want[column].reset_index(drop=True)
        if pd.api.types.is_float_dtype(b) and len(b):
            np.testing.assert_allclose(a.astype(float), b.astype(float), rtol=1e-9, err_msg=column)
        else:
            assert a.tolist() == b.tolist(), column


#: 20 examples a run (was 40): each clean clone draws new ones (it has no example database), so
#: the stores tried add up across runs.
ORACLE = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@ORACLE
@given(stores(), st.sampled_from(["compute_s", "forward_s"]))
def test_stragglers_equal_the_oracle(runs: list[pd.DataFrame], measure: str) -> None:
    rule = {"threshold": 0.1, "min_steps": 3, "persistence": 0.6, "measure": measure}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = _write(Path(tmp), runs)
        steps = load_traces(dirs)
        want = oracle_stragglers(steps, **rule)
        assert_same(stragglers(steps, **rule), want)
        assert_same(stragglers_in_store(dirs, **rule), want)
        # a large run's way: phases summed by the engine, a sampled timer held on its steps
        # alone, each phase read again when a straggler needs it
        with patch.object(slow_ranks, "ONE_AT_A_TIME", 0):
            assert_same(stragglers_in_store(dirs, **rule), want)
            with StoredSteps(serve.open_rows(dirs, RULES)) as stored:
                assert_same(stragglers_in_store(dirs, stored=stored, **rule), want)


def test_each_folders_rows_are_taken_by_the_run_id_its_run_json_gives(tmp_path: Path) -> None:
    """Two runs whose folders were swapped by hand: the straggler pass after the engine's
    passes takes each folder's steps by the run id its ``run.json`` gives, not by the folder's
    name (a folder without one is read from its rows: the generated stores above)."""
    from tests.frames import ddp_steps

    slow = ddp_steps(world_size=4, n_steps=40, slow_rank=2, slow_from=11, factor=1.5)
    even = ddp_steps(world_size=4, n_steps=30)
    slow["run_id"], even["run_id"] = "slow", "even"
    dirs = _write(tmp_path, [slow, even])
    for folder in dirs:
        (folder / schema.RUN_FILE).write_text(json.dumps({"run_id": folder.name}))
    aside = dirs[0].with_name("aside")
    dirs[0].rename(aside)
    dirs[1].rename(dirs[0])
    aside.rename(dirs[1])  # the folder named "slow" now holds the run "even", and back
    want = oracle_stragglers(load_traces(dirs))
    assert want[["run_id", "rank", "start_step"]].values.tolist() == [["slow", 2, 11]]
    with StoredSteps(serve.open_rows(dirs, RULES)) as stored:
        assert_same(stragglers_in_store(dirs, stored=stored), want)


def test_a_planted_straggler_is_found_by_every_path(tmp_path: Path) -> None:
    """A worked example: rank 2 of 4 computes 1.5x from step 11 on (DDP's timer on every
    step); the oracle, the frames and the engine all name it from step 11."""
    from tests.frames import ddp_steps

    steps = ddp_steps(world_size=4, n_steps=40, slow_rank=2, slow_from=11, factor=1.5)
    dirs = _write(tmp_path, [steps])
    want = oracle_stragglers(load_traces(dirs))
    assert want[["rank", "start_step"]].values.tolist() == [[2, 11]]
    assert_same(stragglers(load_traces(dirs)), want)
    assert_same(stragglers_in_store(dirs), want)


@ORACLE
@given(stores(), st.booleans())
def test_measured_window_equals_the_oracle(runs: list[pd.DataFrame], evals: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dirs = _write(Path(tmp), runs, evals)
        want = measured_window(load_traces(dirs), load_traces(dirs, "eval"))
        assert_same(measured_window_in_store(dirs), want)


def test_a_running_run_is_read_from_its_live_files_too(tmp_path: Path) -> None:
    """A run still running: rank 1's rows are in its live Arrow stream, the first half also in
    a Parquet file already (the moment of consolidation); rank 0 is consolidated. The engine
    reads each row once, as ``load_traces`` does, and its results equal the frames'."""
    from tests.frames import ddp_steps
    from workbench.store.arrow_stream import StreamWriter

    steps = ddp_steps(world_size=3, n_steps=40, slow_rank=1, slow_from=11, factor=1.5)
    steps["run_id"] = "live"
    traces = tmp_path / "sweep" / "live" / schema.TRACES_DIR
    traces.mkdir(parents=True)
    for rank, rows in steps.groupby("rank"):
        rows = rows.reset_index(drop=True)
        if rank != 1:
            rows.to_parquet(traces / schema.steps_file(int(rank)))
            continue
        rows.iloc[:20].to_parquet(traces / schema.steps_file(1))
        writer = StreamWriter(traces / schema.live_steps_file(1), schema.STEP_COLUMNS)
        for start in (0, 25):  # two flushes
            part = rows.iloc[start : start + 25]
            writer.write({c: part[c].tolist() for c in schema.STEP_COLUMNS}, len(part))
        writer.close()
    dirs = [traces.parent]
    frame = load_traces(dirs)
    assert len(frame) == 3 * 40
    want = oracle_stragglers(frame)
    assert want[["rank", "start_step"]].values.tolist() == [[1, 11]]
    assert_same(stragglers_in_store(dirs), want)
    assert_same(measured_window_in_store(dirs), measured_window(frame))
