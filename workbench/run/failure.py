"""What the ranks' own records say about a run: its status, and the root cause when it failed.

Pure functions over rank records (the dicts of ``store.files.read_rank_states``, with ranks whose
process died unreported already marked ``died``), the set of hung ranks, the number of rank
processes expected, and log tails as strings: no processes, files or clocks, so each rule can be
tested with hand-built records.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

# The live rule is the store's, so that ``workbench ls`` and a handle say the same.
from workbench.store.run_status import all_completed as all_completed
from workbench.store.run_status import live_status as live_status

RankStates = Mapping[int, Mapping[str, Any]]

#: Errors a rank sees because of another rank (its peer died, hung or closed the connection).
PEER_ERRORS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
    "DistBackendError",
    "pair closure",
    "Timed out",
    "timed out",
    "Connection refused",
)
#: What a log shows when the interpreter crashed on its way out.
EXIT_CRASH_MARKERS = ("terminate called", "Segmentation fault", "core dumped", "Aborted")
#: Log lines kept in a failure record: more for a hung rank, whose stack dump is the evidence.
#: 24: a failing built-in rank's whole traceback, from the task's entry to the raise.
TAIL_LINES = 24
HUNG_TAIL_LINES = 40
#: Log lines searched for a crash at exit.
EXIT_TAIL_LINES = 5

NEVER_STARTED = "the rank never started"
DIED_UNREPORTED = "the rank's process ended without reporting (killed by a signal or exited)"


def _any(states: RankStates, *statuses: str) -> bool:
    """Whether any rank is in one of ``statuses``."""
    return any(s["status"] in statuses for s in states.values())


def final_status(states: RankStates, processes: int) -> str:
    """The status recorded when the job is over: completed, preempted (stopped cleanly and not
    requeued: ``resume=True`` continues it) or failed."""
    if all_completed(states, processes):
        return "completed"
    if _any(states, "preempted") and not _any(states, "failed", "died"):
        return "preempted"
    return "failed"


def hung_message(collective_timeout_s: float) -> str:
    """The exception recorded for a rank still running when its peers gave up on it."""
    return (
        "the rank hung: it was still running when its peers gave up waiting for it "
        f"({collective_timeout_s:g} s collective timeout); its stack is in the log"
    )


@dataclass(frozen=True)
class RootCause:
    """The rank whose failure explains the run's, and what it said."""

    rank: int
    exception: str | None
    traceback: str | None = None
    hung: bool = False
    #: The rank raised an exception of its own (not a peer's timeout or closed connection).
    own: bool = False

    @property
    def tail_lines(self) -> int:
        """How many log lines to keep with the failure."""
        return HUNG_TAIL_LINES if self.hung else TAIL_LINES

    def record(self, log_path: str | None, log_tail: str | None) -> dict[str, Any]:
        """The failure as ``run.json`` stores it."""
        return {
            "rank": self.rank,
            "exception": self.exception,
            "traceback": self.traceback,
            "log_path": log_path,
            "log_tail": log_tail,
        }


def _candidate(
    rank: int, state: Mapping[str, Any], hung: Collection[int], collective_timeout_s: float
) -> tuple[int, float, RootCause] | None:
    """(priority, ended_at, cause) for one rank, or None when it explains nothing: a rank's own
    exception (0) beats a silent death (1), which beats a hang (2: a rank alive and waiting
    while a peer is dead is waiting for that peer), which beats a peer's error (3)."""
    status = state["status"]
    if status == "failed":
        exception = state.get("exception") or ""
        peer = any(marker in exception for marker in PEER_ERRORS)
        cause = RootCause(rank, state.get("exception"), state.get("traceback"), own=not peer)
        return (3 if peer else 0, float(state.get("ended_at") or 0), cause)
    if rank in hung:
        message = hung_message(collective_timeout_s)
        return (2, 0.0, RootCause(rank, message, state.get("traceback"), hung=True))
    if status in ("died", "running"):
        return (1, 0.0, RootCause(rank, DIED_UNREPORTED, state.get("traceback")))
    return None


def root_cause(
    states: RankStates,
    processes: int,
    hung: Collection[int] = (),
    collective_timeout_s: float = 0.0,
) -> RootCause | None:
    """The root cause of a failed run: a rank's own exception beats a silent death (or a rank
    that never started), which beats a hang, which beats the 'connection closed' errors its
    peers see next; ties go to the earliest to end, then the lowest rank. None when no rank
    explains it."""
    candidates = []
    for rank, state in states.items():
        found = _candidate(rank, state, hung, collective_timeout_s)
        if found is not None:
            candidates.append(found)
    for rank in sorted(set(range(processes)) - set(states)):
        candidates.append((1, 0.0, RootCause(rank, NEVER_STARTED)))
    if not candidates:
        return None
    return min(candidates, key=lambda c: (c[0], c[1], c[2].rank))[2]


def last_lines(text: str | None, lines: int) -> str | None:
    """The last ``lines`` lines of ``text`` (None stays None)."""
    if text is None:
        return None
    return "\n".join(text.splitlines()[-lines:])


def crashed_at_exit(log_tail: str | None) -> bool:
    """Whether a log's last lines show the interpreter crashing on its way out."""
    return bool(log_tail) and any(m in log_tail for m in EXIT_CRASH_MARKERS)  # type: ignore[operator]


def exit_warnings(states: RankStates, log_tails: Mapping[int, str | None]) -> list[dict[str, Any]]:
    """Completed ranks whose log shows a crash at exit (seen with gloo about once in 75 runs):
    their results are complete, so the run stays completed, and the crash is recorded rather
    than hidden. ``log_tails``: each rank's last ``EXIT_TAIL_LINES`` log lines."""
    return [
        {"rank": rank, "log_tail": log_tails.get(rank)}
        for rank, s in states.items()
        if s["status"] == "completed" and crashed_at_exit(log_tails.get(rank))
    ]


def rank_measurements(states: RankStates) -> dict[str, Any]:
    """What the ranks' summaries say about how their communication was measured, for
    ``run.json``: ``comm_method`` per rank (``ddp_timer``, ``hook``, ``bytes_only``, ``off``,
    ``none``), ``measurement_warnings`` (each message once, with the ranks that gave it) and
    ``network`` (the allreduce micro-benchmark, the same on every rank: rank 0's),
    ``dropped_samples_per_epoch`` (training samples left out of every epoch to keep every batch
    full, summed over the ranks; None unless every rank said) and ``flops`` (one training step's
    FLOPs, counted on rank 0 before the measured window) and ``memory_parts`` (each rank's
    parameters, gradients and optimizer state, counted: :mod:`workbench.rank.memory_parts`),
    ``until_known`` (rank 0's: :mod:`workbench.rank.until_known`; None when not asked) and,
    for a script, ``strategy`` (what it ran, as its hooks saw it)."""
    summaries = {rank: s.get("summary") or {} for rank, s in sorted(states.items())}
    by_message: dict[str, list[int]] = {}
    for rank, summary in summaries.items():
        for message in summary.get("measurement_warnings") or ():
            by_message.setdefault(message, []).append(rank)
    dropped = [s.get("dropped_samples_per_epoch") for s in summaries.values()]
    return {
        "comm_method": {
            str(r): s["comm_method"] for r, s in summaries.items() if "comm_method" in s
        },
        "measurement_warnings": [{"message": m, "ranks": r} for m, r in by_message.items()],
        "network": summaries.get(0, {}).get("network"),
        "dropped_samples_per_epoch": sum(dropped) if dropped and None not in dropped else None,
        # FLOPs of one training step, counted on rank 0 only (workbench.rank.flops)
        "flops": summaries.get(0, {}).get("step_flops"),
        "memory_parts": {
            str(r): s["memory_parts"] for r, s in summaries.items() if s.get("memory_parts")
        },
        # measuring until known: the goal, what stopped the run, its step time's interval
        "until_known": summaries.get(0, {}).get("until_known"),
        # what a script ran (fsdp where its hooks saw FSDP2, else ddp); a built-in run: its config
        **({"strategy": summaries[0]["strategy"]} if "strategy" in summaries.get(0, {}) else {}),
    }


def disk_full_failure(
    failure: Mapping[str, Any] | None, mount: str, free: str, total: str, run_path: str
) -> dict[str, Any]:
    """The failure record of a run whose store's disk is full when its end is recorded: the
    full disk first (where, and what is free), then what the root-cause rank's record said (a
    rank that could not write its record or log ended "without reporting"); no log tail."""
    record = dict(failure or {"rank": None, "traceback": None, "log_path": None})
    # what a rank's log kept on a full disk is the writes that failed, torn where the log's last
    # block ran out: the full disk says it; the log's path stays
    record["log_tail"] = None
    said = record.get("exception")
    record["exception"] = (
        f"no space left on the disk mounted at {mount} ({free} free of {total}), which holds "
        f"the run's folder {run_path}: its ranks could not write their records, traces or logs"
        + (f"; the rank's record: {said}" if said else "")
    )
    return record
