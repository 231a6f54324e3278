"""JSONL trace files, as the previous version of the tracer wrote them while a rank ran: read, so
that older run folders still load and consolidate; never written any more (live traces are Arrow
streams, ``arrow_stream``). No torch, no pandas."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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
