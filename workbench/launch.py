"""Submitting a run through submitit and watching it: preflight checks, ``launch()``, ``RunHandle``.

Ranks are always fresh subprocesses (submitit's LocalExecutor locally), never forks of the calling
notebook kernel. The only module that imports submitit besides the rank's own environment lookup.
"""

from __future__ import annotations

import datetime as _dt
import os
import secrets
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any, Sequence

from . import environment, schema, slurm
from .config import RunConfig
from .errors import PreflightError, Problem, RunFailedError
from .store import read_json, read_rank_states, update_run, write_json
from .store import run_dir as _run_dir

EXECUTORS = ("local", "debug", "slurm")
EXECUTOR_OPTIONS: dict[str, tuple[str, ...]] = {
    "local": ("setup",),
    "debug": (),
    "slurm": tuple(slurm.SLURM_OPTIONS),
}
#: After the first rank fails, how long its peers get to fail on their own before the job is killed.
FAILURE_GRACE_S = 10.0
#: Free disk space below which a launch is refused (traces and checkpoints need room).
MIN_FREE_BYTES = 50 * 2**20
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


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _writable_dir(path: Path) -> str | None:
    """None when ``path`` (or its nearest existing parent) is a writable folder; else why not."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    free = shutil.disk_usage(probe).free
    if free < MIN_FREE_BYTES:
        return f"only {free // 2**20} MiB free on the disk holding {probe}"
    return None


def preflight(
    config: RunConfig, executor: str, options: dict[str, Any], resume: bool = False
) -> Path:
    """Everything that can be checked on this machine before a process starts; raises one
    PreflightError listing every problem. Returns the run folder."""
    problems: list[Problem] = []
    if executor not in EXECUTORS:
        raise PreflightError(
            [Problem("executor", executor, f"must be one of {', '.join(EXECUTORS)}")]
        )
    valid = EXECUTOR_OPTIONS[executor]
    if executor == "slurm":
        problems += slurm.check_options(options)
    else:
        for name in sorted(set(options) - set(valid)):
            problems.append(
                Problem(
                    name,
                    options[name],
                    f"not an option of the {executor} executor; "
                    f"valid: {', '.join(valid) or '(none)'}",
                )
            )
    if executor == "debug" and config.world_size != 1:
        problems.append(
            Problem(
                "world_size",
                config.world_size,
                "the debug executor runs one task in this process: use world_size=1, "
                "or executor='local' for more ranks",
            )
        )
    if executor == "local" and config.nodes != 1:
        problems.append(
            Problem(
                "nodes",
                config.nodes,
                "the local executor runs on one node; use nodes=1 "
                "(or a Slurm executor for several nodes)",
            )
        )
    if config.device != "cpu" and executor != "slurm":  # Slurm's nodes are not this machine
        import torch

        gpus = torch.cuda.device_count()
        wants_cuda = config.device == "cuda" or gpus > 0
        if config.device == "cuda" and gpus == 0:
            problems.append(
                Problem(
                    "device", config.device, "no CUDA device is visible here; use 'cpu' or 'auto'"
                )
            )
        elif wants_cuda and config.tasks_per_node > gpus:  # type: ignore[operator]
            problems.append(
                Problem(
                    "tasks_per_node",
                    config.tasks_per_node,
                    f"more devices per node than present: this node has {gpus} GPU(s)",
                )
            )
        if wants_cuda and torch.cuda.is_initialized():
            problems.append(
                Problem(
                    "device",
                    config.device,
                    "this kernel already created a CUDA context (it holds GPU memory and "
                    "skews the measurements); restart the kernel and launch before using CUDA",
                )
            )
        if not wants_cuda and config.precision == "fp16":
            problems.append(
                Problem(
                    "precision",
                    config.precision,
                    "fp16 needs CUDA and no GPU is visible; use fp32 or bf16 on CPU",
                )
            )
        if not wants_cuda and config.backend == "nccl":
            problems.append(Problem("backend", config.backend, "nccl needs CUDA; use gloo or auto"))
    if config.strategy == "dp" and executor != "slurm":
        import torch

        gpus = torch.cuda.device_count()
        if gpus < 2 or gpus < config.world_size:  # type: ignore[operator]
            problems.append(
                Problem(
                    "strategy",
                    "dp",
                    f"DataParallel over world_size={config.world_size} "
                    f"GPUs needs that many CUDA devices; this machine has {gpus}. "
                    "Use strategy='ddp' (or 'single') here",
                )
            )
    if config.dataset == "parquet":
        problems += _parquet_problems(config)
    for field_name in ("model", "dataset"):
        spec = getattr(config, field_name)
        if ":" in spec:  # a plug-in: it must import here, not fail in every rank later
            from .models import load_plugin

            try:
                load_plugin(spec, field_name)
            except ValueError as exc:
                problems.append(Problem(field_name, spec, str(exc).split(": ", 1)[1]))
    if (
        config.master_port is not None
        and executor == "local"
        and not _port_free(config.master_port)
    ):
        problems.append(
            Problem(
                "master_port",
                config.master_port,
                "already in use on this machine; pick another or omit it to get a free one",
            )
        )
    run_path = _run_dir(config.output_dir, config.sweep, config.run_name or "x")
    why = _writable_dir(Path(config.output_dir))
    if why:
        problems.append(Problem("output_dir", config.output_dir, why))
    elif config.run_name is not None:
        exists = (run_path / schema.RUN_FILE).exists()
        if resume and not exists:
            problems.append(
                Problem("run_name", config.run_name, f"resume=True but no run at {run_path}")
            )
        if not resume and exists:
            problems.append(
                Problem(
                    "run_name",
                    config.run_name,
                    f"a run already exists at {run_path}; pick another name or resume=True",
                )
            )
    if problems:
        raise PreflightError(problems)
    return run_path


def _parquet_problems(config: RunConfig) -> list[Problem]:
    from . import parquet_data

    problems = []
    for key in ("train", "eval"):
        path = Path(config.dataset_options[key])
        if not path.is_file():
            problems.append(Problem(f"dataset_options.{key}", str(path), "no such Parquet file"))
    if problems:
        return problems
    train = config.dataset_options["train"]
    why = parquet_data.partition_problem(train, config.processes)
    if why:
        return [Problem("dataset_options.train", train, why)]
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(train).metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    per_rank = min(sum(sizes[r :: config.processes]) for r in range(config.processes))
    if config.train_samples > per_rank * config.processes:
        problems.append(
            Problem(
                "train_samples",
                config.train_samples,
                f"the Parquet shards hold {per_rank} rows per rank: use train_samples <= "
                f"{per_rank * config.processes}",
            )
        )
    return problems


def _new_run_id(config: RunConfig) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{config.model.split(':')[-1]}-w{config.world_size}-{stamp}-{secrets.token_hex(2)}"


def launch(
    config: RunConfig, executor: str = "local", *, resume: bool = False, **executor_options: Any
) -> RunHandle:
    """Start a run and return its handle.

    ``executor``: ``"local"`` (one subprocess per rank on this machine), ``"debug"`` (world size 1,
    in this process, for stepping through code) or ``"slurm"`` (options: ``SLURM_OPTIONS``).
    ``resume=True`` continues the run named ``config.run_name`` from its latest checkpoint,
    appending to its traces."""
    import submitit

    config, run_path, task = _prepare(config, executor, executor_options, resume)
    logs = run_path / schema.LOGS_DIR
    if executor == "debug":
        ex: Any = submitit.DebugExecutor(folder=logs)
    elif executor == "slurm":
        ex = slurm.executor(config, logs, executor_options, _uses_cuda(config, remote=True))
    else:
        ex = _detached_local_executor(logs)
        ex.update_parameters(
            tasks_per_node=config.processes,
            nodes=1,
            timeout_min=config.timeout_min,
            gpus_per_node=config.tasks_per_node if _uses_cuda(config) else 0,
            signal_delay_s=config.signal_delay_s,
            **({"setup": executor_options["setup"]} if "setup" in executor_options else {}),
        )
    job = ex.submit(task)
    update_run(run_path, job_id=str(job.job_id), log_dir=str(logs))
    return RunHandle(run_path, config, job, executor, poll_s=executor_options.get("poll_s", 30.0))


def _detached_local_executor(folder: Path) -> Any:
    """submitit's LocalExecutor, but its controller (and so every rank) starts in a session of
    its own. Jupyter interrupts and restarts a kernel by signalling the kernel's whole process
    group: without this, "interrupt kernel" would SIGINT every rank, and a kernel restart would
    kill the job, which must carry on and be re-attached from the store."""
    import subprocess

    import submitit
    from submitit.local import local

    class _Subprocess:  # submitit.local.local's view of `subprocess`, with detached Popen
        def __getattr__(self, name: str) -> Any:
            return getattr(subprocess, name)

        @staticmethod
        def Popen(*args: Any, **kwargs: Any) -> Any:  # noqa: N802
            return subprocess.Popen(*args, start_new_session=True, **kwargs)

    class DetachedLocalExecutor(submitit.LocalExecutor):
        def _submit_command(self, command: str) -> Any:
            local.subprocess = _Subprocess()  # type: ignore[assignment]
            try:
                return super()._submit_command(command)
            finally:
                local.subprocess = subprocess  # type: ignore[assignment]

    return DetachedLocalExecutor(folder=folder)


def launch_array(configs: Sequence[RunConfig], **slurm_options: Any) -> list[RunHandle]:
    """Submit many runs to Slurm as job arrays: one array per distinct layout (nodes, ranks per
    node, time limit), one array task per run, at most ``array_parallelism`` running at once. A
    sweep of 50 points is one or a few submissions instead of 50."""
    import submitit  # noqa: F401  (the executors below need it)

    prepared = [_prepare(c, "slurm", slurm_options, resume=False) for c in configs]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (c, _, _) in enumerate(prepared):
        key = (
            c.nodes,
            c.tasks_per_node,
            c.timeout_min,
            c.signal_delay_s,
            c.threads_per_rank,
            c.device,
        )
        groups.setdefault(key, []).append(i)
    handles: list[RunHandle | None] = [None] * len(prepared)
    for members in groups.values():
        first_config, first_path, _ = prepared[members[0]]
        logs = first_path.parent / ".slurm-arrays"  # one folder per sweep for the array's logs
        ex = slurm.executor(
            first_config,
            logs,
            {**slurm_options, "job_name": first_config.sweep},
            _uses_cuda(first_config, remote=True),
        )
        with ex.batch():
            jobs = [ex.submit(prepared[i][2]) for i in members]
        for i, job in zip(members, jobs, strict=True):
            config, run_path, _ = prepared[i]
            update_run(run_path, job_id=str(job.job_id), log_dir=str(logs))
            handles[i] = RunHandle(
                run_path, config, job, "slurm", poll_s=slurm_options.get("poll_s", 30.0)
            )
    return [h for h in handles if h is not None]


def _prepare(
    config: RunConfig, executor: str, options: dict[str, Any], resume: bool
) -> tuple[RunConfig, Path, Any]:
    """Name the run, check it, write its config and pending record; the task submitit runs."""
    from .train import RankTask

    if config.run_name is None:
        config = config.replace(run_name=_new_run_id(config))
    run_path = preflight(config, executor, options, resume)
    attempt = 0
    if resume:
        attempt = int(read_json(run_path / schema.RUN_FILE).get("attempt", 0)) + 1
        for path in (run_path / schema.RANKS_DIR).glob("rank-*.json"):
            path.unlink()  # the new attempt's ranks report afresh
    # Locally a free port is picked here; on Slurm submitit derives one from the job id.
    port = config.master_port or (_free_port() if executor in ("local", "debug") else None)
    write_json(run_path / schema.CONFIG_FILE, config.to_dict())
    update_run(
        run_path,
        run_id=config.run_name,
        sweep=config.sweep,
        status="pending",
        attempt=attempt,
        config=config.to_dict(),
        executor=executor,
        submitted_at=time.time(),
        environment=environment.collect(),
        trace_schema=schema.TRACE_SCHEMA_VERSION,
        failure=None,
        ended_at=None,
    )
    task = RankTask(
        config=config,
        run_dir=str(run_path),
        run_id=str(config.run_name),
        master_port=port,
        attempt=attempt,
    )
    return config, run_path, task


def sbatch_script(config: RunConfig, **slurm_options: Any) -> str:
    """The sbatch script ``launch(config, executor="slurm", **slurm_options)`` would submit (a dry
    run: nothing is written or submitted)."""
    problems = slurm.check_options(slurm_options)
    if problems:
        raise PreflightError(problems)
    if config.run_name is None:
        config = config.replace(run_name=_new_run_id(config))
    logs = _run_dir(config.output_dir, config.sweep, config.run_name) / schema.LOGS_DIR  # type: ignore[arg-type]
    import submitit  # noqa: F401  (the executor below needs it)

    return slurm.sbatch_script(
        slurm.executor(config, logs, slurm_options, _uses_cuda(config, remote=True))
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


def _uses_cuda(config: RunConfig, remote: bool = False) -> bool:
    if config.device == "cpu":
        return False
    if remote:  # a Slurm node: trust the config, this machine tells nothing about it
        return config.device == "cuda"
    import torch

    return torch.cuda.device_count() > 0


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
        from .summary import run_summary

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
        from .store import load_traces

        return load_traces(self.path, kind)
