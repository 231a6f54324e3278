"""What reproduces a run: versions, host, CPU and GPU names, the code's git revision."""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

_PACKAGES = ("torch", "numpy", "pandas", "pyarrow", "submitit", "plotly", "papermill", "workbench")


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


def collect() -> dict[str, Any]:
    """The launching side's environment. Torch facts are read only if torch is already imported,
    so that recording them never costs an import."""
    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu_model": cpu_model(),
        "packages": versions,
        "git_revision": git_revision(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        env["cuda"] = torch.version.cuda
        env["cuda_available"] = bool(torch.cuda.is_available())
        if torch.cuda.is_available():
            env["gpu_names"] = [
                torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
            ]
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return env
