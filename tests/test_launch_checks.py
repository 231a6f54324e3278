"""Checks made before any process starts, and the in-process debug executor."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from workbench import ports
from workbench.config.run_config import RunConfig
from workbench.errors import PreflightError
from workbench.run.launch import launch, preflight


def _config(tmp_path: Path, **changes) -> RunConfig:
    fields = dict(
        model="mlp",
        world_size=2,
        per_device_batch_size=8,
        train_samples=64,
        output_dir=str(tmp_path),
    )
    return RunConfig(**{**fields, **changes})


def test_master_port_in_use_is_refused(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PreflightError, match=f"master_port={port}: already in use"):
            preflight(_config(tmp_path, master_port=port), "local", {})
    assert not list(tmp_path.iterdir()), "nothing was written"


def test_picked_ports_avoid_the_ephemeral_range_and_each_other() -> None:
    # Runs launched together once failed with EADDRINUSE: a port picked from the ephemeral
    # range was taken by another run's gloo connections before rank 0 bound it.
    low, high = ports.ephemeral_range()
    picked = [ports.free_port() for _ in range(50)]
    assert len(set(picked)) == len(picked)
    assert all(not low <= port <= high for port in picked)
    assert all(ports.port_free(port) for port in picked)
    with socket.socket() as s:
        s.bind(("", picked[0]))
        s.listen()
        assert not ports.port_free(picked[0])


def test_processes_picking_ports_at_once_never_pick_the_same_one(tmp_path: Path) -> None:
    """Jobs started together on one node each pick their rank 0's port: once two of the
    suite's Slurm jobs picked the same one, and the later one's rank 0 failed with EADDRINUSE
    (neither had bound it yet). Three processes picking 400 ports each at once (about 37
    repeats among them expected from 12,768 ports without the host's claims) share none."""
    env = {**os.environ, "WORKBENCH_PORT_CLAIMS": str(tmp_path / "claims")}
    code = "from workbench import ports; print(*(ports.free_port() for _ in range(400)))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(3)
    ]
    picks = [[int(x) for x in proc.communicate(timeout=120)[0].split()] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0]
    everyone = [port for pick in picks for port in pick]
    assert len(everyone) == 1200
    assert len(set(everyone)) == 1200, f"{1200 - len(set(everyone))} ports picked twice"


def test_a_claim_holds_a_port_for_its_lease_then_lapses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port another process claimed is not handed out while its claim is younger than
    ``CLAIM_S``; an older claim is taken over (a one-port pool makes the pick certain)."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("WORKBENCH_PORT_CLAIMS", str(tmp_path))
    monkeypatch.setattr(ports, "_outside_ephemeral", lambda: range(port, port + 1))
    claim = tmp_path / str(port)
    claim.touch()
    with pytest.raises(RuntimeError, match=f"no free TCP port found in {port}-{port}"):
        ports.free_port()
    old = time.time() - ports.CLAIM_S - 1
    os.utime(claim, (old, old))
    assert ports.free_port() == port
    assert time.time() - claim.stat().st_mtime < 60, "claimed afresh"


def test_a_scheduler_jobs_port_is_rank_0s_published_pick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Slurm job's ranks meet at a port rank 0 found free on its node (no rank derives one
    unchecked); a rank that starts first waits for it, and one that waits in vain says where."""
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    path = ports.rendezvous_file(tmp_path, "4242_3", attempt=2)
    assert path == tmp_path / "rendezvous" / "4242_3.attempt2.restart1.port"
    with pytest.raises(TimeoutError, match=f"did not publish the rendezvous port in {path} within"):
        ports.published_port(path, timeout_s=0.2)
    read: list[int] = []
    waiting = threading.Thread(target=lambda: read.append(ports.published_port(path, 60)))
    waiting.start()
    port = ports.publish_port(path)
    waiting.join(60)
    assert read == [port]
    low, high = ports.ephemeral_range()
    assert not low <= port <= high and ports.port_free(port)
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no partial file left"


def test_unknown_executor_and_options_list_valid_names(tmp_path: Path) -> None:
    with pytest.raises(PreflightError, match="executor='lokal': must be one of local, debug"):
        preflight(_config(tmp_path), "lokal", {})
    with pytest.raises(
        PreflightError, match="partition='gpu': not an option of the local executor; valid: setup"
    ):
        preflight(_config(tmp_path), "local", {"partition": "gpu"})


def test_debug_executor_needs_world_size_one(tmp_path: Path) -> None:
    with pytest.raises(PreflightError, match="world_size=2: the debug executor runs one task"):
        preflight(_config(tmp_path), "debug", {})


def test_local_executor_is_one_node(tmp_path: Path) -> None:
    with pytest.raises(PreflightError, match="nodes=2: the local executor runs on one node"):
        preflight(_config(tmp_path, world_size=4, nodes=2), "local", {})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine has no GPU")
def test_cuda_requested_without_a_gpu(tmp_path: Path) -> None:
    with pytest.raises(PreflightError, match="device='cuda': no CUDA device is visible"):
        preflight(_config(tmp_path, device="cuda"), "local", {})
    with pytest.raises(PreflightError, match="precision='fp16': fp16 needs CUDA"):
        preflight(_config(tmp_path, precision="fp16"), "local", {})


def test_gpu_checks_with_a_pretend_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU here: pretend one is visible (and a CUDA context exists) to reach the GPU-only checks.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(PreflightError) as err:
        preflight(_config(tmp_path, device="cuda"), "local", {})
    text = str(err.value)
    assert "tasks_per_node=2: more devices per node than present: this node has 1 GPU(s)" in text
    assert "already created a CUDA context" in text


def test_unwritable_output_dir(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("not a folder")
    with pytest.raises(PreflightError, match="output_dir=.*is not a folder"):
        preflight(_config(tmp_path, output_dir=str(target / "results")), "local", {})
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(PreflightError, match="is not writable"):
            preflight(_config(tmp_path, output_dir=str(locked)), "local", {})


def test_existing_run_and_resume_of_a_missing_run(tmp_path: Path) -> None:
    (tmp_path / "default" / "taken").mkdir(parents=True)
    (tmp_path / "default" / "taken" / "run.json").write_text("{}")
    with pytest.raises(PreflightError, match="run_name='taken': a run already exists"):
        preflight(_config(tmp_path, run_name="taken"), "local", {})
    with pytest.raises(PreflightError, match="run_name='nothing': resume=True but no run"):
        preflight(_config(tmp_path, run_name="nothing"), "local", {}, resume=True)


def test_debug_executor_runs_in_process_with_bf16_and_a_plugin(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        world_size=1,
        model="transformer",
        precision="bf16",
        max_steps=4,
        train_samples=128,
        eval_samples=32,
        warmup_steps=1,
    )
    handle = launch(config, executor="debug")
    assert handle.wait() == "completed"
    steps = handle.traces()
    assert steps["step"].tolist() == [1, 2, 3, 4] and steps["loss"].notna().all()
    assert handle.traces("eval")["metric_value"].between(0, 1).all()
    plugin = _config(
        tmp_path,
        world_size=1,
        model="tests.plugins:tiny_linear",
        dataset="tests.plugins:two_features",
        max_steps=3,
        train_samples=64,
    )
    assert launch(plugin, executor="debug").wait() == "completed"


def test_profiled_window_writes_one_trace_per_rank_with_step_markers(tmp_path: Path) -> None:
    config = _config(tmp_path, world_size=1, max_steps=6, profile_steps=(3, 4), run_name="prof")
    handle = launch(config, executor="debug")
    assert handle.wait() == "completed"
    files = list((handle.path / "profiles").glob("rank00000*.pt.trace.json"))
    assert len(files) == 1
    trace = json.loads(files[0].read_text())
    steps = {
        e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")
    }
    assert steps == {"ProfilerStep#3", "ProfilerStep#4"}
    assert trace["distributedInfo"]["rank"] == 0


def test_comm_tracing_can_be_turned_off(tmp_path: Path) -> None:
    config = _config(tmp_path, world_size=1, max_steps=3, trace_comm="off", run_name="nocomm")
    handle = launch(config, executor="debug")
    assert handle.wait() == "completed"
    steps = handle.traces()
    assert steps["comm_s"].isna().all() and steps["comm_bytes"].isna().all()
    assert steps["step_s"].notna().all()


def test_back_ends_by_name_and_their_options() -> None:
    from workbench.run.backends import BACKENDS, backend
    from workbench.run.backends.slurm import SLURM_OPTIONS

    assert list(BACKENDS) == ["local", "debug", "slurm", "pool"]
    assert [backend(n).on_this_machine for n in BACKENDS] == [True, True, False, True]
    assert backend("slurm").options is SLURM_OPTIONS and "partition" in SLURM_OPTIONS
    assert backend("slurm").queue_s > 0 == backend("local").queue_s
    with pytest.raises(
        PreflightError, match="executor='lokal': must be one of local, debug, slurm"
    ):
        backend("lokal")
    slurm = backend("slurm")
    fields = [p.field for p in slurm.option_problems({"partiton": "x", "env": ["A=1"]})]
    assert fields == ["partiton", "env"]
    assert backend("debug").option_problems({"setup": []})[0].allowed.endswith("valid: (none)")


def test_debug_master_port_in_use_is_refused_too(tmp_path: Path) -> None:
    # The debug executor's rank runs on this machine, so its port is checked like a local one.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        config = _config(tmp_path, world_size=1, master_port=port)
        with pytest.raises(PreflightError, match=f"master_port={port}: already in use"):
            preflight(config, "debug", {})
