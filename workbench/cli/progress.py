"""Live progress while the terminal waits for a run: steps done of the run's total, steps/s and
time left (tqdm's), the run's status (pending while its ranks start) and latest loss, on stderr;
and while it waits for a report of a large sweep (:func:`report_bar`: step rows analysed, rows/s
and time left, the stage).

Progress is read from the run's trace files, as the notebook monitor does, never from the
scheduler. In a terminal the bar redraws in place about once a second; elsewhere (a CI log,
papermill) it writes a plain line about every :data:`LOG_EVERY_S` seconds, so a log still shows
that the run moves without filling up."""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from workbench.run.handle import RunHandle

#: Seconds between progress lines when stderr is no terminal.
LOG_EVERY_S = 5.0
#: Seconds between reads of the traces in a terminal (a read costs a few ms on a small run).
POLL_S = 1.0
#: Seconds a report runs before its bar shows: a small sweep's report, done by then, shows none.
REPORT_DELAY_S = 2.0
#: Reading the traces may take this share of one core at most: a long run's traces take longer
#: to read, so they are read less often, leaving the cores to the ranks being measured.
READ_SHARE = 0.05


class _Lines:
    """A stream for tqdm that turns each redraw (``\\r`` + the bar) into one line of its own, for
    logs that do not interpret ``\\r``."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _read(handle: RunHandle) -> tuple[int, float | None, str]:
    """Steps all ranks have finished (the slowest rank's latest step), the latest step's mean
    loss and the run's status."""
    from workbench.store.load import load_traces

    status = handle.status()
    steps = load_traces(handle.path, "steps")
    if not len(steps):
        return 0, None, status
    latest = steps.groupby("rank")["step"].max()
    done = int(latest.min()) if len(latest) >= handle.config.processes else 0
    last = steps[steps["step"] == steps["step"].max()]["loss"].astype("float64").mean()
    return done, None if math.isnan(last) else float(last), status


def _show(bar: Any, handle: RunHandle) -> float:
    """Read the run once and move the bar; the seconds the read took."""
    started = time.monotonic()
    done, loss, status = _read(handle)
    postfix = [status]
    if loss is not None:
        postfix.append(f"loss {loss:.4f}")
    bar.set_postfix_str(", ".join(postfix), refresh=False)
    bar.update(max(0, min(done, bar.total) - bar.n))
    return time.monotonic() - started


def wait(handle: RunHandle, desc: str = "steps", progress: bool = True) -> str:
    """``handle.wait()`` (same result, same exceptions) with a progress bar on stderr while it
    waits (none when ``progress`` is false)."""
    if not progress:
        return handle.wait()
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    bar = tqdm(
        total=handle.config.total_steps,
        desc=desc,
        unit="step",
        file=sys.stderr if tty else _Lines(sys.stderr),
        mininterval=POLL_S if tty else LOG_EVERY_S,
        dynamic_ncols=tty,
        ascii=None if tty else True,
        postfix="starting",
    )
    stop = threading.Event()

    def follow() -> None:
        while not stop.is_set():
            try:
                took = _show(bar, handle)
            except Exception:  # a torn or vanishing file: the next read will do
                took = 0.0
            stop.wait(max(POLL_S, took / READ_SHARE))

    thread = threading.Thread(target=follow, name=f"progress-{handle.run_id}", daemon=True)
    thread.start()
    try:
        return handle.wait()
    finally:
        stop.set()
        thread.join(timeout=30)
        try:
            _show(bar, handle)
        except Exception:
            pass
        if not tty:
            bar.refresh()  # the last line carries the run's final status, even at the same count
            bar.leave = False  # a log has that line already: no second copy at close
        bar.close()


@contextmanager
def report_bar(progress: bool = True) -> Iterator[Any]:
    """A bar on stderr for :func:`workbench.ui.report.report_from_store`'s ``progress`` (yields
    None when ``progress`` is false): the stage, step rows analysed of the store's (a row counts
    once it has been through every pass, so the rate is the report's own), rows/s and time left.
    It shows after :data:`REPORT_DELAY_S`, then redraws every second in a terminal, or writes a
    line every :data:`LOG_EVERY_S` seconds elsewhere, between the stages too (one pass over 100
    M rows takes half a minute)."""
    if not progress:
        yield None
        return
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    every = POLL_S if tty else LOG_EVERY_S
    bar = tqdm(
        total=0,
        desc="report: opening the traces",  # their footers: the rows, before the first pass
        unit=" rows",
        unit_scale=True,
        file=sys.stderr if tty else _Lines(sys.stderr),
        mininterval=every,
        delay=REPORT_DELAY_S,
        dynamic_ncols=tty,
        ascii=None if tty else True,
    )
    lock = threading.Lock()
    stop = threading.Event()

    def tell(stage: str, done: float, rows: int) -> None:
        with lock:
            bar.total = rows
            bar.set_description_str(f"report: {stage}", refresh=False)
            bar.update(max(0, round(done * rows) - bar.n))

    def tick() -> None:  # the time goes on within a pass: redraw it when nothing else did
        while not stop.wait(every / 4):
            now = time.time()
            if now - bar.start_t >= REPORT_DELAY_S and now - bar.last_print_t >= every:
                with lock:
                    bar.refresh()
                    bar.last_print_t = now

    thread = threading.Thread(target=tick, name="progress-report", daemon=True)
    thread.start()
    try:
        yield tell
    finally:
        stop.set()
        thread.join(timeout=30)
        bar.close()
