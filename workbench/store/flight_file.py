"""A rank's flight record: where it is (step, phase, since when) and its last collectives, in a
small memory-mapped file it writes as it goes.

Written in place by the rank (a few stores into a shared mapping, about 0.1 us each: no system
call, no flush), read by the launcher at any moment, even while the rank hangs or after it was
killed: the page cache keeps what a killed process stored. Torch-free, so the launcher reads it
without importing torch.

Layout, 8-byte little-endian words (``q`` signed integers, ``d`` doubles):

=====  ======================================================================================
word   meaning
=====  ======================================================================================
0      magic (:data:`MAGIC`), set last when the file is ready
1      the rank's pid
2      the step the rank is in (1-based; 0: before its first)
3      its phase (an index into :data:`PHASES`)
4      (d) when it entered that phase (``time.time()``)
5      collectives recorded so far (the ring's next slot is this modulo :data:`RING`)
6, 7   reserved
8 ...  the ring: :data:`RING` entries of :data:`ENTRY_WORDS` words each
=====  ======================================================================================

A ring entry: the group's sequence number of the collective (the process group's own count,
which counts the collectives torch issues in C++ too, DDP's among them), its op (an index
into :data:`OPS`), its bytes, the group (an index into the rank's group list, kept beside the
file as JSON: :func:`groups_path`), the step and phase it was issued in, (d) when it was
issued, (d) when it returned (0: it has not).
"""

from __future__ import annotations

import json
import mmap
import os
import time
from pathlib import Path
from typing import Any

MAGIC = 0x57424652  # "WBFR"
HEADER_WORDS = 8
ENTRY_WORDS = 8
#: Collectives kept per rank: the last ones are what a hang is about.
RING = 64
SIZE = 8 * (HEADER_WORDS + RING * ENTRY_WORDS)
#: What a rank can be doing, by index; ``between steps``: after a step's optimizer, before the
#: next step's data (checkpoints, logging, a script's own code); ``after backward``: a
#: script's code between its backward and its optimizer step (clipping, its own all-reduces).
PHASES = (
    "starting",
    "data loading",
    "forward",
    "backward",
    "optimizer step",
    "between steps",
    "evaluation",
    "after training",
    "after backward",
)
STARTING, DATA, FORWARD, BACKWARD, OPTIMIZER, BETWEEN, EVALUATION, AFTER, AFTER_BACKWARD = range(
    len(PHASES)
)
#: The collectives a rank's Python code can issue, by index (the recorder's wrappers).
OPS = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "all_gather_object",
    "broadcast_object_list",
    "send",
    "recv",
)
FILE_PREFIX = "rank-"


def flight_path(flight_dir: Path, rank: int) -> Path:
    """Where rank ``rank``'s flight record lives."""
    return flight_dir / f"{FILE_PREFIX}{rank}.bin"


def groups_path(path: Path) -> Path:
    """The JSON list of the groups a flight record's entries name (their global ranks)."""
    return path.with_suffix(".groups.json")


def dump_path(path: Path) -> Path:
    """What a rank that could still speak wrote when it failed (PyTorch's flight recorder,
    where it is on)."""
    return path.with_suffix(".dump.json")


class FlightFile:
    """The writer, in the rank's own process. ``at(step, phase)`` where the rank's loop moves
    on; ``issued(...)`` / ``returned(slot)`` around each collective."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        with open(path, "w+b") as f:
            # written, not truncated: the blocks are the file's before it is mapped, so a store
            # to the mapping never needs a block (on a full disk that would be a SIGBUS)
            f.write(bytes(SIZE))
            f.flush()
            self._map = mmap.mmap(f.fileno(), SIZE)
        self._q = memoryview(self._map).cast("q")
        self._d = memoryview(self._map).cast("d")
        self._q[1] = os.getpid()
        self._d[4] = time.time()
        self.count = 0
        self.step = 0
        self.phase = STARTING
        self.groups: list[list[int]] = []
        self._q[0] = MAGIC

    def at(self, step: int, phase: int) -> None:
        """The rank is now in ``phase`` of ``step``."""
        self.step, self.phase = step, phase
        q = self._q
        q[2] = step
        q[3] = phase
        self._d[4] = time.time()

    def group_index(self, ranks: list[int]) -> int:
        """The index of the group of global ``ranks`` (added, and the list rewritten, when
        new: once per group)."""
        try:
            return self.groups.index(ranks)
        except ValueError:
            self.groups.append(ranks)
            try:
                groups_path(self.path).write_text(json.dumps(self.groups))
            except OSError:  # a full disk: the entries name their group by index only
                pass
            return len(self.groups) - 1

    def issued(self, seq: int, op: int, nbytes: int, group: int) -> int:
        """Record a collective as issued now; returns its slot for :meth:`returned`."""
        slot = HEADER_WORDS + (self.count % RING) * ENTRY_WORDS
        q = self._q
        q[slot] = seq
        q[slot + 1] = op
        q[slot + 2] = nbytes
        q[slot + 3] = group
        q[slot + 4] = self.step
        q[slot + 5] = self.phase
        self._d[slot + 6] = time.time()
        self._d[slot + 7] = 0.0
        self.count += 1
        q[5] = self.count
        return slot

    def returned(self, slot: int) -> None:
        """The collective in ``slot`` returned."""
        self._d[slot + 7] = time.time()

    def close(self) -> None:
        self._q.release()
        self._d.release()
        self._map.close()


def read_flight(path: Path) -> dict[str, Any] | None:
    """A flight record as a dict (None: no such file, or not written yet): ``pid``, ``step``,
    ``phase`` (its name), ``since`` (epoch seconds), ``collectives`` (oldest first, each with
    ``seq``, ``op``, ``bytes``, ``group`` (its global ranks, or None), ``step``, ``phase``,
    ``issued_at``, ``returned_at`` (None: it had not)), and ``dump``: what the rank wrote
    when it failed (None if it could not)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) < SIZE:
        return None
    q = memoryview(raw).cast("q")
    d = memoryview(raw).cast("d")
    if q[0] != MAGIC:
        return None
    try:
        groups = json.loads(groups_path(path).read_text())
    except (OSError, ValueError):
        groups = []
    count = q[5]
    entries = []
    for k in range(max(0, count - RING), count):
        s = HEADER_WORDS + (k % RING) * ENTRY_WORDS
        group = q[s + 3]
        entries.append(
            {
                "seq": q[s],
                "op": OPS[q[s + 1]] if 0 <= q[s + 1] < len(OPS) else "?",
                "bytes": q[s + 2],
                "group": groups[group] if 0 <= group < len(groups) else None,
                "step": q[s + 4],
                "phase": PHASES[q[s + 5]] if 0 <= q[s + 5] < len(PHASES) else "?",
                "issued_at": d[s + 6],
                "returned_at": d[s + 7] or None,
            }
        )
    try:
        dump = json.loads(dump_path(path).read_text())
    except (OSError, ValueError):
        dump = None
    return {
        "pid": q[1],
        "step": q[2],
        "phase": PHASES[q[3]] if 0 <= q[3] < len(PHASES) else "?",
        "since": d[4],
        "collectives": entries,
        "dump": dump,
    }


#: Bytes of an element of each dtype as PyTorch's recorder names it.
_DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Byte": 1}


def torch_entries(raw: Any) -> list[dict[str, Any]] | None:
    """PyTorch's flight recorder dump (its JSON, or the pickle NCCL's watchdog writes on a
    timeout), each entry as ``{seq, op, bytes, pg, issued_at, p2p}``; None where empty."""
    out = []
    for e in (raw or {}).get("entries") or ():
        numel = 0
        for shape in e.get("input_sizes") or ():
            n = 1
            for size in shape:
                n *= int(size)
            numel += n
        dtype = (e.get("input_dtypes") or ["Float"])[0]
        out.append(
            {
                "seq": int(e.get("collective_seq_id") or 0),
                "op": str(e.get("profiling_name", "?")).split(":")[-1],
                "bytes": numel * _DTYPE_BYTES.get(str(dtype), 4),
                "pg": str((e.get("process_group") or ["0"])[0]),
                "issued_at": (e.get("time_created_ns") or 0) / 1e9,
                "p2p": bool(e.get("is_p2p")),
            }
        )
    return out or None


def read_nccl_dump(path: Path) -> dict[str, Any] | None:
    """What NCCL's watchdog wrote for a rank on a timeout (``TORCH_FR_DUMP_TEMP_FILE``, a
    pickle of plain values), as a flight record's ``dump``; None where there is none."""
    import pickle

    try:
        raw = pickle.loads(path.read_bytes())
    except Exception:
        return None
    entries = torch_entries(raw)
    return {"torch_recorder": entries} if entries else None
