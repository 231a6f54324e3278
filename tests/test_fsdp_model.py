"""The scaling model knows FSDP: memory per rank and FSDP's traffic at any world size from the
parameters' layout, each strategy's step time from a study of either, worked out by hand on
hand-built frames (no processes), and `workbench predict --strategy` on a hand-built store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.analysis.model.memory import (
    Layout,
    chunk_rows,
    fsdp_traffic,
    memory_per_rank,
)
from workbench.analysis.model.network import NetworkModel
from workbench.analysis.model.predict import parse_bytes
from workbench.analysis.model.strategies import compare_strategies, fsdp_seconds
from workbench.analysis.model.strategy_words import finding, size
from workbench.cli import main
from workbench.store.files import read_json, write_json

from .frames import make_evals, make_runs, make_steps, write_run

#: Two blocks of one (8, 100) weight each, the root an (8, 10) weight and its (8,) bias; fp32,
#: AdamW (two fp32 moments an element, a 4-byte step a parameter). 8 rows divide 1, 2, 4 and 8
#: ranks: no padding anywhere, so every figure below is a whole division.
LAYOUT = [
    {"root": False, "params": [[8, 100, 4, 8, 4, 1]]},
    {"root": False, "params": [[8, 100, 4, 8, 4, 1]]},
    {"root": True, "params": [[8, 10, 4, 8, 4, 1], [8, 1, 4, 8, 4, 1]]},
]
P = 800 + 800 + 80 + 8  # 1,688 parameters
BLOCK, ROOT = 800 * 4, (80 + 8) * 4  # 3,200 and 352 bytes gathered
#: One step's FSDP traffic: the forward gathers the three groups, the backward the two blocks
#: again (the root is never resharded); the reduce-scatter every group once.
AG_BYTES, AG_CALLS = (2 * BLOCK + ROOT) + 2 * BLOCK, 5  # 13,152 B
RS_BYTES, RS_CALLS = 2 * BLOCK + ROOT, 3  # 6,752 B
NET = NetworkModel(name="given", bandwidth_bytes_per_s=1e4, latency_s=0.0)


def test_memory_per_rank_by_hand() -> None:
    layout = Layout.of(LAYOUT)
    # DDP: everything in full on every rank, and its buckets' copy of the gradients
    ddp = memory_per_rank(layout, "ddp", 4)
    assert ddp["param_bytes"] == ddp["grad_bytes"] == 4 * P == 6_752
    assert ddp["optimizer_bytes"] == 8 * P + 4 * 4 == 13_520
    assert ddp["working_set_bytes"] == 4 * P
    assert memory_per_rank(layout, "ddp", 4, bucket_view=True)["working_set_bytes"] == 0
    # FSDP at 4: a quarter of every parameter, gradient and moment; the step tensors whole
    fsdp = memory_per_rank(layout, "fsdp", 4)
    assert fsdp["param_bytes"] == fsdp["grad_bytes"] == 4 * P // 4 == 1_688
    assert fsdp["optimizer_bytes"] == 8 * P // 4 + 4 * 4 == 3_392
    # gathered: the root, one block computing and the next prefetched; or all of them
    assert fsdp["working_set_bytes"] == ROOT + 2 * BLOCK == 6_752
    kept = memory_per_rank(layout, "fsdp", 4, reshard_after_forward=False, gather_bytes=2)
    assert kept["working_set_bytes"] == (2 * BLOCK + ROOT) // 2  # every group, in bf16
    assert fsdp["total_bytes"] == 1_688 * 2 + 3_392 + 6_752


def test_the_mlp_at_four_ranks_as_a_real_run_counted_it() -> None:
    """The mlp of tests/test_fsdp_run.py (32 inputs, hidden layers of 64, 5 classes, AdamW) at 4
    ranks, each rank's parts as ``memory_parts`` counted them in a real run: the 5-row output
    layer pads to 8 rows (2 a rank), and torch.chunk gives ranks 0-3 2, 2, 1 and 0 of its rows."""
    mlp = [
        {"root": False, "params": [[64, 32, 4, 8, 4, 1], [64, 1, 4, 8, 4, 1]]},
        {"root": False, "params": [[64, 64, 4, 8, 4, 1], [64, 1, 4, 8, 4, 1]]},
        {"root": True, "params": [[5, 64, 4, 8, 4, 1], [5, 1, 4, 8, 4, 1]]},
    ]
    layout = Layout.of(mlp)
    assert [chunk_rows(5, 4, r) for r in range(4)] == [2, 2, 1, 0]
    shard = 16 * 32 + 16 + 16 * 64 + 16 + 2 * 64 + 2  # 1,698 elements a rank
    counted = {0: 13_608, 1: 13_608, 2: 13_088, 3: 12_568}
    for rank, optimizer in counted.items():
        parts = memory_per_rank(layout, "fsdp", 4, rank=rank)
        assert parts["param_bytes"] == parts["grad_bytes"] == 4 * shard == 6_792
        assert parts["optimizer_bytes"] == optimizer
    # the traffic a real 2-rank run traced: all-gathers 51,736 B in 5, reduce-scatters 26,648 B
    two = fsdp_traffic(layout, 2)
    assert (two.all_gather_bytes, two.all_gather_calls) == (51_736, 5)
    assert (two.reduce_scatter_bytes, two.reduce_scatter_calls) == (26_648, 3)


def test_fsdp_traffic_and_its_time_by_hand() -> None:
    layout = Layout.of(LAYOUT)
    t = fsdp_traffic(layout, 4)
    assert (t.all_gather_bytes, t.all_gather_calls) == (AG_BYTES, AG_CALLS)
    assert (t.reduce_scatter_bytes, t.reduce_scatter_calls) == (RS_BYTES, RS_CALLS)
    kept = fsdp_traffic(layout, 4, reshard_after_forward=False, micro_steps=2)
    assert (kept.all_gather_bytes, kept.all_gather_calls) == (2 * RS_BYTES, 6)
    # (N-1)/N of each buffer over the bus bandwidth: 3/4 x 19,904 B / 1e4 B/s
    assert fsdp_seconds(NET, t, 4) == pytest.approx(0.75 * (AG_BYTES + RS_BYTES) / 1e4)
    slow = NetworkModel(name="l", bandwidth_bytes_per_s=1e4, latency_s=1e-3)
    # and N-1 hops a call: 3 x 8 calls x 1 ms more
    assert fsdp_seconds(slow, t, 4) - fsdp_seconds(NET, t, 4) == pytest.approx(3 * 8 * 1e-3)


def _fsdp_study() -> tuple[pd.DataFrame, pd.DataFrame]:
    """FSDP at 1 rank, 1.0 s a step; at 2 ranks 1.5 s, its all-gathers 0.3 s (all exposed) and
    its reduce-scatters 0.2 s (0.1 s exposed) at the layout's bytes; 8 samples a rank a step."""
    one = make_steps("f1", world_size=1, step_s=1.0, comm_s=0.0, comm_bytes=0)
    two = make_steps("f2", world_size=2, step_s=1.5, comm_s=0.0, comm_bytes=0).assign(
        all_gather_bytes=AG_BYTES,
        all_gather_calls=AG_CALLS,
        all_gather_s=0.3,
        all_gather_exposed_s=0.3,
        reduce_scatter_bytes=RS_BYTES,
        reduce_scatter_calls=RS_CALLS,
        reduce_scatter_s=0.2,
        reduce_scatter_exposed_s=0.1,
    )
    runs = make_runs(
        [
            {"run_id": "f1", "world_size": 1, "strategy": "fsdp"},
            {"run_id": "f2", "world_size": 2, "strategy": "fsdp", "memory_total_bytes_max": 1},
        ]
    )
    return runs, pd.concat([one, two], ignore_index=True)


def test_an_fsdp_study_predicts_fsdp_and_ddp_by_hand() -> None:
    # Base: 1 rank, compute 1.0 s, of which the optimizer 0.1 s. Beyond 1 rank the compute is
    # the 2-rank run's (FSDP on 1 rank skips its collectives' copies): 1.5 - (0.3 + 0.1)
    # exposed = 1.1 s, its optimizer on half the parameters (0.05 s); at 4 ranks on a quarter
    # (0.025 s): 1.075 s. Exposed share from the 2-rank run: (0.3 + 0.1) / 0.5 = 0.8. At 4
    # ranks on 1e4 B/s: the collectives 3/4 x 19,904 / 1e4 = 1.4928 s, 0.8 of it exposed: a
    # step of 2.26924 s, 32 samples. DDP from it (its optimizer on every parameter, compute
    # 1.0 s): a ring allreduce of the 6,752 B of gradients (one bucket),
    # 2 x 3/4 x 6,752 / 1e4 = 1.0128 s, all exposed: 2.0128 s.
    runs, steps = _fsdp_study()
    layouts = {"f1": LAYOUT, "f2": LAYOUT}
    out = compare_strategies(runs, steps, layouts, [4], ("fsdp", "ddp"), NET, 20_000)
    at4 = out[out["world_size"] == 4].set_index("strategy")
    assert at4.loc["fsdp", "compute_s"] == pytest.approx(1.075)
    assert at4.loc["fsdp", "exposed_comm_s"] == pytest.approx(0.8 * 1.4928)
    assert at4.loc["fsdp", "samples_per_s"] == pytest.approx(32 / 2.26924)
    assert at4.loc["ddp", "exposed_comm_s"] == pytest.approx(1.0128)
    assert at4.loc["ddp", "step_s"] == pytest.approx(2.0128)
    assert at4.loc["fsdp", "speedup"] == pytest.approx(32 / 2.26924 / 8)
    # memory: FSDP's quarter shards and working set (13,520 B); DDP's 33,776 B everywhere
    assert at4.loc["fsdp", "state_bytes"] == 1_688 * 2 + 3_392
    assert at4.loc["fsdp", "total_bytes"] == 13_520
    assert at4.loc["ddp", "total_bytes"] == 6_752 * 3 + 13_520
    assert at4.loc["fsdp", "fits"] is True and at4.loc["ddp", "fits"] is False
    assert (at4["from_strategy"] == "fsdp").all()
    # the measured points: the base exactly; at 2 ranks 1.89616 s predicted (its own compute,
    # the collectives on 1e4 B/s), 1.5 s measured
    at2 = out[(out["world_size"] == 2) & (out["strategy"] == "fsdp")].iloc[0]
    assert at2["step_s"] == pytest.approx(1.1 + 0.8 * 0.5 * 19_904 / 1e4)
    assert at2["relative_error"] == pytest.approx(1.5 / 1.89616 - 1)
    # the intervals: the frames carry no run intervals, so the model's floors alone: FSDP from
    # its own curve +-1.96 x 2 % (13.5/s-14.7/s), DDP from an FSDP study +-1.96 x 4 %
    # (14.7/s-17.1/s); they overlap, so neither is said to be faster
    assert at4.loc["fsdp", "half_width"] == pytest.approx(0.0392)
    assert at4.loc["ddp", "half_width"] == pytest.approx(0.0784)
    words = finding(out, [4], 20_000)
    assert words == [
        "4 ranks: FSDP 14.1/s (13.5/s-14.7/s), DDP 15.9/s (14.7/s-17.1/s) (not resolved: their "
        "95 % intervals overlap); a rank holds FSDP 13.2 KiB, DDP 33 KiB (activations not "
        "counted: the runs did not measure them); within 20 kB "
        "(19.5 KiB): only FSDP fits"
    ], words


def _ddp_study() -> tuple[pd.DataFrame, pd.DataFrame]:
    """tests/test_predict.py's sweep: 1 rank at 1 s a step; 2 ranks at 1.25 s with a 0.3 s
    allreduce span, 0.15 s of it exposed, 1e6 gradient bytes; 8 samples a rank a step."""
    one = make_steps("w1", world_size=1, step_s=1.0)
    two = make_steps("w2", world_size=2, step_s=1.25, comm_s=0.3).assign(comm_exposed_s=0.15)
    runs = make_runs(
        [
            {"run_id": "w1", "world_size": 1, "strategy": "ddp"},
            {"run_id": "w2", "world_size": 2, "strategy": "ddp", "network_busbw_bytes_per_s": 2e6},
        ]
    )
    return runs, pd.concat([one, two], ignore_index=True)


def test_a_ddp_study_answers_and_with_fsdp() -> None:
    # DDP's own rows are the scaling model's (tests/test_predict.py: 1.5 s at 2 ranks on a
    # 1e6 B/s bus). FSDP from it: the same 1.0 s of compute but half the optimizer's 0.1 s
    # (it steps half the parameters), and the layout's traffic, 1/2 x 19,904 B / 1e6 B/s at
    # 2 ranks, all exposed.
    runs, steps = _ddp_study()
    net = NetworkModel(name="given", bandwidth_bytes_per_s=1e6, latency_s=0.0)
    out = compare_strategies(runs, steps, {"w1": LAYOUT}, [2], ("ddp", "fsdp"), net)
    at2 = out[out["world_size"] == 2].set_index("strategy")
    assert at2.loc["ddp", "step_s"] == pytest.approx(1.5)
    assert at2.loc["fsdp", "compute_s"] == pytest.approx(0.95)
    assert at2.loc["fsdp", "exposed_comm_s"] == pytest.approx(0.5 * 19_904 / 1e6)
    assert at2.loc["fsdp", "samples_per_s"] == pytest.approx(16 / (0.95 + 0.5 * 19_904 / 1e6))
    assert at2.loc["ddp", "measured_samples_per_s"] == pytest.approx(16 / 1.25)
    assert np.isnan(at2.loc["fsdp", "measured_samples_per_s"])
    assert out["fits"].isna().all()  # no device memory asked about
    assert "all exposed" in at2.loc["fsdp", "note"]
    # without a layout recorded (runs from before it): no memory, and the note says so
    bare = compare_strategies(runs, steps, {}, [2], ("ddp",), net)
    assert bare["total_bytes"].isna().all()
    assert "recorded no parameter layout" in bare["note"].iloc[0]
    with pytest.raises(ValueError, match="each one of ddp, fsdp"):
        compare_strategies(runs, steps, {}, [2], ("zero3",), net)


def test_units_for_memory() -> None:
    assert parse_bytes("80GB") == 80e9 and parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("512MB") == 512e6 and parse_bytes("1024") == 1024
    with pytest.raises(ValueError, match="unknown unit"):
        parse_bytes("80 furlongs")
    assert size(512) == "512 B" and size(79_164) == "77.3 KiB" and size(96 * 2**30) == "96 GiB"


def _store(tmp_path: Path) -> None:
    runs, steps = _fsdp_study()
    for run_id, n in (("f1", 1), ("f2", 2)):
        path = write_run(
            tmp_path,
            "s",
            run_id,
            steps[steps["run_id"] == run_id],
            make_evals(run_id, n).iloc[0:0],
            network={"busbw_bytes_per_s": 2e4} if n > 1 else None,
            world_size=n,
            per_device_batch_size=8,
            strategy="fsdp",
        )
        record = read_json(path / "run.json")
        record["memory_parts"] = {str(r): {"layout": LAYOUT} for r in range(n)}
        write_json(path / "run.json", record)


def test_the_command_compares_strategies(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """An FSDP sweep predicts itself by default; --strategy adds DDP; the numbers are those
    worked out above (from the store's digests this time)."""
    _store(tmp_path)
    argv = ["predict", "s", "--output-dir", str(tmp_path), "--world-sizes", "4"]
    assert main([*argv, "--busbw", "1e4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["strategy"] for r in rows} == {"fsdp"}
    at4 = next(r for r in rows if r["world_size"] == 4)
    assert at4["step_s"] == pytest.approx(2.26924)
    assert main([*argv, "--busbw", "1e4", "--strategy", "fsdp,ddp", "--device-memory", "20kB"]) == 0
    text = capsys.readouterr().out
    first = text.splitlines()[0]
    assert first.startswith("4 ranks: FSDP 14.1/s (13.5/s-14.7/s), DDP 15.9/s (14.7/s-17.1/s)")
    assert "only FSDP fits" in first and "95 % low" in text
    assert "DDP (from FSDP)" in text and "2.27 s" in text and "13.2 KiB" in text, text
    # without a network, on the one the runs measured (2e4 B/s): half the collectives' time
    assert main([*argv, "--strategy", "fsdp", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    at4 = next(r for r in rows if r["world_size"] == 4)
    assert at4["exposed_comm_s"] == pytest.approx(0.8 * 0.75 * 19_904 / 2e4)
    assert "all-gather and reduce-scatter" in at4["network"]


def test_the_command_says_what_it_needs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _store(tmp_path)
    argv = ["predict", "s", "--output-dir", str(tmp_path), "--world-sizes", "4"]
    with pytest.raises(SystemExit):
        main([*argv, "--strategy", "zero3"])
    assert "each one of ddp, fsdp" in capsys.readouterr().err
    assert main([*argv, "--strategy", "fsdp", "--device-memory", "80 furlongs"]) == 2
    assert "memory '80 furlongs'" in capsys.readouterr().err
    nodes = ["predict", "s", "--output-dir", str(tmp_path), "--nodes", "2", "--per-node", "2"]
    assert main([*nodes, "--strategy", "fsdp"]) == 2
    assert "give the network" in capsys.readouterr().err


def test_a_one_rank_fsdp_run_beside_a_ddp_study_gives_fsdp_its_own_compute() -> None:
    """FSDP's own work a step (its copies and hooks) is not in a DDP study: one FSDP run at 1
    rank (2.0 s a step here, DDP's 1.0 s; 0.1 s the optimizer's in each, half of it saved at
    2 ranks) gives FSDP its own compute, and the finding takes that curve's rows over those
    from DDP's; the traffic from the layout, all exposed."""
    runs, steps = _ddp_study()
    fsdp_one = make_steps("f1", world_size=1, step_s=2.0, comm_s=0.0, comm_bytes=0)
    runs = pd.concat(
        [runs, make_runs([{"run_id": "f1", "world_size": 1, "strategy": "fsdp"}])],
        ignore_index=True,
    )
    steps = pd.concat([steps, fsdp_one], ignore_index=True)
    net = NetworkModel(name="given", bandwidth_bytes_per_s=1e6, latency_s=0.0)
    layouts = {"w1": LAYOUT, "f1": LAYOUT}
    out = compare_strategies(runs, steps, layouts, [2], ("fsdp",), net)
    at2 = out[out["world_size"] == 2].set_index("from_strategy")
    comm = 0.5 * 19_904 / 1e6
    assert at2.loc["fsdp", "step_s"] == pytest.approx(1.95 + comm)
    assert at2.loc["ddp", "step_s"] == pytest.approx(0.95 + comm)
    assert "no multi-rank FSDP run" in at2.loc["fsdp", "note"]
    (line,) = finding(out, [2])
    assert line.startswith(f"2 ranks: FSDP {16 / (1.95 + comm):.2f}/s"), line
