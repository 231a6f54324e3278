"""Costs planted in a real run, measured back: a forward pass that sleeps, dataset items that
sleep, an evaluation that sleeps and a checkpoint that sleeps (tests/plugins.py), in one real
1-rank DDP run. Every expected value is worked out from the planted sleeps and the schedule, or
from the raw trace rows by hand, never from the analysis under test.

The schedule: 27 training samples, global batch 4: 6 steps per epoch (3 samples dropped per
epoch), 2 epochs = 12 steps, step 1 warm-up. Checkpoints every 4 steps: after steps 4, 8 and 12
(the last is the final checkpoint). Evaluation after each epoch: after steps 6 and 12, each 2
batches of 4 samples. The measured window runs from step 2's start to step 12's end, so it holds
the checkpoints after steps 4 and 8 and the evaluation after step 6; those after step 12 are
outside it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from workbench import RunConfig, launch
from workbench.analysis import measured_window, phase_breakdown
from workbench.cli.commands import _print_summary
from workbench.store.files import read_json

from .helpers import WARM

ROOT = Path(__file__).resolve().parent.parent
# timing: its claims are durations measured on this host; they run alone (tests/README.md)
pytestmark = [pytest.mark.slow, pytest.mark.timing]

FORWARD_S = 0.040  # each training forward pass: 5 % of it (2 ms) holds DDP's own forward and
# the sleep's wake-up (1.1 ms seen on a 20 ms sleep, over the 1 ms a 20 ms plant allows)
ITEM_S = 0.010  # each training sample fetched
BATCH = 4
EVAL_S = 0.250  # each evaluation forward pass (one per evaluation batch)
EVAL_BATCHES = 2  # 8 evaluation samples, 4 per batch
SAVE_S = 0.250  # each checkpoint (rank 0's state_dict)
SAVE_STEPS = [4, 8, 12]
MEASURED = list(range(2, 13))
# Planted costs inside the window: the checkpoints after steps 4 and 8, the evaluation after 6.
PLANTED_IN_WINDOW_S = 2 * SAVE_S + EVAL_BATCHES * EVAL_S


def close(measured: float, planted: float, files_s: float = 0.0) -> bool:
    """At least the planted value (a sleep never ends early) and within 5 % or 1 ms of it,
    whichever is looser, plus ``files_s``: what writing a checkpoint's files took bare in the
    same minutes, where the value holds checkpoints. The planted evaluation and checkpoint
    sleeps are long enough (0.25 s) that a busy machine waking a sleeper a few milliseconds late
    stays inside the 5 %."""
    return planted <= measured <= planted + max(0.05 * planted, 0.001) + files_s


#: A checkpoint's files written bare: what the rank writes (its RNG state; rank 0's model,
#: optimizer and scaler state) three times in a fresh process, nothing of the workbench; prints
#: the seconds of each write, the first with torch.save's first call.
BARE_SAVE = """
import sys, time, torch
from pathlib import Path
from tests.plugins import planted_costs_mlp
model = planted_costs_mlp()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", enabled=False)
for i in range(3):
    start = time.perf_counter()
    folder = Path(sys.argv[1]) / f"step-{i}.partial"
    folder.mkdir(parents=True)
    torch.save((torch.get_rng_state(), None), folder / "rng-rank00000.pt")
    state = {"step": i, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scaler": scaler.state_dict()}
    torch.save(state, folder / "train.pt")
    print(time.perf_counter() - start)
"""


def _bare_saves(folder: Path) -> list[float]:
    """:data:`BARE_SAVE`'s seconds: the first write, then the later ones."""
    done = subprocess.run(
        [sys.executable, "-c", BARE_SAVE, str(folder)],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=True,
    )  # fmt: skip
    return [float(line) for line in done.stdout.split()]


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    config = RunConfig(
        model="tests.plugins:planted_costs_mlp",
        model_options={"sleep_s": FORWARD_S, "eval_sleep_s": EVAL_S, "save_sleep_s": SAVE_S},
        dataset="tests.plugins:slow_items",
        dataset_options={"item_sleep_s": ITEM_S},
        train_samples=27,
        eval_samples=8,
        eval_batch_size=4,
        global_batch_size=BATCH,
        world_size=1,
        epochs=2,
        warmup_steps=1,
        checkpoint_every_steps=4,
        trace_flush_s=0.05,  # several periodic flushes: rows held back for their gap_s
        output_dir=str(tmp_path_factory.mktemp("planted")),
        sweep="planted",
        run_name="planted",
        collective_timeout_s=60,
    )
    bare = tmp_path_factory.mktemp("bare-saves")
    before = _bare_saves(bare / "before")
    handle = launch(config, WARM)
    assert handle.wait(timeout_s=180) == "completed"
    after = _bare_saves(bare / "after")
    steps = handle.traces()
    return dict(
        handle=handle,
        steps=steps.sort_values("step").reset_index(drop=True),
        evals=handle.traces("eval"),
        run=read_json(handle.path / "run.json"),
        # the checkpoints in the window (after steps 4 and 8): a first write and a later one,
        # each the slower of before and after the run
        files_s=max(before[0], after[0]) + max(before[1:] + after[1:]),
    )


def test_forward_and_data_times_are_the_planted_sleeps(planted) -> None:
    steps = planted["steps"]
    for phase, planted_s in (("forward_s", FORWARD_S), ("data_s", BATCH * ITEM_S)):
        values = steps.loc[steps["step"].isin(MEASURED), phase]
        # A sleep never ends early: every step is at least the planted cost.
        assert (values >= planted_s).all(), values
        # The least-disturbed step is the planted cost and little else (a busy machine wakes
        # a sleeper late, so single steps may be slower).
        assert close(values.min(), planted_s), values.describe()


def test_save_s_is_on_the_checkpoint_steps_and_is_the_planted_sleep(planted) -> None:
    steps = planted["steps"]
    saved = steps[steps["save_s"].notna()]
    assert saved["step"].tolist() == SAVE_STEPS
    # A sleep never ends early; the least-disturbed checkpoint is the planted sleep and little
    # else (the files of a small MLP). The first one also pays torch.save's first call.
    assert (saved["save_s"] >= SAVE_S).all(), saved[["step", "save_s"]]
    assert close(saved["save_s"].min(), SAVE_S), saved[["step", "save_s"]]
    assert planted["steps"]["warmup"].tolist() == [True] + [False] * 11


def test_train_throughput_leaves_out_evaluation_and_checkpoints(planted) -> None:
    steps, evals, summary = planted["steps"], planted["evals"], planted["run"]["summary"]
    measured = steps[steps["step"].isin(MEASURED)]
    # The window by hand: step 2's start to step 12's end.
    window_s = float(
        (measured["t_start_s"] + measured["step_s"]).max() - measured["t_start_s"].min()
    )
    samples = BATCH * len(MEASURED)
    assert summary["measured_wall_s"] == pytest.approx(window_s)
    assert summary["samples_per_s"] == pytest.approx(samples / window_s), "end to end"
    # What training alone took: the window less the planted costs inside it.
    left_out = window_s - summary["train_wall_s"]
    assert close(left_out, PLANTED_IN_WINDOW_S, planted["files_s"]), (left_out, summary)
    # ... and exactly what the rank traced for them (one rank: no slower rank to take).
    traced = evals.loc[evals["step"] == 6, "eval_s"].sum()
    traced += steps.loc[steps["step"].isin([4, 8]), "save_s"].sum()
    assert left_out == pytest.approx(traced, rel=1e-9)
    assert summary["train_samples_per_s"] == pytest.approx(
        samples / (window_s - PLANTED_IN_WINDOW_S), rel=0.05
    )
    assert close(summary["window_eval_s"], EVAL_BATCHES * EVAL_S)
    assert close(summary["window_save_s"], 2 * SAVE_S, planted["files_s"]), planted["files_s"]
    # End to end holds them: its window is at least the steps plus the planted costs.
    assert window_s >= measured["step_s"].sum() + PLANTED_IN_WINDOW_S
    # Training alone is the steps and the little between them (a trace row, a few checks).
    assert summary["train_wall_s"] == pytest.approx(measured["step_s"].sum(), rel=0.05)
    assert evals["step"].tolist() == [6, 12]
    w = measured_window(steps, evals).iloc[0]
    assert w["train_samples_per_s"] == pytest.approx(summary["train_samples_per_s"])


def test_breakdown_with_between_steps_adds_up_to_the_window(planted) -> None:
    steps, evals = planted["steps"], planted["evals"]
    measured = steps[steps["step"].isin(MEASURED)]
    window_s = float(
        (measured["t_start_s"] + measured["step_s"]).max() - measured["t_start_s"].min()
    )
    b = phase_breakdown(steps, evals).iloc[0]
    assert b["steps"] == len(MEASURED)
    parts = ["data_s", "forward_s", "backward_s", "optimizer_s", "other_s"]
    parts += ["between_s", "save_s", "eval_s"]
    assert sum(b[p] for p in parts) * b["steps"] == pytest.approx(window_s, rel=1e-6)
    assert b["window_s"] == pytest.approx(window_s)
    # the checkpoints after steps 4 and 8
    assert close(b["save_s"] * b["steps"], 2 * SAVE_S, planted["files_s"]), planted["files_s"]
    assert close(b["eval_s"] * b["steps"], EVAL_BATCHES * EVAL_S)  # the evaluation after 6
    # Between steps: what is left of the gaps (a trace row, a few checks): small beside a step.
    assert 0 <= b["between_s"] < 0.25 * b["step_s"]


def test_gap_s_is_traced_and_the_analysis_fills_only_what_could_not_be(planted) -> None:
    steps = planted["steps"]
    by_hand = steps["t_start_s"].shift(-1) - steps["t_start_s"] - steps["step_s"]
    traced = steps["gap_s"].notna()
    assert traced.sum() >= 6, "periodic flushes held rows back until their gap was known"
    pd.testing.assert_series_equal(
        steps.loc[traced, "gap_s"], by_hand[traced], check_names=False, rtol=1e-9
    )
    # Null only where the row was written before the next step started: the checkpoints
    # (written before their commit) and the last step.
    assert set(steps.loc[~traced, "step"]) <= {*SAVE_STEPS, 12}


def test_samples_dropped_per_epoch_in_run_json_and_summary(planted, capsys) -> None:
    assert planted["run"]["dropped_samples_per_epoch"] == 27 - 6 * BATCH
    _print_summary(planted["handle"].path)
    out = capsys.readouterr().out
    assert "samples dropped per epoch (to keep every batch full): 3" in out
    assert "training alone:" in out and "between steps" in out
