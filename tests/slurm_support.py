"""The local Slurm test cluster (scripts/slurm/cluster.sh) as a pytest fixture.

``slurm_cluster`` uses a running cluster when ``$WORKBENCH_SLURM_DIR`` (or the folder of
``$SLURM_CONF``) names one, or starts one (needs root) in a folder of its own under the system's
temporary folder, on free ports, and stops and removes it at the end of the session.
Set ``WORKBENCH_SLURM_AUTOSTART=0`` to only use an already running cluster. Without a cluster the
tests are skipped with the reason (in CI, ``CI=true``, they fail instead). While it is active,
``SLURM_CONF`` is exported and ``tests/slurm/bin`` (a test-only ``sacct``, since the cluster has
no accounting database) is first on ``PATH``.

As soon as the cluster is up it is also given the time-limit job of
``test_slurm_launch.py::test_time_limit_checkpoints_requeues_and_completes``: two minutes and more
of ranks that mostly sleep, past their limit and requeued. A thread records its statuses as they
change; the test judges them at the end. Its wait overlaps the tests in between instead of adding
to them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import typing as tp
from pathlib import Path

import pytest

from workbench.ports import free_port

from .requirements import require

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_SH = ROOT / "scripts" / "slurm" / "cluster.sh"
SHIM_BIN = ROOT / "tests" / "slurm" / "bin"


#: The statuses that end a run.
ENDED = ("completed", "failed", "cancelled")


class StatusLog:
    """A run's statuses in the order they were seen, recorded by a thread that asks every half
    second until the run ends or ``timeout_s`` passes."""

    def __init__(self, handle: tp.Any, timeout_s: float) -> None:
        self.handle = handle
        self.seen = [handle.status()]
        self._deadline = time.monotonic() + timeout_s
        self._thread = threading.Thread(target=self._follow, daemon=True, name="status-log")
        self._thread.start()

    def _follow(self) -> None:
        while self.seen[-1] not in ENDED and time.monotonic() < self._deadline:
            time.sleep(0.5)
            try:
                status = self.handle.status()
            except Exception:  # noqa: BLE001  (a busy controller: ask again)
                continue
            if status != self.seen[-1]:
                self.seen.append(status)

    def wait(self) -> list[str]:
        """The statuses seen, once the run ended (or the time ran out)."""
        self._thread.join(max(0.0, self._deadline - time.monotonic()) + 5)
        return list(self.seen)


#: The time-limit job's config and its status log, once the cluster gave it.
TIME_LIMIT: dict[str, tp.Any] = {}


def time_limit_config(store: Path) -> tp.Any:
    """A 2-minute limit, warned 45 s before. Slurm may send the warning up to a minute early, so
    it arrives 15 to 75 s in; the run (480 steps of 0.2 s sleep: 96 s) cannot finish first, so
    the ranks stop together, checkpoint, requeue and resume (perhaps twice)."""
    from .conftest import base_config

    return base_config(
        store,
        world_size=2,
        run_name="slurm-timelimit",
        model="tests.plugins:sleepy_mlp",
        dataset="tests.plugins:synthetic_like_mlp",
        model_options={"sleep_s": 0.2},
        epochs=60,
        timeout_min=2,
        signal_delay_s=45,
        stop_check_every_steps=1,
        checkpoint_every_steps=0,
    )


def _submit_time_limit_job(store: Path) -> None:
    from workbench.run.launch import launch

    config = time_limit_config(store)
    partition = os.environ.get("WORKBENCH_SLURM_PARTITION", "debug")
    handle = launch(config, executor="slurm", partition=partition, poll_s=2.0)
    TIME_LIMIT.update(config=config, log=StatusLog(handle, timeout_s=420))


def all_job_ids() -> list[str]:
    """Every job the cluster knows, finished ones included (MinJobAge keeps them an hour)."""
    out = subprocess.run(
        ["squeue", "-h", "-r", "-t", "all", "-o", "%i"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return sorted(out.split())


def _cluster_dir() -> Path | None:
    """The folder of a cluster the environment names, or None: the session starts its own."""
    if os.environ.get("WORKBENCH_SLURM_DIR"):
        return Path(os.environ["WORKBENCH_SLURM_DIR"])
    if os.environ.get("SLURM_CONF"):
        return Path(os.environ["SLURM_CONF"]).parent
    return None


def _free_port_triple() -> int:
    """A port p with p, p+1 and p+2 free (slurmctld, two slurmd), below the ephemeral range."""
    for _ in range(200):
        port = free_port()
        if port + 2 < 32768 and all(_port_free(p) for p in (port + 1, port + 2)):
            return port
    raise RuntimeError("no three consecutive free ports found for the Slurm test cluster")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("export ") and "=" in line:
            key, val = line[len("export ") :].split("=", 1)
            env[key.strip()] = val.strip().strip("'\"")
    return env


def _script(
    cmd: str, cluster_dir: Path, timeout: float = 600, **extra: str
) -> subprocess.CompletedProcess:
    env = dict(os.environ, WORKBENCH_SLURM_DIR=str(cluster_dir), **extra)
    return subprocess.run(
        ["bash", str(CLUSTER_SH), cmd], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="session")
def slurm_cluster(store: Path) -> tp.Iterator[dict[str, str]]:
    named = _cluster_dir()
    # A short folder of its own: the munge socket's path must fit a Unix socket name.
    cluster_dir = named or Path(tempfile.mkdtemp(prefix="wb-slurm-", dir="/tmp"))
    env_file = cluster_dir / "env.sh"
    started_here = False
    running = (
        named is not None
        and env_file.exists()
        and CLUSTER_SH.exists()
        and _script("status", cluster_dir).returncode == 0
    )
    if not running:
        if os.environ.get("WORKBENCH_SLURM_AUTOSTART", "1") == "0":
            require(
                False,
                f"Slurm test cluster not running in {cluster_dir} "
                f"(no running daemons / {env_file}); "
                f"start it with: sudo {CLUSTER_SH} start",
            )
        if os.geteuid() != 0:
            require(
                False,
                f"Slurm test cluster not running in {cluster_dir} and starting it needs root; "
                f"run: sudo {CLUSTER_SH} start",
            )
        proc = _script("start", cluster_dir, WORKBENCH_SLURM_PORT=str(_free_port_triple()))
        if proc.returncode != 0:
            if named is None:
                shutil.rmtree(cluster_dir, ignore_errors=True)
            require(
                False,
                f"could not start the Slurm test cluster ({CLUSTER_SH} start, "
                f"rc={proc.returncode}):\n"
                f"{proc.stderr[-2000:]}",
            )
        started_here = True
    env = _read_env_file(env_file)
    assert "SLURM_CONF" in env, f"{env_file} has no SLURM_CONF"
    mp = pytest.MonkeyPatch()
    for key, val in env.items():
        mp.setenv(key, val)
    mp.setenv("PATH", f"{SHIM_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    try:
        _submit_time_limit_job(store)
        yield env
    finally:
        log = TIME_LIMIT.pop("log", None)
        if log is not None and log.seen[-1] not in ENDED:
            log.handle.cancel()  # the session ended before its test judged it
        mp.undo()
        if started_here:
            _script("stop", cluster_dir)
            if named is None:
                shutil.rmtree(cluster_dir, ignore_errors=True)
