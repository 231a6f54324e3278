"""The result store on disk: ``<output_dir>/<sweep>/<run_id>/``, atomic writes, run records.

Every writer owns its files: the launcher writes ``config.json`` and ``run.json``; each rank writes
``ranks/rank-NNNNN.json`` and its own trace files. Writes go to a temporary file that is then
renamed, so a reader never sees half a file (no locks: flock does not hold on cluster file systems).
Results are JSON and Parquet, never pickle: opening a result never runs code.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from workbench import schema

_UMASK_LOCK = threading.Lock()


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
    system can read results."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), 0o666 & ~current_umask())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
