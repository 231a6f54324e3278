"""Watching a launched run: status from the store, wait, cancel, results, logs, traces.

A handle works from the store (each rank's own status record and trace files) and, for Slurm, a
gentle ``squeue``: a new session re-attaches to a run with :func:`attach`.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from workbench import schema
from workbench.config.run_config import RunConfig
from workbench.errors import RunFailedError
from workbench.run import slurm
from workbench.store.files import read_json, read_rank_states, update_run

#: After the first rank fails, how long its peers get to fail on their own before the job is killed.
FAILURE_GRACE_S = 10.0

# Errors a rank sees because of another rank (its peer died, hung or closed the connection).
_PEER_ERRORS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
    "DistBackendError",
    "pair closure",
    "Timed out",
    "timed out",
    "Connection refused",
)


def attach(run_path: str | Path) -> "RunHandle":
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


def _alive(pid: int) -> bool:
    """True while a rank process with this pid exists (and is not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


_EXIT_CRASH_MARKERS = ("terminate called", "Segmentation fault", "core dumped", "Aborted")


def _crashed_at_exit(log_tail: str | None) -> bool:
    return bool(log_tail) and any(m in log_tail for m in _EXIT_CRASH_MARKERS)  # type: ignore[operator]


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
        self._first_failure_seen: float | None = None
        self._hung: list[int] = []
        self._squeue = slurm.SqueuePoller(str(self.job_id), poll_s) if executor == "slurm" else None

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r}, status={self.status()!r}, path={str(self.path)!r})"

    # -- observation
    def _job_running(self) -> bool:
        if self.executor == "debug":
            return False
        if self._squeue is not None:
            states = self.rank_states()
            if len(states) == self.config.processes and all(
                s["status"] == "completed" for s in states.values()
            ):
                return False  # every rank reported: no need to ask the scheduler
            return self._squeue.active()
        if self.job is not None:
            return not self.job.done()
        # Re-attached to a local run: it runs while any of its rank processes does.
        return any(s.get("status") == "running" for s in self.rank_states().values())

    def rank_states(self) -> dict[int, dict[str, Any]]:
        """Each rank's own record; a rank whose process died without reporting is marked
        ``died`` (killed by a signal or ``os._exit``)."""
        states = read_rank_states(self.path)
        for state in states.values():
            if (
                state["status"] == "running"
                and state.get("host") == socket.gethostname()
                and not _alive(int(state["pid"]))
            ):
                state["status"] = "died"
        return states

    def status(self) -> str:
        """pending, running, completed, failed or cancelled (final once ``wait`` returned)."""
        run = read_json(self.path / schema.RUN_FILE)
        if run.get("ended_at") is not None:
            return str(run["status"])
        states = self.rank_states()
        if any(s["status"] in ("failed", "died") for s in states.values()):
            return "failed"
        if any(s["status"] == "preempted" for s in states.values()):
            return "preempted"  # until the requeued attempt's ranks report running again
        if len(states) == self.config.processes and all(
            s["status"] == "completed" for s in states.values()
        ):
            return "completed"
        if states:
            return "running"
        return "pending"

    # -- control
    def wait(
        self, timeout_s: float | None = None, poll_s: float = 0.5, raise_on_failure: bool = True
    ) -> str:
        """Block until the run ends (or ``timeout_s`` passes: TimeoutError, the run goes on).
        When one rank fails, its peers get ``FAILURE_GRACE_S`` to end on their own, then the job
        is killed, so a hung peer never holds the caller. Returns the final status; raises
        RunFailedError naming the root-cause rank when it failed (unless told not to)."""
        if self.executor == "debug" and self.job is not None:
            try:
                self.job.result()
            except Exception:  # recorded by the rank itself; reported below
                pass
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            run = read_json(self.path / schema.RUN_FILE)
            if run.get("ended_at") is not None:
                break
            status = self.status()
            running = self._job_running()
            if not running:
                self._finalize()
                break
            if status == "failed":
                now = time.monotonic()
                self._first_failure_seen = self._first_failure_seen or now
                if now - self._first_failure_seen > FAILURE_GRACE_S:
                    self._dump_stuck_ranks()
                    failure = self._failure()  # before the kill, whose signals ranks also report
                    self._kill()
                    self._finalize(failure=failure)
                    break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.run_id} still {status} after {timeout_s} s")
            time.sleep(poll_s)
        final = self.status()
        if final == "failed" and raise_on_failure:
            raise self.failure_error()
        return final

    def _stuck_ranks(self) -> list[int]:
        """Ranks still running (alive, on this host) while a peer has failed: hung ones."""
        return [
            rank
            for rank, s in read_rank_states(self.path).items()
            if s["status"] == "running"
            and s.get("host") == socket.gethostname()
            and _alive(int(s["pid"]))
        ]

    def _dump_stuck_ranks(self) -> None:
        """Ask each hung rank for its stack traces (SIGUSR1, see train.RankTask) before it is
        killed, so the failure record shows where it hung."""
        self._hung = self._stuck_ranks()
        for rank in self._hung:
            try:
                os.kill(int(read_rank_states(self.path)[rank]["pid"]), signal.SIGUSR1)
            except (OSError, KeyError):
                pass
        if self._hung:
            time.sleep(1.0)

    def cancel(self) -> None:
        """Stop the run now; the store records it as cancelled. Traces written so far stay."""
        self._kill()
        self._finalize(status="cancelled")

    def _kill(self) -> None:
        if self.job is not None and hasattr(self.job, "cancel"):
            try:
                self.job.cancel()
            except Exception:
                pass
        elif self.executor == "slurm" and self.job_id:  # re-attached: no submitit job object
            slurm.cancel(self.job_id)
        deadline = time.monotonic() + 5
        process = getattr(self.job, "_process", None)
        while process is not None and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if process is not None and process.poll() is None:
            process.kill()
        # The controller kills its tasks on the way out; make sure, by pid, that none survives.
        for state in read_rank_states(self.path).values():
            pid = int(state.get("pid", 0))
            if pid and state.get("host") == socket.gethostname() and _alive(pid):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"submitit" in cmdline:
                    os.kill(pid, signal.SIGKILL)

    # -- results
    def _failure(self) -> dict[str, Any] | None:
        """The root cause: a rank's own exception beats a silent death, which beats the
        'connection closed' errors its peers see next; ties go to the earliest."""
        candidates = []
        for rank, s in self.rank_states().items():
            if s["status"] == "failed":
                peer = any(marker in s.get("exception", "") for marker in _PEER_ERRORS)
                candidates.append((2 if peer else 0, s.get("ended_at", 0), rank, s))
            elif rank in self._hung:
                timeout = self.config.collective_timeout_s
                candidates.append(
                    (
                        1,
                        0,
                        rank,
                        {
                            **s,
                            "exception": "the rank hung: it was still running "
                            f"when its peers gave up waiting for it ({timeout:g} s "
                            "collective timeout); its stack is in the log",
                        },
                    )
                )
            elif s["status"] in ("died", "running"):
                candidates.append(
                    (
                        1,
                        0,
                        rank,
                        {
                            **s,
                            "exception": "the rank's process ended without "
                            "reporting (killed by a signal or exited)",
                        },
                    )
                )
        missing = set(range(self.config.processes)) - set(self.rank_states())
        for rank in missing:
            candidates.append((1, 0, rank, {"rank": rank, "exception": "the rank never started"}))
        if not candidates:
            return None
        _, _, rank, s = min(candidates, key=lambda c: (c[0], c[1], c[2]))
        log_path = self._log_path(rank)
        return {
            "rank": rank,
            "exception": s.get("exception"),
            "traceback": s.get("traceback"),
            "log_path": str(log_path) if log_path else None,
            "log_tail": self._tail(log_path, 40 if rank in self._hung else 20),
        }

    def failure_error(self) -> RunFailedError:
        f = read_json(self.path / schema.RUN_FILE).get("failure") or self._failure() or {}
        return RunFailedError(
            self.run_id,
            self.status(),
            rank=f.get("rank"),
            exception=f.get("exception"),
            traceback=f.get("traceback"),
            log_tail=f.get("log_tail"),
            log_path=f.get("log_path"),
        )

    def _finalize(self, status: str | None = None, failure: dict[str, Any] | None = None) -> None:
        states = self.rank_states()
        completed = len(states) == self.config.processes and all(
            s["status"] == "completed" for s in states.values()
        )
        if status is None:
            if completed:
                status = "completed"
            elif any(s["status"] == "preempted" for s in states.values()) and not any(
                s["status"] in ("failed", "died") for s in states.values()
            ):
                status = "preempted"  # stopped cleanly and was not requeued: resume=True continues
            else:
                status = "failed"
        fields: dict[str, Any] = {
            "status": status,
            "ended_at": time.time(),
            "hosts": sorted({s.get("host", "") for s in states.values()}),
        }
        if status == "failed":
            fields["failure"] = failure or self._failure()
        # A rank can finish its work and then crash while the interpreter exits (seen with gloo
        # about once in 75 runs). Its results are complete, so the run stays completed, and the
        # crash is recorded rather than hidden.
        fields["exit_warnings"] = [
            {"rank": rank, "log_tail": self._tail(self._log_path(rank), 5)}
            for rank, s in states.items()
            if s["status"] == "completed" and _crashed_at_exit(self._tail(self._log_path(rank), 5))
        ]
        from workbench.analysis.summary import run_summary

        try:
            fields["summary"] = run_summary(self.path)
        except Exception as exc:  # a summary must never hide the run's own outcome
            fields["summary_error"] = f"{type(exc).__name__}: {exc}"
        update_run(self.path, **fields)

    def result(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Wait, then return each rank's summary (index = rank); RunFailedError on failure."""
        self.wait(timeout_s)
        states = self.rank_states()
        return [states[r].get("summary", {}) for r in range(self.config.processes)]

    def _log_path(self, rank: int) -> Path | None:
        run = read_json(self.path / schema.RUN_FILE)
        folder = Path(run.get("log_dir") or self.path / schema.LOGS_DIR)
        pattern = f"{self.job_id}_{rank}_log.err" if self.job_id else f"*_{rank}_log.err"
        logs = sorted(folder.glob(pattern), key=os.path.getmtime)
        return logs[-1] if logs else None

    @staticmethod
    def _tail(path: Path | None, lines: int = 20) -> str | None:
        if path is None or not path.exists():
            return None
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

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
        from workbench.store.load import load_traces

        return load_traces(self.path, kind)
