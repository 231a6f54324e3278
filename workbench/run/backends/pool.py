"""The pool back end: a run's ranks start in warm, single-use worker processes on this machine.

A :class:`WarmPool` keeps ``size`` workers (:mod:`workbench.rank.pool_worker`) started ahead of
time, each waiting for one task. They are forks of the pool's template: one fresh interpreter
(never a fork of the caller) that imported torch and the rank's code once, so a worker costs
milliseconds, not the seconds of imports a fresh interpreter per rank costs.
``launch(config, executor="pool")`` hands each rank to one of them (forking more when the pool
holds too few) and the pool refills in the background. Each worker runs one rank and exits, so
nothing crosses runs; idle workers die with the template, which dies with the pool's process and
on :meth:`WarmPool.close`, and after ``idle_s`` without a task.

From its task on, a worker is an ordinary rank: the same store, traces, logs and failure triage
as the local back end. Its pid is recorded in the run's logs folder before it gets its task
(``processes.POOL_PIDS_FILE``), so a handle re-attached after a kernel restart finds and ends
it. Unlike the local back end the pool enforces no ``timeout_min``.
"""

from __future__ import annotations

import atexit
import os
import pickle
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workbench.config.run_config import RunConfig
from workbench.errors import PreflightError, Problem
from workbench.run.backends.base import Backend, JobWatch, LocalWatch
from workbench.run.backends.pool_template import SPAWNER, ForkedWorker, Template, fork_over
from workbench.run.processes import POOL_PIDS_FILE
from workbench.store.files import write_json

#: A worker older than its idle time less this is not handed a task (it may be about to leave).
IDLE_MARGIN_S = 5.0


def pool_problems(size: Any, idle_s: Any) -> list[Problem]:
    """What is wrong with a pool's ``size`` and ``idle_s``."""
    problems = []
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        problems.append(Problem("size", size, "a whole number of warm workers, at least 1"))
    if isinstance(idle_s, bool) or not isinstance(idle_s, int | float) or not idle_s > 0:
        problems.append(Problem("idle_s", idle_s, "seconds a worker waits for a task, above 0"))
    return problems


class WarmPool:
    """``size`` warm rank workers; each exits after ``idle_s`` seconds without a task."""

    def __init__(self, size: int = 2, idle_s: float = 600.0) -> None:
        problems = pool_problems(size, idle_s)
        if problems:
            raise PreflightError(problems)
        self.size = size
        self.idle_s = float(idle_s)
        self.closed = False
        self._idle: list[Any] = []
        self._pending = 0
        self._lock = threading.Lock()
        self._template = SPAWNER.submit(lambda: Template(self.idle_s)).result()
        self.refill()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"idle workers {self.pids()}"
        return f"<WarmPool size={self.size} idle_s={self.idle_s:g} {state}>"

    def __enter__(self) -> WarmPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def template_pid(self) -> int:
        """The pid of the template the workers are forked from."""
        return self._template.process.pid

    def _usable(self, worker: Any) -> bool:
        """Alive, and not so old that its idle time may run out before it reads a task."""
        fresh = time.monotonic() - worker.spawned_at < self.idle_s - IDLE_MARGIN_S
        return worker.poll() is None and (fresh or self.idle_s <= 2 * IDLE_MARGIN_S)

    def _prune(self) -> None:
        """Drop idle workers that ended or are too old (ending those); under the lock."""
        for worker in self._idle:
            if not self._usable(worker):
                worker.kill()
                worker.wait()
        self._idle = [w for w in self._idle if w.poll() is None]

    def refill(self) -> None:
        """Start workers, in the background, until the pool holds ``size`` again."""
        with self._lock:
            if self.closed:
                return
            self._prune()
            missing = self.size - len(self._idle) - self._pending
            self._pending += max(0, missing)
        for _ in range(missing):
            SPAWNER.submit(self._template.fork).add_done_callback(self._arrived)

    def _arrived(self, done: Future[Any]) -> None:
        """A worker started for the pool: keep it, or end it when the pool closed meanwhile."""
        with self._lock:
            self._pending -= 1
            if done.exception() is not None:
                return
            worker = done.result()
            if self.closed:
                worker.kill()
                worker.wait()
            else:
                self._idle.append(worker)

    def take(self, n: int) -> list[Any]:
        """``n`` workers for one run's ranks (warm ones first, the rest started now); then the
        pool refills in the background."""
        if self.closed:
            raise RuntimeError("this WarmPool is closed; make a new one (workbench.warm_pool)")
        with self._lock:
            self._prune()
            taken, self._idle = self._idle[:n], self._idle[n:]
        cold = [SPAWNER.submit(self._template.fork) for _ in range(n - len(taken))]
        taken += [c.result() for c in cold]
        self.refill()
        return taken

    def pids(self) -> list[int]:
        """The pids of the idle workers (alive or not yet reaped)."""
        with self._lock:
            return [w.pid for w in self._idle]

    def close(self, timeout_s: float = 30.0) -> None:
        """End every idle worker and return once they are gone (workers already given a rank
        run on: they belong to their run, which ``cancel()`` ends)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self.closed = True
        while True:
            with self._lock:
                workers, self._idle, pending = self._idle, [], self._pending
            for worker in workers:
                worker.kill()
                worker.wait(max(0.0, deadline - time.monotonic()))
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.01)  # a worker being forked: _arrived ends it
        self._template.close(max(1.0, deadline - time.monotonic()))


_OPEN: list[WarmPool] = []
_FALLBACK: list[WarmPool] = []


@contextmanager
def warm_pool(size: int = 2, idle_s: float = 600.0) -> Iterator[WarmPool]:
    """A pool of ``size`` warm workers that ``launch(..., executor="pool")`` takes ranks from
    inside the ``with`` block; closed at its end."""
    pool = WarmPool(size, idle_s)
    _OPEN.append(pool)
    try:
        yield pool
    finally:
        _OPEN.remove(pool)
        pool.close()


#: In the environment of the processes a :func:`shared_template` serves: its socket's path.
SHARED_TEMPLATE_ENV = "WORKBENCH_POOL_TEMPLATE"


@contextmanager
def shared_template(idle_s: float = 600.0) -> Iterator[str]:
    """One template for this process and every process it starts meanwhile (a sweep's notebook
    kernels): their pool runs fork their ranks from it, so a sweep pays torch's imports once,
    not once a rank and point. Yields the socket's path, which is also exported as
    ``$WORKBENCH_POOL_TEMPLATE``; the template ends with the block."""
    folder = tempfile.mkdtemp(prefix="wb-pool-")
    path = os.path.join(folder, "template.sock")
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(path)
        listener.listen()
        template = SPAWNER.submit(lambda: Template(idle_s, listener)).result()
    finally:
        listener.close()
    before = os.environ.get(SHARED_TEMPLATE_ENV)
    os.environ[SHARED_TEMPLATE_ENV] = path
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(SHARED_TEMPLATE_ENV, None)
        else:
            os.environ[SHARED_TEMPLATE_ENV] = before
        template.close(timeout_s=10.0)
        shutil.rmtree(folder, ignore_errors=True)


class SharedPool:
    """The pool of a process that a :func:`shared_template` serves: each ``take`` forks its
    workers there, when the run is launched; none waits idle in between."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._channel = socket.socket(socket.AF_UNIX)
        self._channel.connect(path)
        self._lock = threading.Lock()

    def take(self, n: int) -> list[ForkedWorker]:
        """``n`` new workers."""
        with self._lock:
            return [fork_over(self._channel, self.path) for _ in range(n)]


_SHARED: dict[str, SharedPool] = {}


def current_pool(processes: int) -> WarmPool | SharedPool:
    """The innermost open :func:`warm_pool`, else the template shared with this process
    (``$WORKBENCH_POOL_TEMPLATE``), else this process's own pool (made on first use with
    ``processes`` workers, closed when the process exits)."""
    for pool in reversed(_OPEN):
        if not pool.closed:
            return pool
    shared = os.environ.get(SHARED_TEMPLATE_ENV)
    if shared and os.path.exists(shared):
        if shared not in _SHARED:
            _SHARED[shared] = SharedPool(shared)
        return _SHARED[shared]
    if not _FALLBACK or _FALLBACK[0].closed:
        _FALLBACK[:] = [WarmPool(size=processes)]
        atexit.register(_FALLBACK[0].close)
    return _FALLBACK[0]


class PoolJob:
    """One run's workers, one per rank; ``job_id`` names its log files."""

    def __init__(self, workers: list[Any], job_id: str) -> None:
        self.workers = workers
        self.job_id = job_id

    def done(self) -> bool:
        """Whether every rank's worker has ended."""
        return all(w.poll() is not None for w in self.workers)

    def cancel(self) -> None:
        """SIGKILL every worker of the run and reap them."""
        for worker in self.workers:
            if worker.poll() is None:
                worker.kill()
        for worker in self.workers:
            try:
                worker.wait(10)
            except subprocess.TimeoutExpired:
                pass  # the handle's cancel() reports what survived


class PoolExecutor:
    """Hands one run's ranks to workers of ``pool``; its logs in ``folder``."""

    def __init__(self, pool: WarmPool | SharedPool, config: RunConfig, folder: Path) -> None:
        self.pool = pool
        self.config = config
        self.folder = folder

    def submit(self, task: Any) -> PoolJob:
        """Give rank ``r`` of ``task`` to the ``r``-th worker taken from the pool."""
        workers = self.pool.take(self.config.processes)
        job = PoolJob(workers, f"pool-{workers[0].pid}")
        # Before any task: from its first moment a rank can be found (and killed) from the store.
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(self.folder / POOL_PIDS_FILE, {"pids": [w.pid for w in workers]})
        for rank, worker in enumerate(workers):
            payload = {
                "task": task,
                "rank": rank,
                "world_size": self.config.processes,
                "master_port": task.master_port,
                "job_id": job.job_id,
                "log_stem": str(self.folder / f"{job.job_id}_{rank}_log"),
            }
            try:
                worker.stdin.write(pickle.dumps(payload))
                worker.stdin.close()
            except OSError:
                pass  # it died meanwhile: triage reports the rank as one that never started
        return job


class PoolBackend(Backend):
    """One warm, single-use worker process per rank on this machine."""

    name = "pool"
    options = {
        "pool": "the WarmPool to take the ranks' workers from (default: the innermost "
        "warm_pool(), else one made on first use)",
    }
    on_this_machine = True
    warm_workers = True

    def check(self, config: RunConfig, options: Mapping[str, Any]) -> list[Problem]:
        """Unknown options, several nodes, and a ``pool`` that is not an open WarmPool."""
        problems = super().check(config, options)
        given = options.get("pool")
        if "pool" in options and not (isinstance(given, WarmPool) and not given.closed):
            problems.append(
                Problem("pool", given, "an open WarmPool, e.g. from workbench.warm_pool(size=2)")
            )
        return problems

    def config_problems(self, config: RunConfig) -> list[Problem]:
        """One node only."""
        if config.nodes == 1:
            return []
        return [
            Problem(
                "nodes",
                config.nodes,
                "the pool executor runs on one node; use nodes=1 (or a Slurm executor)",
            )
        ]

    def executor(self, config: RunConfig, folder: Path, options: Mapping[str, Any]) -> Any:
        """Hands the ranks to the given pool, or to :func:`current_pool`."""
        pool = options.get("pool") or current_pool(config.processes)
        return PoolExecutor(pool, config, folder)

    def watch(self, job: Any, job_id: str | None, poll_s: float = 30.0) -> JobWatch:
        """A watch on a pool job."""
        return LocalWatch(job, job_id, poll_s)
