"""What a user's terminal shows when a ``workbench run`` of their script hangs: the
explanation first, then the log's path, and no traceback from the launcher's own controller
(submitit's local controller, cancelled when the hung rank is killed, used to print its
``KeyboardInterrupt``); no process of the run left behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT, wait_until_no_job_processes

pytestmark = [pytest.mark.slow, pytest.mark.waits]


def test_a_hung_script_run_says_what_happened_and_nothing_else(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "workbench.cli", "run", "--script", "tests/scripts/hangs.py",
            "--world-size", "2", "--collective-timeout-s", "5", "--output-dir", str(tmp_path),
            "--sweep", "t", "--no-progress", "--", "--fault", "data", "--rank", "1"]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
    lines = done.stderr.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("error: "))
    assert "rank 1: Rank 1 did not arrive at collective " in lines[first], said
    assert "in the data loading of step 8" in lines[first] and "hangs.py:" in lines[first]
    assert lines[first + 1].startswith("  log: ") and lines[first + 1].endswith("_1_log.err")
    (run,) = (tmp_path / "t").iterdir()
    wait_until_no_job_processes(run)
