"""A rank that raises mid-run, then a resume from the last checkpoint: real 2-process runs."""

from __future__ import annotations

import time

import pytest

from workbench import schema
from workbench.errors import RunFailedError
from workbench.run.launch import launch
from workbench.store.files import read_json
from workbench.store.load import load_traces

from .conftest import base_config
from .helpers import job_processes, wait_until_no_job_processes

# timing: its claims are durations measured on this host; they run alone (tests/README.md)
pytestmark = [pytest.mark.slow, pytest.mark.timing]


@pytest.fixture(scope="module")
def failed_then_resumed(store):
    config = base_config(
        store, world_size=2, run_name="crash-resume", fault={"rank": 1, "step": 11, "kind": "raise"}
    )
    start = time.monotonic()
    handle = launch(config)
    with pytest.raises(RunFailedError) as err:
        handle.wait(timeout_s=120)
    failed_after_s = time.monotonic() - start
    wait_until_no_job_processes(handle.path)  # with a deadline: it fails naming survivors
    leftover = job_processes(handle.path)
    traces_after_failure = load_traces(handle.path)
    status_after_failure = handle.status()
    resumed = launch(config, resume=True)
    assert resumed.wait(timeout_s=180) == "completed"
    return dict(
        error=err.value,
        failed_after_s=failed_after_s,
        leftover=leftover,
        traces_after_failure=traces_after_failure,
        status_after_failure=status_after_failure,
        resumed=resumed,
    )


def test_failure_names_the_rank_and_its_exception(failed_then_resumed) -> None:
    err = failed_then_resumed["error"]
    assert err.rank == 1
    assert "InjectedFault" in err.exception and "step 11" in err.exception
    assert failed_then_resumed["status_after_failure"] == "failed"
    assert failed_then_resumed["failed_after_s"] < 60


def test_no_process_of_the_failed_job_survives(failed_then_resumed) -> None:
    assert failed_then_resumed["leftover"] == []


def test_traces_written_before_the_failure_are_readable(failed_then_resumed) -> None:
    steps = failed_then_resumed["traces_after_failure"]
    rank1 = sorted(steps[steps["rank"] == 1]["step"])
    assert rank1 == list(range(1, 11)), "every step before the fault was kept"


def test_resume_matches_an_uninterrupted_run_bitwise(failed_then_resumed, ddp2) -> None:
    resumed = failed_then_resumed["resumed"].result()
    uninterrupted = ddp2.result()
    assert [s["param_sha256"] for s in resumed] == [s["param_sha256"] for s in uninterrupted]


def test_resumed_trace_has_every_step_exactly_once(failed_then_resumed, ddp2) -> None:
    handle = failed_then_resumed["resumed"]
    steps = handle.traces()
    for rank in (0, 1):
        mine = steps[steps["rank"] == rank]
        assert sorted(mine["step"]) == list(range(1, 17))
        # Checkpoints every 4 steps: the fault at step 11 resumes from step 8.
        assert sorted(mine[mine["attempt"] == 0]["step"]) == list(range(1, 9))
        assert sorted(mine[mine["attempt"] == 1]["step"]) == list(range(9, 17))
    expected = ddp2.traces().groupby("step")["loss"].mean()
    assert (steps.groupby("step")["loss"].mean() == expected).all()
    run = read_json(handle.path / schema.RUN_FILE)
    assert run["status"] == "completed" and run["attempt"] == 1


def test_a_resumed_attempt_warms_up_again_and_traces_its_checkpoints(failed_then_resumed) -> None:
    steps = failed_then_resumed["resumed"].traces()
    for rank in (0, 1):
        mine = steps[steps["rank"] == rank]
        # warmup_steps=2 per attempt: steps 1-2, and 9-10 after resuming from step 8
        assert sorted(mine.loc[mine["warmup"], "step"]) == [1, 2, 9, 10]
        # checkpoints every 4 steps, the one at step 8 written by the failed attempt
        saved = mine[mine["save_s"].notna()]
        assert sorted(saved["step"]) == [4, 8, 12, 16] and (saved["save_s"] > 0).all()
