"""A run's status from its records in the store: ``run.json`` once the launcher recorded the
run's end, else what its ranks' own records say (the rule ``RunHandle.status`` follows too).

A rank record that says ``running`` from a process on this machine that no longer exists is a
rank that ended without reporting (killed, or unable to write its record: a full disk): the
run is then ``failed``, not waiting. Ranks on other hosts are taken at their word.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.store.files import read_rank_states

RankStates = Mapping[int, Mapping[str, Any]]
#: The statuses of a run whose end is not recorded yet.
LIVE = ("pending", "running")


def all_completed(states: RankStates, processes: int) -> bool:
    """Whether every expected rank reported ``completed``."""
    return len(states) == processes and all(s["status"] == "completed" for s in states.values())


def live_status(states: RankStates, processes: int) -> str:
    """The run's status while it is not finalized: failed (a rank failed or died), preempted
    (until the requeued attempt's ranks report running again), completed, running or pending."""
    statuses = {s["status"] for s in states.values()}
    if statuses & {"failed", "died"}:
        return "failed"
    if "preempted" in statuses:
        return "preempted"
    if all_completed(states, processes):
        return "completed"
    return "running" if states else "pending"


def process_exists(pid: int) -> bool:
    """Whether a process with this pid exists on this machine and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def on_this_host(state: Mapping[str, Any]) -> bool:
    """Whether a rank record was written by a process on this machine."""
    return state.get("host") == socket.gethostname()


def rank_alive(state: Mapping[str, Any]) -> bool:
    """Whether the rank of this record runs here and its process is alive."""
    pid = int(state.get("pid") or 0)
    return bool(pid) and on_this_host(state) and process_exists(pid)


def rank_gone(state: Mapping[str, Any]) -> bool:
    """Whether a rank that says ``running`` ran on this machine and its process is gone."""
    pid = int(state.get("pid") or 0)
    return (
        state.get("status") == "running"
        and bool(pid)
        and on_this_host(state)
        and not process_exists(pid)
    )


def stored_status(run_path: Path, run: Mapping[str, Any]) -> str | None:
    """The run's status as its records in the store tell it: ``run.json``'s once the run's end
    is recorded there (or a status other than pending/running), else its ranks' (a rank gone
    from this machine without reporting counts as ``died``)."""
    recorded = run.get("status")
    if run.get("ended_at") is not None or recorded not in LIVE:
        return recorded
    states = {
        rank: {**s, "status": "died"} if rank_gone(s) else s
        for rank, s in read_rank_states(run_path).items()
    }
    if not states:
        return recorded
    return live_status(states, _processes(run.get("config") or {}, len(states)))


def _processes(config: Mapping[str, Any], seen: int) -> int:
    """The rank processes a stored config starts (``RunConfig.processes``): one per device,
    DataParallel's single driver; ``seen`` where the config does not say."""
    if config.get("strategy") == "dp":
        return 1
    return int(config.get("world_size") or seen)
