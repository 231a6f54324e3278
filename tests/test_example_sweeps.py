"""Every example sweep in experiments/sweeps runs (small, on CPU) and produces its report; the
GPU-only one stops before launch with the reason."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.rank.models import build_model, gradient_bytes
from workbench.store.load import load_runs, load_traces

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = ROOT / "experiments" / "sweeps"
CPU_SWEEPS = [
    "seed000_strategies",
    "seed002_batch_precision",
    "seed002_learning_rate",
    "comm_hooks",
    "your_script",
]


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """The example sweeps (they only check results, not speed), one process each, two at a time
    (a sweep runs its points one after another, so at most four ranks share the two cores); the
    next starts as soon as one ends. Each runs on the warm pool (``--executor pool``): its
    points' ranks fork from one template, so the sweep imports torch once, not once a rank;
    the specs' own executor (local) is the demo's, which ``test_cli.py`` runs as written."""
    out = tmp_path_factory.mktemp("examples")
    logs = tmp_path_factory.mktemp("sweep-logs")
    # The GPU-only sweep stops before launching anything: it goes first, beside a CPU one.
    pending = ["seed000_dataparallel_gpu", *CPU_SWEEPS]
    running: dict[str, subprocess.Popen] = {}
    done = {}
    deadline = time.monotonic() + 1800
    while pending or running:
        while pending and len(running) < 2:
            name = pending.pop(0)
            running[name] = _start_sweep(name, out, logs / f"{name}.log")
        for name, proc in list(running.items()):
            try:
                proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                continue
            stdout = (logs / f"{name}.log").read_text()
            done[name] = (out, subprocess.CompletedProcess(proc.args, proc.returncode, stdout))
            del running[name]
        if time.monotonic() > deadline:
            for proc in running.values():
                proc.kill()
            raise AssertionError(f"sweeps {sorted(running)} still running after 1800 s")
    return done


def _start_sweep(name: str, out: Path, log: Path) -> subprocess.Popen:
    with log.open("w") as sink:  # a file, not a pipe: nothing blocks on unread output
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workbench.cli",
                "sweep",
                str(SWEEPS / f"{name}.yaml"),
                "--output-dir",
                str(out),
                "--no-progress",
                "--executor",
                "pool",
            ],
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
        )


def _sweep(swept, name: str, sweep: str):
    out, proc = swept[name]
    assert proc.returncode == 0, proc.stdout[-3000:]
    runs = load_runs(out, [sweep])
    assert (runs["status"] == "completed").all()
    assert (out / sweep / "report.html").stat().st_size > 100_000, "the report embeds plotly.js"
    assert (out / sweep / "summary.csv").exists()
    return runs, load_traces([Path(p) for p in runs["path"]])


def test_strategies_single_vs_ddp(swept) -> None:
    runs, steps = _sweep(swept, "seed000_strategies", "seed000-strategies")
    assert sorted(zip(runs["strategy"], runs["world_size"], strict=True)) == [
        ("ddp", 1),
        ("ddp", 2),
        ("single", 1),
    ]
    single = runs[runs["strategy"] == "single"]["run_id"].iloc[0]
    assert (steps[steps["run_id"] == single]["comm_bytes"] == 0).all()
    assert (steps[steps["run_id"] != single]["comm_bytes"] > 0).all()


def test_batch_precision_grid(swept) -> None:
    runs, _ = _sweep(swept, "seed002_batch_precision", "seed002-batch-precision")
    assert sorted(zip(runs["world_size"], runs["precision"], strict=True)) == [
        (1, "bf16"),
        (1, "fp32"),
        (2, "bf16"),
        (2, "fp32"),
    ]


def test_learning_rate_rule_sweep(swept) -> None:
    runs, steps = _sweep(swept, "seed002_learning_rate", "seed002-learning-rate")
    last_lr = steps.sort_values("step").groupby("run_id")["lr"].last()
    by_point = {(r.world_size, r.lr_scaling): last_lr[r.run_id] for r in runs.itertuples()}
    assert by_point[(1, "none")] == by_point[(2, "none")] == by_point[(1, "linear")] == 0.05
    assert by_point[(2, "linear")] == pytest.approx(0.1)


def test_comm_hooks_sweep(swept) -> None:
    runs, steps = _sweep(swept, "comm_hooks", "comm-hooks")
    full = gradient_bytes(build_model("transformer", {}))
    bytes_by_hook = {
        r.comm_hook: steps[steps["run_id"] == r.run_id]["comm_bytes"] for r in runs.itertuples()
    }
    assert (bytes_by_hook["allreduce"] == full).all()
    assert (bytes_by_hook["fp16"] == full // 2).all() and (bytes_by_hook["bf16"] == full // 2).all()
    assert bytes_by_hook["powersgd"].iloc[-1] < full / 2
    assert steps["comm_s"].notna().all(), "trace_comm: hook times every step of every point"


def test_gpu_only_sweep_fails_clearly_on_cpu(swept) -> None:
    out, proc = swept["seed000_dataparallel_gpu"]
    assert proc.returncode == 1
    assert (
        "needs that many CUDA devices" in proc.stdout or "no CUDA device is visible" in proc.stdout
    )
    assert "Traceback" not in proc.stdout


def test_a_script_sweep_varies_the_layout_and_the_scripts_arguments(swept) -> None:
    runs, steps = _sweep(swept, "your_script", "your-script")
    assert set(runs["model"]) == {"script:ddp_amp"} and len(runs) == 4
    batch = {r.run_id: int(r.script_args.split()[-1]) for r in runs.itertuples()}
    assert sorted(zip(runs["world_size"], batch.values(), strict=True)) == [
        (1, 64),
        (1, 256),
        (2, 64),
        (2, 256),
    ]
    for run_id, rows in steps.groupby("run_id"):
        assert (rows["samples"] == batch[run_id]).all(), run_id
