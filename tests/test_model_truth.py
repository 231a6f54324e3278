"""The scaling model on planted runs whose true curve is known: compute is the step less the
measured exposed communication, the overlap is the run's own, the network is measured per link
class, and a base with nothing left to scale says so instead of dividing by zero."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.analysis.model.network import NetworkModel, ring_allreduce_time
from workbench.analysis.model.scaling_model import (
    Base,
    model_curve,
    predict_scaling,
    predicted_vs_measured,
)

from .frames import make_runs, make_steps

SLOW_NET = NetworkModel(name="slow", bandwidth_bytes_per_s=1e6, latency_s=0.0)


def planted(
    run_id: str, n: int, compute: float, span: float, exposed: float, backward: float = 0.5
) -> pd.DataFrame:
    """A run whose every step is ``compute + exposed`` seconds, DDP's timers on every step
    (``backward`` seconds of backward compute)."""
    steps = make_steps(run_id, world_size=n, step_s=compute + exposed, comm_s=span)
    return steps.assign(comm_exposed_s=exposed, backward_compute_s=backward)


def test_compute_is_the_step_less_the_measured_exposed_communication() -> None:
    # 2 ranks, 1.0 s steps, allreduce span 0.6 s of which 0.1 s exposed: compute 0.9 s, and
    # the run's own overlap 1 - 0.1 / 0.6 = 5/6. A network whose ring at N=2 is the span
    # (1e6 B at 1e6/0.6 B/s: 0.6 s) takes 1.5 x 0.6 = 0.9 s at N=4, of which 1/6 exposed:
    # 0.9 + 0.15 = 1.05 s. (Before: compute = 1.0 - 0.6 = 0.4 s, no overlap: 1.3 s at N=4.)
    # Backward compute is 0.8 s, enough to hide 5/6 of 0.9 s.
    steps = planted("two", 2, compute=0.9, span=0.6, exposed=0.1, backward=0.8)
    net = NetworkModel(name="n", bandwidth_bytes_per_s=1e6 / 0.6, latency_s=0.0)
    pred = predict_scaling(steps, net, [2, 4]).set_index("world_size")
    assert pred["compute_s"].tolist() == pytest.approx([0.9, 0.9])
    assert pred["overlap"].iloc[0] == pytest.approx(5 / 6)
    assert pred["step_s"].tolist() == pytest.approx([1.0, 1.05])
    assert pred.loc[4, "exposed_comm_s"] == pytest.approx(0.15)


def test_no_overlap_hides_more_than_the_backward_compute() -> None:
    # The same base; at N=64 the ring is 2 x 63/64 x 0.6 = 1.18125 s. 5/6 of it hidden would
    # be 0.984 s, more than the 0.8 s of backward compute it runs behind: exposed is at least
    # 1.18125 - 0.8 = 0.38125 s (not 1.18125 / 6 = 0.197 s), the step 0.9 + 0.38125 s.
    steps = planted("two", 2, compute=0.9, span=0.6, exposed=0.1, backward=0.8)
    net = NetworkModel(name="n", bandwidth_bytes_per_s=1e6 / 0.6, latency_s=0.0)
    pred = predict_scaling(steps, net, [64]).set_index("world_size")
    assert pred.loc[64, "exposed_comm_s"] == pytest.approx(1.18125 - 0.8)
    assert pred.loc[64, "step_s"] == pytest.approx(0.9 + 0.38125)


def test_sampled_timers_count_on_their_own_steps_only() -> None:
    # The exposed timer on two of eight measured steps (0.1 s and 0.3 s: median 0.2 s); the
    # other steps have none and are not counted as 0 or as a copy of the last sample.
    steps = make_steps("s", world_size=2, step_s=1.0, comm_s=0.5)
    sampled = steps["step"].isin([4, 8])
    steps["comm_s"] = steps["comm_s"].where(sampled)
    steps["comm_exposed_s"] = np.where(steps["step"] == 4, 0.1, np.where(sampled, 0.3, np.nan))
    pred = predict_scaling(steps, SLOW_NET, [2]).set_index("world_size")
    assert pred.loc[2, "compute_s"] == pytest.approx(0.8)
    assert pred.loc[2, "overlap"] == pytest.approx(1 - 0.2 / 0.5)


def test_the_fallback_fit_counts_backward_once() -> None:
    # Planted: compute 0.8 s at every N, an allreduce span that is the ring at 1e9 B/s (1e8 B:
    # 0.1, 0.15, 0.175 s at N = 2, 4, 8), a quarter of it exposed. The fit to the spans finds
    # 1e9 B/s; from the N=2 base, compute 0.8 and overlap 0.75 give back every measured step:
    # 0.825, 0.8375, 0.84375 s. (Before: compute = 0.825 - 0.1 and no overlap, 0.875 s at 4.)
    parts, rows = [], []
    for n in (2, 4, 8):
        ring = float(ring_allreduce_time(1e8, n, 1e9, 0.0))
        steps = planted(f"n{n}", n, compute=0.8, span=ring, exposed=ring / 4)
        parts.append(steps.assign(comm_bytes=100_000_000))
        rows.append({"run_id": f"n{n}", "world_size": n})
    pvm = predicted_vs_measured(make_runs(rows), pd.concat(parts)).set_index("world_size")
    assert set(pvm["network"]) == {"measured"}
    assert pvm["predicted_step_s"].tolist() == pytest.approx([0.825, 0.8375, 0.84375])
    assert pvm["relative_error"].abs().max() == pytest.approx(0.0, abs=1e-9)


def test_the_network_is_measured_per_link_class() -> None:
    # One node: micro-benchmarks of 10 GB/s; two nodes: 1 GB/s. A median over all four runs
    # (5.5 GB/s) describes neither. 1e6 B: the one-node curve's ring at N=2 is
    # 1e6 / 1e10 = 0.1 ms, the two-node curve's at N=8 is 1.75e6 / 1e9 = 1.75 ms.
    rows = [
        {"run_id": "a1", "world_size": 1, "nodes": 1},
        {"run_id": "a2", "world_size": 2, "nodes": 1, "network_busbw_bytes_per_s": 1e10},
        {"run_id": "a4", "world_size": 4, "nodes": 1, "network_busbw_bytes_per_s": 1e10},
        {"run_id": "b4", "world_size": 4, "nodes": 2, "network_busbw_bytes_per_s": 1e9},
        {"run_id": "b8", "world_size": 8, "nodes": 2, "network_busbw_bytes_per_s": 1e9},
    ]
    steps = pd.concat([make_steps(r["run_id"], world_size=r["world_size"]) for r in rows])
    pvm = predicted_vs_measured(make_runs(rows), steps).set_index(["nodes", "world_size"])
    assert pvm.loc[(1, 2), "predicted_comm_s"] == pytest.approx(1e-4)
    assert pvm.loc[(2, 8), "predicted_comm_s"] == pytest.approx(1.75e-3)
    assert set(pvm["network"]) == {"benchmark"}


def test_a_base_with_no_compute_left_says_so_instead_of_crashing() -> None:
    # A short 2-rank run whose allreduce span (no exposed timer: the no-overlap bound) is the
    # whole step: step less exposed communication is 0 s of compute. No division by zero: the
    # curve states that the base's compute could not be measured.
    rows = [{"run_id": f"n{n}", "world_size": n} for n in (2, 4)]
    steps = pd.concat(
        [make_steps(r["run_id"], world_size=r["world_size"], comm_s=1.0) for r in rows]
    )
    pvm = predicted_vs_measured(make_runs(rows), steps, SLOW_NET)
    assert pvm["predicted_samples_per_s"].isna().all()
    assert pvm["note"].str.contains("compute could not be measured").all()
    assert pvm["measured_samples_per_s"].notna().all()
    base = Base(
        world_size=2,
        step_s=1.0,
        samples_per_step=16,
        exposed_comm_s=1.0,
        gradient_bytes=1e6,
        buckets=1,
    )
    curve = model_curve(base, SLOW_NET, [2, 4], overlap=0.0)
    assert curve["compute_s"].isna().all() and curve["speedup"].isna().all()
