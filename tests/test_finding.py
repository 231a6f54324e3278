"""The study's finding in plain words: worked answers on hand-built frames, and units for people."""

from __future__ import annotations

import html
import math

import pandas as pd
from plotly.io.json import to_json_plotly

from workbench.analysis.advice.finding import findings
from workbench.analysis.measured.intervals import median_interval
from workbench.analysis.measured.units import gib, percent, rate, ratio, seconds
from workbench.analysis.throughput.comm import communication
from workbench.analysis.throughput.groups import resolve_group_by
from workbench.ui.catalogue import CATALOGUE
from workbench.ui.dashboard import finding_html
from workbench.ui.plots.style import wrap
from workbench.ui.report import build_figures, write_report

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
    # The most promising change, by the model fed with the 4-rank point (no exposed timer:
    # all of the 0.3 s allreduce counted exposed, 1.3 s of compute): a 4x batch does 5.2 s of
    # compute and one 0.3 s allreduce for 4x the samples, 4 x 1.6 / 5.5 = 1.16 (+16 %);
    # accumulating 2 micro-steps, 2 x 1.6 / 2.9 (+10 %); PowerSGD sends a tenth of the bytes,
    # 1.6 / 1.33 (+20 %), fp16 half, 1.6 / 1.45 (+10 %), both before their compute; larger or
    # smaller buckets change nothing at no latency (+0 %, under the noise: not named).
    said = findings(runs, steps)
    assert said[0] == (
        "4 ranks: 2.50x the throughput of 1 rank (62 % of ideal), faster than 1 rank "
        "(20/s against 8/s); largest cause: exposed allreduce transfer, 19 % of the 4-rank "
        "step; most promising: per-device batch 8 -> 32: predicted +16 % if all of its compute "
        "grows 4x\n"
        "  next: gradient accumulation 1 -> 2 (no_sync): predicted +10 %; comm_hook powersgd: "
        "predicted +20 % before the cost of compressing; comm_hook fp16: predicted +10 % before "
        "the cost of compressing; workbench tune RUN measures them in this order\n"
        "  of the 38 % lost, as shares of the 4-rank step:\n"
        "    compute grown                 19 %  800 ms -> 1.1 s per step\n"
        "    exposed allreduce transfer    19 %  0 -> 300 ms per step\n"
        "    unexplained                  0.0 %"
    )
    assert said[0].losses[1] == ("exposed allreduce transfer", "19 %", "0 -> 300 ms per step")
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
    # without an exposed timer the model counts all of the 1.2 s allreduce exposed: 0.8 s of
    # compute; a 4x batch: 4 x 2 / (3.2 + 1.2) = 1.82 (+82 %)
    assert first.lead == (
        "2 ranks: 1.00x the throughput of 1 rank (50 % of ideal), no faster than 1 rank "
        "(8/s against 8/s); largest cause: exposed allreduce transfer, 50 % of the 2-rank step; "
        "most promising: per-device batch 8 -> 32: predicted +82 % if all of its compute grows 4x"
    ), first
    assert "comm_hook fp16: predicted +43 % before the cost of compressing" in first.more
    assert first.losses == [
        ("exposed allreduce transfer", "50 %", "0 -> 1 s per step"),
        ("unexplained", "0.0 %", ""),
    ]
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


def test_the_report_and_the_dashboard_show_the_same_words(tmp_path) -> None:
    """The curve's lead line, its next changes and each cell of its loss table, word for word
    in the report's finding and in the Dashboard's (the CLI prints the text itself); and every
    figure's definition is folded behind a closed toggle, not drawn above the figure."""
    runs, steps, evals = scaling_sweep()
    page = write_report(runs, steps, evals, tmp_path / "r.html").read_text()
    said = findings(runs, steps, evals=evals)
    report = page[page.index("<h2>Finding</h2>") : page.index("</section>")]
    dashboard = finding_html(said)
    lead = said[0]
    words = [lead.lead, lead.more, lead.heading, *(c for row in lead.losses for c in row if c)]
    for text in words:
        assert html.escape(text) in report and html.escape(text) in dashboard, text
    assert "<table" in report and "<table" in dashboard
    toggles = page.count('<details class="definition"')
    assert toggles == page.count('<section class="figure"') > 3
    speedup = definition_of("speedup")
    assert f"<summary>What this figure shows</summary>{html.escape(speedup)}</details>" in page
    # the subtitle's wrapped definition as plotly's JSON writes it ("<" as \u003c...): found
    # in the figure as drawn (the control), gone from the page
    in_json = to_json_plotly(wrap(speedup))[1:-1]
    figs, _ = build_figures(runs, steps, evals)
    drawn = dict(figs)["Speedup"].to_html(include_plotlyjs=False)
    assert in_json in drawn
    assert in_json not in page


def test_a_larger_batch_is_predicted_from_the_compute_fitted_on_two_batches() -> None:
    """Per-device batches 8 and 16 at 1 and 2 ranks: compute (forward, backward less the 1 s
    of exposed allreduce, optimizer) 0.9 s a step at 8 and 1.4 s at 16, so 0.4 s a step and
    62.5 ms a sample. The 2-rank point at 8 (step 2 s, all of its 1.2 s allreduce counted
    exposed: 0.8 s of compute) with 4x the batch: 0.4 / 0.9 of its compute stays, the rest
    grows 4x, 0.8 x 2.67 + 1.2 = 3.33 s for 4x the samples: 4 x 2 / 3.33 = 2.40 (+140 %, where
    all of it growing would give +82 %). At 16: 0.4 / 1.4 stays, 1.3 x 3.14 + 1.2 = 5.29 s,
    4 x 2.5 / 5.29 = 1.89 (+89 %)."""
    runs = make_runs(
        [
            {"run_id": "a8", "world_size": 1},
            {"run_id": "b8", "world_size": 2},
            {"run_id": "a16", "world_size": 1, "per_device_batch_size": 16},
            {"run_id": "b16", "world_size": 2, "per_device_batch_size": 16},
        ]
    )
    steps = pd.concat(
        [
            make_steps("a8", world_size=1, step_s=1.0, backward_s=0.6),
            make_steps("b8", world_size=2, step_s=2.0, comm_s=1.2, backward_s=1.6),
            make_steps("a16", world_size=1, step_s=1.5, forward_s=0.3, backward_s=1.0, samples=16),
            make_steps(
                "b16", world_size=2, step_s=2.5, forward_s=0.3, backward_s=2.0, samples=16
            ).assign(comm_s=1.2),
        ],
        ignore_index=True,
    )
    eight, sixteen = findings(runs, steps)[:2]
    fitted = "with 400 ms of its compute a step and 62.5 ms a sample (fitted on per-device "
    fitted += "batches 8 and 16 at 2 ranks)"
    assert eight.lead.endswith(
        f"most promising: per-device batch 8 -> 32: predicted +140 % {fitted}"
    )
    assert sixteen.lead.endswith(f"per-device batch 16 -> 64: predicted +89 % {fitted}")


def test_the_interval_of_a_median_is_read_from_order_statistics() -> None:
    # k = 20: ranks (20 - 1.96 x 4.47) / 2 = 5.6 -> 5 and 1 + (20 + 8.77) / 2 = 15.4 -> 16
    assert median_interval([float(v) for v in range(20, 0, -1)]) == (5.0, 16.0)
    # k = 7: 0.9 -> 1 (clipped) and 7.1 -> 7 (clipped): the whole range
    assert median_interval([3.0, 1.0, 2.0, 7.0, 5.0, 4.0, 6.0]) == (1.0, 7.0)
    assert all(math.isnan(v) for v in median_interval([1.0]))


def definition_of(key: str) -> str:
    return next(spec.definition for spec in CATALOGUE if spec.key == key)


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
    assert first.lead.endswith(
        "most promising: per-device batch 8 -> 32 (in the script): predicted +82 % if all of "
        "its compute grows 4x"
    )
    assert first.more.startswith(
        "gradient accumulation 1 -> 2 (no_sync) (in the script): predicted +43 %; comm_hook "
        "powersgd: predicted +117 % before the cost of compressing"
    ), first.more


def test_a_run_whose_samples_were_not_counted_is_not_called_incomplete() -> None:
    """The 1-rank run of the standard sweep with no sample counted (its steps' samples empty,
    and its warning saying so): the 4-rank point has no speedup, because of that run, in
    words; the run completed, so it is not called incomplete."""
    runs, steps, _ = scaling_sweep(evals=False)
    steps.loc[steps["run_id"] == "ws1", "samples"] = float("nan")
    note = "train.py: the samples of its steps were not counted (...)"
    runs["measurement_warnings"] = [note if r == "ws1" else None for r in runs["run_id"]]
    said = findings(runs, steps)[0]
    assert said.startswith(
        "4 ranks: no speedup (the samples of ws1 were not counted: its measurement warnings "
        "say how to tell them, workbench.trace.note(samples=...))"
    ), said
    assert "incomplete" not in said
