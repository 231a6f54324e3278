"""The result store on disk: ``<output_dir>/<sweep>/<run_id>/``, atomic writes, loading into pandas.

Every writer owns its files: the launcher writes ``config.json`` and ``run.json``; each rank writes
``ranks/rank-NNNNN.json`` and its own trace files. Writes go to a temporary file that is then
renamed, so a reader never sees half a file (no locks: flock does not hold on cluster file systems).
Results are JSON and Parquet, never pickle: opening a result never runs code.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import schema

if TYPE_CHECKING:
    import pandas as pd


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


# -- discovery and loading (pandas from here on)


def iter_run_dirs(
    output_dir: str | Path = "experiments/results", sweeps: Iterable[str] | None = None
) -> list[Path]:
    """Run folders in the store (those with a run.json), optionally limited to some sweeps."""
    root = Path(output_dir)
    if not root.exists():
        return []
    wanted = set(sweeps) if sweeps is not None else None
    dirs = []
    for run_json in sorted(root.glob(f"*/*/{schema.RUN_FILE}")):
        if wanted is None or run_json.parent.parent.name in wanted:
            dirs.append(run_json.parent)
    return dirs


def _flat_run_row(run_path: Path) -> dict[str, Any]:
    run = read_json(run_path / schema.RUN_FILE)
    config = run.get("config") or {}
    row: dict[str, Any] = {
        "run_id": run.get("run_id", run_path.name),
        "sweep": run.get("sweep", run_path.parent.name),
        "status": run.get("status"),
        "path": str(run_path),
        "submitted_at": run.get("submitted_at"),
        "ended_at": run.get("ended_at"),
        "failed_rank": (run.get("failure") or {}).get("rank"),
    }
    for key, value in config.items():
        if key in ("derived", "fault"):
            continue
        if isinstance(value, dict):
            for k, v in value.items():
                row[f"{key}.{k}"] = v
        else:
            row[key] = value
    for key, value in (run.get("summary") or {}).items():
        row[key] = value
    return row


def load_runs(
    output_dir: str | Path = "experiments/results", sweeps: Iterable[str] | None = None
) -> pd.DataFrame:
    """One row per run: id, sweep, status, every config field (dicts flattened as ``a.b``) and
    the summary figures."""
    import pandas as pd

    return pd.DataFrame([_flat_run_row(p) for p in iter_run_dirs(output_dir, sweeps)])


def _trace_paths(run_path: Path, kind: str) -> list[Path]:
    """Every rank's trace files: Parquet (consolidated, or earlier attempts of a resumed run)
    and JSONL (live rows)."""
    traces = run_path / schema.TRACES_DIR
    return sorted(traces.glob(f"{kind}-rank*.parquet")) + sorted(traces.glob(f"{kind}-rank*.jsonl"))


def _read_trace_file(path: Path, columns: dict[str, str]) -> pd.DataFrame | None:
    import pandas as pd

    try:
        if path.suffix == ".parquet":
            frame = pd.read_parquet(path)
        else:
            from .trace import read_jsonl

            frame = pd.DataFrame(list(read_jsonl(path)))
    except Exception as exc:  # a truncated or corrupt file must not hide the others
        warnings.warn(f"skipping unreadable trace file {path}: {exc}", stacklevel=3)
        return None
    for name in columns:
        if name not in frame.columns:
            frame[name] = None
    return frame


def load_traces(runs: str | Path | Iterable[str | Path], kind: str = "steps") -> pd.DataFrame:
    """All ranks' rows of one or more runs (run folders), as one DataFrame with the schema's
    columns in order. ``kind`` is ``"steps"`` or ``"eval"``."""
    import pandas as pd

    if kind not in ("steps", "eval"):
        raise ValueError(f"kind={kind!r}: must be 'steps' or 'eval'")
    columns = schema.STEP_COLUMNS if kind == "steps" else schema.EVAL_COLUMNS
    paths = [runs] if isinstance(runs, (str, Path)) else list(runs)
    frames = []
    for run_path in paths:
        for path in _trace_paths(Path(run_path), kind):
            frame = _read_trace_file(path, columns)
            if frame is not None and len(frame):
                frames.append(frame)
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})
    frame = pd.concat(frames, ignore_index=True)
    # A row can be in both files for the moment a rank consolidates its JSONL into Parquet.
    frame = frame.drop_duplicates(["run_id", "rank", "attempt", "step"], keep="first")
    return frame[list(columns)].sort_values(
        ["run_id", "rank", "step"], kind="stable", ignore_index=True
    )
