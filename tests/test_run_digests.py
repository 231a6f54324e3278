"""Run digests on a real run: the launcher writes one as a run ends (past its size threshold),
the report reads it and says so, a digest whose trace files changed is built again, a run that
has not ended is read from its rows with the reason said, and a small run's digest is left to
its first reader. That digests equal the rows everywhere is ``tests/test_stored_oracle.py``'s
claim (generated stores and a fixed sweep); the benchmark's is their speed and size
(``benchmarks/analysis_scale.py --digests``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from workbench import schema
from workbench.analysis.measured.stored import StoredSteps
from workbench.analysis.run_digests import RULES, digest_at_end, open_steps
from workbench.run.launch import launch
from workbench.store.digests import serve
from workbench.store.digests.on_disk import DIGEST_DIR, MANIFEST, digest_state
from workbench.store.files import update_run
from workbench.store.load import load_runs, load_traces
from workbench.ui.report import report_from_store, write_report

from .conftest import base_config
from .helpers import WARM


@pytest.fixture(scope="module")
def run_path(store: Path) -> Path:
    """A completed 2-rank run whose launcher digests every run as it ends (threshold 0)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serve, "AT_END_ROWS", 0)
        config = base_config(
            store, sweep="digests", run_name="d2", world_size=2, checkpoint_every_steps=0
        )
        handle = launch(config, WARM)
        assert handle.wait(timeout_s=180) == "completed"
    return handle.path


@pytest.mark.slow
def test_the_launcher_digests_the_run_and_the_report_reads_it(
    run_path: Path, tmp_path: Path
) -> None:
    assert digest_state(run_path) == "valid"  # before any reader
    manifest = (run_path / DIGEST_DIR / MANIFEST).stat().st_mtime_ns
    html = report_from_store(run_path, tmp_path / "r.html", summary_csv=tmp_path / "d.csv")
    assert "read from their digests" in html.read_text()
    assert (run_path / DIGEST_DIR / MANIFEST).stat().st_mtime_ns == manifest  # read, not rebuilt
    # the same table from the rows, through the engine
    runs = load_runs(run_path.parent.parent, [run_path.parent.name])
    evals = load_traces([run_path], "eval")
    with StoredSteps(serve.open_rows([run_path], RULES, evals)) as rows:
        write_report(runs, rows, evals, tmp_path / "rows.html", summary_csv=tmp_path / "r.csv")
    got, want = pd.read_csv(tmp_path / "d.csv"), pd.read_csv(tmp_path / "r.csv")
    assert list(got.columns) == list(want.columns) and len(got) == len(want) == 1
    numbers = want.select_dtypes("number").columns
    np.testing.assert_allclose(got[numbers], want[numbers], rtol=1e-9, equal_nan=True)


@pytest.mark.slow
def test_a_changed_trace_file_makes_the_digest_stale_and_the_next_reader_rebuilds_it(
    run_path: Path,
) -> None:
    # a consolidation after a kill rewrites a rank's file: the same rows, a new file
    path = run_path / schema.TRACES_DIR / schema.steps_file(1)
    pq.write_table(pq.read_table(path), path)
    assert digest_state(run_path) == "stale"
    with open_steps([run_path], load_traces([run_path], "eval")) as steps:
        assert steps.source == "digests", steps.note
    assert digest_state(run_path) == "valid"


@pytest.mark.slow
def test_a_run_that_has_not_ended_is_read_from_its_rows_and_says_why(run_path: Path) -> None:
    update_run(run_path, ended_at=None, status="running")
    try:
        assert digest_state(run_path) == "running"
        with open_steps([run_path]) as steps:
            assert steps.source == "rows"
            assert (
                steps.note == f"read from the step rows: run {run_path.name} has not ended "
                "(a digest is written once it has)"
            )
            assert not steps.empty
    finally:
        update_run(run_path, ended_at=1.0, status="completed")


@pytest.mark.slow
def test_a_small_run_is_left_to_its_first_reader(run_path: Path) -> None:
    rows = len(load_traces([run_path]))
    assert rows < serve.AT_END_ROWS  # the default threshold
    for path in (run_path / DIGEST_DIR).iterdir():
        path.unlink()
    assert not digest_at_end(run_path) and digest_state(run_path) == "missing"
    with open_steps([run_path], build=False) as steps:
        assert steps.source == "rows" and "has no digest" in steps.note
    with open_steps([run_path]) as steps:
        assert steps.source == "digests"
    assert digest_state(run_path) == "valid"


@pytest.mark.slow
def test_a_digest_that_cannot_be_kept_is_said_and_what_was_computed_still_serves(
    run_path: Path,
) -> None:
    shutil.rmtree(run_path / DIGEST_DIR, ignore_errors=True)
    (run_path / DIGEST_DIR).write_text("")  # a file where the folder goes: no digest written
    try:
        with pytest.warns(UserWarning, match=f"run {run_path.name}: its digest was not kept"):
            steps = open_steps([run_path])
        with steps:
            assert steps.source == "digests" and not steps.empty
        assert digest_state(run_path) == "missing"
    finally:
        (run_path / DIGEST_DIR).unlink()


def test_a_derived_column_round_trips_exactly_whatever_it_holds() -> None:
    """A per-step column kept null where it equals what it is derived from comes back as it
    was: equal, different, NaN against a number, NaN against NaN."""
    from workbench.store.digests.on_disk import _from_parquet, _to_parquet

    frame = pd.DataFrame(
        {
            "end_s": [1.0, 2.0, np.nan, 4.0, np.nan],
            "all_end_s": [1.0, 2.5, 3.0, np.nan, np.nan],
            "loss_sum": [0.3, 0.3, np.nan, 1.0, 2.0],
            "loss_n": [3, 3, 0, 2, 2],
            "loss": [0.3 / 3, 0.7, np.nan, np.nan, 1.0],
        }
    )

    def back(tmp: Path) -> pd.DataFrame:
        path = tmp / "per_step.parquet"
        path.write_bytes(_to_parquet(frame, "per_step"))
        return _from_parquet(path, "per_step")

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        pd.testing.assert_frame_equal(back(Path(tmp)), frame)
        written = pq.read_table(Path(tmp) / "per_step.parquet")
    # the values that equal their derivation are not stored
    assert written.column("all_end_s").null_count == 2  # rows 0 and 4
    assert written.column("loss").null_count == 3  # rows 0, 2 and 4
