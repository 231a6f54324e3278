"""The node count is an axis: a config's runs at 1, 2 and more nodes are one scaling curve, each
point with the link class its allreduce crossed (none, within a node, across nodes); the model
takes compute from the curve's base and each link class from the runs that crossed it, and
predicts more nodes. Worked by hand on hand-built frames and stores."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.analysis.advice.finding import findings
from workbench.analysis.model.predict import predict, target_cluster, target_network
from workbench.analysis.model.scaling_model import predicted_vs_measured
from workbench.analysis.throughput.scaling import scaling_table
from workbench.cli import main
from workbench.store.load import load_runs, load_traces

from .frames import make_evals, make_runs, make_steps, write_run

#: One config at these layouts: run id -> (world size, nodes, measured step s, allreduce
#: benchmark's bus bandwidth B/s). 8 samples a rank a step, 1e6 gradient bytes in one bucket,
#: DDP's timers on every step with the whole allreduce exposed (no overlap).
LAYOUTS = {
    "a1": (1, 1, 1.0, None),  # 1 node x 1 rank
    "a2": (2, 1, 1.25, 4e6),  # 1 node x 2 ranks: within a node
    "b2": (2, 2, 2.2, 1e6),  # 2 nodes x 1 rank: across nodes
    "b4": (4, 2, 2.5, 1e6),  # 2 nodes x 2 ranks: both
}


def _frames(ids: tuple[str, ...]) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, parts = [], []
    for run_id in ids:
        n, nodes, step_s, busbw = LAYOUTS[run_id]
        comm = 0.0 if n == 1 else step_s - 1.0
        steps = make_steps(run_id, world_size=n, step_s=step_s, comm_s=comm)
        parts.append(steps.assign(comm_exposed_s=steps["comm_s"]))
        row = {"run_id": run_id, "world_size": n, "nodes": nodes, "tasks_per_node": n // nodes}
        rows.append({**row, **({"network_busbw_bytes_per_s": busbw} if busbw else {})})
    return make_runs(rows), pd.concat(parts, ignore_index=True)


def test_one_curve_whatever_the_node_counts_each_point_with_its_link_class() -> None:
    # Base: a1, compute 1.0 s. Within a node (a2's benchmark, 4e6 B/s): 2 x 1/2 x 1e6 / 4e6 =
    # 0.25 s at N=2, step 1.25 s as measured. Across nodes (b2's and b4's, 1e6 B/s): 1.0 s at
    # N=2, step 2.0 s against 2.2 measured: 16/2.0 over 16/2.2 - 1 = +10 %; 1.5 s at N=4, step
    # 2.5 s as measured. Speedups over a1's 8/s: 16/1.25/8 = 1.6, 16/2.0/8 = 1.0, 32/2.5/8 = 1.6.
    runs, steps = _frames(("a1", "a2", "b2", "b4"))
    pvm = predicted_vs_measured(runs, steps)
    assert len(pvm) == 4 and set(pvm["base_run_id"]) == {"a1"}
    assert pvm[["world_size", "nodes"]].values.tolist() == [[1, 1], [2, 1], [2, 2], [4, 2]]
    assert pvm["link_class"].tolist() == ["none", "intra-node", "inter-node", "inter-node"]
    assert pvm["predicted_step_s"].tolist() == pytest.approx([1.0, 1.25, 2.0, 2.5])
    assert pvm["predicted_speedup"].tolist() == pytest.approx([1.0, 1.6, 1.0, 1.6])
    assert pvm["relative_error"].tolist() == pytest.approx([0.0, 0.0, 0.1, 0.0], abs=1e-12)
    table = scaling_table(runs, steps)
    assert table["link_class"].tolist() == ["none", "intra-node", "inter-node", "inter-node"]
    assert table["speedup"].tolist() == pytest.approx([1.0, 1.6, 16 / 2.2 / 8, 1.6])
    said = findings(runs, steps)
    assert said[0].startswith("4 ranks") and "nodes" not in said[0], said  # one curve, one line


def test_more_nodes_predicted_from_known_compute_and_bus_bandwidth() -> None:
    # 2 ranks a node, within a node as the runs measured it (4e6 B/s), across 1e6 B/s; compute
    # 1.0 s, 1e6 bytes, no overlap. 4 nodes (N=8): 2 x 1/2 x 1e6 / 4e6 = 0.25 s within, then
    # 2 x 3/4 x 1e6 / 1e6 = 1.5 s across: step 2.75 s, 64 samples: 23.27/s, speedup 2.909.
    # 8 nodes (N=16): 0.25 + 1.75 = 2.0 s: step 3.0 s, 128 samples: 42.67/s, speedup 5.333.
    # The model's error on the runs: +10 % at 2 nodes x 1, 0 at the others beyond the base:
    # RMS sqrt(0.01 / 3) = 5.77 %, the interval the prediction -+ 1.96 x 5.77 %.
    runs, steps = _frames(("a1", "a2", "b2", "b4"))
    cluster = target_cluster(target_network(busbw_bytes_per_s=1e6), 2, runs=runs, steps=steps)
    out = predict(runs, steps, [8, 16], cluster).set_index("world_size")
    assert out["step_s"].tolist() == pytest.approx([2.75, 3.0])
    assert out["exposed_comm_s"].tolist() == pytest.approx([1.75, 2.0])
    assert out["samples_per_s"].tolist() == pytest.approx([64 / 2.75, 128 / 3.0])
    assert out["speedup"].tolist() == pytest.approx([64 / 2.75 / 8, 128 / 3.0 / 8])
    assert out["bound_by"].tolist() == ["inter-node", "inter-node"]
    error = np.sqrt(0.01 / 3)
    assert out["model_error"].tolist() == pytest.approx([error, error])
    assert out["high"].tolist() == pytest.approx(
        (out["samples_per_s"] * (1 + 1.96 * error)).tolist()
    )
    assert "nodes" not in out.columns  # one curve: the node count tells none apart


def test_one_rank_a_node_predicted_at_4_and_8_nodes() -> None:
    # 1 node x 1 and 2 nodes x 1 (the seeds' multi-node study): compute 1.0 s; on 1e6 B/s
    # 4 nodes: 2 x 3/4 x 1e6 / 1e6 = 1.5 s, step 2.5 s, 32/2.5 = 12.8/s, speedup 1.6; 8 nodes:
    # 1.75 s, step 2.75 s, 64/2.75 = 23.27/s. The model's error, at 2 nodes on their own 1e6 B/s:
    # 2.0 s predicted against 2.2 measured, +10 %. The same on a plain bus and on a cluster of
    # one rank a node (no link within a node needed).
    runs, steps = _frames(("a1", "b2"))
    plain = predict(runs, steps, [4, 8], target_network(busbw_bytes_per_s=1e6))
    cluster = target_cluster(target_network(busbw_bytes_per_s=1e6), 1)
    laid = predict(runs, steps, [4, 8], cluster)
    for out in (plain, laid):
        assert out["step_s"].tolist() == pytest.approx([2.5, 2.75])
        assert out["samples_per_s"].tolist() == pytest.approx([12.8, 64 / 2.75])
        assert out["model_error"].tolist() == pytest.approx([0.1, 0.1])
        assert set(out["base_world_size"]) == {1}
    assert laid["bound_by"].tolist() == ["inter-node", "inter-node"]


def _store(tmp_path: Path, ids: tuple[str, ...]) -> None:
    runs, steps = _frames(ids)
    for run in runs.itertuples():
        n, nodes, _, busbw = LAYOUTS[str(run.run_id)]
        write_run(
            tmp_path,
            "s",
            str(run.run_id),
            steps[steps["run_id"] == run.run_id],
            make_evals(str(run.run_id), n).iloc[0:0],
            network={"busbw_bytes_per_s": busbw} if busbw else None,
            world_size=n,
            nodes=nodes,
            tasks_per_node=n // nodes,
            per_device_batch_size=8,
        )


def test_the_command_predicts_4_and_8_nodes_from_1_and_2(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # The numbers of test_one_rank_a_node_predicted_at_4_and_8_nodes, from a stored sweep:
    # one curve, no "nodes=" label, an interval from the 2-node run's +10 % error:
    # 12.8 x (1 -+ 1.96 x 0.1), 10.3/s to 15.3/s.
    _store(tmp_path, ("a1", "b2"))
    base = ["predict", "s", "--output-dir", str(tmp_path), "--busbw", "1e6"]
    assert main([*base, "--world-sizes", "4,8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["world_size"] for r in rows] == [4, 8] and "nodes" not in rows[0]
    assert [r["step_s"] for r in rows] == pytest.approx([2.5, 2.75])
    assert [r["low"] for r in rows] == pytest.approx([12.8 * 0.804, 64 / 2.75 * 0.804])
    assert main([*base, "--nodes", "4,8"]) == 0  # one rank a node, as the 2-node run
    text = capsys.readouterr().out
    assert "4 ranks: 12.8/s (10.3/s to 15.3/s), step 2.5 s" in text, text
    assert "bound by the inter-node links" in text and "no link within a node" in text, text
    assert "nodes=" not in text and "n/a" not in text, text


def test_the_report_draws_one_speedup_curve_for_1_and_2_node_runs(tmp_path: Path) -> None:
    from workbench.ui.report import build_figures

    _store(tmp_path, ("a1", "a2", "b2", "b4"))
    runs = load_runs(tmp_path, ["s"])
    steps = load_traces([Path(p) for p in runs["path"]], "steps")
    figs = dict(build_figures(runs, steps, None)[0])
    curves = [t for t in figs["Speedup"].data if not t.name.startswith("ideal")]
    assert len(curves) == 1 and list(curves[0].x) == [1, 2, 2, 4], figs["Speedup"].data
    where = [str(c[1]) for c in curves[0].customdata]
    assert where == ["1 node", "1 node, intra-node", "2 nodes, inter-node", "2 nodes, inter-node"]
    assert [str(s) for s in curves[0].marker.symbol] == ["circle", "circle", "diamond", "diamond"]
    predicted = figs["Predicted against measured"]
    assert [t.name.rsplit(", ", 1)[-1] for t in predicted.data] == ["measured", "predicted"]
    # the networks it ran on, per link class: the runs' own benchmarks
    said = predicted.layout.title.subtitle.text.replace("<br>", " ")
    assert "within a node: measured allreduce, busbw 0.004 GB/s" in said, said
    assert "across nodes: measured allreduce, busbw 0.001 GB/s" in said, said


def test_the_what_if_control_starts_at_the_bus_bandwidth_across_nodes(tmp_path: Path) -> None:
    # within a node 4e6 B/s (a2), across 1e6 (b2): the median of both (2.5e6) would describe
    # neither; more nodes is the question, so the control starts across nodes, and 4 ranks on
    # it are test_one_rank_a_node_predicted_at_4_and_8_nodes's 2.5 s step
    from workbench.ui.dashboard import Dashboard

    _store(tmp_path, ("a1", "a2", "b2"))
    what_if = Dashboard(tmp_path, sweeps=["s"]).what_if
    assert what_if.rate.value == "1MB/s"
    what_if.world_sizes.value = "4"
    shown = what_if.predict()
    assert "4 ranks: 12.8/s" in shown and "step 2.5 s" in shown and "nodes=" not in shown, shown
