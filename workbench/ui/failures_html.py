"""The report's section on the runs that failed: each run's failure as recorded, the paragraph
that explains a hang first (``run.json``'s ``failure``), and where its log is."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from workbench import schema
from workbench.store.files import read_json


def failures_html(runs: pd.DataFrame) -> str:
    """An HTML section listing the failed runs of ``runs`` (``load_runs``'s frame) with their
    failures; empty where none failed."""
    if not {"status", "path", "run_id"} <= set(runs.columns):  # a frame not from a store
        return ""
    failed = runs[runs["status"] == "failed"]
    items = []
    for _, run in failed.sort_values("run_id").iterrows():
        failure = read_json(Path(run["path"]) / schema.RUN_FILE).get("failure") or {}
        said = failure.get("exception") or "no rank said why"
        log = failure.get("log_path")
        where = f'<br><span class="muted">log: {html.escape(log)}</span>' if log else ""
        items.append(
            f"<li><b>{html.escape(str(run['run_id']))}</b>, rank {failure.get('rank', '?')}: "
            f"{html.escape(str(said))}{where}</li>"
        )
    if not items:
        return ""
    count = f"{len(items)} run{'s' if len(items) > 1 else ''} failed"
    return f'<section id="failures"><h2>{count}</h2><ul>{"".join(items)}</ul></section>'
