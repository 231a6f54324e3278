"""The Tracer: per-rank, per-step timings and memory, streamed as Arrow record batches, consolidated
to Parquet at the end.

Hot path rules: a step costs a few ``perf_counter`` stamps (or CUDA events from a ring allocated
once), one clock read and one tuple appended to a buffer. Everything else waits for the flush
(every ``flush_s`` seconds, at checkpoints, on exit): phase durations from the stamps or the
events, the loss (a tensor on CUDA: reading it every step would synchronise), the columns, one
record batch appended to the rank's live file. Memory (RSS; on CUDA one ``memory_stats`` call and
NVML) is sampled every ``memory_every_s`` seconds and at every flush, and repeated in between. On
CUDA the tracer adds no synchronisation per step: a step's events are read once the ring wraps
onto them (long done by then) or at the flush, the one place it waits for the GPU (for the last
step's events, and to copy the buffered losses in one go).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from workbench import schema
from workbench.errors import NonFiniteLossError
from workbench.store.arrow_stream import StreamWriter
from workbench.trace.fsdp_comm import FIELDS as FSDP_FIELDS
from workbench.trace.memory_probe import DeviceMemory, rss_bytes
from workbench.trace.phase_clock import CudaStep, Phases, phase_columns

#: How often (seconds) the tracer re-reads the process RSS and, on CUDA, the allocator's figures.
RSS_EVERY_S = 0.5
_now = time.monotonic


def gaps(
    t_start_s: Sequence[float], step_s: Sequence[Any], next_start: float | None
) -> list[float | None]:
    """Each row's ``gap_s``: the next row's start minus this row's end (``t_start_s +
    step_s``); for the last row, ``next_start`` (None: not known yet, or no next step)."""
    starts = [*t_start_s[1:], next_start]
    return [
        None if n is None or s is None or math.isnan(s) else float(n - t - s)
        for t, s, n in zip(t_start_s, step_s, starts, strict=True)
    ]


def loss_values(losses: list[Any]) -> tuple[list[Any], int | None]:
    """Losses as floats (tensors read in one copy), and the index of the first tensor loss that
    is not finite (float losses were checked by the loop already)."""
    if not any(issubclass(t, torch.Tensor) for t in set(map(type, losses))):
        return losses, None
    at = [i for i, v in enumerate(losses) if isinstance(v, torch.Tensor)]
    out = list(losses)
    read: list[float | None]
    try:
        read = list(_read_tensors([losses[i] for i in at]))
    except Exception:  # a CUDA error elsewhere: the rows keep their other columns
        read = [None] * len(at)
    for i, v in zip(at, read, strict=True):
        out[i] = v
    bad = next((i for i in at if out[i] is not None and not math.isfinite(out[i])), None)
    return out, bad


def _read_tensors(tensors: list[torch.Tensor]) -> list[float]:
    """One-element tensors as floats, in one copy from the device: stacked as they are where
    they are alike (0-d on one device, the usual case: 0.5 us a row, against 5 us for a
    reshape and a cast per tensor), else one by one reshaped first."""
    with torch.no_grad():
        try:
            stacked = torch.stack(tensors)
        except RuntimeError:  # shapes (0-d and (1,)) or devices differ
            stacked = torch.stack([t.detach().reshape(()).float() for t in tensors])
        return stacked.float().reshape(-1).tolist()


#: What ``Tracer.step`` buffers per row, in order (then the memory sample); the constant columns
#: (run, rank, host, ...) and the five phase columns are filled in at the flush.
_ROW: tuple[str, ...] = ("epoch", "step", "warmup", "t_start_s", "phases", "comm_s", "comm_bytes")
_ROW += ("comm_buckets", "samples", "loss", "lr", "backward_compute_s", "comm_exposed_s")
_ROW += ("tokens", "save_s", *FSDP_FIELDS)
_SAVE = _ROW.index("save_s")
_PHASES = _ROW.index("phases")


def _start_s(host_start_s: float, phases: Any) -> float:
    """A row's ``t_start_s``: on the device's clock where its phases are (an anchored
    ``CudaStep``), else the host's."""
    device = phases.device_start() if isinstance(phases, CudaStep) else None
    return host_start_s if device is None else device


_MEMORY: tuple[str, ...] = (
    "mem_alloc_bytes",
    "mem_reserved_bytes",
    "mem_peak_bytes",
    "mem_device_bytes",
)
_MEMORY += ("rss_bytes",)


class Tracer:
    """Step and evaluation rows of one rank. Use as a context manager: rows buffered before an
    exception are written on the way out."""

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
        memory_every_s: float = RSS_EVERY_S,
        max_rows: int = 2000,
        stop_on_nonfinite: bool = True,
    ) -> None:
        self.dir = traces_dir
        # The built-in loop stops at a non-finite loss; a user's script decides for itself.
        self.stop_on_nonfinite = stop_on_nonfinite
        self.rank = rank
        self.device = device
        self.flush_s = flush_s
        self.memory_every_s = memory_every_s
        self.max_rows = max_rows  # rows buffered at most: memory stays flat on long runs
        common = {"run_id": run_id, "rank": rank, "world_size": world_size, "attempt": attempt}
        self._rows: list[tuple[Any, ...]] = []
        self._eval_rows: list[dict[str, Any]] = []
        self._step_file = StreamWriter(
            traces_dir / schema.live_steps_file(rank),
            schema.STEP_COLUMNS,
            {**common, "local_rank": local_rank, "host": host},
        )
        self._eval_file = StreamWriter(
            traces_dir / schema.live_eval_file(rank), schema.EVAL_COLUMNS, common
        )
        self.t0 = time.perf_counter()
        self.t0_unix = time.time()
        self.device_memory = DeviceMemory(device)
        self._mem: tuple[Any, ...] = (None,) * 5
        self._mem_due = -math.inf
        self._flush_due = _now() + flush_s

    def set_t0(self) -> None:
        """Call right after a barrier: every rank leaves it together, so their clocks agree."""
        self.t0 = time.perf_counter()
        self.t0_unix = time.time()

    def since_t0(self, t: float) -> float:
        return t - self.t0

    def _sample_memory(self, now: float) -> None:
        """RSS and, on CUDA, the allocator (one ``memory_stats`` call: current allocated and
        reserved, and the peak since the start, so no peak between samples is lost) and NVML."""
        alloc = reserved = peak = on_device = None
        if self.device.type == "cuda":
            stats = torch.cuda.memory_stats(self.device)
            alloc = stats.get("allocated_bytes.all.current")
            reserved = stats.get("reserved_bytes.all.current")
            peak = stats.get("allocated_bytes.all.peak")
            on_device = self.device_memory.bytes()
        self._mem = (alloc, reserved, peak, on_device, rss_bytes())
        self._mem_due = now + self.memory_every_s

    def memory(self, fresh: bool = False) -> dict[str, Any]:
        """The latest memory sample (a new one when ``fresh`` or when it is due)."""
        now = _now()
        if fresh or now >= self._mem_due:
            self._sample_memory(now)
        return dict(zip(_MEMORY, self._mem, strict=True))

    def step(
        self,
        epoch: int,
        step: int,
        warmup: bool,
        t_start_s: float,
        phases: Any,
        comm_s: float | None,
        comm_bytes: int | None,
        comm_buckets: int | None,
        samples: int,
        loss: Any,
        lr: float,
        backward_compute_s: float | None = None,
        comm_exposed_s: float | None = None,
        tokens: int | None = None,
        all_gather_bytes: int | None = None,
        all_gather_s: float | None = None,
        all_gather_exposed_s: float | None = None,
        all_gather_calls: int | None = None,
        reduce_scatter_bytes: int | None = None,
        reduce_scatter_s: float | None = None,
        reduce_scatter_exposed_s: float | None = None,
        reduce_scatter_calls: int | None = None,
    ) -> None:
        """Buffer one step's row. ``phases`` is ``PhaseClock.stop()`` (or ``Phases``);
        ``loss`` a float, None (not known) or a 0-d tensor read at the flush (a non-finite one
        raises ``NonFiniteLossError`` there, naming its step, unless ``stop_on_nonfinite`` is
        off). The ``all_gather_*`` and ``reduce_scatter_*`` figures are FSDP2's
        (``fsdp_comm.FSDPCommMeter.take``)."""
        now = _now()
        if now >= self._mem_due:
            self._sample_memory(now)
        rows = self._rows
        rows.append(
            (epoch, step, warmup, t_start_s, phases, comm_s, comm_bytes, comm_buckets, samples)
            + (loss, lr, backward_compute_s, comm_exposed_s, tokens, None)
            + (all_gather_bytes, all_gather_s, all_gather_exposed_s, all_gather_calls)
            + (reduce_scatter_bytes, reduce_scatter_s, reduce_scatter_exposed_s)
            + (reduce_scatter_calls, self._mem)
        )
        if now >= self._flush_due or len(rows) >= self.max_rows:
            self.flush(hold_last=True)

    def saved(self, save_s: float) -> None:
        """Record the checkpoint just written after the latest step (``save_s`` seconds) on that
        step's row; call before the flush that precedes the checkpoint's commit."""
        if self._rows:
            row = self._rows[-1]
            self._rows[-1] = (*row[:_SAVE], save_s, *row[_SAVE + 1 :])

    def evaluation(self, **fields: Any) -> None:
        self._eval_rows.append(fields)
        if _now() >= self._flush_due:
            self.flush(hold_last=True)

    def flush(self, hold_last: bool = False) -> None:
        """Write the buffered rows (one record batch per kind). Raises ``NonFiniteLossError``
        for the first tensor loss that is not finite, after writing the rows before it.

        ``hold_last`` (the periodic flushes) keeps the latest step row buffered so that its
        ``gap_s`` (the next step's start minus its end) is known when it is written; the other
        flushes (checkpoints, the end) write every row, the last with ``gap_s`` null."""
        now = _now()
        self._flush_due = now + self.flush_s
        error = None
        held = self._rows[-1:] if hold_last else []
        rows = self._rows[:-1] if hold_last else self._rows
        if rows:
            self._rows = held
            next_start = _start_s(held[0][3], held[0][_PHASES]) if held else None
            error = self._write_steps(rows, next_start)
        if self._eval_rows:
            evals, self._eval_rows = self._eval_rows, []
            names = {k for r in evals for k in r}
            self._eval_file.write({k: [r.get(k) for r in evals] for k in names}, len(evals))
        if error is not None:
            raise error

    def _write_steps(
        self, rows: list[tuple[Any, ...]], next_start: float | None = None
    ) -> NonFiniteLossError | None:
        """Write step rows; ``next_start``: the ``t_start_s`` of the row after the last one
        (still buffered), for the last row's ``gap_s``."""
        *buffered, memory = zip(*rows, strict=True)
        columns: dict[str, Any] = dict(zip(_ROW, buffered, strict=True))
        phases = columns.pop("phases")
        columns.update(zip(Phases._fields, phase_columns(phases), strict=True))
        if isinstance(phases[0], CudaStep):  # one clock: starts on the device's, as the phases
            columns["t_start_s"] = list(map(_start_s, columns["t_start_s"], phases))
        columns["gap_s"] = gaps(columns["t_start_s"], columns["step_s"], next_start)
        return self.write_step_columns(columns, list(memory))

    def write_step_columns(
        self, columns: dict[str, Any], memory: list[tuple[Any, ...] | None]
    ) -> NonFiniteLossError | None:
        """Write step rows given as columns (every step column but the memory ones, ``loss``
        as floats, None or 0-d tensors) and each row's memory sample (None: none yet), the last
        row's taken now. A non-finite tensor loss: see ``flush``."""
        n = len(memory)
        self._sample_memory(_now())  # the last row carries a fresh sample (and the peak so far)
        memory[-1] = self._mem
        losses, bad = loss_values(list(columns["loss"]))
        error = None
        # The run stops at that step: later rows never happened.
        if bad is not None and self.stop_on_nonfinite:
            error = NonFiniteLossError(self.rank, columns["step"][bad], losses[bad])
            n = bad
            if not n:
                return error
            columns = {k: v[:n] for k, v in columns.items()}
            columns["gap_s"] = [*columns["gap_s"][:-1], None]
            losses, memory = losses[:n], memory[:n]
        empty = (None,) * len(_MEMORY)
        filled = [empty if m is None else m for m in memory]
        columns.update(zip(_MEMORY, zip(*filled, strict=True), strict=True))
        columns["loss"] = losses
        self._step_file.write(columns, n)  # a column not given (a script's save_s) is null
        return error

    def sample_memory(self) -> tuple[Any, ...]:
        """A fresh memory sample (the five memory columns), also the one later rows carry."""
        self._sample_memory(_now())
        return self._mem

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._step_file.close()
            self._eval_file.close()

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
