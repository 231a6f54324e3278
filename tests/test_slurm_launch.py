"""The workbench on a real (single-machine) Slurm cluster through submitit's SlurmExecutor."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from workbench.errors import RunFailedError
from workbench.run.handle import attach
from workbench.run.launch import launch, sbatch_script
from workbench.run.processes import alive
from workbench.store.files import read_json

from .conftest import base_config
from .helpers import WARM, job_processes, wait_for
from .slurm_support import TIME_LIMIT

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _slurm(config, **options):
    options.setdefault("partition", os.environ.get("WORKBENCH_SLURM_PARTITION", "debug"))
    options.setdefault("poll_s", 2.0)  # a test may ask often; the default is 30 s
    return launch(config, executor="slurm", **options)


@pytest.fixture(scope="module")
def slurm_runs(slurm_cluster, store):
    """A 1-node x 2-task and a 2-node x 2-task run of the shared config, submitted together."""
    one = _slurm(base_config(store, world_size=2, run_name="slurm-1x2"))
    two = _slurm(base_config(store, nodes=2, tasks_per_node=2, run_name="slurm-2x2"))
    assert one.wait(timeout_s=300) == "completed"
    assert two.wait(timeout_s=300) == "completed"
    return one, two


def test_two_task_job_matches_the_local_run(slurm_runs, ddp2) -> None:
    one, _ = slurm_runs
    assert [s["param_sha256"] for s in one.result()] == [s["param_sha256"] for s in ddp2.result()]
    slurm_steps, local_steps = one.traces(), ddp2.traces()
    assert list(slurm_steps.columns) == list(local_steps.columns)
    assert (
        slurm_steps.groupby("step")["loss"].mean() == local_steps.groupby("step")["loss"].mean()
    ).all()


def test_two_nodes_of_two_tasks_follow_the_same_loss_trajectory(slurm_runs, ddp2) -> None:
    _, two = slurm_runs
    steps = two.traces()
    assert sorted(steps["rank"].unique()) == [0, 1, 2, 3]
    assert sorted(steps["local_rank"].unique()) == [0, 1]
    assert len(steps) == 16 * 4 and (steps["samples"] == 16).all()
    np.testing.assert_allclose(
        steps.groupby("step")["loss"].mean().to_numpy(),
        ddp2.traces().groupby("step")["loss"].mean().to_numpy(),
        rtol=1e-5,
    )
    states = {s["rank"]: s for s in two.rank_states().values()}
    assert len({s["summary"]["param_sha256"] for s in states.values()}) == 1
    run = read_json(two.path / "run.json")
    assert run["executor"] == "slurm" and run["status"] == "completed" and run["job_id"]


def test_failing_rank_is_reported_with_its_error(slurm_cluster, store) -> None:
    handle = _slurm(
        base_config(
            store,
            world_size=2,
            run_name="slurm-fail",
            fault={"rank": 1, "step": 3, "kind": "raise"},
        )
    )
    with pytest.raises(RunFailedError) as err:
        handle.wait(timeout_s=180)
    assert err.value.rank == 1 and "InjectedFault" in err.value.exception
    assert read_json(handle.path / "run.json")["status"] == "failed"


def test_cancel_ends_the_job_and_the_store_says_cancelled(slurm_cluster, store) -> None:
    config = base_config(
        store,
        world_size=2,
        run_name="slurm-cancel",
        model="tests.plugins:sleepy_mlp",
        dataset="tests.plugins:synthetic_like_mlp",
        model_options={"sleep_s": 0.2},
        epochs=20,
    )
    handle = _slurm(config)
    states = wait_for(
        lambda: (
            len(handle.rank_states()) == 2
            and all(s["status"] == "running" for s in handle.rank_states().values())
            and handle.rank_states()
        ),
        180,
        "both ranks running",
    )
    # A positive control: the job's processes are found while it runs.
    assert job_processes(handle.path), "no process of the running job was found"
    assert _squeue_state(handle.job_id) == "RUNNING"
    handle.cancel()
    # cancel() returns only once the job is gone: no waiting here.
    assert _squeue_state(handle.job_id) not in ("RUNNING", "PENDING", "COMPLETING")
    assert job_processes(handle.path) == []
    assert not any(alive(int(s["pid"])) for s in states.values())
    assert handle.status() == "cancelled"
    assert read_json(handle.path / "run.json")["status"] == "cancelled"


def _squeue_state(job_id: str | None) -> str:
    """The job's state as Slurm itself reports it ("" once it left the queue)."""
    out = subprocess.run(
        ["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True, timeout=30
    )
    return out.stdout.strip()


def test_time_limit_checkpoints_requeues_and_completes(slurm_cluster) -> None:
    # Submitted when the cluster came up (slurm_support.time_limit_config says why it must be
    # requeued); its statuses were recorded as they changed meanwhile.
    log, config = TIME_LIMIT["log"], TIME_LIMIT["config"]
    seen = log.wait()
    handle = log.handle
    assert seen[-1] == "completed", seen
    # the store follows Slurm: preempted while the job waits to be requeued, running again
    assert "preempted" in seen and "running" in seen[seen.index("preempted") :], seen
    steps = handle.traces()
    assert steps["attempt"].max() >= 1, "the job was requeued at least once"
    for rank in (0, 1):
        assert sorted(steps[steps["rank"] == rank]["step"]) == list(range(1, 481))
    uninterrupted = launch(
        config.replace(
            run_name="timelimit-reference", model_options={"sleep_s": 0.0}, timeout_min=10
        ),
        WARM,
    )
    assert uninterrupted.wait(timeout_s=120) == "completed"
    assert [s["param_sha256"] for s in handle.result()] == [
        s["param_sha256"] for s in uninterrupted.result()
    ]


def test_attach_from_another_session(slurm_runs) -> None:
    one, _ = slurm_runs
    again = attach(one.path)
    assert again.status() == "completed" and again.executor == "slurm"
    assert again.traces().equals(one.traces())


def test_sbatch_script_dry_run(tmp_path: Path) -> None:
    config = base_config(tmp_path, nodes=2, tasks_per_node=4, run_name="dry", timeout_min=90)
    text = sbatch_script(
        config,
        partition="gpu",
        account="proj",
        gpus_per_node=4,
        setup=["module load cuda/12.4"],
        env={"NCCL_DEBUG": "INFO"},
        sbatch_args={"reservation": "r1"},
    )
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj",
        "#SBATCH --time=90",
        "#SBATCH --signal=USR2@60",
        "#SBATCH --reservation=r1",
        "module load cuda/12.4",
        "export NCCL_DEBUG=INFO",
        "--kill-on-bad-exit=1",
    ):
        assert line in text, line
    assert not (tmp_path / "it" / "dry").exists(), "a dry run writes nothing"
