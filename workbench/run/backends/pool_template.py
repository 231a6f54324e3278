"""The pool's processes, seen from the pool: its template (one fresh interpreter that imported
torch and the rank's code once) and the workers forked from it, asked for on a Unix socket
(:mod:`workbench.rank.pool_worker` is the other side)."""

from __future__ import annotations

import os
import queue
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any

from workbench.run.processes import alive

WORKER_MODULE = "workbench.rank.pool_worker"


class _Spawner:
    """Starts every template, and asks for every fork, from one thread that lives as long as this
    process: Linux sends a template its parent-death signal when the *thread* that started it
    ends, so a template started from a short-lived thread would die with that thread."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Any, Future[Any]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, call: Any) -> Future[Any]:
        """A future of ``call()``, run on the spawner's thread."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name="pool-spawn")
                self._thread.start()
        done: Future[Any] = Future()
        self._queue.put((call, done))
        return done

    def _loop(self) -> None:
        while True:
            call, done = self._queue.get()
            try:
                done.set_result(call())
            except BaseException as exc:  # the caller sees it
                done.set_exception(exc)


SPAWNER = _Spawner()


class ForkedWorker:
    """A worker forked by a pool's template: not this process's child, so whether it runs is read
    from ``/proc`` (the template reaps it). The part of ``subprocess.Popen`` the pool uses."""

    def __init__(self, pid: int, stdin: Any) -> None:
        self.pid = pid
        self.stdin = stdin
        self.spawned_at = time.monotonic()

    def poll(self) -> int | None:
        """None while the worker runs, else 0 (its exit status is the template's to reap)."""
        return None if alive(self.pid) else 0

    def kill(self) -> None:
        """SIGKILL the worker."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float | None = None) -> int:
        """Return once the worker has ended; ``subprocess.TimeoutExpired`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.01)
        return 0


def fork_over(channel: socket.socket, template: str) -> ForkedWorker:
    """A new worker forked by the template at the other end of ``channel`` (named ``template``
    in the error when it has ended); waits for the template's imports the first time."""
    read_end, write_end = os.pipe()
    try:
        socket.send_fds(channel, [b"f"], [read_end])
        answer = b""
        while len(answer) < 4:
            chunk = channel.recv(4 - len(answer))
            if not chunk:
                raise RuntimeError(f"the pool's template ({template}) ended")
            answer += chunk
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return ForkedWorker(struct.unpack("!i", answer)[0], os.fdopen(write_end, "wb"))


class Template:
    """A pool's template process and the Unix socket on which it is asked for forks: a channel
    of its own, or, given ``listener``, a listening socket any process may connect to."""

    def __init__(self, idle_s: float, listener: socket.socket | None = None) -> None:
        ours, theirs = (None, listener) if listener is not None else socket.socketpair()
        argv = [sys.executable, "-m", WORKER_MODULE, str(os.getpid()), repr(idle_s)]
        argv.append(str(theirs.fileno()))
        try:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
            )
        finally:
            if ours is not None:
                theirs.close()
        self._channel = ours

    def fork(self) -> ForkedWorker:
        """A new worker (waits for the template's imports the first time)."""
        assert self._channel is not None, "a shared template forks for the processes that connect"
        return fork_over(self._channel, f"pid {self.process.pid}")

    def close(self, timeout_s: float) -> None:
        """Close the channel (the template exits, and its idle workers with it) and reap it; a
        shared template is ended."""
        if self._channel is None:
            self.process.kill()
        else:
            self._channel.close()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
