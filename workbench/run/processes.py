"""A run's processes on this machine, found through ``/proc``: alive or not, which belong to a
run, and ending them. Ranks on other hosts (a Slurm job's other nodes) are left to the scheduler.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from workbench import schema
from workbench.store.run_status import on_this_host, process_exists, rank_alive  # noqa: F401

_PROC = Path("/proc")
#: What a rank process's command line names: submitit (local and Slurm ranks) or the warm pool's
#: worker module.
RANK_COMMANDS = ("submitit", "workbench.rank.pool_worker")
#: In a run's logs folder: the pids of the pool workers given its ranks (``{"pids": [...]}``).
POOL_PIDS_FILE = "pool-pids.json"


#: True while a process with this pid exists here and is not a zombie (the store's rule, which
#: ``workbench ls`` uses too).
alive = process_exists


def command_line(pid: int) -> list[str]:
    """A process's arguments ([] when it is gone or unreadable)."""
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")


def _pool_pids(run_path: Path) -> list[int]:
    """Live pool workers given this run's ranks (recorded before they got their tasks)."""
    try:
        recorded = json.loads((run_path / schema.LOGS_DIR / POOL_PIDS_FILE).read_text())["pids"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [int(p) for p in recorded if alive(int(p)) and is_rank_process(int(p))]


def is_rank_process(pid: int) -> bool:
    """Whether the process ``pid`` runs a rank's command (a reused pid is not one of ours). An
    empty command line counts: a process that is exiting (killed, not yet a zombie) has already
    released its memory and with it its arguments, and must still be waited for."""
    args = command_line(pid)
    return not any(args) or any(marker in a for a in args for marker in RANK_COMMANDS)


def pids_of_run(run_path: Path) -> list[int]:
    """Live processes started for this run: submitit's controller and ranks name the run's logs
    folder on their command line (ranks still importing torch have recorded no pid yet); the
    pool's workers are listed in the logs folder."""
    marker = str(run_path / schema.LOGS_DIR)
    if not _PROC.is_dir():
        return []
    pids: list[int] = _pool_pids(run_path)
    for proc in _PROC.iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        args = command_line(int(proc.name))
        ours = any(a == marker or a.startswith(marker + os.sep) for a in args)
        if ours and alive(int(proc.name)):
            pids.append(int(proc.name))
    return pids


def send(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to each pid, ignoring those already gone."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def kill_run(run_path: Path, within_s: float = 10.0) -> None:
    """SIGKILL every process of the run, again until none is left (the controller may still be
    starting one) or ``within_s`` passed."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        pids = pids_of_run(run_path)
        if not pids:
            return
        send(pids)
        time.sleep(0.1)


def live_ranks(states: Mapping[int, Mapping[str, Any]]) -> list[int]:
    """Pids of the ranks of these records still alive here (submitit or pool processes only: a
    pid reused by something else is not theirs)."""
    return [
        int(s["pid"]) for s in states.values() if rank_alive(s) and is_rank_process(int(s["pid"]))
    ]


def kill_ranks(states: Mapping[int, Mapping[str, Any]]) -> None:
    """SIGKILL the ranks of these records still alive here."""
    send(live_ranks(states))
