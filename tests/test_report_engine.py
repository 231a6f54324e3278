"""The report from a store reads its step rows through the engine and says what the report from
frames says: with every ``load_traces`` of step rows made to fail, ``report_from_store`` still
writes the report, and its text and every number in it (the figures' arrays included) equal
the report written from ``load_traces`` frames, numbers to 1e-9 relative."""

from __future__ import annotations

import base64
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests.frames import ddp_steps, make_evals, write_run, write_scaling_sweep
from workbench.analysis.measured.rank_cells import scattered_cells
from workbench.analysis.measured.stored import StoredSteps
from workbench.analysis.run_digests import RULES
from workbench.analysis.stragglers import slow_ranks
from workbench.analysis.stragglers.slow_ranks import stragglers_in_store
from workbench.store.digests import serve
from workbench.store.load import iter_run_dirs, load_runs, load_traces
from workbench.ui.report import report_from_store, write_report


def _store(root: Path) -> Path:
    """A weak-scaling sweep with evaluations and a 4-rank run with a slow rank 1."""
    write_scaling_sweep(root, train_samples=640)
    slow = ddp_steps(world_size=4, slow_rank=1, slow_from=30).assign(run_id="slow")
    no_evals = make_evals("slow", world_size=4).iloc[:0]
    write_run(root, "weak", "slow", slow, no_evals, world_size=4, per_device_batch_size=8)
    return root / "weak"


def _numbers(page: str) -> tuple[str, list[np.ndarray], np.ndarray]:
    """The page without its time stamp, its numbers and plotly's binary arrays taken out: the
    text left, the arrays, and the decimal numbers."""
    page = re.sub(r"written [^<]*", "", page)
    arrays: list[np.ndarray] = []

    def array(m: re.Match[str]) -> str:
        raw = base64.b64decode(m.group(2).encode().decode("unicode_escape"))
        arrays.append(np.frombuffer(raw, dtype=np.dtype(m.group(1))).astype("float64"))
        return "#"

    page = re.sub(r'"dtype":"(\w+)","bdata":"([^"]*)"', array, page)
    numbers: list[float] = []

    def number(m: re.Match[str]) -> str:
        numbers.append(float(m.group(0)))
        return "N"

    page = re.sub(r"(?<![\w#.])-?\d+\.\d+(e-?\d+)?", number, page)
    return page, arrays, np.array(numbers)


def test_the_report_from_a_store_loads_no_step_row_and_says_what_frames_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = _store(tmp_path)
    dirs = iter_run_dirs(tmp_path, ["weak"])
    frames = write_report(
        load_runs(tmp_path, ["weak"]),
        load_traces(dirs),
        load_traces(dirs, "eval"),
        tmp_path / "frames.html",
        title="Scaling report: weak",
        found=stragglers_in_store(dirs),
    ).read_text()

    def no_step_rows(paths: Any, kind: str = "steps") -> pd.DataFrame:
        assert kind != "steps", "step rows loaded into pandas"
        return load_traces(paths, kind)

    patched = 0
    for name, module in list(sys.modules.items()):
        if name.startswith("workbench") and getattr(module, "load_traces", None) is load_traces:
            monkeypatch.setattr(module, "load_traces", no_step_rows)
            patched += 1
    assert patched  # the report's own module among them
    engine = report_from_store(sweep, tmp_path / "engine.html").read_text()
    assert "rank 1 of run slow is a straggler" in engine
    source = ", read from their digests (written once, when each run ended)"
    assert source in engine  # where the store's report read its figures: the only difference
    text, arrays, numbers = _numbers(engine.replace(source, ""))
    want_text, want_arrays, want_numbers = _numbers(frames)
    assert text == want_text
    assert len(arrays) == len(want_arrays) and len(numbers) == len(want_numbers)
    for got, want in zip(arrays, want_arrays, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, equal_nan=True)
    np.testing.assert_allclose(numbers, want_numbers, rtol=1e-9, equal_nan=True)


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("bins", [400, 7])
def test_values_binned_from_the_straggler_matrices_equal_the_engine_query(
    tmp_path: Path, bins: int, large: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report bins each run's step and compute time from the matrices its straggler pass
    built (one read; for a large run, the step time read last, alone); the engine's own binning
    query is the reference (7 bins: several steps a bin, a shorter last one)."""
    if large:
        monkeypatch.setattr(slow_ranks, "ONE_AT_A_TIME", 0)
    _store(tmp_path)
    dirs = iter_run_dirs(tmp_path, ["weak"])
    fresh_rows, kept_rows = serve.open_rows(dirs, RULES), serve.open_rows(dirs, RULES)
    with StoredSteps(fresh_rows) as fresh, StoredSteps(kept_rows) as kept:
        kept.heatmap_bins = bins
        stragglers_in_store(dirs, stored=kept)
        assert len(kept._binned) == len(fresh.run_ids)  # every run, one attempt each
        for run in fresh.run_ids:
            for value in ("step_s", "compute_s"):
                got, got_size = kept.binned(run, value, bins)
                want, size = fresh.binned(run, value, bins)
                assert got_size == size
                pd.testing.assert_frame_equal(
                    got.reset_index(drop=True), want.reset_index(drop=True), rtol=1e-9
                )


def test_rows_a_live_run_wrote_after_its_steps_were_read_are_left_out() -> None:
    """The straggler pass reads a run's steps and ranks first, then its rows: a live rank may
    have written another step (or a new rank its first) in between; such rows are left out,
    not scattered into another cell."""
    steps, ranks = np.array([3, 4, 5]), np.array([0, 1])
    batch = {
        "step": np.array([3, 4, 5, 6, 2, 4]),
        "rank": np.array([0, 1, 0, 0, 1, 2]),
        "data_s": np.array([1.0, 2.0, 3.0, 9.0, 9.0, 9.0]),
    }
    cells = scattered_cells(steps, ranks, [batch], pd.Series(2, index=steps), {})
    want = np.array([[1.0, np.nan], [np.nan, 2.0], [3.0, np.nan]])
    np.testing.assert_array_equal(cells.values["data_s"], want)
    assert cells.present.sum() == 3


def test_the_report_tells_its_progress_in_step_rows_stage_by_stage(tmp_path: Path) -> None:
    sweep = _store(tmp_path)
    told: list[tuple[str, float, int]] = []
    report_from_store(sweep, tmp_path / "r.html", progress=lambda *a: told.append(a))
    rows = len(load_traces(iter_run_dirs(tmp_path, ["weak"])))  # counted apart, every row
    assert {r for _, _, r in told} == {rows}, told
    stages = [s for s, _, _ in told]
    order = ["steps, per step", "per rank and stragglers", "figures and tables", "written"]
    assert [s for i, s in enumerate(stages) if i == 0 or stages[i - 1] != s] == order
    runs = len(load_runs(tmp_path, ["weak"]))
    ranking = "per rank and stragglers"
    assert stages.count(ranking) == 1 + runs, "once at the start, then once a run ranked"
    done = [d for _, d, _ in told]
    assert done[0] == 0.0 and done[-1] == 1.0 and done == sorted(done), done
    ranked = [d for s, d, _ in told if s == ranking]
    assert ranked[0] < ranked[-1] <= 0.85, "the straggler pass moves the bar within its share"


def test_workbench_report_shows_rows_per_second_and_time_left_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from workbench import cli
    from workbench.cli import progress

    sweep = _store(tmp_path)
    monkeypatch.setattr(progress, "REPORT_DELAY_S", 0.0)  # a small report: shown at once
    assert cli.main(["report", str(sweep), "-o", str(tmp_path / "r.html")]) == 0
    err = capsys.readouterr().err
    rows = len(load_traces(iter_run_dirs(tmp_path, ["weak"])))
    last = err.strip().splitlines()[-1]
    assert last.startswith("report: written: 100%"), err
    assert re.search(rf" {rows}/{rows} \[[\d:]+<00:00, [\d.]+k? rows/s\]$", last), last
    quiet = ["report", str(sweep), "-o", str(tmp_path / "q.html"), "--no-progress"]
    assert cli.main(quiet) == 0
    assert "report:" not in capsys.readouterr().err
