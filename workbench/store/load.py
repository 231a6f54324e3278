"""Loading the store into pandas: run folders, one row per run, and every rank's trace rows.

Reads Parquet (consolidated traces), Arrow streams (live rows) and JSONL (live rows of runs from
before the Arrow stream) alike, without torch: a dashboard kernel opens a live or failed run's
traces on a laptop with no GPU stack.
"""

from __future__ import annotations

import shlex
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench import schema
from workbench.config.choices import COMM_HOOKS
from workbench.store.arrow_stream import read_stream
from workbench.store.files import read_json
from workbench.store.jsonl import read_jsonl
from workbench.store.run_status import stored_status
from workbench.store.trace_files import ROW_KEYS

if TYPE_CHECKING:
    import pandas as pd


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


#: The longest failure a runs table shows (the whole is in run.json and the report).
FAILURE_CHARS = 90


def _failure_words(failure: dict[str, Any] | None) -> str | None:
    """A failed run's failure in a few words: a hang's summary, else its rank and the first
    line of its exception, cut to :data:`FAILURE_CHARS`."""
    if not failure:
        return None
    summary = (failure.get("hang") or {}).get("summary")
    if summary is None:
        first = str(failure.get("exception") or "").strip().splitlines()[:1]
        summary = f"rank {failure.get('rank')}: {first[0] if first else 'unknown'}"
    return summary if len(summary) <= FAILURE_CHARS else summary[: FAILURE_CHARS - 3] + "..."


def _flat_run_row(run_path: Path) -> dict[str, Any]:
    run = read_json(run_path / schema.RUN_FILE)
    config = run.get("config") or {}
    row: dict[str, Any] = {
        "run_id": run.get("run_id", run_path.name),
        "sweep": run.get("sweep", run_path.parent.name),
        # the recorded status; until the run's end is recorded, its ranks' (store.run_status)
        "status": stored_status(run_path, run),
        "path": str(run_path),
        "submitted_at": run.get("submitted_at"),
        "ended_at": run.get("ended_at"),
        "device_s": run.get("device_s"),  # devices x the time they were the run's
        "failed_rank": (run.get("failure") or {}).get("rank"),
        "failure": _failure_words(run.get("failure")),
    }
    for key, value in config.items():
        if key == "fault":
            continue
        # ``derived`` stays (a list): which batch the config gave tells a run's scaling family
        if isinstance(value, dict):
            for k, v in value.items():
                row[f"{key}.{k}"] = v
        elif key == "script_args":  # one hashable value, as a shell would write the arguments
            row[key] = shlex.join(value or ())
        else:
            row[key] = value
    if run.get("strategy"):  # a script's, as traced: not its config's default
        row["strategy"] = run["strategy"]
    for key, value in (run.get("summary") or {}).items():
        row[key] = value
    row.update(_measurement_columns(run))
    return row


#: The parts of a rank's memory ``run.json`` keeps per rank, bytes.
MEMORY_PARTS = (
    "param_bytes",
    "grad_bytes",
    "optimizer_bytes",
    "total_bytes",
    "gathered_param_bytes",
    "activation_bytes",  # saved for backward in a micro-batch of activation_samples samples
    "activation_samples",
)


def _measurement_columns(run: dict[str, Any]) -> dict[str, Any]:
    """How the run's communication was measured (``comm_method``: one value, or the ranks'
    values joined by commas), what it could not measure (``measurement_warnings``, the messages
    joined; None if none) and the allreduce micro-benchmark (``network_*``: null when the run
    had one rank or ``network_benchmark`` off; ``network_hook_<hook>_s``: each comm hook's
    seconds a step on the run's buckets, null where not timed) and the largest rank's memory
    in its parts (``memory_<part>_max``, bytes; null where not counted)."""
    network = run.get("network") or {}
    methods = sorted(set((run.get("comm_method") or {}).values()))
    said = [w.get("message", "") for w in run.get("measurement_warnings") or ()]
    out: dict[str, Any] = {
        "comm_method": ",".join(methods) or None,
        "measurement_warnings": "; ".join(said) or None,
    }
    for key in ("bytes", "time_s", "algbw_bytes_per_s", "busbw_bytes_per_s", "latency_s"):
        out[f"network_{key}"] = network.get(key)
    out["network_buckets"] = len(network.get("bucket_sizes_bytes") or ()) or None
    hooks = (network.get("hooks") or {}).get("time_s") or {}
    for hook in COMM_HOOKS:  # what each comm hook took on the run's buckets, seconds a step
        out[f"network_hook_{hook}_s"] = hooks.get(hook)
    out.update(_flops_columns(run))
    parts = list((run.get("memory_parts") or {}).values())
    for part in MEMORY_PARTS:  # counted per rank (workbench.rank.memory_parts): the largest
        values = [p[part] for p in parts if p.get(part) is not None]
        out[f"memory_{part}_max"] = max(values) if values else None
    return out


def _flops_columns(run: dict[str, Any]) -> dict[str, Any]:
    """What MFU needs from ``run.json``: the device the ranks ran on (``device_name``: its CUDA
    name, ``cpu``, or the ranks' names joined when they differ), one training step's FLOPs
    (``flops_per_step``, ``flops_per_sample``), the float32 matmul precision and cuDNN's TF32
    switch it ran with, the convolutions' share of the FLOPs and,
    when counting failed, ``flops_error``; null for runs from before the count."""
    devices = run.get("devices") or {}
    names = sorted({f.get("name") or f.get("device", "") for f in devices.values()} - {""})
    flops = run.get("flops") or {}
    return {
        "device_name": ", ".join(names) or None,
        "flops_per_step": flops.get("flops_per_step"),
        "flops_per_sample": flops.get("flops_per_sample"),
        "flops_matmul_precision": flops.get("matmul_precision"),
        "flops_cudnn_allow_tf32": flops.get("cudnn_allow_tf32"),
        "flops_conv_share": flops.get("conv_flops_share"),
        "flops_error": flops.get("error"),
    }


def load_runs(
    output_dir: str | Path = "experiments/results", sweeps: Iterable[str] | None = None
) -> pd.DataFrame:
    """One row per run: id, sweep, status (``run.json``'s; a run whose end is not recorded
    there yet: its ranks', see ``store.run_status``), every config field (dicts flattened as
    ``a.b``; the fault plan left out; ``derived``, the fields the config filled in, as a list),
    the summary figures, and how communication was measured (see ``_measurement_columns``)."""
    import pandas as pd

    return pd.DataFrame([_flat_run_row(p) for p in iter_run_dirs(output_dir, sweeps)])


def _trace_paths(run_path: Path, kind: str) -> list[Path]:
    """Every rank's trace files: Parquet (consolidated, or earlier attempts of a resumed run),
    then the live rows (Arrow streams; JSONL in runs written before them)."""
    traces = run_path / schema.TRACES_DIR
    suffixes = (schema.FINAL_SUFFIX, schema.LIVE_SUFFIX, schema.LEGACY_LIVE_SUFFIX)
    return [p for suffix in suffixes for p in sorted(traces.glob(f"{kind}-rank*.{suffix}"))]


def _read_trace_file(path: Path, columns: dict[str, str]) -> pd.DataFrame | None:
    import pandas as pd

    try:
        if path.suffix == f".{schema.FINAL_SUFFIX}":
            frame = pd.read_parquet(path)
        elif path.suffix == f".{schema.LIVE_SUFFIX}":
            table = read_stream(path)  # complete batches only: a torn last one is left out
            frame = table.to_pandas() if table is not None else pd.DataFrame()
        else:
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
    # A row can be in two files for the moment a rank consolidates its live file into Parquet.
    frame = frame.drop_duplicates(ROW_KEYS, keep="first")
    return frame[list(columns)].sort_values(
        ["run_id", "rank", "step"], kind="stable", ignore_index=True
    )


def parameter_layouts(run_dirs: Iterable[str | Path]) -> dict[str, Any]:
    """Run id -> the parameters' layout its first rank recorded (``run.json``'s
    ``memory_parts``: what a strategy comparison works each rank's memory out from); runs that
    recorded none are left out."""
    out = {}
    for run_dir in run_dirs:
        record = read_json(Path(run_dir) / schema.RUN_FILE)
        parts = record.get("memory_parts") or {}
        layout = next((p.get("layout") for p in parts.values() if p and p.get("layout")), None)
        if layout:
            out[str(record.get("run_id", Path(run_dir).name))] = layout
    return out
