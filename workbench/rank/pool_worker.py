"""The warm rank processes of the pool executor.

A pool starts one *template*: ``python -m workbench.rank.pool_worker PARENT_PID IDLE_S CHANNEL_FD``,
a fresh interpreter (never a fork of the parent) that imports torch, DDP's ``torch._dynamo``,
``torch.distributed`` and the rank's code once, then forks one worker per request that arrives on
``CHANNEL_FD`` (a Unix socket; each request carries the read end of the worker's stdin). A fork
costs milliseconds and shares those imports, where a fresh interpreter per rank would import them
again (seconds of CPU each). The template computes nothing and starts no thread pool, so a fork
inherits no half-held lock of torch's; it exits when the pool closes the channel or its parent dies.

A worker waits for exactly one task. Before its task it initialises neither CUDA nor a process
group, and it dies with the template (``PR_SET_PDEATHSIG``, and a thread watching the parent's pid
where that is missing) or after ``IDLE_S`` seconds without a task. Its task arrives on stdin as one
pickled dict (``task``: the pickled ``RankTask``; ``rank``, ``world_size``, ``master_port``,
``job_id``; ``log_stem``: its log files without ``.out``/``.err``), then stdin closes; from then on
it is an ordinary rank of a run in a session of its own: it outlives the parent (a notebook kernel
restart does not end the run, which is re-attached from the store), its output goes to the run's
log files, and it exits when the rank is done.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from pathlib import Path

#: ``prctl`` option: the signal this process gets when its parent ends (0: none).
_PR_SET_PDEATHSIG = 1
#: How often the watch thread compares the parent's pid with the one it started with.
_PARENT_POLL_S = 0.5


def _warm_up() -> None:
    """Import what a rank needs (after the parent-death signal is set: a worker orphaned while
    importing leaves at once): torch, what building a DDP model imports (``torch._dynamo``,
    about 1.5 s) and the rank's code, which running the task needs, and pandas (below)."""
    import pyarrow as pa
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    import workbench.rank.run_rank  # noqa: F401

    # pyarrow imports pandas on its first conversion of a Python value (the tracer's first
    # stream): 0.6-0.9 s on a 2-core host that every run would otherwise wait for before its
    # first step. Once here, every fork shares it.
    pa.scalar(0)


def _parent_death_signal(sig: int) -> None:
    """Ask Linux to send ``sig`` when the parent ends (0: stop asking); elsewhere a no-op."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the watch thread alone ends an orphaned worker


def _watch_parent(parent_pid: int, stop: threading.Event) -> None:
    """Exit at once when the parent is gone (this process re-parented), until ``stop`` is set."""
    while not stop.wait(_PARENT_POLL_S):
        if os.getppid() != parent_pid:
            os._exit(0)


def _read_task(idle_s: float) -> bytes:
    """Everything written to stdin until it closes; b"" when nothing came within ``idle_s``."""
    fd = sys.stdin.fileno()
    deadline = time.monotonic() + idle_s
    chunks: list[bytes] = []
    while True:
        wait_s = deadline - time.monotonic() if not chunks else None
        if wait_s is not None and wait_s <= 0:
            return b""
        readable, _, _ = select.select([fd], [], [], wait_s)
        if not readable:
            return b""
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _redirect_output(log_stem: str) -> None:
    """Send this process's stdout and stderr to the rank's log files, as submitit names them."""
    sys.stdout.flush()
    sys.stderr.flush()
    Path(log_stem).parent.mkdir(parents=True, exist_ok=True)
    for fd, suffix in ((1, ".out"), (2, ".err")):
        log = os.open(log_stem + suffix, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, fd)
        os.close(log)


def _worker(idle_s: float) -> int:
    """A forked worker: wait for one task on stdin and run it; 0 when it completed or none
    came, 1 when it failed."""
    template_pid = os.getppid()
    _parent_death_signal(signal.SIGKILL)
    if os.getppid() != template_pid:
        return 0  # the template ended before the signal was asked for
    stop_watching = threading.Event()
    threading.Thread(
        target=_watch_parent, args=(template_pid, stop_watching), daemon=True, name="parent-watch"
    ).start()
    payload = _read_task(idle_s)
    if not payload:
        return 0  # idle too long, or the pool closed this worker's stdin
    # From here this process is a rank of a run: it must outlive the notebook kernel.
    _parent_death_signal(0)
    stop_watching.set()
    job = pickle.loads(payload)
    _redirect_output(job["log_stem"])
    from workbench.rank.distributed import RankEnv

    env = RankEnv.on_this_host(job["rank"], job["world_size"], job["master_port"], job["job_id"])
    try:
        os.chdir(job["task"].cwd)  # the caller's, as a local rank inherits it
        job["task"].run(env)
    except BaseException:
        traceback.print_exc()  # the rank's own record holds it too
        return 1
    return 0


def _fork_worker(sockets: list[socket.socket], stdin_fd: int, idle_s: float) -> int:
    """Fork one worker whose stdin is ``stdin_fd`` (closing the template's ``sockets`` in it);
    the worker's pid in the template."""
    pid = os.fork()
    if pid:
        os.close(stdin_fd)
        return pid
    code = 1
    try:
        # The template ignores SIGCHLD to have its workers reaped; a rank waits for its own
        # children (a script's subprocesses), so it needs the default back.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()  # Ctrl-C in the parent's terminal or kernel does not reach a rank
        for sock in sockets:
            sock.close()
        os.dup2(stdin_fd, 0)
        os.close(stdin_fd)
        code = _worker(idle_s)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(parent_pid: int, idle_s: float, channel_fd: int) -> int:
    """The template: warm up, then fork a worker for each request on the channel (answered with
    the worker's pid) until the pool closes it; 0 when it ended so. A listening channel (a
    template shared by a sweep's kernels) takes requests from every process that connects, until
    the template is ended."""
    _parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent_pid:
        return 0  # the parent ended before the signal was asked for
    threading.Thread(
        target=_watch_parent, args=(parent_pid, threading.Event()), daemon=True, name="parent-watch"
    ).start()
    _warm_up()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    channel = socket.socket(fileno=channel_fd)
    listening = bool(channel.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    clients = [] if listening else [channel]
    while listening or clients:
        for sock in select.select([channel] * listening + clients, [], [])[0]:
            if listening and sock is channel:
                clients.append(channel.accept()[0])
                continue
            try:
                _, fds, _, _ = socket.recv_fds(sock, 1, 1)
            except OSError:
                fds = []
            try:
                if not fds:
                    raise OSError("closed")  # this client closed its pool
                pid = _fork_worker([channel, *clients], fds[0], idle_s)
                sock.sendall(struct.pack("!i", pid))
            except OSError:
                clients.remove(sock)
                sock.close()
    return 0


def main(argv: list[str]) -> int:
    """``PARENT_PID IDLE_S CHANNEL_FD``: serve forks until the pool closes the channel."""
    return serve(int(argv[0]), float(argv[1]), int(argv[2]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
