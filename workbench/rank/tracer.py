"""The Tracer: per-rank, per-step timings and memory, streamed to JSONL, consolidated to Parquet.

Hot path rules: a step costs a few ``perf_counter`` stamps (or CUDA events, resolved with the one
synchronisation per step the loop already pays), one RSS read and a list append. Rows leave memory
at every flush, so a 100,000-step run holds at most a few seconds of rows.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from workbench import schema
from workbench.store.jsonl import TraceWriter

#: How often (seconds) the tracer re-reads the process RSS.
RSS_EVERY_S = 0.5
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


class PhaseClock:
    """Stamps the phases of one step: perf_counter on CPU, CUDA events on GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list[Any] = []

    def start(self) -> None:
        self._marks = []
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._marks.append((time.perf_counter(), ev))
        else:
            self._marks.append(time.perf_counter())

    def durations(self) -> list[float]:
        """Seconds between consecutive marks; on CUDA this waits for the last event (the step's
        single synchronisation)."""
        m = self._marks
        if not self.cuda:
            return [m[i + 1] - m[i] for i in range(len(m) - 1)]
        m[-1][1].synchronize()
        return [m[i][1].elapsed_time(m[i + 1][1]) / 1000.0 for i in range(len(m) - 1)]

    @property
    def started_at(self) -> float:
        first = self._marks[0]
        return first[0] if self.cuda else first


class Tracer:
    """Step and evaluation rows of one rank. Use as a context manager: rows written before an
    exception are flushed on the way out."""

    def __init__(
        self,
        traces_dir: Path,
        *,
        run_id: str,
        rank: int,
        local_rank: int,
        host: str,
        world_size: int,
        attempt: int,
        flush_s: float,
        device: torch.device,
    ) -> None:
        self.dir = traces_dir
        self.rank = rank
        self.device = device
        self._common = {
            "run_id": run_id,
            "rank": rank,
            "world_size": world_size,
            "attempt": attempt,
        }
        self._step_extra = {"local_rank": local_rank, "host": host}
        self.steps = TraceWriter(traces_dir / schema.steps_file(rank, "jsonl"), flush_s)
        self.evals = TraceWriter(traces_dir / schema.eval_file(rank, "jsonl"), flush_s)
        self.t0 = time.perf_counter()
        self.t0_unix = time.time()
        self.device_memory = DeviceMemory(device)
        self._rss, self._rss_at = 0, -float("inf")

    def set_t0(self) -> None:
        """Call right after a barrier: every rank leaves it together, so their clocks agree."""
        self.t0 = time.perf_counter()
        self.t0_unix = time.time()

    def since_t0(self, t: float) -> float:
        return t - self.t0

    def memory(self, fresh: bool = False) -> dict[str, Any]:
        # RSS costs ~15 us to read from /proc, a third of a step's tracing: read it at most
        # every RSS_EVERY_S seconds and repeat the last value in between.
        now = time.monotonic()
        if fresh or now - self._rss_at >= RSS_EVERY_S:
            self._rss, self._rss_at = rss_bytes(), now
        mem: dict[str, Any] = {"rss_bytes": self._rss}
        if self.device.type == "cuda":
            mem.update(
                mem_alloc_bytes=torch.cuda.memory_allocated(self.device),
                mem_reserved_bytes=torch.cuda.memory_reserved(self.device),
                mem_peak_bytes=torch.cuda.max_memory_allocated(self.device),
                mem_device_bytes=self.device_memory.bytes(),
            )
        else:
            mem.update(
                mem_alloc_bytes=None,
                mem_reserved_bytes=None,
                mem_peak_bytes=None,
                mem_device_bytes=None,
            )
        return mem

    def step(self, **fields: Any) -> None:
        self.steps.add({**self._common, **self._step_extra, **fields, **self.memory()})

    def evaluation(self, **fields: Any) -> None:
        self.evals.add({**self._common, **fields})

    def close(self) -> None:
        self.steps.close()
        self.evals.close()

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
