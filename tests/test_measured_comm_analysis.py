"""The analysis prefers what was measured: DDP's own exposed-communication timer over estimates,
and the runs' allreduce micro-benchmark over a fit to the comm span; worked answers."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.analysis import communication
from workbench.analysis.model.network import benchmarked_network, network_fit, ring_allreduce_time
from workbench.analysis.model.scaling_model import predicted_vs_measured

from .frames import make_runs, make_steps, scaling_sweep


def test_traced_exposed_communication_wins_over_the_estimates() -> None:
    steps = make_steps("r", world_size=2, comm_s=0.3, backward_s=0.5)
    # DDP's timer on steps 3, 5 and 7 (measured steps): 0.04, 0.05 and 0.06 s exposed
    for step, exposed in ((3, 0.04), (5, 0.05), (7, 0.06)):
        steps.loc[steps["step"] == step, "comm_exposed_s"] = exposed
    out = communication(steps).set_index("rank")
    assert out["method"].tolist() == ["measured", "measured"]
    assert out["exposed_comm_s"].tolist() == pytest.approx([0.05, 0.05])
    assert out["overlapped_comm_s"].tolist() == pytest.approx([0.25, 0.25])
    assert out["exposed_share"].tolist() == pytest.approx([0.05, 0.05])  # of a 1 s step
    # without the timer: the no-overlap bound min(comm_s, backward_s) = 0.3
    bound = communication(make_steps("r", world_size=2, comm_s=0.3, backward_s=0.5))
    assert bound["method"].tolist() == ["no_overlap_bound"] * 2
    assert bound["exposed_comm_s"].tolist() == pytest.approx([0.3, 0.3])


def test_the_runs_micro_benchmark_is_the_default_network() -> None:
    runs, steps, _ = scaling_sweep(evals=False)
    # no benchmark in these runs, and only world sizes 2 and 4 above one: no network at all
    assert network_fit(None, steps, runs).model is None
    runs["network_busbw_bytes_per_s"] = [np.nan, 1.0e9, 3.0e9]  # ws1 has none (one rank)
    fit = network_fit(None, steps, runs)
    assert fit.model is not None and fit.model.name == "benchmark"
    assert fit.model.bandwidth_bytes_per_s == 2.0e9 and fit.model.latency_s == 0.0
    assert fit.world_sizes == (2, 4) and "median 2 GB/s over 2 run(s)" in fit.note
    predicted = predicted_vs_measured(runs, steps, fit)
    assert set(predicted["network"]) == {"benchmark"}
    # ring time of 1 MB at N=4: 2 * 3/4 * 1e6 / 2e9 = 0.75 ms, as the model computes it
    row = predicted[predicted["world_size"] == 4].iloc[0]
    assert row["predicted_comm_s"] == pytest.approx(0.75e-3)


def test_a_failed_run_s_benchmark_is_not_used() -> None:
    runs = make_runs(
        [
            {"run_id": "a", "world_size": 2, "network_busbw_bytes_per_s": 1e9},
            {"run_id": "b", "world_size": 2, "network_busbw_bytes_per_s": 9e9, "status": "failed"},
        ]
    )
    assert benchmarked_network(runs).model.bandwidth_bytes_per_s == 1e9


def test_the_benchmarks_hops_are_its_latency_and_the_rest_carries_the_bytes() -> None:
    """4 ranks, 2 buckets a step in 1 ms at a bus bandwidth of 1 GB/s (so 666,667 bytes: busbw
    x n / 2(n-1) x T), 50 us a hop measured: the hops take 2 x 2(4-1) x 50 us = 0.6 ms, the bytes
    the other 0.4 ms, a bandwidth of 1e9 x 1 / 0.4 = 2.5 GB/s. The ring model then gives back the
    benchmark's own 1 ms: 2 x 3/4 x 666,667 / 2.5e9 + 0.6 ms."""
    run = {"run_id": "a", "world_size": 4, "network_busbw_bytes_per_s": 1e9}
    measured = {"network_time_s": 1e-3, "network_latency_s": 50e-6, "network_buckets": 2}
    model = benchmarked_network(make_runs([{**run, **measured}])).model
    assert model.bandwidth_bytes_per_s == pytest.approx(2.5e9)
    assert model.latency_s == pytest.approx(50e-6)
    nbytes = 1e9 * 4 / 6 * 1e-3
    own = ring_allreduce_time(nbytes, 4, model.bandwidth_bytes_per_s, model.latency_s, 2)
    assert own == pytest.approx(1e-3)
    # a one-element allreduce as slow as the buckets (a loaded host): the bytes keep a tenth
    slow = {**measured, "network_latency_s": 200e-6}
    assert benchmarked_network(make_runs([{**run, **slow}])).model.bandwidth_bytes_per_s == (
        pytest.approx(1e10)
    )
    # an older run without the hop's latency: folded into the bandwidth, as before
    older = benchmarked_network(make_runs([run])).model
    assert older.bandwidth_bytes_per_s == 1e9 and older.latency_s == 0.0
