"""Claims of the docs beside tests/test_cli.py: the ``workbench`` console script itself, a scaling
study (workbench/run/study.py) that goes on past a failed run, and the failure report of a rank
that raises, with the rank's own traceback pointing at the line that raised."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workbench.config.run_config import RunConfig
from workbench.run.study import run_study, scaling_configs

from .helpers import wait_until_no_job_processes

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- the console script


def test_the_console_script_is_the_cli(tmp_path: Path) -> None:
    """``workbench`` as installed in the venv (docs/cli.md): ``run --help`` lists
    every RunConfig field as a flag (but the test-only fault injection), ``ls`` of an empty
    store says so, and a misspelled flag is refused naming the closest one."""
    script = Path(sys.executable).parent / "workbench"
    assert script.is_file(), f"no console script beside {sys.executable}: is the package installed?"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }

    def workbench(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(script), *args], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
        )

    helped = workbench("run", "--help")
    assert helped.returncode == 0, helped.stderr
    hidden = {"fault"}  # test-only: accepted, not shown
    flags = {
        f"--{f.name.replace('_', '-')}"
        for f in dataclasses.fields(RunConfig)
        if f.init and f.name not in hidden
    }
    missing = sorted(f for f in flags if f not in helped.stdout.replace(",", " ").split())
    assert not missing, f"run --help lacks {missing}"
    empty = workbench("ls", "--output-dir", str(tmp_path))
    assert empty.returncode == 0 and f"no runs in {tmp_path}" in empty.stdout, empty
    typo = workbench("run", "--world-sizes", "2")
    assert typo.returncode == 2 and "--world-sizes: did you mean --world-size?" in typo.stderr


# ----------------------------------------------------------------------------- a failing study

#: A plug-in model whose forward raises on one rank at one training step; the test knows the
#: line that raises because it wrote it.
PLUGIN = textwrap.dedent("""\
    import torch
    from torch import nn


    class Faulty(nn.Module):
        task = "classification"

        def __init__(self, fail_rank, fail_step):
            super().__init__()
            from workbench.rank.models import MLP

            self.net = MLP(input_dim=32, hidden_dim=64, num_layers=2, num_classes=4)
            self.fail_rank, self.fail_step, self.calls = fail_rank, fail_step, 0

        def forward(self, x):
            if self.training:
                self.calls += 1
                rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
                if rank == self.fail_rank and self.calls == self.fail_step:
                    raise LookupError(f"planted on rank {rank} in forward call {self.calls}")
            return self.net(x)


    def faulty_mlp(fail_rank=1, fail_step=3):
        return Faulty(fail_rank, fail_step)
""")
RAISING_LINE = 'raise LookupError(f"planted on rank {rank} in forward call {self.calls}")'


@pytest.fixture(scope="module")
def failed_study(tmp_path_factory: pytest.TempPathFactory):
    """One real study through ``run_study``: world size 2 first, whose rank 1 raises in its
    third training step, then world size 1 (no rank 1: it completes)."""
    plugins = tmp_path_factory.mktemp("plugins")
    plugin = plugins / "planted_fault.py"
    plugin.write_text(PLUGIN)
    store = tmp_path_factory.mktemp("study-store")
    config = RunConfig(
        model="planted_fault:faulty_mlp",
        model_options={"fail_rank": 1, "fail_step": 3},
        dataset="tests.plugins:synthetic_like_mlp",
        world_size=2,
        per_device_batch_size=16,
        train_samples=512,
        eval_samples=64,
        eval_batch_size=64,
        max_steps=6,
        warmup_steps=2,
        collective_timeout_s=60,
        trace_flush_s=0.2,
        output_dir=str(store),
        sweep="study",
    )
    configs = scaling_configs(config, [2, 1])
    said = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        # the launcher checks the plug-in imports; each rank, a fresh process, imports it too
        mp.syspath_prepend(str(plugins))
        mp.setenv("PYTHONPATH", os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")]))
        mp.setenv("OMP_NUM_THREADS", "1")
        with contextlib.redirect_stdout(said):
            handles = run_study(configs, progress=False)
    for handle in handles:
        wait_until_no_job_processes(handle.path)
    return dict(handles=handles, said=said.getvalue(), plugin=plugin)


@pytest.mark.slow
def test_a_study_reports_a_failed_run_and_goes_on(failed_study) -> None:
    two, one = failed_study["handles"]
    assert (two.config.world_size, one.config.world_size) == (2, 1), "in the order asked"
    assert (two.status(), one.status()) == ("failed", "completed")
    assert {two.config.per_device_batch_size, one.config.per_device_batch_size} == {16}
    assert two.run_id != one.run_id
    said = failed_study["said"]
    assert f"run {two.run_id} failed: " in said and "rank 1: LookupError" in said, said
    assert one.run_id not in said, "the completed run is not reported as failed"
    steps = one.traces()
    assert sorted(steps["step"]) == list(range(1, 7)), "the run after the failure ran in full"


@pytest.mark.slow
def test_a_raising_rank_is_reported_with_its_traceback(failed_study) -> None:
    """docs/failures.md: the rank that raised is named, with its exception and traceback (the
    type and the line that raised, here a line of the plug-in this test wrote); its peer's
    "connection closed" is not taken for the cause; its rows before the fault stay readable."""
    two = failed_study["handles"][0]
    plugin: Path = failed_study["plugin"]
    line = 1 + PLUGIN.splitlines().index(" " * 16 + RAISING_LINE)
    failure = json.loads((two.path / "run.json").read_text())["failure"]
    assert failure["rank"] == 1, failure
    assert failure["exception"] == "LookupError: planted on rank 1 in forward call 3"
    tb = failure["traceback"]
    assert tb.startswith("Traceback (most recent call last):"), tb
    assert f'File "{plugin}", line {line}, in forward\n    {RAISING_LINE}' in tb, tb
    assert tb.rstrip().endswith("LookupError: planted on rank 1 in forward call 3"), tb
    assert "in train_step" in tb, "the traceback runs through the training step"
    err = two.failure_error()
    assert (err.rank, err.traceback) == (1, tb)
    states = two.rank_states()
    assert states[1]["status"] == "failed" and states[0]["status"] == "failed"
    assert "LookupError" not in (states[0].get("exception") or ""), states[0]
    steps = two.traces()
    assert sorted(steps.loc[steps["rank"] == 1, "step"]) == [1, 2], "rank 1 failed in step 3"
