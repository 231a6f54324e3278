"""Root-cause analysis and run status from hand-built rank records: no processes, no files."""

from __future__ import annotations

from typing import Any

from workbench.run.failure import (
    DIED_UNREPORTED,
    HUNG_TAIL_LINES,
    NEVER_STARTED,
    TAIL_LINES,
    all_completed,
    crashed_at_exit,
    exit_warnings,
    final_status,
    last_lines,
    live_status,
    root_cause,
)


def rank(status: str, **fields: Any) -> dict[str, Any]:
    return {"status": status, "host": "node-a", "pid": 1234, **fields}


PEER = "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4242"


def test_own_exception_beats_silent_death_beats_peer_errors() -> None:
    states = {
        0: rank("failed", exception=PEER, ended_at=1.0),
        1: rank("died"),
        2: rank("failed", exception="ValueError: bad batch", traceback="tb", ended_at=5.0),
    }
    cause = root_cause(states, 3)
    assert cause is not None and cause.rank == 2
    assert cause.exception == "ValueError: bad batch" and cause.traceback == "tb"
    del states[2]  # no rank's own exception: the silent death explains the peer's error
    cause = root_cause(states, 2)
    assert cause is not None and (cause.rank, cause.exception) == (1, DIED_UNREPORTED)
    del states[1]  # only the peer error is left: it is reported rather than nothing
    cause = root_cause(states, 1)
    assert cause is not None and cause.rank == 0 and "Connection closed by peer" in cause.exception


def test_ties_go_to_the_earliest_end_then_the_lowest_rank() -> None:
    states = {
        0: rank("failed", exception="InjectedFault: late", ended_at=9.0),
        1: rank("failed", exception="InjectedFault: early", ended_at=2.0),
        2: rank("failed", exception="InjectedFault: also early", ended_at=2.0),
    }
    cause = root_cause(states, 3)
    assert cause is not None and cause.rank == 1 and cause.exception == "InjectedFault: early"
    assert root_cause({r: rank("died") for r in (3, 1, 2)}, 4).rank == 0  # type: ignore[union-attr]


def test_missing_ranks_never_started() -> None:
    states = {0: rank("completed"), 2: rank("completed")}
    cause = root_cause(states, 4)
    assert cause is not None and (cause.rank, cause.exception) == (1, NEVER_STARTED)
    peer_only = {0: rank("failed", exception=PEER, ended_at=1.0)}
    assert root_cause(peer_only, 2).rank == 1  # type: ignore[union-attr]


def test_a_hung_rank_is_named_with_the_collective_timeout_and_a_longer_tail() -> None:
    states = {
        0: rank("failed", exception="DistBackendError: Timed out waiting", ended_at=3.0),
        1: rank("running"),
    }
    cause = root_cause(states, 2, hung={1}, collective_timeout_s=8)
    assert cause is not None and cause.rank == 1 and cause.hung
    assert (
        cause.exception.startswith("the rank hung") and "8 s collective timeout" in cause.exception
    )
    assert cause.tail_lines == HUNG_TAIL_LINES
    # Not known to hang (say, on another host): a running rank is one that ended unreported.
    plain = root_cause(states, 2)
    assert plain is not None and plain.exception == DIED_UNREPORTED
    assert plain.tail_lines == TAIL_LINES
    record = plain.record("/logs/1_1_log.err", "last words")
    assert record == {
        "rank": 1,
        "exception": DIED_UNREPORTED,
        "traceback": None,
        "log_path": "/logs/1_1_log.err",
        "log_tail": "last words",
    }


def test_a_silent_death_beats_the_peer_left_waiting_for_it() -> None:
    # Rank 1 SIGKILLed before the rendezvous: rank 0, alive and waiting there, is found hung
    # when the grace period ends, but it waits because rank 1 is gone.
    states = {0: rank("running"), 1: rank("died")}
    cause = root_cause(states, 2, hung={0}, collective_timeout_s=8)
    assert cause is not None and (cause.rank, cause.exception) == (1, DIED_UNREPORTED)
    # The same for a rank that never started at all.
    cause = root_cause({1: rank("running")}, 2, hung={1}, collective_timeout_s=8)
    assert cause is not None and (cause.rank, cause.exception) == (0, NEVER_STARTED)


def test_nothing_to_blame() -> None:
    assert root_cause({0: rank("completed"), 1: rank("completed")}, 2) is None
    assert root_cause({0: rank("preempted")}, 1) is None


def test_crash_at_exit_is_a_warning_on_a_completed_rank() -> None:
    assert crashed_at_exit(
        "done\nterminate called after throwing an instance of 'gloo::IoException'"
    )
    assert crashed_at_exit("Segmentation fault (core dumped)")
    assert not crashed_at_exit("all fine") and not crashed_at_exit(None) and not crashed_at_exit("")
    states = {0: rank("completed"), 1: rank("completed"), 2: rank("failed", exception="Aborted")}
    tails = {0: "ok", 1: "bye\nAborted", 2: "Aborted"}
    assert exit_warnings(states, tails) == [{"rank": 1, "log_tail": "bye\nAborted"}]
    assert exit_warnings(states, {}) == []


def test_status_from_the_records() -> None:
    done = {0: rank("completed"), 1: rank("completed")}
    assert all_completed(done, 2) and not all_completed(done, 3)
    assert live_status({}, 2) == "pending"
    assert live_status({0: rank("running")}, 2) == "running"
    assert live_status(done, 2) == "completed" and live_status(done, 3) == "running"
    assert live_status({**done, 2: rank("died")}, 3) == "failed"
    assert live_status({0: rank("preempted"), 1: rank("running")}, 2) == "preempted"
    assert final_status(done, 2) == "completed"
    assert final_status({0: rank("preempted"), 1: rank("completed")}, 2) == "preempted"
    assert final_status({0: rank("preempted"), 1: rank("died")}, 2) == "failed"
    assert final_status({0: rank("running")}, 2) == "failed"


def test_last_lines() -> None:
    assert last_lines("a\nb\nc\n", 2) == "b\nc"
    assert last_lines(None, 5) is None
