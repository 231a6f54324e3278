"""Watching a launched run: status from the store, wait, cancel, results, logs, traces.

A handle works from the store (each rank's own status record and trace files) and its executor's
back end (whether the job still runs: submitit's controller locally, a gentle ``squeue`` on
Slurm); a new session re-attaches to a run with :func:`attach`. What the rank records say (the
status, the root cause of a failure) is :mod:`workbench.run.failure`; finding and ending
processes is :mod:`workbench.run.processes`.
"""

from __future__ import annotations

import os
import signal
import time
import warnings
from pathlib import Path
from typing import Any

from workbench import schema
from workbench.analysis.run_digests import digest_at_end
from workbench.analysis.throughput.summary import run_summary
from workbench.config.run_config import RunConfig
from workbench.errors import RunFailedError, StoreFullError
from workbench.run import processes
from workbench.run.backends import backend
from workbench.run.failure import (
    EXIT_TAIL_LINES,
    disk_full_failure,
    exit_warnings,
    final_status,
    last_lines,
    live_status,
    rank_measurements,
    root_cause,
)
from workbench.run.hang_words import Hang, explain_hang
from workbench.store.files import read_json, read_rank_states, release_space, update_run
from workbench.store.flight_file import flight_path, read_flight, read_nccl_dump
from workbench.store.load import load_traces
from workbench.store.run_status import rank_gone

#: After the first rank fails, how long its peers get to fail on their own before the job is killed.
FAILURE_GRACE_S = 10.0
#: After asking hung ranks for their stacks (SIGUSR1), how long they get to write them.
STACK_DUMP_S = 1.0


def attach(run_path: str | Path) -> RunHandle:
    """A handle on a run launched earlier, perhaps from another kernel or machine: status, wait,
    cancel and traces work from the store (and the scheduler, for Slurm jobs)."""
    path = Path(run_path)
    run = read_json(path / schema.RUN_FILE)
    return RunHandle(
        path,
        RunConfig.from_dict(run["config"]),
        None,
        run.get("executor", "local"),
        job_id=run.get("job_id"),
    )


class RunHandle:
    """A launched run: status, wait, cancel, per-rank results and logs, traces."""

    def __init__(
        self,
        run_path: Path,
        config: RunConfig,
        job: Any,
        executor: str = "local",
        job_id: str | None = None,
        poll_s: float = 30.0,
    ) -> None:
        self.path = run_path
        self.config = config
        self.job = job
        self.executor = executor
        self.job_id = str(job.job_id) if job is not None else job_id
        self.run_id = run_path.name
        self.backend = backend(executor)
        self.watch = self.backend.watch(job, self.job_id, poll_s)
        self._first_failure_seen: float | None = None
        self._hung: list[int] = []
        #: The run's end where even a freed reserve left no room to record it (a full disk).
        self._unrecorded: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r}, status={self.status()!r}, path={str(self.path)!r})"

    # -- observation
    def rank_states(self) -> dict[int, dict[str, Any]]:
        """Each rank's own record; a rank whose process died here without reporting is marked
        ``died`` (killed by a signal or ``os._exit``)."""
        states = read_rank_states(self.path)
        for state in states.values():
            if rank_gone(state):  # the store's rule, which ``workbench ls`` follows too
                state["status"] = "died"
        return states

    def status(self) -> str:
        """pending, running, completed, failed, preempted or cancelled (final once ``wait``
        returned)."""
        run = read_json(self.path / schema.RUN_FILE)
        if run.get("ended_at") is not None:
            return str(run["status"])
        return live_status(self.rank_states(), self.config.processes)

    def _ended(self) -> bool:
        """Whether run.json records the run's end."""
        return read_json(self.path / schema.RUN_FILE).get("ended_at") is not None

    def _job_running(self) -> bool:
        """Whether the executor says the job still runs."""
        return self.watch.running(self.rank_states(), self.config.processes)

    # -- control
    def wait(
        self, timeout_s: float | None = None, poll_s: float = 0.05, raise_on_failure: bool = True
    ) -> str:
        """Block until the run ends (or ``timeout_s`` passes: TimeoutError, the run goes on).
        The store is read every ``poll_s`` (0.2 ms a read here: a run's end is seen within 0.05 s
        for 0.4 % of a core; on Slurm, ``squeue`` is asked at its own, gentler pace).
        When one rank fails, its peers get ``FAILURE_GRACE_S`` to end on their own, then the job
        is killed, so a hung peer never holds the caller. Returns the final status; raises
        RunFailedError naming the root-cause rank when it failed (unless told not to)."""
        self.watch.settle()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._ended():
            status = self.status()
            if not self._job_running():
                self._finalize()
                break
            if status == "failed" and self._grace_over():
                self._dump_stuck_ranks()
                cause = self._failure()  # before the kill, whose signals ranks also report
                self._kill()
                self._finalize(failure=cause)
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.run_id} still {status} after {timeout_s} s")
            time.sleep(poll_s)
        final = self.status() if self._unrecorded is None else self._unrecorded["status"]
        if final == "failed" and raise_on_failure:
            raise self.failure_error()
        if self._unrecorded is not None:
            warnings.warn(f"run {self.run_id} {final}; {self._unrecorded_note()}", stacklevel=2)
        return final

    def _grace_over(self) -> bool:
        """Whether the first failure seen is older than ``FAILURE_GRACE_S``."""
        now = time.monotonic()
        self._first_failure_seen = self._first_failure_seen or now
        return now - self._first_failure_seen > FAILURE_GRACE_S

    def _dump_stuck_ranks(self) -> None:
        """Ranks still running (alive, on this host) while a peer has failed are hung: ask each
        for its stack traces (SIGUSR1, see the rank's task) before it is killed, so the failure
        record shows where it hung."""
        states = read_rank_states(self.path)
        self._hung = [
            rank
            for rank, s in states.items()
            if s["status"] == "running" and processes.rank_alive(s)
        ]
        processes.send((int(states[rank]["pid"]) for rank in self._hung), signal.SIGUSR1)
        if self._hung:
            time.sleep(STACK_DUMP_S)

    def cancel(self, timeout_s: float = 60.0) -> None:
        """Stop the run now and return once it is gone: the executor, asked afresh, says the job
        ended (on Slurm: ``squeue`` no longer lists it as active) and no process of the run is
        left on this machine. Only then does the store say ``cancelled``; traces written so far
        stay. After ``timeout_s`` a RuntimeError names what survived."""
        self.watch.cancel()
        deadline = time.monotonic() + timeout_s
        while True:
            left = self._kill_what_is_left()
            ended, said = self.watch.ended()
            if ended and not left:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"run {self.run_id} still there {timeout_s:g} s after cancel: "
                    f"processes {left or 'none'}, the executor says {said!r}"
                )
            time.sleep(0.2)
        self._finalize(status="cancelled")

    def _kill(self) -> None:
        """Cancel the job through its back end, then kill any rank left on this machine."""
        self.watch.cancel()
        self._kill_what_is_left()

    def _kill_what_is_left(self) -> list[int]:
        """SIGKILL the run's processes still alive here (recorded ranks, and those still
        starting, found by the run's logs folder on their command line); the pids still seen."""
        processes.kill_ranks(read_rank_states(self.path))
        processes.send(processes.pids_of_run(self.path))
        recorded = processes.live_ranks(read_rank_states(self.path))
        return sorted(set(recorded + processes.pids_of_run(self.path)))

    # -- results
    def _failure(self) -> dict[str, Any] | None:
        """The root cause as run.json records it, with the rank's log tail."""
        cause = root_cause(
            self.rank_states(),
            self.config.processes,
            hung=self._hung,
            collective_timeout_s=self.config.collective_timeout_s,
        )
        if cause is None:
            return None
        hang = self._hang()
        if hang is None or cause.own:  # a rank's own exception says it best
            log_path = self._log_path(cause.rank)
            record = cause.record(
                str(log_path) if log_path else None, self._tail(log_path, cause.tail_lines)
            )
            return record if hang is None else {**record, "hang": hang.record()}
        log_path = self._log_path(hang.rank)
        return {
            # no log tail: its last lines are a stack's outermost frames; the text has its top
            **cause.record(str(log_path) if log_path else None, None),
            "rank": hang.rank,
            "exception": hang.text,
            "traceback": self.rank_states().get(hang.rank, {}).get("traceback"),
            "hang": hang.record(),
            "first_error": {"rank": cause.rank, "exception": cause.exception},
        }

    def _hang(self) -> Hang | None:
        """What the ranks' flight records say happened (:mod:`workbench.run.hang_words`)."""
        processes = int(self.config.processes)
        folder = self.path / schema.FLIGHT_DIR
        records = {r: read_flight(flight_path(folder, r)) for r in range(processes)}
        for r, record in records.items():  # a rank NCCL's watchdog ended wrote its recorder
            if record is not None and record["dump"] is None:
                record["dump"] = read_nccl_dump(
                    self.path / schema.LOGS_DIR / f"nccl_trace_rank_{r}"
                )
        stacks = {r: self._tail(self._log_path(r), 200) for r in self._hung}
        try:
            return explain_hang(records, self.rank_states(), processes, stacks, time.time())
        except Exception as exc:  # the failure is still recorded, without its explanation
            warnings.warn(f"run {self.run_id}: the hang was not explained ({exc!r})", stacklevel=2)
            return None

    def failure_error(self) -> RunFailedError:
        """The run's failure as an exception (the recorded root cause, else one found now)."""
        unrecorded = self._unrecorded or {}
        f = (
            unrecorded.get("failure")
            or read_json(self.path / schema.RUN_FILE).get("failure")
            or self._failure()
            or {}
        )
        exception = f.get("exception")
        if unrecorded:
            exception = f"{exception}; {self._unrecorded_note()}"
        return RunFailedError(
            self.run_id,
            unrecorded.get("status") or self.status(),
            rank=f.get("rank"),
            exception=exception,
            traceback=f.get("traceback"),
            log_tail=f.get("log_tail"),
            log_path=f.get("log_path"),
        )

    def _finalize(self, status: str | None = None, failure: dict[str, Any] | None = None) -> None:
        """Record the run's end in run.json (see ``_end_fields``). On a full disk the run's
        reserve is given back and the end recorded with the failure saying so; where even that
        finds no room, the end stays unrecorded here (``wait`` raises with it) and the store
        lists the run from its ranks' records."""
        fields = self._end_fields(status, failure)
        try:
            update_run(self.path, **fields)
        except StoreFullError as full:
            release_space(self.path)
            fields = self._disk_full_fields(fields, full)
            try:
                update_run(self.path, **fields)
            except StoreFullError:
                self._unrecorded = fields
            return  # no digest: no room for it (its first reader builds it, or reads the rows)
        release_space(self.path)
        try:  # once, now that the run has ended: its reports read the digest, not the rows
            digest_at_end(self.path)
        except Exception as exc:  # its first reader builds it then, or reads the rows
            warnings.warn(f"run {self.run_id}: no digest written ({exc})", stacklevel=2)

    def _unrecorded_note(self) -> str:
        """What a caller is told when the run's end could not be recorded (a full disk)."""
        return (
            f"its end is not recorded in {self.path / schema.RUN_FILE} (no space left even "
            "for that): the store lists it from its ranks' records, and attach(path).wait() "
            "records it once space is freed"
        )

    def _end_fields(
        self, status: str | None = None, failure: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """What run.json records at the run's end: its status, root cause, hosts, each rank's
        device, crashes at exit and summary."""
        states = self.rank_states()
        status = status or final_status(states, self.config.processes)
        ended_at = time.time()
        fields: dict[str, Any] = {
            "status": status,
            "ended_at": ended_at,
            "device_s": self._device_s(states, ended_at),
            "hosts": sorted({s.get("host", "") for s in states.values()}),
            # What each rank ran on, as it saw it (the launcher never touches CUDA itself).
            "devices": {
                str(r): s["device_facts"] for r, s in states.items() if "device_facts" in s
            },
        }
        if status == "failed":
            fields["failure"] = failure or self._failure()
        tails = {
            rank: self._tail(self._log_path(rank), EXIT_TAIL_LINES)
            for rank, s in states.items()
            if s["status"] == "completed"
        }
        fields["exit_warnings"] = exit_warnings(states, tails)
        fields.update(rank_measurements(states))
        try:
            fields["summary"] = run_summary(
                load_traces(self.path, "steps"),
                load_traces(self.path, "eval"),
                writers=self.config.processes,
            )
        except Exception as exc:  # a summary must never hide the run's own outcome
            fields["summary_error"] = f"{type(exc).__name__}: {exc}"
        return fields

    def _device_s(self, states: dict[int, dict[str, Any]], ended_at: float) -> float | None:
        """Device-seconds the run held: its devices (one per rank) x the time from when they
        became its own (the back end says: submission, or a queued job's first rank) to its
        end; None where its submission is not recorded."""
        submitted = read_json(self.path / schema.RUN_FILE).get("submitted_at")
        if submitted is None:
            return None
        starts = [float(s["started_at"]) for s in states.values() if "started_at" in s]
        held_since = self.backend.held_since(float(submitted), starts)
        return self.config.processes * max(0.0, ended_at - held_since)

    def _disk_full_fields(self, fields: dict[str, Any], full: StoreFullError) -> dict[str, Any]:
        """The end's fields when the store's disk is full: a failure says so first (the ranks
        could write neither their records nor their logs, so their own words are missing)."""
        fields = {**fields, "disk_full": {"mount": full.mount, "free": full.free}}
        if fields["status"] == "failed":
            fields["failure"] = disk_full_failure(
                fields.get("failure"), full.mount, full.free, full.total, str(self.path)
            )
        return fields

    def result(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Wait, then return each rank's summary (index = rank); RunFailedError on failure."""
        self.wait(timeout_s)
        states = self.rank_states()
        return [states[r].get("summary", {}) for r in range(self.config.processes)]

    def _log_path(self, rank: int) -> Path | None:
        """The rank's stderr log of the latest attempt (None before it wrote one)."""
        run = read_json(self.path / schema.RUN_FILE)
        folder = Path(run.get("log_dir") or self.path / schema.LOGS_DIR)
        pattern = f"{self.job_id}_{rank}_log.err" if self.job_id else f"*_{rank}_log.err"
        logs = sorted(folder.glob(pattern), key=os.path.getmtime)
        return logs[-1] if logs else None

    @staticmethod
    def _tail(path: Path | None, lines: int) -> str | None:
        """A log file's last ``lines`` lines (None when there is none)."""
        if path is None or not path.exists():
            return None
        return last_lines(path.read_text(errors="replace"), lines)

    def logs(self, rank: int = 0) -> str:
        """The rank's stdout and stderr (latest attempt)."""
        err = self._log_path(rank)
        if err is None:
            return ""
        out = err.with_name(err.name.replace("_log.err", "_log.out"))
        parts = [p.read_text(errors="replace") for p in (out, err) if p.exists()]
        return "\n".join(parts)

    def traces(self, kind: str = "steps") -> Any:
        """This run's trace rows as a DataFrame (``kind``: steps or eval)."""
        return load_traces(self.path, kind)
