"""What ``workbench tune`` left beside a run: ``tune.json`` in the run's folder (the last tune of
that run), read back for the finding and the report."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from workbench.store.files import read_json

#: The file a tune writes in its base run's folder.
TUNE_FILE = "tune.json"


def load_tunes(run_paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """The tunes of these runs (their folders), in the order given; runs never tuned are left
    out."""
    out = []
    for path in run_paths:
        file = Path(path) / TUNE_FILE
        if file.is_file():
            out.append(read_json(file))
    return out
