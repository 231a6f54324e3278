"""A live run monitor for notebooks: status, progress, throughput and loss of one run.

It reads the run's streaming trace files (an Arrow stream per rank while the run is live, Parquet
after), so it works for any executor and never polls a scheduler. No torch at import time.
"""

from __future__ import annotations

import html
import math
import threading
import time
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import pandas as pd

from workbench import schema
from workbench.analysis.measured.units import rate, ratio
from workbench.analysis.measured.windows import measured_window
from workbench.config.run_config import RunConfig
from workbench.run.handle import RunHandle
from workbench.store.arrow_stream import read_messages
from workbench.store.files import read_json
from workbench.ui import progress

FINAL_STATUSES = ("completed", "failed", "cancelled", "preempted")
#: The colour of a rank that falls behind (its bar is ipywidgets' "warning" orange).
LAG_COLOR = "#c60"


def _fixed(text: str, chars: int) -> widgets.Label:
    """A label of a fixed width in a monospace font: its neighbours stay put as its text
    changes."""
    return widgets.Label(
        text,
        layout=widgets.Layout(width=f"{chars}ch", overflow="hidden"),
        style={"font_family": "monospace"},
    )


class _TraceTail:
    """The step rows of one run so far, read incrementally: a rank's live Arrow stream from the
    byte offset after its last complete batch (JSONL, in runs from before the stream, from the
    end of its last complete line), and its Parquet file again only when it changed. Rows are
    keyed by (attempt, step), so a row seen in two files (during consolidation) counts once."""

    _KEEP = (
        "rank",
        "world_size",
        "attempt",
        "step",
        "warmup",
        "t_start_s",
        "step_s",
        "samples",
        "loss",
        "run_id",
        # for the straggler test (analysis.stragglers): compute time and its phases
        "host",
        "data_s",
        "forward_s",
        "backward_s",
        "optimizer_s",
        "comm_s",
    )

    def __init__(self, traces_dir: Path) -> None:
        self.dir = traces_dir
        self._parquet: dict[Path, tuple[tuple[float, int], dict[tuple[int, int], dict]]] = {}
        # live file -> (inode, offset after the last complete message or line, schema, rows)
        self._live: dict[Path, tuple[int, int, Any, dict[tuple[int, int], dict]]] = {}

    def _read_parquet(self, path: Path) -> dict[tuple[int, int], dict]:
        stamp = (path.stat().st_mtime, path.stat().st_size)
        cached = self._parquet.get(path)
        if cached is None or cached[0] != stamp:
            import pyarrow.parquet as pq

            table = pq.read_table(path, columns=[c for c in self._KEEP])
            rows = {(r["attempt"], r["step"]): r for r in table.to_pylist()}
            self._parquet[path] = cached = (stamp, rows)
            # A new Parquet file means the live files beside it were consolidated or trimmed
            # (then deleted, and perhaps made anew): read those from the start again.
            for live in self._live_paths(path.name.split(".")[0]):
                self._live.pop(live, None)
        return cached[1]

    def _live_paths(self, stem: str) -> list[Path]:
        return [self.dir / f"{stem}.{s}" for s in (schema.LIVE_SUFFIX, schema.LEGACY_LIVE_SUFFIX)]

    def _read_live(self, path: Path) -> dict[tuple[int, int], dict]:
        stat = path.stat()
        inode, offset, known, rows = self._live.get(path, (stat.st_ino, 0, None, {}))
        if inode != stat.st_ino or stat.st_size < offset:  # rewritten: read it afresh
            offset, known, rows = 0, None, {}
        if stat.st_size > offset:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            if path.suffix == f".{schema.LIVE_SUFFIX}":
                used, known = self._add_batches(chunk, known, rows)
            else:
                used = self._add_lines(chunk, rows)
            offset += used
        self._live[path] = (stat.st_ino, offset, known, rows)
        return rows

    def _add_batches(self, chunk: bytes, known: Any, rows: dict) -> tuple[int, Any]:
        """Rows of the complete record batches in ``chunk``; (bytes they take, the schema)."""
        batches, used, known = read_messages(chunk, known)
        for batch in batches:
            for r in batch.select(list(self._KEEP)).to_pylist():
                rows[(r["attempt"], r["step"])] = r
        return used, known

    def _add_lines(self, chunk: bytes, rows: dict) -> int:
        """Rows of the complete JSONL lines in ``chunk``; the bytes they take."""
        import json

        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits
        for line in complete.splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            rows[(r.get("attempt", 0), r["step"])] = {k: r.get(k) for k in self._KEEP}
        return len(complete)

    def frame(self) -> pd.DataFrame:
        """Every step row so far (the monitor's columns only)."""
        rows: list[dict] = []
        stems = {p.name.split(".")[0] for p in self.dir.glob("steps-rank*.*")}
        for stem in sorted(stems):
            merged: dict[tuple[int, int], dict] = {}
            parquet = self.dir / f"{stem}.{schema.FINAL_SUFFIX}"
            for path in (parquet, *self._live_paths(stem)):
                reader = self._read_parquet if path == parquet else self._read_live
                try:
                    merged.update(reader(path))
                except FileNotFoundError:  # consolidated (live file gone) or not written yet
                    self._live.pop(path, None)
            rows.extend(merged.values())
        return pd.DataFrame(rows, columns=list(self._KEEP))


class RunMonitor(widgets.VBox):
    """Live progress of one run from its trace files: a bar per rank (steps done of
    ``config.total_steps``, a rank that falls behind in orange), the status (while starting, how
    many ranks are ready), elapsed time, steps per second, the time left, throughput over the
    measured window and the latest loss with a sparkline of its recent trend.

    ``run`` is a :class:`RunHandle` or a run folder. The status comes from the store (the ranks'
    own records), never from a scheduler, so it works for local and Slurm runs alike.
    """

    def __init__(self, run: RunHandle | str | Path, poll_s: float = 1.0) -> None:
        self.handle = run if isinstance(run, RunHandle) else None
        self.path = Path(run.path if isinstance(run, RunHandle) else run)
        self.config = RunConfig.load(self.path / schema.CONFIG_FILE)
        self.poll_s = poll_s
        self.total_steps = self.config.total_steps
        # A handle without a job: status() reads the store and the ranks' pids, nothing else.
        self._status_source = self.handle or RunHandle(self.path, self.config, None)
        self._tail = _TraceTail(self.path / schema.TRACES_DIR)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._opened = time.time()  # elapsed counts from here when run.json has no submit time
        self.status = "pending"
        self.steps_done: dict[int, int] = {}
        self.ranks_ready = 0
        self.samples_per_s: float | None = None
        self.steps_per_s: float | None = None
        self.eta_s: float | None = None
        self.elapsed_s: float | None = None
        self.latest_loss: float | None = None
        self.lagging: dict[int, str] = {}  # rank -> why it is highlighted
        self.error: str | None = None
        self._build()

    def _build(self) -> None:
        """The widgets: fixed widths and a monospace font, so nothing moves as the text changes."""
        world = self.config.processes  # ranks that trace: 1 for DataParallel over N devices
        self.bars = [
            widgets.IntProgress(value=0, min=0, max=self.total_steps or 1, description=f"rank {r}")
            for r in range(world)
        ]
        self.bar_labels = [_fixed(f"0 / {self._of()}", 34) for _ in range(world)]
        steps = (
            "steps set by the script" if self.total_steps is None else f"{self.total_steps} steps"
        )
        self.title = widgets.HTML(
            f"<b>{html.escape(self.path.name)}</b> &nbsp; sweep {html.escape(self.config.sweep)},"
            f" {self.config.model}, {world} rank(s), {steps}"
        )
        self.status_label = _fixed("status: pending", 36)
        self.elapsed_label = _fixed("elapsed -", 17)
        self.rate_label = _fixed("- steps/s", 17)
        self.eta_label = _fixed("ETA -", 14)
        self.throughput_label = _fixed("throughput: -", 36)
        self.loss_label = _fixed("loss: -", 17)
        self.loss_spark = _fixed("", progress.SPARK_STEPS + 2)
        self.failure_label = widgets.HTML()
        rows = [widgets.HBox([b, lab]) for b, lab in zip(self.bars, self.bar_labels, strict=True)]
        facts = [
            widgets.HBox([self.status_label, self.elapsed_label, self.rate_label, self.eta_label]),
            widgets.HBox([self.throughput_label, self.loss_label, self.loss_spark]),
        ]
        super().__init__([self.title, *rows, *facts, self.failure_label])

    @property
    def ended(self) -> bool:
        return self._final(self.status)

    def _final(self, status: str) -> bool:
        """Whether the run is over. "preempted" is final only once the run's record says it
        ended; until then the job is being requeued and will report "running" again."""
        if status != "preempted":
            return status in FINAL_STATUSES
        return read_json(self.path / schema.RUN_FILE).get("ended_at") is not None

    def refresh(self) -> str:
        """Read the store once and update the widgets; returns the status."""
        with self._lock:
            status = self._status_source.status()
            self.ranks_ready = len(self._status_source.rank_states())
            steps = self._tail.frame()
            self._measure(status, steps)
            self._show(steps)
            return status

    def _elapsed(self) -> float | None:
        """Seconds since the run was submitted, up to its end once it ended."""
        try:
            run = read_json(self.path / schema.RUN_FILE)
        except (OSError, ValueError):
            return None
        end = run.get("ended_at") if self._final(self.status) else None
        return (end or time.time()) - float(run.get("submitted_at") or self._opened)

    def _measure(self, status: str, steps: pd.DataFrame) -> None:
        """The figures the widgets show, from the status and the step rows so far."""
        self.status = status
        self.elapsed_s = self._elapsed()
        if len(steps):
            done = steps.groupby("rank")["step"].max()
            self.steps_done = {int(r): int(s) for r, s in done.items()}
            window = measured_window(steps)
            rate = float(window["samples_per_s"].iloc[0]) if len(window) else float("nan")
            self.samples_per_s = None if pd.isna(rate) else rate
            last = steps[steps["step"] == steps["step"].max()]
            loss = last["loss"].astype("float64").mean()
            self.latest_loss = None if pd.isna(loss) else float(loss)
            self.steps_per_s = progress.steps_per_s(steps)
        world = len(self.bars)
        slowest = min((self.steps_done.get(r, 0) for r in range(world)), default=0)
        running = status == "running"
        total = self.total_steps
        self.eta_s = progress.eta_s(slowest, total, self.steps_per_s) if running and total else None
        self.lagging = {}
        if running and self.steps_per_s:
            # rows reach the files once per flush (the latest held back): lag within that is not
            allowance = 2 + math.ceil(self.steps_per_s * self.config.trace_flush_s)
            for rank in progress.behind(self.steps_done, world, allowance):
                self.lagging[rank] = f"behind: {max(self.steps_done.values())} on the lead rank"
        if running:
            for rank, times in progress.slow_ranks(steps).items():
                self.lagging.setdefault(rank, f"slow: {ratio(times)} the others' compute")

    def _of(self) -> str:
        """The steps a rank makes, or ``?`` where a script decides."""
        return "?" if self.total_steps is None else str(self.total_steps)

    def _status_text(self) -> str:
        """``status: ...``; before the first step row, how many ranks have started."""
        if self.status in ("pending", "running") and not self.steps_done:
            world = len(self.bars)
            return f"status: starting, {self.ranks_ready}/{world} ranks ready"
        return f"status: {self.status}"

    def _show(self, steps: pd.DataFrame) -> None:
        style = {"completed": "success", "failed": "danger"}.get(self.status, "")
        for rank, (bar, label) in enumerate(zip(self.bars, self.bar_labels, strict=True)):
            done = self.steps_done.get(rank, 0)
            if self.total_steps is None:  # a script: the bar fills with the lead rank's steps
                bar.max = max(1, *self.steps_done.values()) if self.steps_done else 1
            bar.value = min(done, bar.max)
            why = self.lagging.get(rank)
            bar.bar_style = "warning" if why else style
            label.value = f"{done} / {self._of()}"
            label.value += f"  {why}" if why else ""
            label.style.text_color = LAG_COLOR if why else None
        self.status_label.value = self._status_text()
        self.elapsed_label.value = f"elapsed {progress.clock(self.elapsed_s)}"
        per_s = f"{self.steps_per_s:.3g}" if self.steps_per_s else "-"
        self.rate_label.value = f"{per_s} steps/s"
        self.eta_label.value = f"ETA {progress.clock(self.eta_s)}"
        if self.samples_per_s is not None:
            self.throughput_label.value = f"throughput: {rate(self.samples_per_s)}"
        if self.latest_loss is not None:
            self.loss_label.value = f"loss: {self.latest_loss:.4g}"
            self.loss_spark.value = progress.sparkline(progress.loss_trend(steps))
        failure = self._failure_text() if self.status == "failed" else None
        notes = [f"failed: {failure}"] if failure else []
        notes += [f"monitor: {self.error}"] if self.error else []
        self.failure_label.value = "<br>".join(
            f'<span style="color:#b00020">{html.escape(n)}</span>' for n in notes
        )

    def _failure_text(self) -> str | None:
        try:
            failure = read_json(self.path / schema.RUN_FILE).get("failure") or {}
        except (OSError, ValueError):
            return None
        if failure.get("exception"):
            return f"rank {failure.get('rank')}: {failure['exception']}"
        return None

    def _finish(self) -> None:
        """With a handle, let it record the outcome in run.json (status, summary) and clean up;
        the ranks are done by now, so this returns promptly."""
        if self.handle is not None:
            try:
                self.handle.wait(raise_on_failure=False)
            except Exception as exc:  # the monitor reports; it must not raise from a thread
                self.error = f"{type(exc).__name__}: {exc}"
        self.refresh()

    def wait(self, timeout_s: float | None = None) -> None:
        """Poll until the run ends (``TimeoutError`` after ``timeout_s``; the run goes on), then
        refresh a last time. The final status is :attr:`status`: nothing is returned, so a
        notebook cell that ends in ``monitor.wait()`` echoes nothing under the widget."""
        self.stop()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._final(self.refresh()):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.path.name} still {self.status} after {timeout_s} s")
            time.sleep(self.poll_s)
        self._finish()

    def start(self) -> RunMonitor:
        """Poll in a background thread until the run ends (or :meth:`stop`); returns self."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    if self._final(self.refresh()):
                        self._finish()
                        return
                except Exception as exc:  # a torn file or a vanished folder: show, keep polling
                    self.error = f"{type(exc).__name__}: {exc}"
                self._stop.wait(self.poll_s)

        self._thread = threading.Thread(target=loop, name=f"monitor-{self.path.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop background polling (the run itself goes on)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._thread = None
