"""FSDP2's all-gathers and reduce-scatters, timed from outside (``fully_shard`` modules, a
script's or the built-in loop's alike).

FSDP2 moves parameters and gradients through one communication object per parameter group
(``FSDPParamGroup``: one per ``fully_shard`` call): an ``AllGather`` (``_all_gather_comm``,
called by ``foreach_all_gather`` for the forward's gather and for backward's re-gather of a
module resharded after forward) and a ``ReduceScatter`` (``_reduce_scatter_comm``, called by
``foreach_reduce`` once per group in backward). ``FSDPModule.set_custom_all_gather`` and
``set_custom_reduce_scatter`` are the public way to replace them; :meth:`FSDPCommMeter.attach`
puts a wrapper around whatever object each group holds (its own or the script's custom one),
which times the call and counts its bytes, and hands every call on unchanged. FSDP at one rank
calls neither (its gather is a copy, its reduction a division): 0 bytes, 0 s, 0 calls, known.

What a call's figures are (torch 2.13, ``_fsdp_collectives.py``):

- bytes: the collective's whole buffer, as nccl-tests counts ``size``: an all-gather's gathered
  output, a reduce-scatter's input (the unsharded parameters or gradients, each parameter's
  first dimension padded to a multiple of the world size, at the all-gather's dtype
  (``param_dtype``) or the reduction's (``reduce_dtype``)). Each rank sends (n-1)/n of it.
- time: from the call to its completion. FSDP2 calls both with ``async_op=False`` unless
  ``unshard_async_op`` is set; on CPU (gloo) such a call returns once the collective is done,
  in the thread that computes the step, so the whole of it is **exposed** (the step waited for
  it) and none hidden. An ``async_op=True`` gather returns a work handle: its time runs to the
  handle's completion (a callback on its future), and the part the step waited for is not
  seen from outside (exposed: null for that step).
- on CUDA a call only enqueues the collective on FSDP's own stream: a host clock would time
  the enqueue, so bytes and calls only (times null), as DDP's Python comm hook there.
- spacing: each call's gap, the time from the previous call's return to its start (the
  compute between them), and the CPU time the rank's own thread spent in it (its host work:
  on a host whose cores the ranks share, what a collective competes with), so that the
  network benchmark can replay a step's calls as the step made them (``pattern``).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from workbench.trace.comm_timing import CommFields, warn

_clock = time.perf_counter
_cpu = time.thread_time  # the calling thread's CPU seconds: the training thread's host work
#: The mark, in an FSDP module's ``__dict__``, of one whose groups are metered.
MARK = "_workbench_fsdp"
ALL_GATHER, REDUCE_SCATTER = 0, 1
KINDS = ("all_gather", "reduce_scatter")
#: The longest gap a replay keeps (seconds): a step's first call may follow an evaluation.
MAX_GAP_S = 1.0
#: The step columns the meter fills (``schema.STEP_COLUMNS``), per kind.
FIELDS = tuple(f"{kind}_{what}" for kind in KINDS for what in ("bytes", "s", "exposed_s", "calls"))


def _nbytes(tensor: Any) -> int:
    return int(tensor.numel()) * int(tensor.element_size())


class _Timed:
    """One group's communication object, wrapped: the call timed and counted by ``meter``,
    everything else (``allocate``, attributes) the wrapped object's."""

    def __init__(self, inner: Any, meter: FSDPCommMeter, kind: int) -> None:
        self.inner, self.meter, self.kind = inner, meter, kind

    def allocate(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.allocate(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __call__(self, output_tensor: Any, input_tensor: Any, *args: Any, **kwargs: Any) -> Any:
        meter, kind = self.meter, self.kind
        buffer = output_tensor if kind == ALL_GATHER else input_tensor
        busy, start = _cpu(), _clock()
        work = self.inner(output_tensor, input_tensor, *args, **kwargs)
        # a call that returns a work handle returned before completing (``async_op``)
        dtype = str(buffer.dtype).removeprefix("torch.")
        meter.record(kind, _nbytes(buffer), dtype, start, work, busy)
        return work


class FSDPCommMeter:
    """The all-gathers and reduce-scatters of the FSDP2 modules attached, summed per step:
    :meth:`attach` once per root (again for another root: each group is wrapped once), then
    :meth:`take` once per optimizer step, after its backward. ``timed=False`` (CUDA): bytes and
    calls only. ``sizes`` holds the bytes of each call of the last step taken, per kind (what
    the network micro-benchmark times), ``pattern`` the same calls in the order they were made,
    each ``(kind, bytes, gap_s, host_s)``: the seconds since the previous call returned (at most
    :data:`MAX_GAP_S`; the run's first call 0) and the calling thread's CPU seconds among them
    (at most the gap), ``dtypes`` each kind's buffer dtype (``float32``), ``device`` the
    parameters' device."""

    def __init__(self, timed: bool = True, device: Any = None) -> None:
        self.timed = timed
        self.device = device
        self.groups = 0  # parameter groups metered
        self.warnings: list[str] = []
        self.sizes: tuple[list[int], list[int]] = ([], [])
        self.pattern: list[tuple[int, int, float, float]] = []
        self._last_end: float | None = None  # when the previous call returned
        self._last_busy = 0.0  # the calling thread's CPU seconds then
        self.dtypes: list[str | None] = [None, None]
        self._lock = threading.Lock()  # an async call completes in the backend's thread
        self._reset()

    def _reset(self) -> None:
        self._bytes = [0, 0]
        self._seconds = [0.0, 0.0]
        self._exposed: list[float | None] = [0.0, 0.0]
        self._calls = [0, 0]
        self._step_sizes: tuple[list[int], list[int]] = ([], [])
        self._step_pattern: list[tuple[int, int, float, float]] = []

    @classmethod
    def for_module(cls, module: Any) -> FSDPCommMeter:
        """A meter for the device of ``module``'s parameters: timed on CPU only."""
        param = next(module.parameters(), None)
        device = param.device if param is not None else None
        return cls(timed=device is None or device.type == "cpu", device=device)

    @property
    def method(self) -> str:
        """How the FSDP columns were measured, for the rank's summary: ``fsdp_comm`` (host
        clock around each call), ``bytes_only`` (CUDA) or ``none`` (no group could be
        metered)."""
        if not self.groups:
            return "none"
        return "fsdp_comm" if self.timed else "bytes_only"

    def attach(self, root: Any) -> int:
        """Meter every FSDP2 parameter group under ``root`` (itself included) not metered yet;
        returns how many were added. A torch whose FSDP keeps its groups or communication
        objects elsewhere: nothing is metered, and the rank's log says so once."""
        # the class the script's ``fully_shard`` made its modules (never imported here)
        fsdp = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
        if fsdp is None:
            return 0
        added = 0
        for module in root.modules():
            if not isinstance(module, fsdp) or MARK in module.__dict__:
                continue
            module.__dict__[MARK] = True
            try:
                groups = list(module._get_fsdp_state()._fsdp_param_groups)
                for group in groups:
                    added += self._wrap(group)
            except AttributeError as exc:
                self._missing(exc)
        self.groups += added
        return added

    def _wrap(self, group: Any) -> int:
        names = ("_all_gather_comm", "_reduce_scatter_comm")
        comms = [getattr(group, name) for name in names]  # AttributeError: another torch
        if any(isinstance(c, _Timed) for c in comms):
            return 0
        for kind, (name, comm) in enumerate(zip(names, comms, strict=True)):
            setattr(group, name, _Timed(comm, self, kind))
        return 1

    def _missing(self, exc: Exception) -> None:
        import torch

        text = (
            f"FSDP2's communication could not be metered in torch {torch.__version__} "
            f"({type(exc).__name__}: {exc}): the all_gather_* and reduce_scatter_* columns "
            "are not recorded"
        )
        if text not in self.warnings:
            self.warnings.append(warn(text))

    def record(
        self, kind: int, nbytes: int, dtype: str, start: float, work: Any, busy: float
    ) -> None:
        """One call of ``kind`` that started at ``start`` (the clock), its thread's CPU seconds
        then ``busy``, and moved ``nbytes``; ``work``: its handle where it returned before
        completing (``async_op``)."""
        end = _clock()
        with self._lock:
            self._bytes[kind] += nbytes
            self._calls[kind] += 1
            self._step_sizes[kind].append(nbytes)
            since = 0.0 if self._last_end is None else start - self._last_end
            gap = min(max(since, 0.0), MAX_GAP_S)
            host = 0.0 if self._last_end is None else busy - self._last_busy
            self._step_pattern.append((kind, nbytes, gap, min(max(host, 0.0), gap)))
            self._last_end, self._last_busy = end, _cpu()
            self.dtypes[kind] = dtype
            if not self.timed:
                return
            if work is None:
                self._seconds[kind] += end - start
                exposed = self._exposed[kind]
                self._exposed[kind] = None if exposed is None else exposed + end - start
                return
            self._exposed[kind] = None  # what the step waited for is not seen from outside
        work.get_future().add_done_callback(self._done(kind, start))

    def _done(self, kind: int, start: float) -> Callable[[Any], None]:
        def done(_: Any) -> None:
            elapsed = _clock() - start
            with self._lock:
                self._seconds[kind] += elapsed

        return done

    def take_fields(self) -> dict[str, Any]:
        """The step's columns (:data:`FIELDS`), and a fresh count for the next step."""
        with self._lock:
            out: dict[str, Any] = {}
            for kind, name in enumerate(KINDS):
                timed = self.timed and self.groups > 0
                out[f"{name}_bytes"] = self._bytes[kind] if self.groups else None
                out[f"{name}_s"] = self._seconds[kind] if timed else None
                out[f"{name}_exposed_s"] = self._exposed[kind] if timed else None
                out[f"{name}_calls"] = self._calls[kind] if self.groups else None
            if any(self._step_sizes):
                self.sizes, self.pattern = self._step_sizes, self._step_pattern
            self._reset()
        return out

    def take(self) -> CommFields:
        """The step's communication columns, as DDP's meters give them (DDP's own null)."""
        return CommFields(None, None, None, **self.take_fields())
