"""What a rank's memory is, read cheaply: the process's resident set (from /proc) and, on an
NVIDIA GPU, the process's memory as the driver sees it (NVML). The tracer samples both."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size of this process (bytes), from /proc where it exists."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class DeviceMemory:
    """This process's memory on its GPU as the driver sees it (NVML): the CUDA context, NCCL
    buffers and everything else the PyTorch allocator does not count. Sampled at most once per
    ``every_s`` seconds, because one NVML query costs far more than a step's timers. None where
    NVML (``nvidia-ml-py``) or an NVIDIA GPU is missing."""

    def __init__(self, device: torch.device, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self._last = -float("inf")
        self._value: int | None = None
        self._handle: Any = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            self._handle = pynvml.nvmlDeviceGetHandleByUUID(
                uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
            )
            self._nvml = pynvml
        except Exception:  # no NVML: the allocator's figures still stand
            self._handle = None

    def bytes(self) -> int | None:
        if self._handle is None:
            return None
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            pid = os.getpid()
            try:
                procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
                self._value = next((int(p.usedGpuMemory) for p in procs if p.pid == pid), None)
            except Exception:
                self._value = None
        return self._value
