"""Tables for a terminal: one unit per column, numbers as people write them (``15,290/s``,
``1.45`` ms, ``78 %``), never in exponent form, and no index row."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import pandas as pd

from workbench.analysis.measured.units import gib, number, percent, rate, seconds
from workbench.analysis.throughput.fsdp_comm import KINDS, size
from workbench.analysis.throughput.memory import MEMORY_WORDS

#: Per-rank phase columns and their headers; the values are shown in milliseconds.
PHASE_HEADERS = {
    "data_s": "data",
    "forward_s": "forward",
    "backward_s": "backward",
    "optimizer_s": "optimizer",
    "comm_s": "comm",
    "all_gather_exposed_s": "all-gather exposed",
    "reduce_scatter_exposed_s": "reduce-scatter exposed",
    "step_s": "step",
}
#: ``workbench ls``: the run columns shown (those present) and their headers.
RUN_HEADERS = {
    "sweep": "sweep",
    "run_id": "run",
    "status": "status",
    "model": "model",
    "world_size": "ranks",
    "per_device_batch_size": "batch/device",
    "precision": "precision",
    "samples_per_s": "samples/s",
    "final_loss": "loss",
    "final_metric": "metric",
    "failure": "why it failed",
}


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, numbers.Real) and math.isnan(value))


def cell(value: Any, fmt: Callable[[float], str] = number) -> str:
    """One cell: ``-`` when missing, a number through ``fmt``, anything else as text."""
    if _missing(value):
        return "-"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return str(value)
    return fmt(float(value))


def count(value: float) -> str:
    """A whole number (a float column holds them where some rows lack one): ``1,024``."""
    return f"{int(value):,}"


def text_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], left: Collection[int] = ()
) -> str:
    """Columns two spaces apart: those numbered in ``left`` aligned left (names), the others
    right (numbers)."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def per_rank_text(table: pd.DataFrame) -> str:
    """``analysis.throughput.summary.per_rank_table``'s frame for people: one row per rank, the
    phase means in ms (FSDP's exposed all-gathers and reduce-scatters where traced, instead of
    the allreduce's column), samples/s and peak RSS."""
    fsdp = "all_gather_exposed_s" in table.columns  # no allreduce: no comm column
    phases = [
        c
        for c in PHASE_HEADERS
        if c in table.columns and not (fsdp and c == "comm_s" and table[c].isna().all())
    ]
    headers = ["rank", *(PHASE_HEADERS[c] for c in phases), "samples/s", "peak RSS"]
    rows = []
    for rank, row in table.iterrows():
        ms = [cell(None if _missing(row[c]) else row[c] * 1e3) for c in phases]
        rss = row.get("peak_rss_mib")
        rows.append(
            [
                str(rank),
                *ms,
                cell(row.get("samples_per_s"), rate),
                cell(None if _missing(rss) else rss * 2**20, gib),
            ]
        )
    return text_table(headers, rows)


def runs_text(runs: pd.DataFrame) -> str:
    """``store.load.load_runs``'s frame for people: the :data:`RUN_HEADERS` columns it has; an
    accuracy as a percentage, the metric's header its name when all runs share one."""
    columns = [c for c in RUN_HEADERS if c in runs.columns]
    if "failure" in columns and runs["failure"].isna().all():
        columns.remove("failure")  # no run failed: no column of dashes
    names = runs["final_metric_name"].dropna().unique() if "final_metric_name" in runs else []
    headers = [RUN_HEADERS[c] for c in columns]
    if "final_metric" in columns and len(names) == 1:
        headers[columns.index("final_metric")] = str(names[0])
    rows = []
    for _, run in runs.iterrows():
        accuracy = run.get("final_metric_name") == "accuracy"
        fmts: dict[str, Callable[[float], str]] = {
            "world_size": count,
            "per_device_batch_size": count,
            "samples_per_s": rate,
            "final_metric": percent if accuracy else number,
        }
        rows.append([cell(run[c], fmts.get(c, number)) for c in columns])
    text = ("sweep", "run_id", "status", "model", "precision", "failure")
    return text_table(headers, rows, left=[i for i, c in enumerate(columns) if c in text])


#: What each of FSDP's collectives does to its bytes, in words.
MOVED = {"all_gather": "gathered", "reduce_scatter": "reduce-scattered"}


def fsdp_text(summary: Mapping[str, Any]) -> str | None:
    """A run summary's FSDP communication for people (None where FSDP's collectives were not
    traced; ``none`` where they moved nothing): ``exposed all-gather 150 ms (12 %; hidden 50
    ms), exposed reduce-scatter ...``, and the bytes and calls a step."""
    step = summary.get("mean_step_s")
    said, moved, known = [], [], False
    for kind, words in KINDS.items():
        total, exposed = summary.get(f"mean_{kind}_s"), summary.get(f"mean_{kind}_exposed_s")
        nbytes, calls = summary.get(f"mean_{kind}_bytes"), summary.get(f"mean_{kind}_calls")
        known = known or not (_missing(total) and _missing(nbytes))
        if not nbytes and not calls:  # none traced, or none at one rank
            continue
        if not _missing(exposed):
            share = percent(exposed / step) if not _missing(step) and step > 0 else "n/a"
            hidden = "n/a" if _missing(total) else max(total - exposed, 0.0)
            hidden = seconds(hidden) if hidden else "0"
            said.append(f"exposed {words} {seconds(exposed)} ({share}; hidden {hidden})")
        elif not _missing(total):
            said.append(f"{words} {seconds(total)} (exposed part not seen)")
        if not _missing(nbytes):
            n = "" if _missing(calls) else f" in {number(calls, trim=True)} calls"
            moved.append(f"{size(nbytes)} {MOVED[kind]}{n}")
    if not known:
        return None
    if not said and not moved:
        return "FSDP communication a step: none (one rank gathers and reduces nothing)"
    text = "FSDP communication a step: " + (", ".join(said) or "times not traced")
    return text + (f"; {', '.join(moved)} (each call's whole buffer)" if moved else "")


def memory_text(parts: Mapping[str, Mapping[str, Any]]) -> str | None:
    """``run.json``'s ``memory_parts`` (per rank: bytes of each part, counted at the first
    step) for people: the ranks that hold the same parts on one line; None where none counted."""
    lines: dict[str, list[str]] = {}
    for rank, p in sorted(parts.items(), key=lambda kv: int(kv[0])):
        if _missing(p.get("total_bytes")):
            continue
        words = [f"{w} {size(p[k])}" for k, w in MEMORY_WORDS.items() if not _missing(p.get(k))]
        total, saved = p["total_bytes"], p.get("activation_bytes")
        if saved is not None and not _missing(p.get("activation_samples")):
            total += saved
            words.append(
                f"activations {size(saved)} at a micro-batch of {p['activation_samples']:,}"
            )
        text = f"{size(total)} ({', '.join(words)})"
        if not _missing(p.get("gathered_param_bytes")):
            text += f", parameters gathered {size(p['gathered_param_bytes'])}"
        lines.setdefault(text, []).append(str(rank))
    if not lines:
        return None
    said = [
        f"{'rank' if len(r) == 1 else 'ranks'} {', '.join(r)}: {text}" for text, r in lines.items()
    ]
    return "memory per rank (counted): " + "; ".join(said)


def until_known_text(record: dict[str, Any]) -> str:
    """How a run measuring until known ended (``run.json``'s ``until_known``), in a line: known
    to +-x % after n steps, or known to +-x % only, at its step or time cap."""
    goal = percent(record["within"])
    half = record.get("half_width")
    known = "too few steps for an interval" if half is None else f"known to +-{percent(half)}"
    warm = record.get("warmup_detected") or 0
    found = f"; {warm} more warm-up steps found and left out" if warm else ""
    head, steps = f"measured until known (+-{goal}): {known}", number(record["steps"])
    if record.get("stopped_by") == "known":
        return f"{head} after {steps} steps{found}"
    if record.get("note"):  # known, but the script's loop could not be ended from outside
        return f"{head} after {steps} steps: {record['note']}{found}"
    if record.get("stopped_by") == "time cap":
        cap = f"time cap of {seconds(record['cap_s'])}"
    elif record.get("stopped_by") == "step cap":
        cap = f"cap of {number(record['cap_steps'])} steps"
    else:
        cap = "the script's own end"
    return f"{head} only: {cap} ({steps} steps){found}"
