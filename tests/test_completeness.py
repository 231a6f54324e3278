"""A run missing some rank's step rows is marked incomplete, never reported with a partial
throughput; worked answers on hand-built frames."""

from __future__ import annotations

import math
import shutil

import pandas as pd
import pytest

from workbench.analysis import run_table, scaling_table
from workbench.analysis.throughput.completeness import incomplete_traces

from .frames import make_runs, make_steps, scaling_sweep


def _drop_rank(steps: pd.DataFrame, run_id: str, rank: int) -> pd.DataFrame:
    return steps[~((steps["run_id"] == run_id) & (steps["rank"] == rank))]


def test_a_missing_rank_is_named_with_its_file_and_blanks_the_throughput() -> None:
    runs, steps, evals = scaling_sweep()
    # ws4's rank 2 file was lost: with the other three ranks the window would say
    # 8 samples * 3 ranks / 1.6 s = 15 samples/s instead of the run's 20.
    partial = _drop_rank(steps, "ws4", 2)

    notes = incomplete_traces(runs, partial)
    assert notes.to_dict() == {
        "ws4": "attempt 0: rank 2 (traces/steps-rank00002.*) has no readable rows"
    }

    per_run = run_table(runs, partial, evals).set_index("run_id")
    assert math.isnan(per_run.loc["ws4", "samples_per_s"])
    assert math.isnan(per_run.loc["ws4", "samples_per_s_per_device"])
    assert per_run.loc["ws4", "world_size"] == 4, "kept at its own world size, not 3"
    assert per_run.loc["ws2", "samples_per_s"] == 12.8 and per_run.loc["ws2", "incomplete"] == ""

    table = scaling_table(runs, partial, evals).set_index("world_size")
    assert table.loc[4, "incomplete"] == (
        "ws4: attempt 0: rank 2 (traces/steps-rank00002.*) has no readable rows"
    )
    assert math.isnan(table.loc[4, "samples_per_s"]) and math.isnan(table.loc[4, "speedup"])
    assert table.loc[2, "speedup"] == 1.6 and table.loc[2, "incomplete"] == ""


def test_running_runs_data_parallel_and_every_attempt() -> None:
    steps = pd.concat(
        [
            make_steps("live", world_size=2).pipe(_drop_rank, "live", 1),  # not flushed yet
            make_steps("dp", world_size=2).pipe(_drop_rank, "dp", 1),  # one process traces
            make_steps("resumed", world_size=2, attempt=0),
            # attempt 1 lost rank 0; attempt 0 is whole
            make_steps("resumed", world_size=2, attempt=1).pipe(_drop_rank, "resumed", 0),
        ],
        ignore_index=True,
    )
    runs = make_runs(
        [
            {"run_id": "live", "world_size": 2, "status": "running"},
            {"run_id": "dp", "world_size": 2, "strategy": "dp"},
            {"run_id": "resumed", "world_size": 2},
        ]
    )
    assert incomplete_traces(runs, steps).to_dict() == {
        "resumed": "attempt 1: rank 0 (traces/steps-rank00000.*) has no readable rows"
    }


def test_the_report_and_the_dashboard_table_say_which_run_is_incomplete(tmp_path) -> None:
    from workbench.ui.report import write_report
    from workbench.ui.tables import scaling_table_html

    runs, steps, evals = scaling_sweep()
    partial = _drop_rank(steps, "ws4", 2)
    note = "ws4: attempt 0: rank 2 (traces/steps-rank00002.*) has no readable rows"
    page = write_report(runs, partial, evals, tmp_path / "report.html").read_text()
    assert "Incomplete runs" in page and note in page
    whole = write_report(runs, steps, evals, tmp_path / "whole.html").read_text()
    assert "Incomplete runs" not in whole
    table = scaling_table(runs, partial, evals)
    shown = scaling_table_html(table, [])
    assert note in shown and "<th>incomplete</th>" in shown
    assert "<th>incomplete</th>" not in scaling_table_html(scaling_table(runs, steps, evals), [])


def test_the_run_summary_leaves_out_the_throughput_of_an_incomplete_run() -> None:
    from workbench.analysis.throughput.summary import run_summary

    steps = make_steps("r", world_size=2)  # 8 measured steps of 1 s, 8 samples per rank
    whole = run_summary(steps, pd.DataFrame(), writers=2)
    assert whole["samples_per_s"] == 16.0 and "incomplete" not in whole
    partial = run_summary(_drop_rank(steps, "r", 1), pd.DataFrame(), writers=2)
    assert partial["samples_per_s"] is None and partial["samples_per_s_per_device"] is None
    assert partial["incomplete"] == (
        "attempt 0: rank 1 (traces/steps-rank00001.*) has no readable rows"
    )


@pytest.mark.slow
def test_a_real_run_with_a_corrupt_rank_file_is_reported_incomplete(ddp2, tmp_path) -> None:
    """A copy of a real 2-rank run whose rank 1 Parquet file is cut short: the store skips it
    with a warning, and the report names the rank and file instead of a halved throughput."""
    from workbench.store.load import load_runs, load_traces
    from workbench.ui.report import report_from_store

    copy = tmp_path / "it" / ddp2.path.name
    shutil.copytree(ddp2.path, copy)
    rank1 = copy / "traces" / "steps-rank00001.parquet"
    rank1.write_bytes(rank1.read_bytes()[:100])
    with pytest.warns(UserWarning, match="steps-rank00001.parquet"):
        steps = load_traces(copy, "steps")
    assert sorted(steps["rank"].unique()) == [0]
    runs = load_runs(tmp_path, ["it"])
    per_run = run_table(runs, steps)
    assert per_run["incomplete"].tolist() == [
        "attempt 0: rank 1 (traces/steps-rank00001.*) has no readable rows"
    ]
    assert per_run["samples_per_s"].isna().all()
    with pytest.warns(UserWarning):
        page = report_from_store(copy.parent, tmp_path / "r.html").read_text()
    assert "Incomplete runs" in page and "steps-rank00001" in page
