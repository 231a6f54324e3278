"""Small helpers for the tests."""

from __future__ import annotations

from pathlib import Path


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
