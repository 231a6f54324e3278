"""A rank's flight record: what it stores is read back as stored, its ring keeps the last
collectives in order, and a process killed with SIGKILL leaves it readable up to its last
store (the page cache keeps a shared mapping's writes; no flush is needed)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workbench.store.flight_file import (
    BACKWARD,
    DATA,
    OPS,
    RING,
    FlightFile,
    flight_path,
    read_flight,
)


def test_what_a_rank_stores_is_read_back_and_the_ring_keeps_the_last(tmp_path: Path) -> None:
    path = flight_path(tmp_path, 3)
    assert read_flight(path) is None, "no record before the rank writes one"
    f = FlightFile(path)
    group = f.group_index([0, 1, 2, 3])
    for k in range(1, RING + 11):  # ten more than the ring holds
        f.at(k, BACKWARD)
        slot = f.issued(seq=100 + k, op=OPS.index("all_reduce"), nbytes=4 * k, group=group)
        if k < RING + 10:
            f.returned(slot)
    f.at(RING + 11, DATA)
    record = read_flight(path)
    assert record is not None
    assert (record["step"], record["phase"]) == (RING + 11, "data loading")
    seqs = [e["seq"] for e in record["collectives"]]
    assert seqs == list(range(100 + 11, 100 + RING + 11)), "the last RING, oldest first"
    last = record["collectives"][-1]
    assert last == {**last, "op": "all_reduce", "bytes": 4 * (RING + 10), "group": [0, 1, 2, 3],
                    "step": RING + 10, "phase": "backward", "returned_at": None}  # fmt: skip
    assert all(e["returned_at"] for e in record["collectives"][:-1])
    f.close()


@pytest.mark.slow
def test_a_process_killed_with_sigkill_leaves_its_record(tmp_path: Path) -> None:
    path = flight_path(tmp_path, 0)
    code = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from workbench.store.flight_file import FlightFile, FORWARD
        f = FlightFile(Path({str(path)!r}))
        f.at(20, FORWARD)
        f.issued(seq=7, op=0, nbytes=64, group=f.group_index([0, 1]))
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    record = read_flight(path)
    assert record is not None and (record["step"], record["phase"]) == (20, "forward")
    assert [(e["seq"], e["bytes"], e["returned_at"]) for e in record["collectives"]] == [
        (7, 64, None)
    ]
