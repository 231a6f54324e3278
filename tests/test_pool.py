"""The pool executor with real processes: warm single-use workers that run a rank exactly like
the local executor does (same results bit for bit), failures named by rank, cancel and
re-attach after the parent dies, no worker outliving its pool, its parent or its idle time, and
one template shared by the processes a sweep starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from workbench import RunFailedError, WarmPool, warm_pool
from workbench.errors import PreflightError
from workbench.run.backends.pool import SHARED_TEMPLATE_ENV, shared_template
from workbench.run.handle import attach
from workbench.run.launch import launch
from workbench.run.processes import alive, command_line, pids_of_run
from workbench.store.files import read_json

from .conftest import base_config
from .helpers import wait_for

ROOT = Path(__file__).resolve().parents[1]
SLEEPY = dict(
    model="tests.plugins:sleepy_mlp",
    dataset="tests.plugins:synthetic_like_mlp",
    model_options={"sleep_s": 0.2},
    epochs=20,  # 160 steps of 0.2 s: it cannot end while the test looks at it
    trace_flush_s=0.1,
)


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def pool_processes(parent_pid: int) -> list[int]:
    """Live processes of the pools of ``parent_pid`` (templates and workers), found in /proc
    independently of the pools' own bookkeeping."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and alive(int(proc.name)):
            args = command_line(int(proc.name))
            if "workbench.rank.pool_worker" in args and str(parent_pid) in args:
                found.append(int(proc.name))
    return sorted(found)


def pool_workers(parent_pid: int) -> list[int]:
    """The workers among them (idle or running a rank): forks of a template, so not children of
    ``parent_pid`` as the templates are."""
    workers = []
    for pid in pool_processes(parent_pid):
        try:
            if _parent(pid) != parent_pid:
                workers.append(pid)
        except OSError:
            pass  # gone meanwhile
    return workers


def _running(handle) -> dict:
    states = handle.rank_states()
    return len(states) == 2 and all(s["status"] == "running" for s in states.values()) and states


# -- bad input: named before any process starts


def test_bad_pool_input_is_named_before_any_process_starts(store) -> None:
    with pytest.raises(PreflightError) as err:
        WarmPool(size=0, idle_s=-1)
    assert "size=0" in str(err.value) and "idle_s=-1" in str(err.value)
    config = base_config(store, world_size=2, nodes=1)
    with pytest.raises(PreflightError) as err:
        launch(config.replace(run_name="bad-pool"), executor="pool", pool="mine", workers=3)
    text = str(err.value)
    assert "pool='mine'" in text and "WarmPool" in text, text
    assert "workers=3" in text and "valid: pool" in text, text
    assert not (store / "it" / "bad-pool" / "logs").exists(), "nothing was started"
    with pytest.raises(PreflightError) as err:
        launch(config, executor="pools")
    assert "local, debug, slurm, pool" in str(err.value)


# -- results equal the local executor's


@pytest.mark.slow
def test_a_pool_run_equals_the_local_run_bit_for_bit(ddp2, store) -> None:
    with warm_pool(size=2) as pool:
        warm = wait_for(lambda: len(pool.pids()) == 2 and pool.pids(), 60, "2 warm workers")
        handle = launch(
            base_config(
                store,
                world_size=2,
                run_name="pool-ddp2",  # ddp2's config but for the name
                trace_sample_ids=True,
                trace_comm_every_steps=4,
            ),
            executor="pool",
        )
        assert handle.wait(timeout_s=180) == "completed"
    states = handle.rank_states()
    assert [states[r]["pid"] for r in (0, 1)] == warm, "the ranks ran in the warm workers"
    assert all(s["job_id"].startswith("pool-") for s in states.values())
    local, pooled = ddp2.result(), handle.result()
    assert [s["param_sha256"] for s in pooled] == [s["param_sha256"] for s in local]
    # The final checkpoint's tensors, compared here (not by the rank's own hash).
    ours = torch.load(max((handle.path / "checkpoints").glob("step-*")) / "train.pt")
    theirs = torch.load(max((ddp2.path / "checkpoints").glob("step-*")) / "train.pt")
    assert ours["step"] == theirs["step"] == 16
    for name, tensor in theirs["model"].items():
        assert torch.equal(ours["model"][name], tensor), name
    columns = ["rank", "step", "loss", "samples"]
    a = ddp2.traces().sort_values(["rank", "step"])[columns].reset_index(drop=True)
    b = handle.traces().sort_values(["rank", "step"])[columns].reset_index(drop=True)
    assert len(a) == 32 and a.equals(b), "the same losses, step by step, on every rank"


# -- failures named by rank


@pytest.mark.slow
def test_a_failing_rank_is_named_with_its_log(store) -> None:
    handle = launch(
        base_config(
            store,
            world_size=2,
            run_name="pool-raise",
            fault={"rank": 1, "step": 3, "kind": "raise"},
        ),
        executor="pool",
    )
    with pytest.raises(RunFailedError) as err:
        handle.wait(timeout_s=120)
    assert err.value.rank == 1 and "step 3" in (err.value.exception or ""), err.value
    assert (err.value.log_path or "").endswith("_1_log.err"), err.value.log_path
    assert "Traceback" in (err.value.log_tail or ""), "the worker's stderr went to the rank's log"
    wait_for(lambda: not pids_of_run(handle.path), 30, "no process of the failed run")


@pytest.mark.slow
def test_a_worker_killed_with_sigkill_is_named(store) -> None:
    handle = launch(base_config(store, world_size=2, run_name="pool-sigkill", **SLEEPY), "pool")
    states = wait_for(lambda: _running(handle), 120, "both ranks running")
    # Past the rendezvous (a rank killed before it leaves its peer waiting, not failing).
    wait_for(lambda: handle.traces()["rank"].nunique() == 2, 120, "a traced step on each rank")
    os.kill(int(states[1]["pid"]), signal.SIGKILL)
    with pytest.raises(RunFailedError) as err:
        handle.wait(timeout_s=120)
    assert err.value.rank == 1 and "ended without reporting" in (err.value.exception or "")
    assert not alive(int(states[0]["pid"])), "the peer was ended too"


# -- the parent dies: idle workers go, ranks run on, re-attach and cancel

PARENT = """
import json, os, sys, time
from workbench import RunConfig, WarmPool, launch
config = RunConfig.from_dict(json.loads(sys.argv[1]))
idle = WarmPool(size=2, idle_s=600)
pool = WarmPool(size=2, idle_s=600)
handle = launch(config, executor="pool", pool=pool)
# Fork only once both pools are full: a fork while the pool's thread is inside Popen would hand
# the helper the write end of Popen's exec-status pipe, and that Popen would wait for the helper.
deadline = time.monotonic() + 120
while len(idle.pids()) < 2 or len(pool.pids()) < 2:
    assert time.monotonic() < deadline, f"pools not refilled: {idle!r} {pool!r}"
    time.sleep(0.05)
# A forked child (as a kernel's helpers may be) holds the workers' stdin pipes open, so they
# see no end of input when this process dies: only their parent-death watch can end them.
helper = os.fork()
if helper == 0:
    time.sleep(600)
    os._exit(0)
print(json.dumps({"run": str(handle.path), "helper": helper}), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_parent_death_ends_idle_workers_and_the_run_is_reattached_and_cancelled(store) -> None:
    config = base_config(store, world_size=2, run_name="pool-orphan", **SLEEPY)
    helper = 0
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, json.dumps(config.to_dict())],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        said = json.loads(parent.stdout.readline())
        helper, run_path = said["helper"], Path(said["run"])
        handle = attach(run_path)
        states = wait_for(lambda: _running(handle), 120, "both ranks running")
        ranks = sorted(int(s["pid"]) for s in states.values())
        # Positive control: /proc shows the ranks and the 4 idle workers (2 + the refill).
        idle = wait_for(
            lambda: (
                len(set(pool_workers(parent.pid)) - set(ranks)) == 4
                and sorted(set(pool_workers(parent.pid)) - set(ranks))
            ),
            120,
            "4 idle workers besides the 2 ranks",
        )
        assert set(ranks) <= set(pool_workers(parent.pid))
        assert os.getsid(ranks[0]) != os.getsid(parent.pid), "ranks in a session of their own"
        parent.kill()  # what a kernel restart does to the kernel
        parent.wait()
        wait_for(lambda: not any(alive(p) for p in idle), 30, f"idle workers {idle} to exit")
        assert set(pool_processes(parent.pid)) == set(ranks), "the templates are gone too"
        assert all(alive(p) for p in ranks), "the run's ranks outlive the parent"
        again = attach(run_path)  # a new session finds the run in the store
        assert again.status() == "running"
        again.cancel()  # returns only once the processes are gone
        assert not any(alive(p) for p in ranks) and pids_of_run(run_path) == []
        assert read_json(run_path / "run.json")["status"] == "cancelled"
    finally:
        parent.kill()
        parent.wait()
        if helper:
            os.kill(helper, signal.SIGKILL)
        for pid in pool_workers(parent.pid):  # only when the test failed midway
            os.kill(pid, signal.SIGKILL)


# -- close() and the idle time


@pytest.mark.slow
def test_close_returns_once_every_idle_worker_is_gone() -> None:
    others = set(pool_workers(os.getpid()))  # other pools of this process (launch's default)
    pool = WarmPool(size=2, idle_s=600)

    def ours() -> list[int]:
        return sorted(set(pool_workers(os.getpid())) - others)

    workers = wait_for(lambda: len(ours()) == 2 and ours(), 60, "2 workers in /proc")
    assert sorted(pool.pids()) == workers  # the positive control: /proc finds them alive
    assert alive(pool.template_pid)
    pool.close()
    assert not any(alive(p) for p in workers), "close() returned with workers alive"
    assert not alive(pool.template_pid), "close() returned with the template alive"
    assert ours() == []
    with pytest.raises(RuntimeError, match="closed"):
        pool.take(1)


@pytest.mark.slow
@pytest.mark.waits
def test_an_idle_worker_exits_on_its_own_after_the_idle_time() -> None:
    idle_s = 4.0
    started = time.monotonic()
    pool = WarmPool(size=1, idle_s=idle_s)
    (pid,) = wait_for(lambda: pool.pids(), 60, "the worker")
    assert alive(pid)
    wait_for(lambda: not alive(pid), 120, "the worker to exit")
    # Nothing else ends an idle worker while its pool is open and its template alive.
    assert not pool.closed and alive(pool.template_pid), "it left on its own"
    assert time.monotonic() - started >= idle_s, "it waited its idle time first"
    pool.close()


# -- one template shared by a sweep's kernels

KERNEL = """
import json, sys
from workbench import RunConfig, launch
handle = launch(RunConfig.from_dict(json.loads(sys.argv[1])), executor="pool")
print(handle.path, flush=True)
"""


@pytest.mark.slow
def test_a_shared_template_forks_the_ranks_of_every_process_it_serves(store) -> None:
    """Two processes (as two points' kernels) launch pool runs while one shared template serves
    them: every rank is a fork of that template, none of a template of their own."""
    ranks = {}
    outer = os.environ.get(SHARED_TEMPLATE_ENV)  # the session's (conftest.pool_template)
    with shared_template() as path:
        assert os.environ[SHARED_TEMPLATE_ENV] == path
        for name in ("shared-a", "shared-b"):
            config = base_config(store, world_size=2, run_name=name, **SLEEPY)
            out = subprocess.run(
                [sys.executable, "-c", KERNEL, json.dumps(config.to_dict())],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
            handle = attach(Path(out.stdout.split()[-1]))
            states = wait_for(lambda h=handle: _running(h), 120, f"both ranks of {name} running")
            ranks[name] = (handle, [int(s["pid"]) for s in states.values()])
        parents = {_parent(pid) for _, pids in ranks.values() for pid in pids}
        assert len(parents) == 1, f"the ranks of both runs have one parent, not {parents}"
        (template,) = parents
        assert "workbench.rank.pool_worker" in command_line(template)
        assert str(os.getpid()) in command_line(template), "the template this process started"
        for handle, _ in ranks.values():
            handle.cancel()
    assert os.environ.get(SHARED_TEMPLATE_ENV) == outer, "the outer template is back"
    wait_for(lambda: not alive(template), 30, "the shared template to end with its block")
