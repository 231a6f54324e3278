"""Benchmarks cannot rot: every script in benchmarks/ (not the private ``_*.py`` helpers), found by
globbing, runs at its ``--smoke`` size in a subprocess, must exit 0 and print its figures.

Only that: a smoke size is a check of the harness, its figures are not meaningful. The scripts
run two at a time, each in a fresh process with this checkout first on ``PYTHONPATH`` (one after
another, alone: 306 CPU s in 333 s, so they keep a core busy and a third at once would not help
on two cores); a script that mostly waits (``WAITS``) runs beside those two. A script that needs
something of the machine (root and ``ip``/``tc`` for the emulated network) says so in ``NEEDS``:
skipped without it, a failure in CI.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from .requirements import require

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))
#: Longest a smoke run may take here (a loaded 2-core machine), seconds.
TIMEOUT_S = 300
#: What a script needs of the machine beyond the package: (available, what is missing).
NEEDS = {
    "cluster_prediction.py": (
        os.geteuid() == 0
        and all(shutil.which(b) for b in ("ip", "tc", "nsenter", "slurmd", "munged")),
        "root, ip(8), tc(8), nsenter(1), Slurm and munge for the emulated cluster",
    ),
    "network_emulation.py": (
        os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None,
        "root, ip(8) and tc(8) for network namespaces shaped by tbf",
    ),
}
#: The figures each script prints (a number with its unit or word); any other script: a number.
FIGURES = {
    "adaptive_study.py": r"adaptive / fixed device-seconds: [\d.]+",
    "analysis_scale.py": r"report, digests present\s+[\d.]+ s",
    "cluster_prediction.py": r"held out \(\d+ points at [\d, ]+ nodes\), bus bandwidth at the",
    "launch_latency.py": r"to_result_s: workbench [\d.]+ s, torchrun [\d.]+ s, ratio",
    "network_emulation.py": r"held out, overlap fraction model: median \|error\| [\d.]+%",
    "plain_ddp.py": r"[\d,]+ samples/s",
    "pool_startup.py": r"pool/torchrun first step: [\d.]+x",
    "report_scale.py": r"[\d.]+ MB of HTML",
    "run_all.py": r"tracer memory \(rss\) growth.*KiB",
    "scaling_fidelity.py": r"workbench/torchrun throughput 1 rank [\d.]+",
    "script_overhead.py": r"end to end [\d.]+",
    "flight_recorder.py": r"flight recorder and flushing: [\d.]+ us a 5 ms step",
    "script_zoo.py": r"no_dataloader\s+[\d,]+/s\s+[\d.]+ \[IQR",
    "tracer_memory.py": r"rss: growth [+-]?\d+ KiB",
    "tracing_overhead.py": r"tracer host cost per step \(cpu\): [\d.]+ us",
}
#: Scripts that mostly wait (on Slurm's daemons: 46 s for 6 CPU s), run beside the two workers.
WAITS = {"cluster_prediction.py"}
#: Scripts known to fail, and why (none).
KNOWN: dict[str, str] = {}

pytestmark = pytest.mark.slow


def _command(script: str) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / script), "--smoke"]


def _run(script: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    try:
        return subprocess.run(
            _command(script), cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        return subprocess.CompletedProcess(e.cmd, 124, out, f"timed out after {TIMEOUT_S} s")


@pytest.fixture(scope="module")
def smoke_runs(
    request: pytest.FixtureRequest,
) -> dict[str, Future[subprocess.CompletedProcess[str]]]:
    """Every selected script's smoke run, started at once on two workers."""
    chosen = [
        item.callspec.params["script"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_benchmark_smoke" and hasattr(item, "callspec")
    ]
    runnable = [s for s in chosen if NEEDS.get(s, (True, ""))[0]]
    pool, beside = ThreadPoolExecutor(max_workers=2), ThreadPoolExecutor(max_workers=1)
    request.addfinalizer(lambda: (pool.shutdown(wait=True), beside.shutdown(wait=True)))
    return {s: (beside if s in WAITS else pool).submit(_run, s) for s in runnable}


def test_scripts_are_found() -> None:
    assert "report_scale.py" in SCRIPTS and "run_all.py" in SCRIPTS
    assert not [s for s in SCRIPTS if s.startswith("_")]


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(s, marks=pytest.mark.xfail(strict=False, reason=KNOWN[s])) if s in KNOWN else s
        for s in SCRIPTS
    ],
)
def test_benchmark_smoke(
    script: str, smoke_runs: dict[str, Future[subprocess.CompletedProcess[str]]]
) -> None:
    available, what = NEEDS.get(script, (True, ""))
    require(available, f"benchmarks/{script} needs {what}")
    done = smoke_runs[script].result()
    said = (
        f"{' '.join(done.args[1:])}: exit {done.returncode}\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    assert done.returncode == 0, said
    assert re.search(FIGURES.get(script, r"\d"), done.stdout), said
