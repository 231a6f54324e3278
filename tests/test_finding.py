"""The study's finding in plain words: worked answers on hand-built frames, and units for people."""

from __future__ import annotations

import pandas as pd

from workbench.analysis.finding import findings
from workbench.analysis.units import gib, percent, rate, ratio, seconds
from workbench.ui.report import write_report

from .frames import ddp_steps, make_runs, make_steps, scaling_sweep


def test_units_for_people() -> None:
    assert [rate(21005.4), rate(12.5), rate(float("nan"))] == ["21,005/s", "12.5/s", "n/a"]
    assert [percent(0.7788), percent(0.004)] == ["78 %", "0.4 %"]
    assert [ratio(0.5823), seconds(0.001523), seconds(0.00034), seconds(2.4)] == [
        "0.58x",
        "1.52 ms",
        "340 us",
        "2.4 s",
    ]
    assert gib(0.31 * 2**30) == "0.31 GiB"


def test_a_curve_that_scales() -> None:
    runs, steps, _ = scaling_sweep(evals=False)
    # 8 samples per rank per step: 8/s at N=1, 4 x 8 / 1.6 s = 20/s at N=4; comm 0.3 s of 1.6 s,
    # all of it exposed (backward grew by 0.6 s over N=1's, capped at comm_s)
    said = findings(runs, steps)
    assert said[0] == (
        "4 ranks: 2.50x the throughput of 1 rank (62 % of ideal), faster than 1 rank "
        "(20/s against 8/s); allreduce 19 % of the step, 19 % not hidden behind backward"
    )
    assert said[1:] == ["no slow rank", "peak memory 1 GiB per process (RSS)"]


def test_a_communication_bound_curve_says_what_to_try() -> None:
    runs = make_runs([{"run_id": "a", "world_size": 1}, {"run_id": "b", "world_size": 2}])
    steps = pd.concat(
        [
            make_steps("a", world_size=1, step_s=1.0),
            # 2 x 8 samples in 2 s: 8/s, the same as one rank; 1.2 s of allreduce, all exposed
            make_steps("b", world_size=2, step_s=2.0, comm_s=1.2, backward_s=1.7),
        ],
        ignore_index=True,
    )
    first = findings(runs, steps)[0]
    assert first.startswith(
        "2 ranks: 1.00x the throughput of 1 rank (50 % of ideal), no faster than 1 rank "
        "(8/s against 8/s); allreduce 60 % of the step, 60 % not hidden behind backward: "
        "communication-bound"
    ), first
    assert "comm_hook='fp16'" in first


def test_no_baseline_and_a_straggler_are_said() -> None:
    runs = make_runs([{"run_id": "d", "world_size": 8}])
    said = findings(runs, ddp_steps(slow_rank=5, slow_from=40))
    assert said[0].startswith("only 8 ranks measured: no speedup to report; add a run")
    assert said[1] == (
        "rank 5 of run d is a straggler from step 40: 1.50x the others' compute time, "
        "mostly in backward compute"  # ddp_steps slows backward less the rank's comm
    )


def test_repeats_give_the_speedup_its_spread() -> None:
    runs = make_runs(
        [
            {"run_id": "a1", "world_size": 1},
            {"run_id": "a2", "world_size": 1},
            {"run_id": "b1", "world_size": 2},
            {"run_id": "b2", "world_size": 2},
        ]
    )
    # 8 samples per rank per step: 8/s and 10/s at N=1 (mean 9, std 1.414), 16/s and 20/s at
    # N=2 (mean 18, std 2.828); speedup 18 / 9 = 2.00, its std 2 x sqrt((2.828 / 18)^2 +
    # (1.414 / 9)^2) = 2 x 0.2222 = 0.44
    steps = pd.concat(
        [
            make_steps("a1", world_size=1, step_s=1.0),
            make_steps("a2", world_size=1, step_s=0.8),
            make_steps("b1", world_size=2, step_s=1.0),
            make_steps("b2", world_size=2, step_s=0.8),
        ],
        ignore_index=True,
    )
    first = findings(runs, steps)[0]
    assert first.startswith(
        "2 ranks: 2.00x ± 0.44 (2 runs against 2) the throughput of 1 rank (100 % of ideal), "
        "faster than 1 rank (18/s against 9/s)"
    ), first


def test_the_report_opens_with_the_finding(tmp_path) -> None:
    runs, steps, evals = scaling_sweep()
    page = write_report(runs, steps, evals, tmp_path / "r.html").read_text()
    finding = page.index("<h2>Finding</h2>")
    assert finding < page.index("<h2>Scaling</h2>") and finding < page.index('class="note"')
    assert "4 ranks: 2.50x the throughput of 1 rank" in page
