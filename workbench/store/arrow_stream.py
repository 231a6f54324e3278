"""Live trace files: one Arrow IPC stream per rank and kind, appended one record batch per flush.

The file is a schema message followed by record-batch messages (Arrow's streaming format, without
the end-of-stream marker while it grows), each written with one ``write`` and flushed, so a reader
sees every batch flushed so far. A crash mid-write leaves a torn last message: readers stop at the
last complete one and keep everything before it; a writer opening the file again cuts the torn
tail off and appends after it. Readers remember the byte offset of the last complete message and
read only what came after (``read_messages``). No torch, no pandas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from workbench import schema

_TYPES = {
    "string": pa.string(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
}


def arrow_schema(columns: dict[str, str]) -> pa.Schema:
    """The Arrow schema of a trace (``schema.STEP_COLUMNS`` or ``EVAL_COLUMNS``), with the trace
    schema version in its metadata: the same for the live stream and the Parquet file."""
    return pa.schema(
        [pa.field(name, _TYPES[kind]) for name, kind in columns.items()],
        metadata={"workbench_trace_schema": str(schema.TRACE_SCHEMA_VERSION)},
    )


def read_messages(
    data: Any, known: pa.Schema | None = None
) -> tuple[list[pa.RecordBatch], int, pa.Schema | None]:
    """The complete record batches in ``data`` (bytes or a pyarrow Buffer, starting at a message
    boundary), the number of bytes they take (where the next read starts), and the stream's
    schema (``known`` when ``data`` starts after the schema message). A torn last message, or
    anything after it, is left for the next read."""
    reader = pa.BufferReader(data)
    batches: list[pa.RecordBatch] = []
    end = 0
    while True:
        try:
            message = pa.ipc.read_message(reader)
            if message.type == "schema":
                known = pa.ipc.read_schema(message)
            elif message.type == "record batch" and known is not None:
                batches.append(pa.ipc.read_record_batch(message, known))
        except (EOFError, OSError, ValueError, pa.ArrowException):
            break  # the end, an end-of-stream marker, or a message still being written (torn)
        end = reader.tell()
    return batches, end, known


def read_stream(path: Path) -> pa.Table | None:
    """Every complete batch of a live trace file as one table; None when the file is missing
    or holds no complete schema message yet."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    batches, _, known = read_messages(data)
    if known is None:
        return None
    return pa.Table.from_batches(batches, schema=known)


def _complete_length(path: Path) -> tuple[int, pa.Schema | None]:
    """Bytes of ``path`` up to its last complete message, and its schema."""
    _, end, known = read_messages(path.read_bytes())
    return end, known


class StreamWriter:
    """Appends record batches to one live trace file (Arrow IPC stream). ``constants`` are the
    columns that hold one value in every row the writer writes (run, rank, host, ...).

    Opening an existing file (an attempt that restarted without a checkpoint to trim to) keeps its
    complete messages, cuts a torn tail off, and appends after them."""

    def __init__(
        self, path: Path, columns: dict[str, str], constants: Mapping[str, Any] | None = None
    ) -> None:
        self.path = path
        self.schema = arrow_schema(columns)
        self.constants = {
            f.name: pa.scalar(constants[f.name], type=f.type)
            for f in self.schema
            if constants and f.name in constants
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab")
        known = None
        if self._file.tell():
            end, known = _complete_length(path)
            if end < self._file.tell():
                self._file.truncate(end)
                self._file.seek(end)
        if known is None or not known.equals(self.schema, check_metadata=True):
            self._write(self.schema.serialize())
        # pyarrow's first conversion of Python values sets up its pandas shim (milliseconds, or
        # 0.3 s where pandas is not imported yet): pay it here, before the run's clock starts.
        pa.array([], type=pa.float64())

    def _write(self, message: Any) -> None:
        self._file.write(message)
        self._file.flush()

    def write(self, values: Mapping[str, Sequence[Any]], rows: int) -> None:
        """Append one batch of ``rows`` rows: ``values`` maps each column that is not a constant
        to its values (a sequence or a NumPy array); a column in neither is null."""
        if rows <= 0:
            return
        arrays = []
        for f in self.schema:
            if f.name in values:
                arrays.append(pa.array(values[f.name], type=f.type))
            elif f.name in self.constants:
                arrays.append(pa.repeat(self.constants[f.name], rows))
            else:
                arrays.append(pa.nulls(rows, f.type))
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        self._write(batch.serialize())

    @property
    def closed(self) -> bool:
        return self._file.closed

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
