"""The flight recorder of a rank: its step and phase, and every collective its Python code
issues (the script's, FSDP2's, the workbench's own), in a memory-mapped file the launcher reads
when a rank hangs or dies (:mod:`workbench.store.flight_file`); on a failure the rank adds
its default group's sequence number (the count of collectives it issued, torch's own in C++
among them: DDP's gradient buckets) and PyTorch's own flight recorder where it is on, which
names those too (on by default in recent torch, gloo included; ``TORCH_FR_BUFFER_SIZE=0``
turns it off, about 5 us a collective on a 2-core host: benchmarks/flight_recorder.py).

Each collective is recorded with its process group's own sequence number (read before the
call: the call's is one more), so that the ranks' records line up collective by collective,
and so that they line up with PyTorch's recorder; an ``async_op`` call is stamped as returned
when it hands back its work handle. The wrapper costs about 1.6 us a collective, a phase mark
about 0.2 us (benchmarks/flight_recorder.py).
"""

from __future__ import annotations

import functools
import inspect
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from workbench.store.flight_file import OPS, FlightFile, dump_path, torch_entries

#: Each op's buffer: the index of the positional argument (and its keyword) whose bytes are
#: the collective's size, as nccl-tests counts it; None: no buffer (a barrier) or objects.
_BUFFER: dict[str, tuple[int, str] | None] = {
    "all_reduce": (0, "tensor"),
    "broadcast": (0, "tensor"),
    "all_gather": (1, "tensor"),
    "all_gather_into_tensor": (0, "output_tensor"),
    "reduce_scatter": (1, "input_list"),
    "reduce_scatter_tensor": (1, "input"),
    "reduce": (0, "tensor"),
    "gather": (0, "tensor"),
    "scatter": (0, "tensor"),
    "all_to_all": (1, "input_tensor_list"),
    "all_to_all_single": (1, "input"),
    "barrier": None,
    "all_gather_object": None,
    "broadcast_object_list": None,
    "send": (0, "tensor"),
    "recv": (0, "tensor"),
}


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.numel()) * int(value.element_size())
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return 0


class FlightRecorder:
    """One rank's recorder: :meth:`at` where its loop moves on, :meth:`install` to wrap the
    collectives of ``torch.distributed``, :meth:`dump` on a failure."""

    def __init__(self, path: Path) -> None:
        self.file = FlightFile(path)
        self.at = self.file.at
        self._groups: dict[int, tuple[Any, int]] = {}  # id(group) -> (group, its index)
        self._undo: list[Callable[[], None]] = []

    @property
    def step(self) -> int:
        return self.file.step

    def phase(self, phase: int) -> None:
        """The rank is now in ``phase`` of the same step."""
        self.file.at(self.file.step, phase)

    def _group(self, group: Any) -> tuple[Any, int]:
        found = self._groups.get(id(group))
        if found is None:
            pg = group if group is not None else dist.distributed_c10d._get_default_group()
            ranks = dist.get_process_group_ranks(pg)
            found = self._groups[id(group)] = (pg, self.file.group_index(sorted(ranks)))
        return found

    def wrapped(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        """``original`` (``torch.distributed.<name>``) recording each call."""
        op = OPS.index(name)
        buffer = _BUFFER[name]
        at, key = buffer if buffer is not None else (None, "")
        try:
            params = list(inspect.signature(original).parameters)
        except (TypeError, ValueError):
            params = []
        by_place = params.index("group") if "group" in params else None
        file, group_of, compiling = self.file, self._group, torch.compiler.is_compiling

        def collective(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                return original(*args, **kwargs)
            try:
                group = kwargs.get("group")
                if group is None and by_place is not None and len(args) > by_place:
                    group = args[by_place]
                pg, index = group_of(group)
                seq = pg._get_sequence_number_for_group() + 1
                value = args[at] if at is not None and len(args) > at else kwargs.get(key)
                slot = file.issued(seq, op, _nbytes(value), index)
            except Exception:  # no default group yet, a torch without sequence numbers
                return original(*args, **kwargs)
            result = original(*args, **kwargs)
            file.returned(slot)
            return result

        collective.__wrapped__ = original  # type: ignore[attr-defined]
        collective._flight = True  # type: ignore[attr-defined]
        return collective

    def install(self) -> FlightRecorder:
        """Wrap each collective of ``torch.distributed`` (the names scripts and FSDP2 call)."""
        for name in OPS:
            original = getattr(dist, name, None)
            if original is None or hasattr(original, "_flight"):
                continue
            setattr(dist, name, self.wrapped(name, original))
            self._undo.append(functools.partial(setattr, dist, name, original))
        return self

    def remove(self) -> None:
        """Put torch's own collectives back."""
        while self._undo:
            self._undo.pop()()

    def dump(self, exc: BaseException | None) -> None:
        """What a failing rank can still say: its exception, and PyTorch's flight recorder's
        entries where it is on (``torch_recorder``). Never raises."""
        try:
            record: dict[str, Any] = {"at": time.time(), "step": self.file.step}
            try:  # the default group's count: the collective it was in, if torch issued it
                pg = dist.distributed_c10d._get_default_group()
                record["seq"] = int(pg._get_sequence_number_for_group())  # type: ignore[attr-defined]
            except Exception:
                pass
            if exc is not None:
                record["exception"] = "".join(traceback.format_exception_only(exc)).strip()
            record["torch_recorder"] = torch_recorder_entries()
            dump_path(self.file.path).write_text(json.dumps(record))
        except Exception:
            pass

    def close(self) -> None:
        self.remove()
        self.file.close()


def torch_recorder_entries() -> list[dict[str, Any]] | None:
    """PyTorch's flight recorder (:func:`workbench.store.flight_file.torch_entries`); None
    where it is off or absent."""
    for name in ("_dump_fr_trace_json", "_dump_nccl_trace_json"):
        try:
            dump = getattr(torch._C._distributed_c10d, name)
            entries = torch_entries(json.loads(dump(True, True)))
        except Exception:
            continue
        if entries:
            return entries
    return None


class _NoRecorder:
    """Where no recorder runs (a rank's loop called outside a run): every call does nothing."""

    step = 0

    def at(self, step: int, phase: int) -> None:
        self.step = step

    def phase(self, phase: int) -> None:
        pass

    def dump(self, exc: BaseException | None) -> None:
        pass


_active: FlightRecorder | _NoRecorder = _NoRecorder()


def start(path: Path) -> FlightRecorder | _NoRecorder:
    """This process's recorder, writing ``path``, its collectives wrapped (:func:`active`);
    one that records nothing where its file cannot be made (a full disk): the run goes on."""
    global _active
    try:
        _active = FlightRecorder(path).install()
    except OSError:
        _active = _NoRecorder()
    return _active


def stop() -> None:
    """Close this process's recorder (its file stays)."""
    global _active
    if isinstance(_active, FlightRecorder):
        _active.close()
    _active = _NoRecorder()


def active() -> FlightRecorder | _NoRecorder:
    """This process's recorder (one that records nothing where none was started)."""
    return _active
