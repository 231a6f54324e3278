"""Rendezvous ports (no torch import): a free one for a local run, picked by the launcher, and a
scheduler job's, picked by its rank 0 on its own node and published in the run folder."""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from pathlib import Path

_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LINUX_DEFAULT_EPHEMERAL = (32768, 60999)
_LOWEST = 20000
_handed_out: set[int] = set()
#: How long a port handed out on this host stays claimed: far longer than the seconds between
#: its pick and rank 0's bind, after which the bind itself keeps it from being picked again.
CLAIM_S = 600.0


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


def claims_dir() -> Path:
    """Where the ports handed out on this host are claimed: ``WORKBENCH_PORT_CLAIMS``, else a
    folder of this user's in the temporary directory."""
    given = os.environ.get("WORKBENCH_PORT_CLAIMS")
    if given:
        return Path(given)
    return Path(tempfile.gettempdir()) / f"workbench-ports-{os.getuid()}"


def _claim(port: int) -> bool:
    """Claim ``port`` for this process: False when another process on this host claimed it in
    the last :data:`CLAIM_S` seconds. A claim is a file created exclusively (one process wins
    it); an older one is taken over. Where no claim can be written, the port is not claimed."""
    folder = claims_dir()
    path = folder / str(port)
    for _ in range(2):
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return True
        except FileExistsError:
            try:
                if time.time() - path.stat().st_mtime < CLAIM_S:
                    return False
                path.unlink()  # an old claim: removed, then won by one process alone
            except FileNotFoundError:
                pass
        except OSError:
            return True
    return False


def free_port() -> int:
    """A TCP port that is free now, outside the ephemeral range, and handed out to no other
    process on this host in the last :data:`CLAIM_S` seconds (nor before by this one).

    Rank 0 binds the port seconds after it is picked (``import torch`` comes first). A port from
    the ephemeral range may meanwhile be taken by any outgoing connection (gloo opens many per
    process group), and another run's rank 0 may pick the same port in between (jobs started
    together on one node, each picking its own), so runs launched together would fail with
    EADDRINUSE."""
    pool = _outside_ephemeral()
    rng = random.SystemRandom()
    for _ in range(500):
        port = rng.choice(pool)
        if port not in _handed_out and port_free(port) and _claim(port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free TCP port found in {pool.start}-{pool.stop - 1}")


def rendezvous_file(run_dir: Path, job_id: str, attempt: int) -> Path:
    """Where a scheduler job's rank 0 publishes its rendezvous port: one file per job, attempt
    and Slurm restart (a requeue keeps the job id), so no rank ever reads a stale port."""
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    return Path(run_dir) / "rendezvous" / f"{job_id}.attempt{attempt}.restart{restart}.port"


def publish_port(path: Path) -> int:
    """Rank 0: a port free on this node (:func:`free_port`), written to ``path`` whole (written
    aside, then renamed) for the other ranks to read; returns it.

    A port every rank derives alike from the job id (submitit's way) is never checked: where any
    other process on the node holds it (another job's rank 0, a local run), the job fails with
    EADDRINUSE."""
    port = free_port()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    partial.write_text(f"{port}\n")
    partial.replace(path)
    return port


def published_port(path: Path, timeout_s: float, poll_s: float = 0.05) -> int:
    """The other ranks: the port rank 0 published at ``path``, waiting up to ``timeout_s`` for
    it (a shared file system may show a new file late)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return int(path.read_text())
        except (FileNotFoundError, ValueError):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"rank 0 did not publish the rendezvous port in {path} within {timeout_s:g} s"
                    " (did it start? is the run folder on a file system every node shares?)"
                ) from None
        time.sleep(poll_s)
