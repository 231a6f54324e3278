"""How many of the host's cores were busy during each test (``make test-profile``).

Set ``WORKBENCH_TEST_CORES=FILE`` and each test's wall time (setup, call and teardown) and the
host's busy CPU time over it, from ``/proc/stat``, are written to FILE as tab-separated lines
(wall seconds, busy cores on average, node id, then the cores the pytest process itself kept
busy). A slow test with few cores busy is waiting (Slurm's scheduler, a timeout, a planted
sleep); one whose busy cores are the pytest process's own launched nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

_TICKS = os.sysconf("SC_CLK_TCK")


def _busy_s() -> float:
    """CPU seconds the whole host has spent busy (all but idle and iowait) since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICKS


def _own_s() -> float:
    """CPU seconds this process has spent, its threads included."""
    times = os.times()
    return times.user + times.system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    target = os.environ.get("WORKBENCH_TEST_CORES")
    if not target:
        yield
        return
    wall, busy, own = time.monotonic(), _busy_s(), _own_s()
    yield
    wall, busy, own = time.monotonic() - wall, _busy_s() - busy, _own_s() - own
    wall = max(wall, 1e-9)
    with open(target, "a") as sink:
        sink.write(f"{wall:.2f}\t{busy / wall:.2f}\t{item.nodeid}\t{own / wall:.2f}\n")
