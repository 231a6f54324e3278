"""Faults and bad input with real processes: a clear error or a survived fault, no process left
behind, nothing written before the fault lost."""

from __future__ import annotations

import importlib
import queue
import textwrap
from pathlib import Path

import pytest

from workbench.errors import PreflightError, RunFailedError
from workbench.run.handle import attach
from workbench.run.launch import launch

from .conftest import base_config
from .helpers import WARM, wait_for, wait_until_no_job_processes
from .nonfinite_plugin import NAN_RANK, NAN_STEP

pytestmark = pytest.mark.slow


def _fails(handle, timeout_s: float = 120) -> RunFailedError:
    with pytest.raises(RunFailedError) as err:
        handle.wait(timeout_s=timeout_s)
    wait_until_no_job_processes(handle.path)
    return err.value


def test_rank_killed_with_sigkill(store) -> None:
    handle = launch(
        base_config(
            store, world_size=2, run_name="sigkill", fault={"rank": 1, "step": 6, "kind": "kill"}
        )
    )
    err = _fails(handle)
    assert err.rank == 1 and "ended without reporting" in err.exception
    steps = handle.traces()
    assert sorted(steps[steps["rank"] == 0]["step"]) == list(range(1, 6)), "rank 0's rows survive"


def test_non_finite_loss_stops_with_step_and_rank(store) -> None:
    """The NaN is planted on one rank at one step (a plug-in model): that rank and that step are
    named, not its peer, whose next step fails only as a consequence."""
    handle = launch(
        base_config(
            store,
            world_size=2,
            run_name="nan",
            model="tests.nonfinite_plugin:nan_on_one_rank",
            dataset="tests.plugins:synthetic_like_mlp",
        ),
        WARM,
    )
    err = _fails(handle)
    assert err.rank == NAN_RANK, err.exception
    assert "NonFiniteLossError" in err.exception
    assert f"at step {NAN_STEP} on rank {NAN_RANK}" in err.exception


def test_unused_parameters_get_advice(store) -> None:
    handle = launch(
        base_config(
            store,
            world_size=2,
            run_name="unused",
            model="tests.plugins:with_unused_head",
            dataset="tests.plugins:synthetic_like_mlp",
        ),
        WARM,
    )
    err = _fails(handle)
    assert "unused_head.weight" in err.exception and "find_unused_parameters=True" in err.exception


def test_plugin_that_does_not_import_is_refused_before_launch(tmp_path: Path) -> None:
    with pytest.raises(
        PreflightError, match="model='nosuch.module:f': cannot import module 'nosuch.module'"
    ):
        launch(base_config(tmp_path, world_size=2, model="nosuch.module:f"))
    assert not any(tmp_path.rglob("run.json"))


def test_full_disk_is_refused_before_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch_module = importlib.import_module(
        "workbench.run.preflight"
    )  # the module, not the function
    monkeypatch.setattr(launch_module, "MIN_FREE_BYTES", 2**62)  # more than any disk has free
    with pytest.raises(PreflightError, match="output_dir=.*MiB free on the disk"):
        launch(base_config(tmp_path, world_size=2))


def test_two_runs_writing_into_one_store_at_once(store) -> None:
    a = launch(base_config(store, world_size=1, run_name="together-a", sweep="shared"), WARM)
    b = launch(
        base_config(store, world_size=1, run_name="together-b", sweep="shared", seed=1), WARM
    )
    assert a.wait(timeout_s=120) == b.wait(timeout_s=120) == "completed"
    for handle in (a, b):
        steps = handle.traces()
        assert set(steps["run_id"]) == {handle.run_id} and len(steps) == 16
    assert a.traces()["loss"].tolist() != b.traces()["loss"].tolist()


def _interrupt_a_running_cell(km, kc) -> None:
    """Jupyter's "Interrupt kernel" during a cell: jupyter_client signals the kernel's process
    group with SIGINT. The cell's KeyboardInterrupt proves the signal was delivered."""
    msg_id = kc.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(600)")

    def sleeping() -> bool:
        try:  # one message at a time: the channel's get_msgs() blocks until the next one
            m = kc.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            return False
        return (
            m["parent_header"].get("msg_id") == msg_id
            and m["msg_type"] == "stream"
            and "sleeping" in m["content"]["text"]
        )

    wait_for(sleeping, 60, "the cell to start sleeping")
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"].get("ename") == "KeyboardInterrupt", reply["content"]


def _traced_steps(run_path: Path) -> int:
    """Step rows the ranks have flushed so far, all ranks together."""
    return len(attach(run_path).traces())


@pytest.mark.waits
def test_job_survives_a_kernel_restart_and_is_reattached(store) -> None:
    """docs/notebooks.md: ranks are untouched by "interrupt kernel" and still running after
    a kernel restart; the run is picked up again from the store."""
    jupyter_client = pytest.importorskip("jupyter_client")
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.start_kernel()
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        code = textwrap.dedent(f"""
            from workbench import RunConfig
            from workbench.run.launch import launch
            # Steps sleep 50 ms, so the run cannot end before the restart is checked.
            config = RunConfig(model="tests.plugins:sleepy_mlp",
                               dataset="tests.plugins:synthetic_like_mlp",
                               model_options={{"sleep_s": 0.05}}, world_size=2,
                               global_batch_size=64, train_samples=512, epochs=40,
                               output_dir={str(store)!r}, sweep="kernel", run_name="survivor")
            handle = launch(config)
        """)
        reply = kc.execute_interactive(code, timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        run_path = store / "kernel" / "survivor"
        wait_for(lambda: attach(run_path).status() == "running", 60, "the run to start")
        # "running" once one rank runs: both must have recorded their process before it is read
        wait_for(
            lambda: sorted(attach(run_path).rank_states()) == [0, 1], 60, "both ranks to record"
        )
        _interrupt_a_running_cell(km, kc)  # SIGINT to the kernel's whole process group
        pids = {r: s["pid"] for r, s in attach(run_path).rank_states().items()}
        then = _traced_steps(run_path)
        wait_for(
            lambda: _traced_steps(run_path) >= then + 20,
            120,  # 10 steps of 50 ms per rank: seconds, unless the ranks were interrupted
            f"the ranks to go on stepping after the interrupt (from {then} rows)",
        )
        after = attach(run_path).rank_states()
        assert {r: s["pid"] for r, s in after.items()} == pids, "the same rank processes"
        assert {s["status"] for s in after.values()} == {"running"}, after
        km.restart_kernel(
            now=True
        )  # what Jupyter's "Restart kernel" does: SIGKILL to its process group
        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)
    again = attach(run_path)  # a new session finds the run in the store
    assert again.status() == "running"
    assert again.wait(timeout_s=180) == "completed"
    assert sorted(again.traces()["step"].unique()) == list(range(1, 321))


@pytest.mark.timing
def test_long_rank0_evaluation_does_not_trip_the_collective_timeout(store) -> None:
    # Rank 0 evaluates alone for about 6 s; the other rank waits far past the 3 s collective
    # timeout, on the evaluation side group whose own timeout allows it.
    config = base_config(
        store,
        world_size=2,
        run_name="slow-eval",
        eval_on="rank0",
        epochs=1,
        collective_timeout_s=3,
        eval_batch_size=8,
        model="tests.plugins:sleepy_mlp",
        dataset="tests.plugins:synthetic_like_mlp",
        model_options={"eval_sleep_s": 0.25},
    )
    handle = launch(config)
    assert handle.wait(timeout_s=120) == "completed"
    evals = handle.traces("eval")
    rank1 = evals[evals["rank"] == 1].iloc[0]
    waiting = rank1["wait_s"]  # in the barrier before the broadcast, on the side group
    assert waiting > 3, f"rank 1 waited {waiting:.1f} s, longer than the collective timeout"
    assert rank1["broadcast_s"] < 1, "the broadcast itself holds only the transfer"
