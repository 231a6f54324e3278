"""The terminal's tables with numbers worked out by hand: times in ms, rates with separators,
an accuracy as a percentage, never a number in exponent form and no pandas index row. The same
tables from real runs are checked in tests/test_cli.py."""

from __future__ import annotations

import re
import subprocess
import sys

import pandas as pd
import pytest

from workbench.analysis.measured.units import number
from workbench.cli.tables import per_rank_text, runs_text

EXPONENT = re.compile(r"e[+-]\d\d")


def test_plain_numbers_never_use_an_exponent() -> None:
    assert number(15290.4) == "15,290"
    assert number(123.4) == "123"
    assert number(99.96) == "100"
    assert number(2.314) == "2.31"
    assert number(0.1726) == "0.173"
    assert number(0.0001726) == "0.000173"
    assert number(0) == "0"
    assert number(float("nan")) == "n/a"
    assert not EXPONENT.search(number(1.5e-9)) and not EXPONENT.search(number(3e21))


def test_per_rank_table_in_ms_without_an_index_row() -> None:
    """What ``per_rank_table`` returns (indexed by rank, seconds, MiB) as the user saw it
    printed: 0.0001726 s is 0.173 ms; 15,290.4 samples/s; 391 MiB is 0.38 GiB."""
    table = pd.DataFrame(
        {
            "data_s": [0.0001726, 0.0000857],
            "forward_s": [0.000435, 0.000322],
            "backward_s": [0.00103, 0.00128],
            "optimizer_s": [0.00034, 0.000227],
            "comm_s": [float("nan"), 0.000981],
            "step_s": [0.0019134, 0.012],
            "samples_per_s": [15290.4, 8359.0],
            "peak_rss_mib": [391.0, 2048.0],
        },
        index=pd.Index([0, 1], name="rank"),
    )
    lines = per_rank_text(table).splitlines()
    assert lines[0].split() == [
        "rank", "data", "forward", "backward", "optimizer", "comm", "step", "samples/s", "peak",
        "RSS",
    ]  # fmt: skip
    assert lines[1].split() == [
        "0", "0.173", "0.435", "1.03", "0.340", "-", "1.91", "15,290/s", "0.38", "GiB",
    ]  # fmt: skip
    assert lines[2].split() == [
        "1", "0.0857", "0.322", "1.28", "0.227", "0.981", "12.0", "8,359/s", "2", "GiB",
    ]  # fmt: skip
    assert len(lines) == 3, "a header and one row per rank: no index row"
    assert not EXPONENT.search("\n".join(lines))


def test_runs_table_formats_rates_losses_and_accuracy() -> None:
    runs = pd.DataFrame(
        {
            "sweep": ["s", "s"],
            "run_id": ["mlp-w1-a", "mlp-w2-b"],
            "status": ["completed", "failed"],
            "model": ["mlp", "mlp"],
            "world_size": [1, 2],
            "per_device_batch_size": [16, 16],
            "precision": ["fp32", "fp32"],
            "samples_per_s": [15290.4, 48.25],
            "final_loss": [0.000012, 1.3495],
            "final_metric": [0.78125, None],
            "final_metric_name": ["accuracy", None],
            "path": ["x", "y"],
        }
    )
    lines = runs_text(runs).splitlines()
    assert lines[0].split() == [
        "sweep", "run", "status", "model", "ranks", "batch/device", "precision", "samples/s",
        "loss", "accuracy",
    ]  # fmt: skip
    assert lines[1].split() == [
        "s", "mlp-w1-a", "completed", "mlp", "1", "16", "fp32", "15,290/s", "0.0000120", "78", "%",
    ]  # fmt: skip
    assert lines[2].split() == [
        "s", "mlp-w2-b", "failed", "mlp", "2", "16", "fp32", "48.2/s", "1.35", "-",
    ]  # fmt: skip
    assert not EXPONENT.search("\n".join(lines))


@pytest.mark.slow
@pytest.mark.waits
def test_a_run_with_no_steps_prints_empty_tables_and_no_rate(tmp_path) -> None:
    """A script that steps no optimizer, named as folders cannot be (a leading ``_``, a space):
    its run id is made a folder name, its tables print with no rows, its rates are n/a (never
    0), and the command ends without a traceback (the terminal, as a user types it)."""
    script = tmp_path / "_no steps.py"
    script.write_text("print('trained nothing')\n")
    argv = [sys.executable, "-m", "workbench.cli", "run", "--script", str(script)]
    argv += ["--executor", "debug", "--no-progress", "--output-dir", str(tmp_path / "store")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    (run,) = (tmp_path / "store" / "default").iterdir()
    assert run.name.startswith("no-steps-w1-"), run.name
    said = done.stdout
    assert "throughput: n/a samples/s" in said and " 0 samples/s" not in said, said
    assert "rank  data  forward" in said, said


UNCOUNTED = """\
import torch
from torch import nn


class Generated(nn.Module):  # makes its own batch from a seed: nothing to count from outside
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 1)

    def forward(self, seed: int):
        x = torch.randn(32, 16, generator=torch.Generator().manual_seed(seed))
        return self.lin(x).pow(2).mean()


model = Generated()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(30):
    model(step).backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.slow
@pytest.mark.waits
def test_samples_that_cannot_be_counted_are_unknown_never_zero(tmp_path) -> None:
    """A script whose batch no hook can see (its model makes it from a seed): its throughput is
    printed as unknown, with the note that says how to tell it, never as 0 samples/s."""
    script = tmp_path / "uncounted.py"
    script.write_text(UNCOUNTED)
    argv = [sys.executable, "-m", "workbench.cli", "run", "--script", str(script)]
    argv += ["--executor", "debug", "--no-progress", "--output-dir", str(tmp_path / "store")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    said = done.stdout
    assert "uncounted.py: the samples of its steps were not counted" in said, said
    assert said.index("note: ") < said.index("throughput:"), said
    assert "workbench.trace.note(samples=" in said, said
    assert "throughput: unknown samples/s total end to end" in said, said
    assert "training alone: unknown samples/s" in said, said
    assert "0 samples/s" not in said and " 0/s" not in said, said
