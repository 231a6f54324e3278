"""The study's finding in plain words: worked answers on hand-built frames, and units for people."""

from __future__ import annotations

import pandas as pd

from workbench.analysis.comm import communication
from workbench.analysis.finding import findings
from workbench.analysis.groups import resolve_group_by
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
    # 8 samples per rank per step: 8/s at N=1, 4 x 8 / 1.6 s = 20/s at N=4: 0.6 s of the
    # 1.6 s step lost (38 %). Backward grew by 0.6 s over N=1's; comm 0.3 s, all of it exposed
    # (capped at comm_s), so backward compute 1.1 - 0.3 = 0.8 s against 0.5: compute 0.2 +
    # 0.8 + 0.1 = 1.1 s against 0.8 (+0.3 s, 19 % of 1.6 s), exposed transfer +0.3 s (19 %),
    # nothing unexplained (the phases leave 0.1 s untraced at both ends).
    said = findings(runs, steps)
    assert said[0] == (
        "4 ranks: 2.50x the throughput of 1 rank (62 % of ideal), faster than 1 rank "
        "(20/s against 8/s); of the 38 % lost, as shares of the 4-rank step: compute grown "
        "19 % (800 ms -> 1.1 s per step), exposed allreduce transfer 19 % (0 -> 300 ms per "
        "step), unexplained 0.0 %. Largest: exposed allreduce transfer, so communication-bound: "
        "try bucket_cap_mb 25 -> 100 (larger), bucket_cap_mb 25 -> 6.25 (smaller), comm_hook "
        "fp16, comm_hook bf16, comm_hook powersgd, gradient_as_bucket_view, static_graph, "
        "per-device batch 8 -> 32, gradient accumulation 1 -> 2 (no_sync); workbench tune RUN "
        "predicts and measures each"
    )
    assert said[1:] == ["no slow rank", "peak memory 1 GiB per process (RSS)"]


def test_a_communication_bound_curve_says_what_to_try() -> None:
    runs = make_runs([{"run_id": "a", "world_size": 1}, {"run_id": "b", "world_size": 2}])
    steps = pd.concat(
        [
            make_steps("a", world_size=1, step_s=1.0, backward_s=0.6),
            # 2 x 8 samples in 2 s: 8/s, the same as one rank. Backward 1.6 s against 0.6 s:
            # 1 s of the 1.2 s allreduce exposed, 50 % of the 2 s step, all of the loss
            make_steps("b", world_size=2, step_s=2.0, comm_s=1.2, backward_s=1.6),
        ],
        ignore_index=True,
    )
    first = findings(runs, steps)[0]
    assert first.startswith(
        "2 ranks: 1.00x the throughput of 1 rank (50 % of ideal), no faster than 1 rank "
        "(8/s against 8/s); of the 50 % lost, as shares of the 2-rank step: exposed allreduce "
        "transfer 50 % (0 -> 1 s per step), unexplained 0.0 %. Largest: exposed allreduce "
        "transfer, so communication-bound"
    ), first
    assert "comm_hook fp16" in first
    # the caller's communication table (the report's, computed once) says the same
    comm = communication(steps, runs, group_by=resolve_group_by(runs, None))
    assert findings(runs, steps, comm=comm) == findings(runs, steps)


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


def test_a_scripts_advice_is_in_the_scripts_own_terms() -> None:
    """The same communication-bound curve as a user's script: the DDP knobs the workbench applies
    to the script's DDP are offered as such, the batch and accumulation left to the script."""
    runs = make_runs(
        [
            {"run_id": "a", "world_size": 1, "model": "script:train"},
            {"run_id": "b", "world_size": 2, "model": "script:train"},
        ]
    )
    steps = pd.concat(
        [
            make_steps("a", world_size=1, step_s=1.0, backward_s=0.6),
            make_steps("b", world_size=2, step_s=2.0, comm_s=1.2, backward_s=1.6),
        ],
        ignore_index=True,
    )
    first = findings(runs, steps)[0]
    assert (
        "Largest: exposed allreduce transfer, so communication-bound: the workbench applies to "
        "the script's DDP, with no change to it, bucket_cap_mb 25 -> 100 (larger)"
    ) in first
    assert (
        "; in the script itself: per-device batch 8 -> 32, gradient accumulation 1 -> 2 "
        "(no_sync); workbench tune RUN"
    ) in first
