"""The explanation of a hang, rule by rule, on hand-built flight records whose answer is known:
which rank did not arrive where, which collectives the ranks issued at one point, and the stack
of the rank that is stuck with the user's frames first."""

from __future__ import annotations

from typing import Any

from workbench.run.hang_words import explain_hang, stack_frames, stack_words

T0 = 1_800_000_000.0


def _entry(seq: int, op: str, nbytes: int, step: int, phase: str, returned: bool) -> dict:
    return {
        "seq": seq,
        "op": op,
        "bytes": nbytes,
        "group": None,
        "step": step,
        "phase": phase,
        "issued_at": T0 + seq,
        "returned_at": T0 + seq + 0.001 if returned else None,
    }


def _record(step: int, phase: str, entries: list[dict], dump: Any = None) -> dict:
    return {"pid": 1, "step": step, "phase": phase, "since": T0, "collectives": entries,
            "dump": dump}  # fmt: skip


def _states(**status: str) -> dict[int, dict]:
    return {int(r[1:]): {"status": s} for r, s in status.items()}


def test_the_rank_that_did_not_arrive_is_named_with_where_it_was_and_who_waited() -> None:
    """Ranks 0, 2, 3 are inside collective 12 (a 1 KiB all_reduce issued at step 5); rank 1
    returned from 11 and sits in its data loading of step 5: it is the one missing. Rank 0
    ended (gave up) 20 s after issuing it; the others were still in it when the run was
    given up at T0 + 40."""
    routine = [_entry(11, "all_reduce", 1024, 4, "backward", True)]
    stuck = [*routine, _entry(12, "all_reduce", 1024, 5, "backward", False)]
    records = {r: _record(5, "backward", stuck) for r in (0, 2, 3)}
    records[1] = _record(5, "data loading", routine)
    states = _states(r0="failed", r1="running", r2="running", r3="running")
    states[0].update(exception="RuntimeError: Timed out waiting 20000ms", ended_at=T0 + 32)
    hang = explain_hang(records, states, 4, at=T0 + 40)
    assert hang is not None
    assert (hang.rank, hang.seq, hang.op, hang.nbytes) == (1, 12, "all_reduce", 1024)
    assert (hang.step, hang.phase, hang.kind) == (5, "data loading", "missing")
    assert hang.text.startswith(
        "Rank 1 did not arrive at collective 12 of the default group (all_reduce of 1 KiB): "
        "rank 0 (in the backward of step 5) waited 20.0 s, rank 2 (in the backward of step 5) "
        "waited 28.0 s, rank 3 (in the backward of step 5) waited 28.0 s in it. Rank 1 was in "
        "the data loading of step 5 (for 40.0 s), alive but hung"
    ), hang.text


def test_a_collective_torch_issued_in_cpp_comes_from_its_recorder_where_a_rank_gave_up() -> None:
    """DDP's bucket all-reduce is issued in C++: no Python entry. Rank 0 timed out in it; its
    dump holds PyTorch's recorder, whose last entry on the default group (seq 16) is it.
    Rank 1 died in its forward of step 10."""
    torch_entries = [
        {"seq": 15, "op": "all_reduce", "bytes": 26128, "pg": "0", "issued_at": T0, "p2p": False},
        {"seq": 16, "op": "all_reduce", "bytes": 26128, "pg": "0", "issued_at": T0 + 1,
         "p2p": False},
    ]  # fmt: skip
    records = {
        0: _record(10, "backward", [], {"step": 10, "torch_recorder": torch_entries}),
        1: _record(10, "forward", []),
    }
    states = _states(r0="failed", r1="died")
    states[0].update(exception="RuntimeError: Connection closed by peer", ended_at=T0 + 3)
    hang = explain_hang(records, states, 2, at=T0 + 9)
    assert hang is not None and (hang.rank, hang.seq, hang.op) == (1, 16, "all_reduce")
    assert (hang.step, hang.phase) == (10, "forward")
    assert "rank 0 (in the backward of step 10) waited 2.0 s in it" in hang.text
    assert "then the rank's process ended without reporting" in hang.text


def test_without_torchs_recorder_the_groups_count_names_a_collective_issued_in_cpp() -> None:
    """The same hang with PyTorch's recorder off: rank 0's dump holds its default group's
    count (16) when it gave up in its backward, where what torch issues in C++ is DDP's
    gradient all-reduce; it waited from its backward's start (T0 + 1) to its end (T0 + 3)."""
    records = {
        0: _record(10, "backward", [], {"step": 10, "seq": 16}) | {"since": T0 + 1},
        1: _record(10, "forward", []),
    }
    states = _states(r0="failed", r1="died")
    states[0].update(exception="RuntimeError: Connection closed by peer", ended_at=T0 + 3)
    hang = explain_hang(records, states, 2)
    assert hang is not None and (hang.rank, hang.seq, hang.op, hang.nbytes) == (
        1,
        16,
        "all_reduce",
        0,
    )
    assert (
        "(all_reduce of DDP's gradients, issued in C++): rank 0 (in the backward of step 10) "
        "waited 2.0 s in it" in hang.text
    ), hang.text


def test_a_rank_failing_on_its_own_is_no_waiter_and_a_clean_record_no_hang() -> None:
    """A rank whose exception is its own was in no collective; ranks whose collectives all
    returned are in none: nothing to explain."""
    done = [_entry(3, "barrier", 0, 0, "starting", True)]
    torch_entries = [{"seq": 9, "op": "all_reduce", "bytes": 8, "pg": "0", "issued_at": T0,
                      "p2p": False}]  # fmt: skip
    records = {0: _record(4, "forward", done, {"step": 4, "torch_recorder": torch_entries}),
               1: _record(4, "forward", done)}  # fmt: skip
    states = _states(r0="failed", r1="running")
    states[0]["exception"] = "ValueError: bad batch"
    assert explain_hang(records, states, 2) is None
    assert (
        explain_hang({0: records[1], 1: records[1]}, _states(r0="completed", r1="completed"), 2)
        is None
    )


def test_different_collectives_at_one_point_name_the_few_against_the_many() -> None:
    """Four ranks at collective 21: three gather 16 B, rank 2 all-reduces 4 B."""
    records = {
        r: _record(8, "between steps", [_entry(21, "all_gather_into_tensor", 16, 8,
                                               "between steps", False)])
        for r in (0, 1, 3)
    }  # fmt: skip
    records[2] = _record(
        8, "between steps", [_entry(21, "all_reduce", 4, 8, "between steps", False)]
    )
    hang = explain_hang(records, _states(r0="running", r1="running", r2="died", r3="running"), 4)
    assert hang is not None and (hang.rank, hang.kind, hang.op, hang.seq) == (
        2,
        "mismatch",
        "all_reduce",
        21,
    )
    assert "rank 2: all_reduce of 4 B between steps 8 and 9" in hang.text


def test_between_two_ranks_the_collective_not_issued_before_is_the_odd_one() -> None:
    """Two ranks, one each: rank 0's gather is what both issued every step before (its
    history), rank 1's all-reduce is new; then a rank that has left its training is the odd
    one whatever it issued."""
    gathers = [
        _entry(s, "all_gather_into_tensor", 8, s - 10, "between steps", True) for s in (18, 20)
    ]
    records = {
        0: _record(8, "between steps", [*gathers, _entry(21, "all_gather_into_tensor", 8, 8,
                                                         "between steps", False)]),
        1: _record(8, "between steps", [*gathers, _entry(21, "all_reduce", 4, 8, "between steps",
                                                         False)]),
    }  # fmt: skip
    hang = explain_hang(records, _states(r0="running", r1="running"), 2)
    assert hang is not None and (hang.rank, hang.op) == (1, "all_reduce")
    records[1] = _record(
        8,
        "after training",
        [*gathers, _entry(21, "all_gather_into_tensor", 8, 8, "after training", False)],
    )
    records[0] = _record(9, "backward", [*gathers, _entry(21, "all_reduce", 4, 9, "backward",
                                                          False)])  # fmt: skip
    hang = explain_hang(records, _states(r0="running", r1="running"), 2)
    assert hang is not None and hang.rank == 1 and "had left its training" in hang.text
    assert "rank 1: all_gather_into_tensor of 8 B after its training (its last step 8)" in hang.text


FAULTHANDLER = """some output
Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
Current thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/selectors.py", line 415 in select
  File "/home/me/project/data.py", line 31 in read_shard
  File "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 725 in __next__
  File "/home/me/project/train.py", line 74 in main
  File "/venv/lib/python3.11/site-packages/workbench/rank/script.py", line 128 in run_main
  File "<frozen runpy>", line 88 in _run_code
"""


def test_the_stuck_threads_stack_reads_with_the_users_frames_first() -> None:
    """The dump of the current thread (the other thread's is left), most recent call first;
    the user's frames (data.py, then train.py) before the others, the stuck one on top."""
    frames = stack_frames(FAULTHANDLER)
    assert [f[2] for f in frames] == ["select", "read_shard", "__next__", "main", "run_main",
                                      "_run_code"]  # fmt: skip
    words = stack_words(FAULTHANDLER)
    assert words.startswith("data.py:31 in read_shard < train.py:74 in main < "), words
    assert "selectors.py:415 in select" in words and stack_words("no dump here") == ""
