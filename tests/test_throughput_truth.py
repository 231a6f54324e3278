"""Speedup, efficiency and MFU compare training alone: an evaluation inside the measured window
does not scale with the training step and is left out of them (end to end beside it)."""

from __future__ import annotations

import pandas as pd
import pytest

from workbench.analysis import scaling_table
from workbench.analysis.advice.finding import findings

from .frames import make_evals, make_runs, make_steps, room_for_evals


def _study() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """1 rank and 2 ranks at 1 s per step, 8 samples per rank per step (10 steps, 2 warm-up);
    the 2-rank run evaluates after step 5 for 2.0 s (rank 0: 1.7 predict + 0.1 gather + 0.2
    metric; rank 1: 1.7 + 0.2 gather), so its later steps start 2 s later."""
    one = make_steps("one", world_size=1)
    two, evals = room_for_evals(
        make_steps("two", world_size=2),
        make_evals(
            "two",
            world_size=2,
            eval_steps=(5,),
            metric_values=(0.5,),
            predict_s=1.7,
            gather_s=0.1,
            metric_s=0.2,
            broadcast_s=0.0,
        ),
    )
    flops = {
        "flops_per_sample": 1e12,
        "device_name": "NVIDIA A100-SXM4-80GB",
        "precision": "bf16",
        "flops_matmul_precision": "highest",
    }
    runs = make_runs(
        [{"run_id": "one", "world_size": 1, **flops}, {"run_id": "two", "world_size": 2, **flops}]
    )
    return runs, pd.concat([one, two], ignore_index=True), evals


def test_speedup_efficiency_and_mfu_come_from_training_throughput() -> None:
    # 2 ranks: 8 steps x 2 ranks x 8 samples = 128 samples in a 10 s window (steps 3-10 and
    # the 2 s evaluation): 12.8/s end to end, 128 / 8 s = 16/s training. 1 rank: 8/s. So the
    # training speedup is 2.0 (efficiency 1.0), not 1.6; TFLOP/s per device 1e12 x 16 / 2 /
    # 1e12 = 8 against A100's dense bf16 peak of 312: MFU 8/312.
    runs, steps, evals = _study()
    t = scaling_table(runs, steps, evals).set_index("world_size")
    assert t["samples_per_s"].tolist() == pytest.approx([8.0, 16.0])
    assert t["end_to_end_samples_per_s"].tolist() == pytest.approx([8.0, 12.8])
    assert t.loc[2, "speedup"] == pytest.approx(2.0)
    assert t.loc[2, "efficiency"] == pytest.approx(1.0)
    assert t.loc[2, "tflops_per_device"] == pytest.approx(8.0)
    assert t.loc[2, "mfu"] == pytest.approx(8 / 312)
    said = findings(runs, steps, evals=evals)[0]
    assert said.startswith("2 ranks: 2.00x the throughput of 1 rank (100 % of ideal)"), said
