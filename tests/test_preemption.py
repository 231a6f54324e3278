"""Preemption on the local executor: one rank gets the scheduler's signal, all ranks stop at the
same step, checkpoint, the job is requeued and finishes; nothing lost, nothing counted twice."""

from __future__ import annotations

import time

import pytest

from workbench.run.launch import launch

from .conftest import base_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def preempted(store):
    config = base_config(
        store,
        world_size=2,
        run_name="preempted",
        stop_check_every_steps=2,
        fault={"rank": 1, "step": 5, "kind": "preempt"},
    )
    handle = launch(config)
    seen = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        status = handle.status()
        if not seen or seen[-1] != status:
            seen.append(status)
        if status in ("completed", "failed"):
            break
        time.sleep(0.05)
    assert handle.wait(timeout_s=60) == "completed"
    return handle, seen


def test_status_goes_preempted_then_running_then_completed(preempted) -> None:
    _, seen = preempted
    assert "preempted" in seen
    after = seen[seen.index("preempted") :]
    assert after[-1] == "completed" and "running" in after


def test_all_ranks_stopped_at_the_same_step_and_resumed_there(preempted) -> None:
    handle, _ = preempted
    steps = handle.traces()
    for rank in (0, 1):
        mine = steps[steps["rank"] == rank]
        # Rank 1 got the signal at step 5; the ranks agree every 2 steps, so both stop after 6.
        assert sorted(mine[mine["attempt"] == 0]["step"]) == list(range(1, 7))
        assert sorted(mine[mine["attempt"] == 1]["step"]) == list(range(7, 17))


def test_requeued_run_ends_with_the_parameters_of_an_uninterrupted_run(preempted, ddp2) -> None:
    handle, _ = preempted
    assert [s["param_sha256"] for s in handle.result()] == [
        s["param_sha256"] for s in ddp2.result()
    ]
