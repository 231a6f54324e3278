"""cancel() on the local executor: it returns only once the job is gone, and says so then.

The Slurm twin is ``test_cancel_ends_the_job_and_the_store_says_cancelled`` in
``tests/test_slurm_launch.py``.
"""

from __future__ import annotations

import pytest

from workbench.run.launch import launch
from workbench.run.processes import alive
from workbench.store.files import read_json

from .conftest import base_config
from .helpers import job_processes, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.waits]


def test_cancel_ends_every_rank_and_keeps_the_traces(store) -> None:
    handle = launch(
        base_config(
            store,
            world_size=2,
            run_name="local-cancel",
            model="tests.plugins:sleepy_mlp",
            dataset="tests.plugins:synthetic_like_mlp",
            model_options={"sleep_s": 0.2},
            epochs=20,  # 160 steps of 0.2 s: it cannot end before the cancel
            trace_flush_s=0.1,
        )
    )
    states = wait_for(
        lambda: (
            len(handle.rank_states()) == 2
            and all(s["status"] == "running" for s in handle.rank_states().values())
            and handle.rank_states()
        ),
        120,
        "both ranks running",
    )
    # A positive control for job_processes: it finds the job while the job runs, so the empty
    # list after cancel() (here and in every "no process survives" check) means something.
    found = job_processes(handle.path)
    assert found, "no process of the running job was found"
    assert {int(s["pid"]) for s in states.values()} <= set(found)
    wait_for(lambda: len(handle.traces()) >= 2, 60, "a traced step from the ranks")
    traced_before = len(handle.traces())

    handle.cancel()

    # cancel() returns only once the job is gone: no waiting here.
    assert job_processes(handle.path) == []
    assert not any(alive(int(s["pid"])) for s in states.values())
    assert handle.status() == "cancelled"
    assert read_json(handle.path / "run.json")["status"] == "cancelled"
    assert len(handle.traces()) >= traced_before, "rows written before the cancel are kept"
