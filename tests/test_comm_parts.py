"""Communication split into what a performance engineer acts on: the transfer no compute hid,
the wait for the slowest rank (not communication), the hidden part; and bus bandwidth from the
collective's own time, never from DDP's span. Planted runs with answers worked out by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.analysis import communication

from .frames import make_runs, make_steps


def slow_rank_three() -> pd.DataFrame:
    """4 ranks, 1 s steps, DDP's timers on every step. Rank 3 computes 0.2 s longer; the
    allreduce's tail after the last gradient is 0.04 s exposed, 0.06 s hidden, on every rank;
    ranks 0-2 also wait 0.2 s for rank 3 (their span 0.3 s, exposed 0.24 s)."""
    steps = make_steps("w", world_size=4, step_s=1.0, comm_s=0.1)
    late = steps["rank"] != 3
    steps["comm_s"] = np.where(late, 0.3, 0.1)
    steps["comm_exposed_s"] = np.where(late, 0.24, 0.04)
    steps["backward_compute_s"] = np.where(late, 0.3, 0.5)
    return steps


def test_a_wait_for_the_slowest_rank_is_not_communication() -> None:
    c = communication(slow_rank_three()).set_index("rank")
    assert c["exposed_comm_s"].tolist() == pytest.approx([0.24, 0.24, 0.24, 0.04])
    assert c["wait_s"].tolist() == pytest.approx([0.2, 0.2, 0.2, 0.0])
    assert c["exposed_transfer_s"].tolist() == pytest.approx([0.04] * 4)
    assert c["hidden_comm_s"].tolist() == pytest.approx([0.06] * 4)
    assert c["exposed_transfer_share"].tolist() == pytest.approx([0.04] * 4)  # of 1 s


def test_bus_bandwidth_comes_from_the_collective_not_the_span() -> None:
    # 1e6 bytes over 2 ranks, DDP's span 0.3 s (it holds backward compute): 1e6 / 0.3 B/s
    # would be a bus bandwidth of a span, not of the allreduce. With the run's micro-benchmark
    # (2 GB/s) that figure; without it, none.
    steps = make_steps("r", world_size=2, comm_s=0.3).assign(
        backward_compute_s=0.45, comm_exposed_s=0.05
    )
    alone = communication(steps)
    assert alone["bus_bandwidth_bytes_per_s"].isna().all()
    assert set(alone["bus_bandwidth_source"]) == {"none: DDP's span only"}
    runs = make_runs([{"run_id": "r", "world_size": 2, "network_busbw_bytes_per_s": 2e9}])
    benched = communication(steps, runs)
    assert benched["bus_bandwidth_bytes_per_s"].tolist() == pytest.approx([2e9, 2e9])
    assert set(benched["bus_bandwidth_source"]) == {"benchmark"}
    # hook-timed collectives (no DDP backward timer): their own time, 1e6 / 0.3 B/s
    hooked = communication(make_steps("h", world_size=2, comm_s=0.3))
    assert hooked["bus_bandwidth_bytes_per_s"].tolist() == pytest.approx([1e6 / 0.3] * 2)
