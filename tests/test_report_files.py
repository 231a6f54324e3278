"""The report's files as others on a shared cluster find them: readable as the umask allows."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from workbench.store.files import current_umask
from workbench.ui.report import report_from_store

from .frames import scaling_sweep, write_run


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _store(root: Path) -> Path:
    runs, steps, evals = scaling_sweep()
    for run in runs.itertuples():
        write_run(
            root,
            "weak",
            run.run_id,
            steps[steps["run_id"] == run.run_id],
            evals[evals["run_id"] == run.run_id],
            world_size=run.world_size,
            per_device_batch_size=8,
        )
    return root / "weak"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_results_and_report_are_readable_by_group_and_others_under_umask_022(
    tmp_path: Path,
) -> None:
    with umask(0o022):
        assert current_umask() == 0o022
        sweep = _store(tmp_path)
        report = report_from_store(sweep, sweep / "report.html", summary_csv=sweep / "summary.csv")
    files = [report, sweep / "summary.csv", sweep / "ws1" / "run.json"]
    assert [oct(_mode(p)) for p in files] == [oct(0o644)] * 3  # rw-r--r--, as `touch` gives


def test_a_private_umask_keeps_them_private(tmp_path: Path) -> None:
    with umask(0o077):
        assert current_umask() == 0o077
        sweep = _store(tmp_path)
        report = report_from_store(sweep, sweep / "report.html", summary_csv=sweep / "summary.csv")
    files = [report, sweep / "summary.csv", sweep / "ws1" / "run.json"]
    assert [oct(_mode(p)) for p in files] == [oct(0o600)] * 3
