"""``workbench predict`` and :func:`workbench.analysis.predict.predict`: a sweep's throughput at
other world sizes on a given network, worked out by hand; a clear error without a multi-rank
run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from workbench.analysis.predict import parse_rate, parse_seconds, predict, target_network
from workbench.cli import main

from .frames import make_evals, make_runs, make_steps, write_run


def _sweep() -> tuple[pd.DataFrame, pd.DataFrame]:
    """1 rank at 1 s per step; 2 ranks at 1.25 s with a 0.3 s allreduce span, 0.15 s of it
    exposed (DDP's timer on every step), 1e6 gradient bytes, its micro-benchmark 2e6 B/s; 8
    samples per rank per step."""
    one = make_steps("w1", world_size=1, step_s=1.0)
    two = make_steps("w2", world_size=2, step_s=1.25, comm_s=0.3).assign(comm_exposed_s=0.15)
    runs = make_runs(
        [
            {"run_id": "w1", "world_size": 1},
            {"run_id": "w2", "world_size": 2, "network_busbw_bytes_per_s": 2e6},
        ]
    )
    return runs, pd.concat([one, two], ignore_index=True)


def test_predict_by_hand() -> None:
    # Base: 1 rank, compute 1.0 s of which backward 0.5 s. Overlap from the 2-rank run:
    # 1 - 0.15 / 0.3 = 0.5. On a 1e6 B/s bus: ring 2 (N-1)/N x 1e6 / 1e6 = 1 s at N=2, half
    # exposed (0.5 s, what 0.5 s of backward can hide); 1.75 s at N=8, of which at most 0.5 s
    # hidden: 1.25 s exposed. Steps 1.5 and 2.25 s, 16 / 1.5 and 64 / 2.25 samples/s,
    # speedups 4/3 and 32/9 over 8/s. The model's error on the sweep: with its own network
    # (2e6 B/s: ring 0.5 s, 0.25 s exposed) it predicts 1.25 s at N=2, as measured: 0, so
    # low = high = predicted.
    runs, steps = _sweep()
    net = target_network(busbw_bytes_per_s=1e6)
    out = predict(runs, steps, [2, 8], net).set_index("world_size")
    assert out["step_s"].tolist() == pytest.approx([1.5, 2.25])
    assert out["compute_s"].tolist() == pytest.approx([1.0, 1.0])
    assert out["exposed_comm_s"].tolist() == pytest.approx([0.5, 1.25])
    assert out["samples_per_s"].tolist() == pytest.approx([16 / 1.5, 64 / 2.25])
    assert out["speedup"].tolist() == pytest.approx([4 / 3, 32 / 9])
    assert out["efficiency"].tolist() == pytest.approx([2 / 3, 4 / 9])
    assert out["model_error"].tolist() == pytest.approx([0.0, 0.0], abs=1e-12)
    assert out["low"].tolist() == pytest.approx(out["samples_per_s"].tolist())


def test_units_and_the_link_rule() -> None:
    assert parse_rate("9.5GB/s") == 9.5e9 and parse_rate("2.5e9") == 2.5e9
    assert parse_rate("10Gbit/s", bits=True) == pytest.approx(1.25e9)
    assert parse_seconds("5us") == pytest.approx(5e-6) and parse_seconds("0.5ms") == 5e-4
    # a 10 Gbit/s link: bus bandwidth 10e9 / 8 bytes per second
    assert target_network(link_bits_per_s=10e9).bandwidth_bytes_per_s == pytest.approx(1.25e9)
    with pytest.raises(ValueError, match="unknown unit"):
        parse_rate("9.5 furlongs")


def _store(tmp_path: Path, multi: bool = True) -> None:
    runs, steps = _sweep()
    for run_id, n in (("w1", 1), ("w2", 2)):
        if n > 1 and not multi:
            continue
        rows = steps[steps["run_id"] == run_id]
        evals = make_evals(run_id, n).iloc[0:0]
        network = {"busbw_bytes_per_s": 2e6} if n > 1 else None
        write_run(
            tmp_path,
            "s",
            run_id,
            rows,
            evals,
            network=network,
            world_size=n,
            per_device_batch_size=8,
        )


def test_the_command_prints_json_and_text(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _store(tmp_path)
    argv = ["predict", "s", "--output-dir", str(tmp_path), "--world-sizes", "2,8"]
    assert main([*argv, "--busbw", "1e6", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["world_size"] for r in rows] == [2, 8]
    keys = {"world_size", "samples_per_s", "step_s", "compute_s", "exposed_comm_s", "low", "high"}
    assert keys <= set(rows[0])
    assert rows[1]["step_s"] == pytest.approx(2.25)
    assert main([*argv, "--bandwidth", "8Mbit/s"]) == 0  # 1e6 B/s again: the same numbers
    text = capsys.readouterr().out
    assert "2 ranks: 10.7/s" in text and "step 2.25 s" in text, text


def test_no_multi_rank_run_says_what_to_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _store(tmp_path, multi=False)
    argv = ["predict", "s", "--output-dir", str(tmp_path), "--world-sizes", "8", "--busbw", "1e9"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "no completed multi-rank run" in err and "--world-sizes 1,2" in err


def test_the_dashboards_what_if_control_gives_the_commands_numbers(tmp_path: Path) -> None:
    """The same hand-worked sweep in the dashboard: the control starts at the runs' own measured
    bus bandwidth (2e6 B/s: at 2 ranks the measured 1.25 s step again), and a 1e6 B/s bus at 8
    ranks gives the 2.25 s step worked out above."""
    from workbench.ui.dashboard import Dashboard

    _store(tmp_path)
    board = Dashboard(tmp_path, sweeps=["s"])
    what_if = board.what_if
    assert what_if.rate.value == "2MB/s"
    assert "2 ranks: 12.8/s" in what_if.output.value and "step 1.25 s" in what_if.output.value
    what_if.world_sizes.value, what_if.rate.value = "8", "1MB/s"
    shown = what_if.predict()
    assert "8 ranks: 28.4/s" in shown and "step 2.25 s" in shown, shown
    what_if.network_kind.value, what_if.rate.value = "link", "8Mbit/s"  # 1e6 B/s again
    assert "step 2.25 s" in what_if.predict()
    what_if.world_sizes.value = "8, x"
    assert "No prediction" in what_if.predict() and "world sizes" in what_if.output.value


def test_the_what_if_control_says_what_to_run_without_a_multi_rank_run(tmp_path: Path) -> None:
    from workbench.ui.dashboard import Dashboard

    _store(tmp_path, multi=False)
    shown = Dashboard(tmp_path, sweeps=["s"]).what_if.output.value
    assert "No prediction" in shown and "--world-sizes 1,2" in shown, shown


def test_the_reports_model_section_states_the_models_error_on_its_own_fit(tmp_path: Path) -> None:
    """By hand: errors +10 % and -20 % beyond the base give RMS sqrt((0.01 + 0.04) / 2) = 15.8 %
    and worst 20 %; the base's 0 is left out (it agrees by construction)."""
    from workbench.ui.report import report_from_store
    from workbench.ui.what_if import fit_error_note

    frame = pd.DataFrame(
        {"world_size": [1, 2, 4], "base_world_size": [1, 1, 1], "relative_error": [0, 0.1, -0.2]}
    )
    note = fit_error_note(frame)
    assert "RMS 16 %" in note and "worst 20 %" in note and "2 points" in note, note
    alone = fit_error_note(frame.iloc[:1])
    assert "not known" in alone, alone
    _store(tmp_path)  # the 2-rank run measured its own network: the model checks itself there
    page = Path(report_from_store(tmp_path / "s", tmp_path / "r.html")).read_text()
    section = page.split('id="table-predicted"', 1)[1].split("</section>", 1)[0]
    assert "The model&#x27;s error on this study&#x27;s measured points" in section, section[:400]
