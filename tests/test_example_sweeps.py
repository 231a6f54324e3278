"""Every example sweep in experiments/sweeps runs (small, on CPU) and produces its report; the
GPU-only one stops before launch with the reason."""

from __future__ import annotations

import subprocess
import sys
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
]


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """All example sweeps at once (they only check results, not speed), one process each."""
    out = tmp_path_factory.mktemp("examples")
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workbench.cli",
                "sweep",
                str(SWEEPS / f"{name}.yaml"),
                "--output-dir",
                str(out),
                "--no-progress",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in CPU_SWEEPS + ["seed000_dataparallel_gpu"]
    }
    done = {}
    for name, proc in procs.items():
        stdout, _ = proc.communicate(timeout=900)
        done[name] = (out, subprocess.CompletedProcess(proc.args, proc.returncode, stdout))
    return done


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
