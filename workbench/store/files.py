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
from pathlib import Path
from typing import Any

from workbench import schema


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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
