"""Rendezvous ports for local runs and requeued attempts (no torch import)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LINUX_DEFAULT_EPHEMERAL = (32768, 60999)
_LOWEST = 20000
_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports of outgoing connections and ``bind(0)``."""
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return _LINUX_DEFAULT_EPHEMERAL
    return low, high


def port_free(port: int) -> bool:
    """Whether ``port`` can be bound on every interface now (as rank 0's TCPStore will)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _outside_ephemeral() -> range:
    """Ports no outgoing connection takes: below the ephemeral range (20000 up), else above it."""
    low, high = ephemeral_range()
    if low - _LOWEST >= 1000:
        return range(_LOWEST, low)
    if 65535 - high >= 1000:
        return range(high + 1, 65536)
    return range(1024, 65536)


def job_port(job_id: str) -> int:
    """The rendezvous port of a scheduler's job: every task derives the same one from the job id
    (as submitit does), but outside the ephemeral range. submitit's own pick (20000-60000)
    mostly falls inside it, where any outgoing connection on the node (gloo opens many) may
    hold it: two array tasks on one node then fail with EADDRINUSE."""
    pool = _outside_ephemeral()
    return pool[random.Random(job_id).randrange(len(pool))]


def free_port() -> int:
    """A TCP port that is free now, outside the ephemeral range, and not handed out before by
    this process.

    Rank 0 binds the port seconds after it is picked (``import torch`` comes first). A port from
    the ephemeral range may meanwhile be taken by any outgoing connection (gloo opens many per
    process group), so runs launched together would fail with EADDRINUSE."""
    pool = _outside_ephemeral()
    rng = random.SystemRandom()
    for _ in range(500):
        port = rng.choice(pool)
        if port not in _handed_out and port_free(port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free TCP port found in {pool.start}-{pool.stop - 1}")
