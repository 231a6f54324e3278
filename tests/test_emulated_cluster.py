"""The emulated cluster (``scripts/emulated-cluster.sh``): Slurm nodes in network namespaces of
their own, each link shaped by tbf. ``workbench run --executor slurm --nodes 2`` typed in a
shell completes on it, its ranks' traffic crosses the shaped links (the network it measured
is the link's rate; half the rate, set in place by ``rate``, makes it measurably slower), and
``down`` leaves no namespace, link, qdisc or daemon behind. Needs root, tc and Slurm: in CI a
missing part fails the run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from workbench.run.processes import alive, command_line
from workbench.store.load import load_traces

from .requirements import require

# timing: its claims are durations measured on this host; they run alone (tests/README.md)
pytestmark = [pytest.mark.slow, pytest.mark.timing]
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "emulated-cluster.sh"
#: Communication-bound: 8 MiB of gradients a step (about 0.17 s at 400 Mbit/s), 15 ms of compute.
WORKLOAD = '{"gradient_kib": 8192, "forward_us": 5000, "backward_us": 10000}'


@pytest.fixture
def emu_dir() -> Iterator[Path]:
    """The cluster's folder: short and open to all (munged refuses a socket under a private
    folder such as pytest's, and a Unix socket's path is short)."""
    folder = Path(tempfile.mkdtemp(prefix="wb-emu-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder / "emu"
    shutil.rmtree(folder, ignore_errors=True)


def _cluster(emu: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORKBENCH_EMU_DIR": str(emu), "WORKBENCH_EMU_PORT": "6927"}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=180
    )


def _run(emu: Path, store: Path, name: str) -> dict:
    """``workbench run`` on the cluster, as typed in a shell that sourced ``env``."""
    env = dict(os.environ)
    for line in _cluster(emu, "env").stdout.splitlines():
        if line.startswith("export "):
            key, _, value = line.removeprefix("export ").partition("=")
            env[key] = value
    argv = ["run", "--executor", "slurm", "--nodes", "2", "--tasks-per-node", "1"]
    argv += ["--partition", env["WORKBENCH_SLURM_PARTITION"], "--poll-s", "1", "--no-progress"]
    argv += ["--model", "planted", "--model-options", WORKLOAD, "--per-device-batch-size", "16"]
    argv += ["--steps", "14", "--warmup-steps", "4", "--time-min", "5", "--sweep", "emu"]
    argv += ["--output-dir", str(store), "--run-name", name]
    done = subprocess.run(
        [sys.executable, "-m", "workbench.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = json.loads((store / "emu" / name / "run.json").read_text())
    steps = load_traces([store / "emu" / name], "steps")
    run["median_step_s"] = float(np.median(steps.loc[~steps["warmup"], "step_s"]))
    return run


def _leftovers(emu: Path) -> list[str]:
    """Namespaces, links and daemons of the emulated cluster still there."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = [n.split()[0] for n in names.splitlines() if n.startswith("wbemu-")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left += [line.split(":")[1].strip() for line in links.splitlines() if "wbemu" in line]
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    return left + [str(p) for p in pids if alive(p) and str(emu) in " ".join(command_line(p))]


def test_runs_cross_the_shaped_links_and_down_leaves_nothing(emu_dir: Path, tmp_path: Path) -> None:
    require(
        os.geteuid() == 0 and all(shutil.which(b) for b in ("tc", "slurmd", "munged", "nsenter")),
        "root, tc, nsenter, Slurm and munge, to build the emulated cluster",
    )
    try:
        runs = {}
        # up at 400 Mbit/s, then the same cluster's links shaped again in place
        for command in (["up", "--nodes", "2", "--rate", "400mbit"], ["rate", "200mbit"]):
            done = _cluster(emu_dir, *command)
            assert done.returncode == 0, done.stderr[-2000:]
            rate = int(command[-1].removesuffix("mbit"))
            runs[rate] = _run(emu_dir, tmp_path, f"at-{rate}mbit")
        for rate, run in runs.items():
            assert (run["executor"], run["status"]) == ("slurm", "completed")
            # the network the run measured is its link's: bus bandwidth near rate / 8 bytes
            busbw = run["network"]["busbw_bytes_per_s"]
            assert 0.7 * rate * 1e6 / 8 < busbw < 1.05 * rate * 1e6 / 8, (rate, run["network"])
        slower = runs[200]["median_step_s"] / runs[400]["median_step_s"]
        assert slower > 1.4, f"half the rate: step x{slower:.2f}"
    finally:
        down = _cluster(emu_dir, "down")
    assert down.returncode == 0, down.stderr
    assert _leftovers(emu_dir) == []


def test_bad_input_is_named_before_anything_is_built(emu_dir: Path) -> None:
    for args, said in (
        (["up", "--nodes", "0"], "--nodes '0': a whole number from 1 to 250"),
        (["up", "--rate", "fast"], "--rate 'fast': a tc rate such as 1gbit"),
        (["up", "--burst", "lots"], "--burst 'lots': a tc size such as 64kb, 1mb"),
        (["up", "--nodez", "2"], "unknown option '--nodez'"),
        (["rate", "fast"], "rate 'fast': a tc rate such as 1gbit"),
        (["rate", "200mbit"], "the emulated cluster is down"),
    ):
        done = _cluster(emu_dir, *args)
        assert done.returncode == 1 and said in done.stderr, done.stderr
    assert not emu_dir.exists()
