"""``workbench predict`` and :func:`workbench.analysis.model.predict.predict`: a sweep's throughput
at other world sizes on a given network, worked out by hand; a clear error without a multi-rank
run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.analysis.model.cluster_network import ClusterNetwork, allreduce_time
from workbench.analysis.model.network import NetworkModel, ring_allreduce_time
from workbench.analysis.model.predict import (
    parse_rate,
    parse_seconds,
    predict,
    target_cluster,
    target_network,
)
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
    # (2e6 B/s: ring 0.5 s, 0.25 s exposed) it predicts 1.25 s at N=2, as measured: 0, so the
    # interval takes the floor of 2 % (x 1.96: +-3.92 %); the frames carry no run intervals.
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
    assert out["half_width"].tolist() == pytest.approx([0.0392, 0.0392])
    assert out["low"].tolist() == pytest.approx([16 / 1.5 * 0.9608, 64 / 2.25 * 0.9608])
    assert out["high"].tolist() == pytest.approx([16 / 1.5 * 1.0392, 64 / 2.25 * 1.0392])


def test_one_curve_given_no_group_columns_keeps_its_error() -> None:
    """``group_by=[]``: the study is one curve; its error on its own fit is stated as with the
    default grouping (0 here, by hand above), never left unknown."""
    runs, steps = _sweep()
    net = target_network(busbw_bytes_per_s=1e6)
    out = predict(runs, steps, [2, 8], net, group_by=[])
    assert out["model_error"].tolist() == pytest.approx([0.0, 0.0], abs=1e-12)
    assert out["step_s"].tolist() == pytest.approx([1.5, 2.25])


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


def test_more_ranks_on_the_runs_own_machine_need_no_network_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """No --busbw: the network the 2-rank run measured (its micro-benchmark, 2e6 B/s). By hand:
    at N=8 the ring is 2 x 7/8 x 1e6 / 2e6 = 0.875 s, half of it hidden (overlap 0.5; under the
    0.5 s of backward that can hide it): 0.4375 s exposed; step 1.4375 s, 64 / 1.4375
    samples/s; the error on its own fit 0 (predicted 1.25 s at N=2, as measured)."""
    _store(tmp_path)
    argv = ["predict", "s", "--output-dir", str(tmp_path), "--world-sizes", "8"]
    assert main([*argv, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["step_s"] == pytest.approx(1.4375)
    assert row["exposed_comm_s"] == pytest.approx(0.4375)
    assert row["samples_per_s"] == pytest.approx(64 / 1.4375)
    assert row["low"] == pytest.approx(64 / 1.4375 * (1 - 0.0392))  # the floor, as above
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert text.startswith("network: as the runs measured it on their own machine"), text
    assert "8 ranks: 44.5/s" in text and "step 1.44 s" in text, text


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
    from workbench.ui.tables import fit_error_note

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


# -- a cluster: ranks per node, a link class within a node and one across nodes


def test_the_two_level_allreduce_by_hand() -> None:
    # 1e8 bytes, 8 ranks a node, 4 nodes, within a node 100 GB/s, across 10 GB/s, latencies
    # 1 us and 10 us, 2 buckets: 2 x 7/8 x 1e8 / 1e11 + 2 x 7 x 1e-6 x 2 = 1.778 ms inside,
    # 2 x 3/4 x 1e8 / 1e10 + 2 x 3 x 1e-5 x 2 = 15.12 ms across: bound by the inter-node links.
    intra = NetworkModel(name="nvlink", bandwidth_bytes_per_s=1e11, latency_s=1e-6)
    inter = NetworkModel(name="ib", bandwidth_bytes_per_s=1e10, latency_s=1e-5)
    cluster = ClusterNetwork.of(intra, inter, per_node=8)
    n = np.array([8, 32])
    inside, across = cluster.parts(1e8, n, 2)
    assert inside.tolist() == pytest.approx([1.778e-3, 1.778e-3])
    assert across.tolist() == pytest.approx([0.0, 15.12e-3])
    assert allreduce_time(cluster, 1e8, n, 2).tolist() == pytest.approx([1.778e-3, 16.898e-3])
    assert cluster.bound_by(1e8, n, 2) == ["intra-node", "inter-node"]
    # one node: the plain ring within it; one rank a node: the plain ring across nodes
    assert allreduce_time(cluster, 1e8, np.array([4]), 2)[0] == pytest.approx(
        ring_allreduce_time(1e8, 4, 1e11, 1e-6, 2)
    )
    single = ClusterNetwork.of(intra, inter, per_node=1)
    assert allreduce_time(single, 1e8, np.array([4]), 2)[0] == pytest.approx(
        ring_allreduce_time(1e8, 4, 1e10, 1e-5, 2)
    )


def test_predict_on_a_cluster_by_hand() -> None:
    # The sweep of test_predict_by_hand (compute 1.0 s, 0.5 s of it backward, overlap 0.5,
    # 1e6 bytes in 1 bucket), 4 ranks a node, 4e6 B/s within a node and 1e6 B/s across.
    # N=4 (one node): 2 x 3/4 x 1e6 / 4e6 = 0.375 s, half exposed: step 1.1875 s, bound inside.
    # N=16 (4 nodes): 0.375 + 2 x 3/4 x 1e6 / 1e6 = 1.875 s, of which at most the 0.5 s of
    # backward hidden: 1.375 s exposed, step 2.375 s, 128 samples: 53.9/s, bound across.
    runs, steps = _sweep()
    cluster = target_cluster(
        target_network(busbw_bytes_per_s=1e6), 4, target_network(busbw_bytes_per_s=4e6)
    )
    out = predict(runs, steps, [4, 16], cluster).set_index("world_size")
    assert out["step_s"].tolist() == pytest.approx([1.1875, 2.375])
    assert out["exposed_comm_s"].tolist() == pytest.approx([0.1875, 1.375])
    assert out["samples_per_s"].tolist() == pytest.approx([32 / 1.1875, 128 / 2.375])
    assert out["bound_by"].tolist() == ["intra-node", "inter-node"]


def test_predict_nodes_per_node_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # Within a node, as the sweep's own 2-rank run measured it (its benchmark: 2e6 B/s):
    # N=4 on one node: 2 x 3/4 x 1e6 / 2e6 = 0.75 s, exposed max(0.375, 0.75 - 0.5) = 0.375 s,
    # step 1.375 s. N=8 on 2 nodes: 0.75 + 2 x 1/2 x 1e6 / 1e6 = 1.75 s, exposed 1.25 s.
    _store(tmp_path)
    argv = ["predict", "s", "--output-dir", str(tmp_path), "--nodes", "1,2", "--per-node", "4"]
    assert main([*argv, "--busbw", "1e6", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["world_size"] for r in rows] == [4, 8]
    assert [r["step_s"] for r in rows] == pytest.approx([1.375, 2.25])
    assert [r["bound_by"] for r in rows] == ["intra-node", "inter-node"]
    assert "within a node: as the runs measured it" in rows[0]["network"]
    assert main([*argv, "--busbw", "1e6", "--intra-busbw", "4e6"]) == 0
    text = capsys.readouterr().out
    assert "bound by the inter-node links" in text and "4 ranks a node" in text, text
    # the flags that do not fit together are named; nothing is read
    for bad, said in (
        (["--world-sizes", "8", "--nodes", "2", "--per-node", "4", "--busbw", "1e6"], "exactly"),
        (["--world-sizes", "8", "--intra-busbw", "1e9", "--busbw", "1e6"], "needs --per-node"),
    ):
        assert main(["predict", "s", "--output-dir", str(tmp_path), *bad]) == 2
        assert said in capsys.readouterr().err
    # --nodes alone takes the layout of the sweep's runs on several nodes: these have none
    assert main(["predict", "s", "--output-dir", str(tmp_path), "--nodes", "2", "--busbw", "1e6"])
    err = capsys.readouterr().err
    assert "on more than one node do not say one layout (none); give --per-node" in err, err
