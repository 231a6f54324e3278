"""Shared helpers of the benchmarks: paired-ratio statistics, machine facts, result files.

Every figure the benchmarks report is a ratio against a baseline measured in the same run, from
interleaved pairs, summarised by the median of the pairwise ratios and its spread: the machine is
shared and noisy, so a ratio of two medians taken minutes apart would mostly measure the load.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: Where ``workbench`` is imported from: this checkout, or another one named by
#: ``WORKBENCH_BENCH_TREE`` (a benchmark interleaving the code before a change against it).
IMPORT_ROOT = Path(os.environ.get("WORKBENCH_BENCH_TREE") or ROOT)
if str(IMPORT_ROOT) not in sys.path:  # runnable as `python benchmarks/x.py` without installing
    sys.path.insert(0, str(IMPORT_ROOT))


def ratio_stats(ratios: list[float] | np.ndarray, seed: int = 0) -> dict[str, float]:
    """Median of pairwise ratios, IQR, 5-95 % range and a bootstrap 95 % confidence interval of
    the median (whether a 1 % difference is resolvable is read off the CI, not the IQR)."""
    r = np.asarray(ratios, dtype=float)
    if r.size == 0:
        return {"n": 0}
    rng = np.random.default_rng(seed)
    boot = np.median(rng.choice(r, size=(2000, r.size), replace=True), axis=1)
    return {
        "n": int(r.size),
        "median": float(np.median(r)),
        "p25": float(np.percentile(r, 25)),
        "p75": float(np.percentile(r, 75)),
        "p5": float(np.percentile(r, 5)),
        "p95": float(np.percentile(r, 95)),
        "ci95_lo": float(np.percentile(boot, 2.5)),
        "ci95_hi": float(np.percentile(boot, 97.5)),
    }


def mean_stats(values: list[float] | np.ndarray, seed: int = 0) -> dict[str, float]:
    """Mean with a bootstrap 95 % confidence interval of the mean (where rare costs, such as a
    flush every few seconds, must count at their weight, which the median leaves out)."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return {"n": 0}
    rng = np.random.default_rng(seed)
    boot = rng.choice(v, size=(2000, v.size), replace=True).mean(axis=1)
    return {
        "n": int(v.size),
        "mean": float(v.mean()),
        "ci95_lo": float(np.percentile(boot, 2.5)),
        "ci95_hi": float(np.percentile(boot, 97.5)),
    }


def fmt_ratio(s: dict[str, float], digits: int = 3) -> str:
    """``1.004 [IQR 0.998-1.010, CI 1.001-1.007, n=40]``."""
    if not s.get("n"):
        return "n/a"
    d = digits
    return (
        f"{s['median']:.{d}f} [IQR {s['p25']:.{d}f}-{s['p75']:.{d}f}, "
        f"CI95 {s['ci95_lo']:.{d}f}-{s['ci95_hi']:.{d}f}, n={s['n']}]"
    )


def cpu_model() -> str:
    from workbench.environment import cpu_model as model

    return model()


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def machine() -> dict[str, Any]:
    """Where a figure came from: CPU, cores, versions, the load when it was taken and, on a GPU
    machine, the GPUs and driver (from NVML: no CUDA context in this process) and torch's CUDA."""
    import torch

    from workbench.environment import gpus_from_nvml

    return {
        "host": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        **(gpus_from_nvml() or {}),
        "python": platform.python_version(),
        "loadavg": load_average(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def write_result(path: str | None, name: str, result: dict[str, Any]) -> None:
    """Print the result as one JSON line and, if asked, write it to ``path`` (for run_all)."""
    payload = {"benchmark": name, "machine": machine(), **result}
    if path:
        Path(path).write_text(json.dumps(payload, indent=2, default=float) + "\n")
