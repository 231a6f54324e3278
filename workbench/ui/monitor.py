"""A live run monitor for notebooks: status, progress, throughput and loss of one run.

It reads the run's streaming trace files (an Arrow stream per rank while the run is live, Parquet
after), so it works for any executor and never polls a scheduler. No torch at import time.
"""

from __future__ import annotations

import html
import threading
import time
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import pandas as pd

from workbench import schema
from workbench.analysis.windows import measured_window
from workbench.config.run_config import RunConfig
from workbench.run.handle import RunHandle
from workbench.store.arrow_stream import read_messages
from workbench.store.files import read_json

FINAL_STATUSES = ("completed", "failed", "cancelled", "preempted")


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
    ``config.total_steps``), throughput over the measured window, the latest loss and the status.

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
        self.status = "pending"
        self.steps_done: dict[int, int] = {}
        self.samples_per_s: float | None = None
        self.latest_loss: float | None = None
        self.error: str | None = None
        world = self.config.processes  # ranks that trace: 1 for DataParallel over N devices
        self.bars = [
            widgets.IntProgress(value=0, min=0, max=self.total_steps, description=f"rank {r}")
            for r in range(world)
        ]
        self.bar_labels = [widgets.Label(f"0 / {self.total_steps}") for _ in range(world)]
        self.title = widgets.HTML(
            f"<b>{html.escape(self.path.name)}</b> &nbsp; sweep {html.escape(self.config.sweep)},"
            f" {self.config.model}, {world} rank(s), {self.total_steps} steps"
        )
        self.status_label = widgets.Label("status: pending")
        self.throughput_label = widgets.Label("throughput: -")
        self.loss_label = widgets.Label("loss: -")
        rows = [widgets.HBox([b, lab]) for b, lab in zip(self.bars, self.bar_labels, strict=True)]
        facts = widgets.HBox(
            [self.status_label, self.throughput_label, self.loss_label],
            layout=widgets.Layout(justify_content="space-between", width="600px"),
        )
        super().__init__([self.title, *rows, facts])

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
            steps = self._tail.frame()
            self._show(status, steps)
            return status

    def _show(self, status: str, steps: pd.DataFrame) -> None:
        self.status = status
        if len(steps):
            done = steps.groupby("rank")["step"].max()
            self.steps_done = {int(r): int(s) for r, s in done.items()}
            window = measured_window(steps)
            rate = float(window["samples_per_s"].iloc[0]) if len(window) else float("nan")
            self.samples_per_s = None if pd.isna(rate) else rate
            last = steps[steps["step"] == steps["step"].max()]
            loss = last["loss"].astype("float64").mean()
            self.latest_loss = None if pd.isna(loss) else float(loss)
        for rank, (bar, label) in enumerate(zip(self.bars, self.bar_labels, strict=True)):
            bar.value = min(self.steps_done.get(rank, 0), self.total_steps)
            bar.bar_style = {"completed": "success", "failed": "danger"}.get(status, "")
            label.value = f"{self.steps_done.get(rank, 0)} / {self.total_steps}"
        self.status_label.value = f"status: {status}"
        if self.samples_per_s is not None:
            self.throughput_label.value = f"throughput: {self.samples_per_s:,.1f} samples/s"
        if self.latest_loss is not None:
            self.loss_label.value = f"loss: {self.latest_loss:.4g}"
        if status == "failed":
            failure = self._failure_text()
            self.status_label.value = f"status: failed ({failure})" if failure else "status: failed"
        if self.error:
            self.status_label.value += f" (monitor: {self.error})"

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

    def wait(self, timeout_s: float | None = None) -> str:
        """Poll until the run ends (``TimeoutError`` after ``timeout_s``; the run goes on), then
        refresh a last time. Returns the final status."""
        self.stop()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._final(self.refresh()):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.path.name} still {self.status} after {timeout_s} s")
            time.sleep(self.poll_s)
        self._finish()
        return self.status

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
