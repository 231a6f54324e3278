"""What reproduces a run: versions, host, CPU and GPU names, the code's git revision."""

from __future__ import annotations

import functools
import glob
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

_PACKAGES = ("torch", "numpy", "pandas", "pyarrow", "submitit", "plotly", "papermill", "workbench")


#: Device nodes a GPU torch can see needs (NVIDIA, ROCm, WSL's GPU): with none of them, no GPU.
GPU_DEVICE_NODES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")


def cuda_device_count() -> int:
    """``torch.cuda.device_count()`` (a driver query, no CUDA context), without importing torch
    where this machine has no GPU device node: there the count is 0, and the import would cost
    the launching process about 1.8 s (each sweep point's kernel launches once)."""
    if "torch" not in sys.modules and not any(glob.glob(p) for p in GPU_DEVICE_NODES):
        return 0
    import torch

    return int(torch.cuda.device_count())


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where it exists)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_revision(cwd: str | Path | None = None) -> str | None:
    """The code's revision, with ``+dirty`` when the work tree has changes (None outside git)."""
    here = Path(cwd) if cwd else Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("+dirty" if dirty else "")


def gpus_from_nvml() -> dict[str, Any] | None:
    """This machine's NVIDIA GPU names and driver version from NVML (``nvidia-ml-py``), which
    creates no CUDA context; None where NVML, a driver or a GPU is missing. These are the
    machine's GPUs (NVML ignores ``CUDA_VISIBLE_DEVICES``), not necessarily the ranks' ones."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handles = [
                pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
            ]
            names = [pynvml.nvmlDeviceGetName(h) for h in handles]
            driver = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML, no driver, no GPU: the ranks report their devices themselves
        return None

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    return {"gpu_names": [text(n) for n in names], "gpu_driver": text(driver)} if names else None


def collect() -> dict[str, Any]:
    """The launching side's environment: versions, host, CPU, the code's revision.

    It never creates a CUDA context in the caller (a notebook kernel launches many runs, and a
    context there holds GPU memory and makes the next launch refuse): torch facts are read only if
    torch is already imported, and only those that need no context (the CUDA build, the device
    count); GPU names come from NVML. Device names, CUDA and NCCL versions as the ranks see them
    are in each rank's record (``ranks/rank-N.json``)."""
    facts = _process_facts()
    env: dict[str, Any] = {**facts, "packages": dict(facts["packages"])}
    env["git_revision"] = git_revision()
    torch = sys.modules.get("torch")
    if torch is not None:
        env["cuda"] = torch.version.cuda
        env["cuda_devices"] = int(torch.cuda.device_count())  # no context: NVML / driver query
    env.update(dict(_nvml_facts()))
    return env


@functools.cache
def _process_facts() -> dict[str, Any]:
    """What cannot change while this process lives (its packages are loaded): read once, as
    the package metadata takes about 50 ms, which a warm pool's launch would wait for each time."""
    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu_model": cpu_model(),
        "packages": versions,
    }


@functools.cache
def _nvml_facts() -> dict[str, Any]:
    """The machine's GPU names and driver, once a process (NVML's init is not free)."""
    return gpus_from_nvml() or {}
