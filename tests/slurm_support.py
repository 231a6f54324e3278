"""The local Slurm test cluster (scripts/slurm/cluster.sh) as a pytest fixture.

``slurm_cluster`` uses a running cluster (found through ``$WORKBENCH_SLURM_DIR/env.sh``, or the
folder of ``$SLURM_CONF``), or starts one (needs root) and stops it at the end of the session.
Set ``WORKBENCH_SLURM_AUTOSTART=0`` to only use an already running cluster. Without a cluster the
tests are skipped with the reason (in CI, ``CI=true``, they fail instead). While it is active,
``SLURM_CONF`` is exported and ``tests/slurm/bin`` (a test-only ``sacct``, since the cluster has
no accounting database) is first on ``PATH``.
"""

from __future__ import annotations

import os
import subprocess
import typing as tp
from pathlib import Path

import pytest

from .requirements import require

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_SH = ROOT / "scripts" / "slurm" / "cluster.sh"
SHIM_BIN = ROOT / "tests" / "slurm" / "bin"
DEFAULT_DIR = "/tmp/workbench-slurm"


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
    return subprocess.run(
        ["bash", str(CLUSTER_SH), cmd], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="session")
def slurm_cluster() -> tp.Iterator[dict[str, str]]:
    cluster_dir = _cluster_dir()
    env_file = cluster_dir / "env.sh"
    started_here = False
    running = (
        env_file.exists() and CLUSTER_SH.exists() and _script("status", cluster_dir).returncode == 0
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
        proc = _script("start", cluster_dir)
        if proc.returncode != 0:
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
        yield env
    finally:
        mp.undo()
        if started_here:
            _script("stop", cluster_dir)
