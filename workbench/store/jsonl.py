"""JSONL trace files: one writer per rank and kind that flushes on a time budget, and a reader that
skips a torn last line (a crash mid-write). No torch, no pandas."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class TraceWriter:
    """Appends rows to one JSONL file and flushes at least every ``flush_s`` seconds."""

    def __init__(self, path: Path, flush_s: float, max_rows: int = 2000) -> None:
        self.path = path
        self.flush_s = flush_s
        self.max_rows = max_rows
        self._rows: list[dict[str, Any]] = []
        self._last_flush = time.monotonic()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")

    def add(self, row: dict[str, Any]) -> None:
        self._rows.append(row)
        if len(self._rows) >= self.max_rows or time.monotonic() - self._last_flush >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        if self._rows:
            self._file.write("".join(json.dumps(r) + "\n" for r in self._rows))
            self._rows.clear()
        self._file.flush()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a JSONL trace; a torn last line (a crash mid-write) is skipped."""
    if not path.exists():
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
