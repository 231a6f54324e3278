"""The result store on disk: ``<output_dir>/<sweep>/<run_id>/``, atomic writes, run records.

Every writer owns its files: the launcher writes ``config.json`` and ``run.json``; each rank writes
``ranks/rank-NNNNN.json`` and its own trace files. Writes go to a temporary file that is then
renamed, so a reader never sees half a file (no locks: flock does not hold on cluster file systems).
Results are JSON and Parquet, never pickle: opening a result never runs code.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from workbench import schema
from workbench.errors import StoreFullError

_UMASK_LOCK = threading.Lock()
#: The errors of a full disk (ENOSPC) or a full quota (EDQUOT).
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
#: In a run folder while its end is not recorded: space held back, released to record the end
#: (run.json) when the disk has filled (``reserve_space``, ``release_space``).
RESERVE_FILE = ".space-reserve"
#: How much it holds: a final run.json (a failure's log tail, the summary) is tens of KiB, and
#: its replacement is written beside the old one before the rename.
RESERVE_BYTES = 1 * 2**20


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (``/proc/self/status``,
    kernel 4.7+); elsewhere set and restored under a lock (``os.umask`` is the only other way to
    read it, and another thread creating a file in between would get the wrong mode)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed over it, so a reader never
    sees half a file. The file gets the mode a plain ``open`` would give it (0666 less the
    umask: 0644 under the usual 022), not mkstemp's 0600, so colleagues on a shared file
    system can read results. A full disk (or quota) raises :class:`StoreFullError` naming the
    file, the disk's mount point and its free space; no temporary file is left."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:  # no room for a folder or an inode
        if exc.errno in FULL_ERRNOS:
            raise store_full(exc.errno, path) from exc
        raise
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), 0o666 & ~current_umask())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            raise store_full(exc.errno, path) from exc
        raise


def mount_point(path: Path) -> Path:
    """The mount point of the file system holding ``path`` (or its nearest existing parent)."""
    probe = path.absolute()
    while not probe.exists():
        probe = probe.parent
    while not os.path.ismount(probe):
        probe = probe.parent
    return probe


def size_text(n: float) -> str:
    """A size for people: 0 B, 512 B, 4 KiB, 63.9 MiB, 1.2 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if n >= 100 or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def store_full(errno_: int, path: Path) -> StoreFullError:
    """The error for ``path`` not written on a full disk: its mount point and free space."""
    mount = mount_point(path)
    usage = shutil.disk_usage(mount)
    return StoreFullError(
        errno_, str(path), str(mount), size_text(usage.free), size_text(usage.total)
    )


def reserve_space(run_path: Path, size: int = RESERVE_BYTES) -> None:
    """Hold ``size`` bytes in the run folder, to be given back by ``release_space`` when the
    disk fills: the run's end can then still be recorded. Blocks allocated by
    ``posix_fallocate`` (0.1 ms); where a file system has none (ZFS), written bytes that do not
    compress (os.urandom: about 20 ms a MiB). Best effort: a disk already too full keeps none."""
    path = run_path / RESERVE_FILE
    try:
        with open(path, "wb") as f:
            try:
                os.posix_fallocate(f.fileno(), 0, size)
            except OSError as exc:
                if exc.errno in FULL_ERRNOS:
                    raise
                f.write(os.urandom(size))
    except OSError:
        path.unlink(missing_ok=True)


def release_space(run_path: Path) -> bool:
    """Give back the run's reserve; whether there was one."""
    try:
        (run_path / RESERVE_FILE).unlink()
    except FileNotFoundError:
        return False
    return True


def write_json(path: Path, data: Any) -> None:
    atomic_write_bytes(
        path, (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode()
    )


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def run_dir(output_dir: str | Path, sweep: str, run_id: str) -> Path:
    return Path(output_dir) / sweep / run_id


def rank_file(run_path: Path, rank: int) -> Path:
    return run_path / schema.RANKS_DIR / f"rank-{rank:05d}.json"


def read_rank_states(run_path: Path) -> dict[int, dict[str, Any]]:
    """Each rank's own status record (running / completed / failed), by rank."""
    out: dict[int, dict[str, Any]] = {}
    for path in sorted((run_path / schema.RANKS_DIR).glob("rank-*.json")):
        try:
            state = read_json(path)
        except (OSError, json.JSONDecodeError):
            continue
        out[int(state["rank"])] = state
    return out


def update_run(run_path: Path, **fields: Any) -> dict[str, Any]:
    """Merge fields into run.json (written only by the launcher side)."""
    path = run_path / schema.RUN_FILE
    data = read_json(path) if path.exists() else {}
    data.update(fields)
    write_json(path, data)
    return data
