"""End-to-end checks of the single-machine Slurm test cluster (scripts/slurm/cluster.sh).

The session fixture ``slurm_cluster`` uses a running cluster (found through
``$WORKBENCH_SLURM_DIR/env.sh``, or the folder of ``$SLURM_CONF``), or starts one with
``scripts/slurm/cluster.sh start`` (needs root) and then stops it at the end of the session.
Set ``WORKBENCH_SLURM_AUTOSTART=0`` to only use an already running cluster.
Tests are skipped, with the reason, when no cluster is available.

While the fixture is active, ``SLURM_CONF`` is exported and ``tests/slurm/bin`` (the test-only
``sacct`` replacement submitit needs, since the cluster has no accounting database) is put
first on ``PATH``.  Run with the venv python, so submitit's tasks use it too::

    .venv/bin/python -m pytest tests/test_slurm_cluster.py -q -p no:cacheprovider
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

import pytest

submitit = pytest.importorskip("submitit")
cloudpickle = pytest.importorskip("cloudpickle")

# The task functions below live in this test module, which the job's python cannot import
# (pytest put tests/ on its own sys.path only): ship them by value instead of by reference.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_SH = ROOT / "scripts" / "slurm" / "cluster.sh"
SHIM_BIN = ROOT / "tests" / "slurm" / "bin"
DEFAULT_DIR = "/tmp/workbench-slurm"
FINAL_STATES_TIMEOUT_S = 240


# ----------------------------------------------------------------------------- helpers


def _cluster_dir() -> Path:
    if os.environ.get("WORKBENCH_SLURM_DIR"):
        return Path(os.environ["WORKBENCH_SLURM_DIR"])
    if os.environ.get("SLURM_CONF"):
        return Path(os.environ["SLURM_CONF"]).parent
    return Path(DEFAULT_DIR)


def _read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("export ") and "=" in line:
            key, val = line[len("export ") :].split("=", 1)
            env[key.strip()] = val.strip().strip("'\"")
    return env


def _script(cmd: str, cluster_dir: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, WORKBENCH_SLURM_DIR=str(cluster_dir))
    return subprocess.run(["bash", str(CLUSTER_SH), cmd], env=env, capture_output=True, text=True, timeout=timeout)


def _refresh(job: tp.Any) -> str:
    """Force one sacct call (through the shim) and return the job's state."""
    job.watcher.update()
    return job.watcher.get_state(job.job_id, mode="cache")


def _wait_for(job: tp.Any, predicate: tp.Callable[[str], bool], timeout_s: float, period_s: float = 0.5) -> str:
    deadline = time.time() + timeout_s
    state = _refresh(job)
    while not predicate(state):
        if time.time() > deadline:
            raise AssertionError(f"job {job.job_id} still in state {state!r} after {timeout_s} s")
        time.sleep(period_s)
        state = _refresh(job)
    return state


def _wait_done(job: tp.Any, timeout_s: float = FINAL_STATES_TIMEOUT_S) -> str:
    return _wait_for(job, lambda s: job.watcher.is_done(job.job_id, mode="cache"), timeout_s)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def slurm_cluster() -> tp.Iterator[dict[str, str]]:
    cluster_dir = _cluster_dir()
    env_file = cluster_dir / "env.sh"
    started_here = False
    running = env_file.exists() and CLUSTER_SH.exists() and _script("status", cluster_dir).returncode == 0
    if not running:
        if os.environ.get("WORKBENCH_SLURM_AUTOSTART", "1") == "0":
            pytest.skip(f"Slurm test cluster not running in {cluster_dir} (no running daemons / {env_file}); "
                        f"start it with: sudo {CLUSTER_SH} start")
        if os.geteuid() != 0:
            pytest.skip(f"Slurm test cluster not running in {cluster_dir} and starting it needs root; "
                        f"run: sudo {CLUSTER_SH} start")
        proc = _script("start", cluster_dir)
        if proc.returncode != 0:
            pytest.skip(f"could not start the Slurm test cluster ({CLUSTER_SH} start, rc={proc.returncode}):\n"
                        f"{proc.stderr[-2000:]}")
        started_here = True
    env = _read_env_file(env_file)
    assert "SLURM_CONF" in env, f"{env_file} has no SLURM_CONF"
    mp = pytest.MonkeyPatch()
    for key, val in env.items():
        mp.setenv(key, val)
    mp.setenv("PATH", f"{SHIM_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    try:
        yield env
    finally:
        mp.undo()
        if started_here:
            _script("stop", cluster_dir)


@pytest.fixture(scope="session")
def job_root(slurm_cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the cluster runs on this machine, so any local folder is "shared"; pytest's lives in /tmp
    return tmp_path_factory.mktemp("submitit")


def _executor(folder: Path, **params: tp.Any) -> tp.Any:
    ex = submitit.AutoExecutor(folder=folder / "%j", cluster="slurm")
    base = dict(timeout_min=5, slurm_partition=os.environ.get("WORKBENCH_SLURM_PARTITION", "debug"),
                cpus_per_task=1, nodes=1, tasks_per_node=1)
    base.update(params)
    ex.update_parameters(**base)
    return ex


def _ignore_usr2_and_sleep(seconds: float) -> str:
    # submitit asks Slurm for USR2 `signal_delay_s` (default 90 s) before the time limit and its
    # handler then ends a non-checkpointable job itself (FAILED); ignore it to see Slurm's TIMEOUT.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    time.sleep(seconds)
    return "woke up"


@pytest.fixture(scope="session")
def timeout_job(job_root: Path) -> tp.Iterator[tp.Any]:
    """A job with a 1-minute limit that sleeps longer; submitted as early as possible so
    its minute runs while the other tests do."""
    ex = _executor(job_root / "timeout", timeout_min=1, name="wb-timeout")
    job = ex.submit(_ignore_usr2_and_sleep, 600)
    yield job
    if not job.watcher.is_done(job.job_id, mode="cache"):
        job.cancel(check=False)


# ----------------------------------------------------------------------------- task functions


def _env_facts() -> dict[str, tp.Any]:
    env = submitit.JobEnvironment()
    return dict(job_id=env.job_id, global_rank=env.global_rank, local_rank=env.local_rank,
                num_tasks=env.num_tasks, num_nodes=env.num_nodes, node=env.node, hostname=env.hostname,
                nodename=os.environ.get("SLURMD_NODENAME"), cluster=env.cluster)


def _dist_facts() -> dict[str, tp.Any]:
    env = submitit.JobEnvironment()
    dist = submitit.helpers.TorchDistributedEnvironment()
    return dict(global_rank=env.global_rank, local_rank=env.local_rank, hostname=socket.gethostname(),
                nodename=os.environ.get("SLURMD_NODENAME"), master_addr=dist.master_addr,
                master_port=dist.master_port, world_size=dist.world_size,
                local_world_size=dist.local_world_size)


def _gloo_all_reduce() -> dict[str, tp.Any]:
    import datetime

    import torch
    import torch.distributed as dist

    denv = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    dist.init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=120))
    try:
        value = torch.tensor([float(denv.rank + 1)])
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        gathered = [torch.zeros(1) for _ in range(denv.world_size)]
        dist.all_gather(gathered, torch.tensor([float(denv.rank)]))
        return dict(rank=dist.get_rank(), world_size=dist.get_world_size(), sum=value.item(),
                    gathered=[t.item() for t in gathered], nodename=os.environ.get("SLURMD_NODENAME"),
                    master=f"{denv.master_addr}:{denv.master_port}")
    finally:
        dist.destroy_process_group()


class _Preemptible(submitit.helpers.Checkpointable):
    """Sleeps `seconds` in small steps; checkpointable, so submitit requeues it when preempted."""

    def __call__(self, seconds: float) -> dict[str, tp.Any]:
        end = time.time() + seconds
        while time.time() < end:
            time.sleep(0.2)
        return dict(restart_count=int(os.environ.get("SLURM_RESTART_COUNT", "0")))


# ----------------------------------------------------------------------------- tests


def test_cluster_is_up(slurm_cluster: dict[str, str], timeout_job: tp.Any) -> None:
    # `timeout_job` is requested here only to submit it early (see test_timeout_reaches_timeout)
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t %c"], capture_output=True, text=True, check=True).stdout
    nodes = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    expected = slurm_cluster["WORKBENCH_SLURM_NODES"].split(",")
    assert sorted(nodes) == sorted(expected), out
    for name in expected:
        # the first node becomes MASTER_ADDR: every node name must resolve to this machine
        assert socket.gethostbyname(name).startswith("127."), name
    assert shutil.which("sacct") == str(SHIM_BIN / "sacct")


def test_one_node_two_tasks(job_root: Path) -> None:
    ex = _executor(job_root / "a", tasks_per_node=2, name="wb-1x2")
    t0 = time.time()
    job = ex.submit(_env_facts)
    results = job.results()
    elapsed = time.time() - t0
    print(f"\n1 node x 2 tasks: submit-to-results {elapsed:.1f} s")
    assert sorted(r["global_rank"] for r in results) == [0, 1]
    assert sorted(r["local_rank"] for r in results) == [0, 1]
    for r in results:
        assert r["job_id"] == job.job_id
        assert (r["num_tasks"], r["num_nodes"], r["node"], r["cluster"]) == (2, 1, 0, "slurm")
    assert len({r["nodename"] for r in results}) == 1
    assert _wait_done(job, 60) == "COMPLETED"
    assert job.state == "COMPLETED"


def test_two_nodes_two_tasks_each(job_root: Path, slurm_cluster: dict[str, str]) -> None:
    ex = _executor(job_root / "b", nodes=2, tasks_per_node=2, name="wb-2x2")
    t0 = time.time()
    job = ex.submit(_dist_facts)
    results = job.results()
    elapsed = time.time() - t0
    print(f"\n2 nodes x 2 tasks: submit-to-results {elapsed:.1f} s")
    assert sorted(r["global_rank"] for r in results) == [0, 1, 2, 3]
    assert {r["nodename"] for r in results} == set(slurm_cluster["WORKBENCH_SLURM_NODES"].split(","))
    assert len({(r["master_addr"], r["master_port"]) for r in results}) == 1
    assert socket.gethostbyname(results[0]["master_addr"]).startswith("127.")
    assert {(r["world_size"], r["local_world_size"]) for r in results} == {(4, 2)}
    assert _wait_done(job, 60) == "COMPLETED"
    info = job.get_info(mode="force")
    assert sorted(info["NodeList"].split(",")) == sorted(slurm_cluster["WORKBENCH_SLURM_NODES"].split(","))


def test_torch_gloo_all_reduce_across_nodes(job_root: Path) -> None:
    pytest.importorskip("torch")
    ex = _executor(job_root / "gloo", nodes=2, tasks_per_node=2, name="wb-gloo")
    t0 = time.time()
    job = ex.submit(_gloo_all_reduce)
    results = job.results()
    print(f"\ngloo all_reduce 2x2: submit-to-results {time.time() - t0:.1f} s; master {results[0]['master']}")
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 for r in results)
    assert all(r["sum"] == 10.0 for r in results)  # 1 + 2 + 3 + 4
    assert all(r["gathered"] == [0.0, 1.0, 2.0, 3.0] for r in results)
    assert len({r["nodename"] for r in results}) == 2
    assert _wait_done(job, 60) == "COMPLETED"


def test_cancelled_job_is_done(job_root: Path) -> None:
    ex = _executor(job_root / "c", name="wb-cancel")
    job = ex.submit(time.sleep, 600)
    _wait_for(job, lambda s: s == "RUNNING", 60)
    job.cancel()
    # without accounting, only the sacct shim tells submitit that this job (which never
    # writes a result) is over
    state = _wait_done(job, 60)
    assert state.startswith("CANCELLED"), state
    assert job.done()
    with pytest.raises(submitit.core.utils.UncompletedJobError):
        job.result()


def test_preempted_job_is_requeued(job_root: Path) -> None:
    # (runs while the 1-minute timeout job waits for its limit)
    ex = _executor(job_root / "preempt", name="wb-preempt")
    job = ex.submit(_Preemptible(), 4)
    _wait_for(job, lambda s: s == "RUNNING", 60)
    time.sleep(1)
    t0 = time.time()
    job._interrupt()  # like a preemption: SIGTERM, then USR2 -> checkpoint, scontrol requeue
    # a requeued job may start again only after munge's cred_expire (10 s here, 120 s by default)
    _wait_for(job, lambda s: s == "PENDING", 30, period_s=0.2)
    result = job.result()
    print(f"\npreempted job: requeued and finished {time.time() - t0:.1f} s after the signal")
    assert result["restart_count"] >= 1
    assert _wait_done(job, 60) == "COMPLETED"


def test_timeout_reaches_timeout(timeout_job: tp.Any) -> None:
    # Slurm checks time limits about every 30 s, then waits KillWait (5 s): 60-100 s in total
    state = _wait_done(timeout_job, FINAL_STATES_TIMEOUT_S)
    assert state == "TIMEOUT", state
    with pytest.raises(submitit.core.utils.UncompletedJobError):
        timeout_job.result()
