"""The Slurm claims of docs/slurm.md, each proved on the real local cluster (cluster.sh):
misspelled options refused before anything is submitted, the rendezvous port derived from the job
id, preemption seen in the store as ``preempted`` then ``running`` again, cancel through a handle
re-attached in another process, a sweep spec with ``executor: slurm``, and job arrays of several
layouts with their concurrency limit seen in ``squeue``.

The processes, ports and states checked here are read from Slurm itself (``squeue``,
``scontrol``) and from ``/proc``, never from what the workbench says about them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from workbench import RunConfig, launch
from workbench.cli import main
from workbench.errors import PreflightError
from workbench.run.launch import launch_array
from workbench.run.processes import alive
from workbench.store.files import read_json

from .conftest import base_config
from .helpers import job_processes, wait_for
from .slurm_support import all_job_ids

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_02 = ROOT / "notebooks" / "02_scaling_sweep.ipynb"
SLEEPY = dict(model="tests.plugins:sleepy_mlp", dataset="tests.plugins:synthetic_like_mlp")


def _slurm(config: RunConfig, **options):
    options.setdefault("poll_s", 2.0)  # a test may ask often; the default is 30 s
    return launch(config, executor="slurm", **options)


def _readme_slurm_options() -> list[str]:
    """The option names docs/slurm.md lists after "Slurm options (...)"."""
    text = (ROOT / "docs" / "slurm.md").read_text()
    start = text.index("Slurm options (")
    paragraph = text[start : text.index("A misspelled option", start)]
    return re.findall(r"`([a-z_]+)`", paragraph.split(":", 1)[1])


def _scontrol(job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields for one job (or array task), as Slurm reports them."""
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def _slurm_completed(job_id: str, timeout_s: float = 60) -> dict[str, str]:
    """Slurm's record of the job once it says COMPLETED (it ends the job a moment after the
    ranks reported completed)."""
    return wait_for(
        lambda: (job := _scontrol(job_id))["JobState"] == "COMPLETED" and job,
        timeout_s,
        f"Slurm to say {job_id} COMPLETED",
    )


def _tcp(pid: int) -> tuple[set[int], set[int]]:
    """The TCP ports process ``pid`` listens on, and the remote ports of its established
    connections, read from /proc as ``ss -tnp`` does (socket inodes of its file descriptors)."""
    try:
        links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    except OSError:
        return set(), set()
    inodes = {link[8:-1] for link in links if link.startswith("socket:[")}
    listening: set[int] = set()
    remote: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[9] not in inodes:
                continue
            if fields[3] == "0A":  # LISTEN
                listening.add(int(fields[1].rsplit(":", 1)[1], 16))
            elif fields[3] == "01":  # ESTABLISHED
                remote.add(int(fields[2].rsplit(":", 1)[1], 16))
    return listening, remote


def _ranks_running(handle, attempt: int) -> dict[int, dict] | None:
    """The rank records once every rank of ``attempt`` says running, else None."""
    states = handle.rank_states()
    ok = len(states) == handle.config.processes and all(
        s["status"] == "running" and s["attempt"] == attempt for s in states.values()
    )
    return states if ok else None


def _rendezvous(states: dict[int, dict]) -> tuple[set[int], set[int]] | None:
    """Rank 0's listening ports and rank 1's remote ports, once rank 1 is connected to rank 0."""
    listening, _ = _tcp(int(states[0]["pid"]))
    _, remote = _tcp(int(states[1]["pid"]))
    return (listening, remote) if listening & remote else None


# ----------------------------------------------------------------------------- 1: bad options


@pytest.mark.slurm
def test_misspelled_slurm_option_is_refused_before_anything_is_submitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """From Python and from a sweep spec file: the error names the misspelled option and lists
    every option docs/slurm.md documents, and ``sbatch`` is never run. An ``sbatch`` on ``PATH``
    that records its calls shows it; the correctly spelled option (positive control) reaches it.
    The real cluster's own count of jobs is checked in the sweep test below."""
    calls = tmp_path / "sbatch-calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit 1\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    documented = _readme_slurm_options()
    assert len(documented) == 14 and "partition" in documented, documented

    config = base_config(tmp_path / "store", world_size=2, run_name="typo")
    with pytest.raises(PreflightError) as err:
        launch(config, executor="slurm", partiton="debug", poll_s=1.0)
    message = str(err.value)
    assert "partiton" in message and "'debug'" in message
    valid = message.split("valid:", 1)[1]
    assert [o.strip() for o in valid.split("\n")[0].split(",")] == documented, message

    spec = tmp_path / "typo.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "typo-sweep",
                "output_dir": str(tmp_path / "store"),
                "notebook": str(NOTEBOOK_02),
                "executor": "slurm",
                "executor_options": {"partiton": "debug"},
                "grid": {"world_size": [1, 2]},
            }
        )
    )
    assert main(["sweep", str(spec), "--no-progress"]) == 2
    printed = capsys.readouterr().err
    assert "executor_options.partiton" in printed and all(o in printed for o in documented)
    assert not calls.exists(), f"sbatch was run: {calls.read_text()}"
    assert not list((tmp_path / "store").rglob("config.json")), "a run folder was written"

    # Positive control: spelled right, the same launch reaches sbatch (which refuses it here).
    with pytest.raises(Exception):  # noqa: B017 (submitit's error for a failed sbatch)
        launch(config, executor="slurm", partition="debug", poll_s=1.0)
    assert calls.exists() and "submission" in calls.read_text()


# ----------------------------------------------------------------------------- 2 + 3: preemption


@pytest.fixture(scope="module")
def preempted(slurm_cluster, store):
    """A 2-node x 1-task run preempted by the signal Slurm sends (USR2 to every rank, as
    ``scancel --signal`` delivers it); what was seen on the way: statuses, ports, job id."""
    config = base_config(
        store,
        nodes=2,
        tasks_per_node=1,
        run_name="slurm-preempt",
        model_options={"sleep_s": 0.2},
        epochs=6,  # 48 steps of at least 0.2 s: the signal comes long before the end
        stop_check_every_steps=1,
        checkpoint_every_steps=0,
        **SLEEPY,
    )
    handle = _slurm(config)
    seen = [handle.status()]

    def status() -> str:
        now = handle.status()
        if now != seen[-1]:
            seen.append(now)
        return now

    def running(attempt: int) -> dict[int, dict] | None:
        status()
        return _ranks_running(handle, attempt)

    first = wait_for(lambda: running(0), 180, "both ranks of attempt 0 running")
    ports = {0: wait_for(lambda: _rendezvous(first), 60, "rank 1 connected to rank 0")}
    wait_for(lambda: status() and len(handle.traces()) >= 2, 60, "a traced step")
    # The job id as Slurm itself lists it under the run's job name.
    job_ids = subprocess.run(
        ["squeue", "-h", "-n", "slurm-preempt", "-o", "%i"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    assert len(job_ids) == 1, job_ids
    subprocess.run(["scancel", "--signal=USR2", job_ids[0]], check=True, timeout=30)
    wait_for(lambda: status() == "preempted", 120, "the store to say preempted")
    second = wait_for(lambda: running(1), 240, "both ranks of attempt 1 running")
    ports[1] = wait_for(lambda: _rendezvous(second), 60, "rank 1 connected to rank 0 again")
    assert handle.wait(timeout_s=300) == "completed"
    seen.append(handle.status())
    return handle, job_ids[0], ports, seen


@pytest.mark.slow
def test_each_attempts_rendezvous_port_is_rank_0s_published_pick(preempted) -> None:
    """docs/slurm.md's rule: rank 0 picks a port free on its node, outside the kernel's ephemeral
    range (read here from /proc), and publishes it in the run folder, one file per attempt of
    the job id squeue listed; in each attempt rank 0 listened on its own attempt's port and rank 1
    connected to it (so no rank joined a stale store)."""
    handle, job_id, ports, _ = preempted
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    published = {}
    for attempt in (0, 1):
        files = list((handle.path / "rendezvous").glob(f"{job_id}.attempt{attempt}.*.port"))
        assert len(files) == 1, sorted(p.name for p in (handle.path / "rendezvous").iterdir())
        published[attempt] = int(files[0].read_text())
        assert not low <= published[attempt] <= high, "a port any outgoing connection may take"
        listening, remote = ports[attempt]
        assert published[attempt] in listening & remote, (published, ports[attempt])


@pytest.mark.slow
def test_preempted_then_running_again_then_completed(preempted) -> None:
    handle, _, _, seen = preempted
    assert "preempted" in seen, seen
    after = seen[seen.index("preempted") :]
    assert "running" in after and after[-1] == "completed", seen
    steps = handle.traces()
    assert sorted(steps["attempt"].unique()) == [0, 1]
    for rank in (0, 1):
        mine = steps[steps["rank"] == rank]
        assert sorted(mine["step"]) == list(range(1, 49)), "every step exactly once"
    stops = {r: steps[(steps["rank"] == r) & (steps["attempt"] == 0)]["step"].max() for r in (0, 1)}
    assert stops[0] == stops[1] < 48, f"both ranks stopped at the same step: {stops}"


# ----------------------------------------------------------------------------- 4: cancel


@pytest.mark.slow
def test_cancel_through_a_handle_reattached_in_another_process(slurm_cluster, store) -> None:
    """As after a kernel restart: a new Python process re-attaches to the run from the store
    (it holds no submitit job) and cancels it; Slurm then says CANCELLED and no process of the
    job is left."""
    handle = _slurm(
        base_config(
            store,
            world_size=2,
            run_name="slurm-reattach-cancel",
            model_options={"sleep_s": 0.2},
            epochs=20,  # 160 steps of 0.2 s: it cannot end before the cancel
            **SLEEPY,
        )
    )
    states = wait_for(lambda: _ranks_running(handle, 0), 180, "both ranks running")
    assert job_processes(handle.path), "positive control: the running job's processes are found"
    assert _scontrol(str(handle.job_id))["JobState"] == "RUNNING"
    code = "import sys; from workbench import attach; attach(sys.argv[1]).cancel()"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(handle.path)], capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # cancel() returned only once the job was gone: no waiting here.
    assert _scontrol(str(handle.job_id))["JobState"] == "CANCELLED"
    assert job_processes(handle.path) == []
    assert not any(alive(int(s["pid"])) for s in states.values())
    assert handle.status() == "cancelled"
    assert read_json(handle.path / "run.json")["status"] == "cancelled"


# ----------------------------------------------------------------------------- 5: sweep


@pytest.mark.slow
def test_sweep_spec_with_the_slurm_executor_runs_on_the_cluster(
    slurm_cluster, tmp_path: Path
) -> None:
    """A spec file as users write it, run by ``workbench sweep``: each point a Slurm job, then
    the summary and the report. Same global batch at 1 and 2 ranks: the same final loss."""
    spec = {
        "name": "slurm-sweep",
        "output_dir": str(tmp_path / "store"),
        "notebook": str(NOTEBOOK_02),
        "executor": "slurm",
        "executor_options": {"poll_s": 2},
        "fixed": {
            "model": "mlp",
            "train_samples": 512,
            "eval_samples": 128,
            "global_batch_size": 64,
            "max_steps": 6,
            "warmup_steps": 2,
            "eval_batch_size": 64,
            "timeout_min": 5,
            "trace_flush_s": 0.2,
            "device": "cpu",
        },
        "grid": {"world_size": [1, 2]},
    }
    path = tmp_path / "slurm.yaml"
    before = all_job_ids()
    path.write_text(yaml.safe_dump({**spec, "executor_options": {"partiton": "debug"}}))
    assert main(["sweep", str(path), "--no-progress"]) == 2
    assert all_job_ids() == before, "a misspelled option submitted a job"

    path.write_text(yaml.safe_dump(spec))
    assert main(["sweep", str(path), "--no-progress"]) == 0
    sweep_dir = tmp_path / "store" / "slurm-sweep"
    points = sorted(p for p in sweep_dir.iterdir() if (p / "run.json").exists())
    assert len(points) == 2
    for point in points:
        run = read_json(point / "run.json")
        assert (run["executor"], run["status"]) == ("slurm", "completed")
        assert run["job_id"] not in before
        _slurm_completed(run["job_id"])
        assert (point / "notebook.ipynb").is_file()
    summary = pd.read_csv(sweep_dir / "summary.csv").sort_values("world_size")
    assert list(summary["world_size"]) == [1, 2] and set(summary["scaling"]) == {"strong"}
    assert summary["speedup"].iloc[0] == 1.0
    np.testing.assert_allclose(summary["final_loss"].iloc[1], summary["final_loss"].iloc[0], 1e-5)
    report = (sweep_dir / "report.html").read_text()
    assert all(p.name in report for p in points)


# ----------------------------------------------------------------------------- 6 + 7: arrays


@pytest.fixture(scope="module")
def arrays(slurm_cluster, tmp_path_factory: pytest.TempPathFactory):
    """One ``launch_array`` call: three 1-node x 2-task points (one array, at most 2 at once),
    a 2-node x 1-task and a 2-node x 2-task point (an array each). ``squeue`` is sampled while
    they run."""
    store = tmp_path_factory.mktemp("arrays")

    def point(name: str, **changes):
        fields = dict(run_name=name, sweep="layouts", epochs=1, learning_rate=0.01, **SLEEPY)
        fields.update(changes)
        return base_config(store, **fields)

    configs = [
        point("p0", world_size=2, model_options={"sleep_s": 0.5}),
        point("p1", world_size=2, model_options={"sleep_s": 0.5}, learning_rate=0.02),
        point("p2", world_size=2, model_options={"sleep_s": 0.5}, learning_rate=0.05),
        point("n2x1", nodes=2, tasks_per_node=1),
        point("n2x2", nodes=2, tasks_per_node=2),
    ]
    handles = launch_array(
        configs,
        partition=os.environ.get("WORKBENCH_SLURM_PARTITION", "debug"),
        array_parallelism=2,
        poll_s=2.0,
    )
    array_id = handles[0].job_id.split("_")[0]
    jobs = ",".join(sorted({h.job_id.split("_")[0] for h in handles}))
    samples: list[list[tuple[str, ...]]] = []

    def sample() -> bool:
        """Record the 1 x 2 array's tasks (id, state, reason); True once Slurm holds none of
        the arrays' jobs any more."""
        out = subprocess.run(
            ["squeue", "-h", "-r", "-j", jobs, "-t", "PD,R,CG,CF", "-o", "%i %T %r"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode != 0:  # the controller is busy: ask again
            return False
        lines = [tuple(line.split(None, 2)) for line in out.stdout.splitlines()]
        samples.append([t for t in lines if t[0].startswith(f"{array_id}_")])
        return not lines

    wait_for(sample, 400, "Slurm to end every array task", poll_s=0.5)
    return handles, array_id, samples, store


@pytest.mark.slow
def test_job_array_concurrency_limit_seen_in_squeue(arrays) -> None:
    """Never more than 2 of the 3 tasks RUNNING at once; 2 at once seen, while the third waited
    on the limit (Slurm's reason JobArrayTaskLimit, though the nodes had CPUs for it)."""
    handles, array_id, samples, store = arrays
    running = [sum(s[1] == "RUNNING" for s in sample) for sample in samples]
    assert max(running) == 2, running
    held = [
        sample
        for sample in samples
        if sum(s[1] == "RUNNING" for s in sample) == 2
        and any(s[1] == "PENDING" and "JobArrayTaskLimit" in s[2] for s in sample)
    ]
    assert held, samples
    script = next((store / "layouts" / ".slurm-arrays").glob(f"{array_id}*submission.sh"))
    assert "#SBATCH --array=0-2%2" in script.read_text()
    assert [h.wait(timeout_s=60) for h in handles] == ["completed"] * 5
    assert [h.job_id for h in handles[:3]] == [f"{array_id}_{i}" for i in range(3)]
    losses = [h.traces()["loss"].iloc[-1] for h in handles[:3]]
    assert len(set(losses)) == 3, "each array task ran its own config"
    assert handles[0].logs(0) != ""


@pytest.mark.slow
def test_job_arrays_of_several_layouts_run_each_layout(arrays) -> None:
    """Each layout got the nodes and tasks it asked for (Slurm's own record), its ranks and
    local ranks; and, with the same global batch, the loss trajectory of the 1 x 2 point
    (identical parameters at the same world size, within 1e-5 at 4 ranks)."""
    handles, array_id, _, _ = arrays
    p0, _, _, n2x1, n2x2 = handles
    assert len({h.job_id.split("_")[0] for h in handles}) == 3, "one array per layout"
    for handle, (nodes, tasks) in ((p0, (1, 2)), (n2x1, (2, 1)), (n2x2, (2, 2))):
        job = _slurm_completed(str(handle.job_id))
        assert (job["NumNodes"], job["NumTasks"]) == (str(nodes), str(nodes * tasks)), job
        steps = handle.traces()
        assert sorted(steps["rank"].unique()) == list(range(nodes * tasks))
        assert sorted(steps["local_rank"].unique()) == list(range(tasks))
        assert (steps["world_size"] == nodes * tasks).all()
        assert len(steps) == 8 * nodes * tasks and (steps["samples"] == 64 // (nodes * tasks)).all()
    assert [s["param_sha256"] for s in n2x1.result()] == [s["param_sha256"] for s in p0.result()]
    np.testing.assert_allclose(
        n2x2.traces().groupby("step")["loss"].mean().to_numpy(),
        p0.traces().groupby("step")["loss"].mean().to_numpy(),
        rtol=1e-5,
    )
