"""End-to-end checks of the single-machine Slurm test cluster (scripts/slurm/cluster.sh).

The session fixture ``slurm_cluster`` uses a running cluster when ``$WORKBENCH_SLURM_DIR`` (or
the folder of ``$SLURM_CONF``) names one, or starts one with ``scripts/slurm/cluster.sh start``
(needs root) in a temporary folder of the session's own, then stops and removes it.
Set ``WORKBENCH_SLURM_AUTOSTART=0`` to only use an already running cluster.
Tests are skipped, with the reason, when no cluster is available (in CI they fail).

While the fixture is active, ``SLURM_CONF`` is exported and ``tests/slurm/bin`` (the test-only
``sacct`` replacement submitit needs, since the cluster has no accounting database) is put
first on ``PATH``.  Run with the venv python, so submitit's tasks use it too::

    .venv/bin/python -m pytest tests/test_slurm_cluster.py -q -p no:cacheprovider
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import typing as tp
from pathlib import Path

import pytest

from workbench import jobs

from .slurm_support import SHIM_BIN

submitit = pytest.importorskip("submitit")
cloudpickle = pytest.importorskip("cloudpickle")

# The task functions below live in this test module, which the job's python cannot import
# (pytest put tests/ on its own sys.path only): ship them by value instead of by reference.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

FINAL_STATES_TIMEOUT_S = 240


# ----------------------------------------------------------------------------- helpers


def _refresh(job: tp.Any) -> str:
    """Force one sacct call (through the shim) and return the job's state."""
    job.watcher.update()
    return job.watcher.get_state(job.job_id, mode="cache")


def _wait_for(
    job: tp.Any, predicate: tp.Callable[[str], bool], timeout_s: float, period_s: float = 0.5
) -> str:
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
def job_root(slurm_cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the cluster runs on this machine, so any local folder is "shared"; pytest's lives in /tmp
    return tmp_path_factory.mktemp("submitit")


def _executor(folder: Path, **params: tp.Any) -> tp.Any:
    ex = submitit.AutoExecutor(folder=folder / "%j", cluster="slurm")
    base = dict(
        timeout_min=5,
        slurm_partition=os.environ.get("WORKBENCH_SLURM_PARTITION", "debug"),
        cpus_per_task=1,
        nodes=1,
        tasks_per_node=1,
    )
    base.update(params)
    ex.update_parameters(**base)
    return ex


# ----------------------------------------------------------------------------- task functions


def _env_facts() -> dict[str, tp.Any]:
    env = submitit.JobEnvironment()
    return dict(
        job_id=env.job_id,
        global_rank=env.global_rank,
        local_rank=env.local_rank,
        num_tasks=env.num_tasks,
        num_nodes=env.num_nodes,
        node=env.node,
        hostname=env.hostname,
        nodename=os.environ.get("SLURMD_NODENAME"),
        cluster=env.cluster,
    )


def _dist_facts() -> dict[str, tp.Any]:
    env = submitit.JobEnvironment()
    dist = jobs.job_facts()  # what a workbench rank sees, MASTER_ADDR included
    return dict(
        global_rank=env.global_rank,
        local_rank=env.local_rank,
        hostname=socket.gethostname(),
        nodename=os.environ.get("SLURMD_NODENAME"),
        master_addr=dist.master_addr,
        master_port=dist.master_port,
        world_size=dist.world_size,
        local_world_size=dist.local_world_size,
    )


# ----------------------------------------------------------------------------- tests


def test_cluster_is_up(slurm_cluster: dict[str, str]) -> None:
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %t %c"], capture_output=True, text=True, check=True
    ).stdout
    nodes = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    expected = slurm_cluster["WORKBENCH_SLURM_NODES"].split(",")
    assert sorted(nodes) == sorted(expected), out
    for name in expected:
        # the first node becomes MASTER_ADDR: its name, or Slurm's NodeAddr where the name
        # resolves nowhere, must reach this machine
        assert socket.gethostbyname(jobs.node_address(name)).startswith("127."), name
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
    assert {r["nodename"] for r in results} == set(
        slurm_cluster["WORKBENCH_SLURM_NODES"].split(",")
    )
    assert len({(r["master_addr"], r["master_port"]) for r in results}) == 1
    assert socket.gethostbyname(results[0]["master_addr"]).startswith("127.")
    assert {(r["world_size"], r["local_world_size"]) for r in results} == {(4, 2)}
    assert _wait_done(job, 60) == "COMPLETED"
    info = job.get_info(mode="force")
    assert sorted(info["NodeList"].split(",")) == sorted(
        slurm_cluster["WORKBENCH_SLURM_NODES"].split(",")
    )


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


def test_cluster_starts_where_the_host_name_resolves_nowhere() -> None:
    """Many container and cloud images map ``hostname -s`` to no address or a non-loopback one: the
    script gives every daemon 127.0.0.1 itself. A new UTS namespace with a host name that resolves
    nowhere starts a second cluster, runs a two-node step and stops it."""
    from .requirements import require
    from .slurm_support import CLUSTER_SH, _free_port_triple

    require(os.geteuid() == 0 and shutil.which("unshare") is not None, "root and unshare(1)")
    folder = Path(tempfile.mkdtemp(prefix="wb-slurm-uts-", dir="/tmp"))
    name = "wb-unresolvable-host"
    script = (
        f"hostname {name} && ! getent hosts {name} && bash {CLUSTER_SH} start && "
        f"srun -N2 -n2 hostname; rc=$?; bash {CLUSTER_SH} stop; exit $rc"
    )
    env = dict(
        os.environ,
        WORKBENCH_SLURM_DIR=str(folder),
        WORKBENCH_SLURM_PORT=str(_free_port_triple()),
        SLURM_CONF=str(folder / "slurm.conf"),
    )
    try:
        proc = subprocess.run(
            ["unshare", "--uts", "bash", "-c", script],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == [name, name], proc.stdout  # after the printed env
