"""Small helpers for the tests."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: The executor of the tests whose claim is not about how ranks start (the local back end, a
#: cold start, Slurm): forks of the warm pool's template, so a run pays no imports per rank.
#: ``test_pool.py`` holds that a pool run equals a local run bit for bit.
WARM = "pool"
ROOT = Path(__file__).resolve().parent.parent


def start_cli(*args: str) -> subprocess.Popen[str]:
    """``workbench ARGS`` started as a user would, from the repository's root, its output
    captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def job_processes(run_path: Path) -> list[int]:
    """PIDs of live processes whose command line or environment names this run's submitit folder."""
    marker = str(run_path / "logs").encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            continue
        if marker in cmdline:
            pids.append(int(proc.name))
    return pids


def wait_for(condition: Callable[[], T], timeout_s: float, what: str, poll_s: float = 0.2) -> T:
    """Poll ``condition`` until it returns something true (and return that), or fail after
    ``timeout_s`` saying ``what`` was awaited and what the condition last returned. The one way
    tests wait on processes, files and status: never a fixed sleep before an assertion."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = condition()
        if seen:
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what}; last seen: {seen!r}")
        time.sleep(poll_s)


def wait_until_no_job_processes(run_path: Path, timeout_s: float = 30) -> None:
    """Wait until no process of the run is alive; fail naming the pids still there."""
    left: list[int] = []

    def gone() -> bool:
        left[:] = job_processes(run_path)
        return not left

    try:
        wait_for(gone, timeout_s, f"every process of {run_path.name} to end")
    except AssertionError:
        raise AssertionError(
            f"processes of {run_path.name} alive after {timeout_s:g} s: {left}"
        ) from None


def stays(condition: Callable[[], T], duration_s: float, what: str, poll_s: float = 0.2) -> T:
    """Poll ``condition`` for ``duration_s`` and fail the moment it stops holding, saying ``what``
    should have held and what was seen: for claims that something does *not* happen (no file
    appears, nothing restarts), which no single look can show."""
    deadline = time.monotonic() + duration_s
    while True:
        seen = condition()
        if not seen:
            raise AssertionError(f"{what} stopped holding; seen: {seen!r}")
        if time.monotonic() > deadline:
            return seen
        time.sleep(poll_s)
