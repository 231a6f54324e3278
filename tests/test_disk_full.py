"""A store whose disk fills mid-run: the run ends with RunFailedError saying no space is left and
on which disk, never a bare ``OSError`` from the workbench's own files; ``workbench ls`` never
lists it ``pending`` (its end is recorded with the space the launch held back, or the store
reads its ranks' records); the rows written before stay readable; no process is left.

The disk is a small tmpfs mounted for this module (needs root: skipped without, failed in CI)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import typing as tp
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.errors import RunFailedError, StoreFullError
from workbench.run.handle import attach
from workbench.store.files import RESERVE_FILE, read_json, read_rank_states, write_json
from workbench.store.load import load_runs, load_traces

from .conftest import base_config
from .helpers import WARM, job_processes, wait_for, wait_until_no_job_processes
from .requirements import require

#: The disk: above preflight's 50 MiB floor, so that the launch is let through.
SIZE = "56m"


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory: pytest.TempPathFactory) -> tp.Iterator[Path]:
    require(
        os.geteuid() == 0 and shutil.which("mount") is not None,
        "root and mount(8), to mount a small tmpfs that fills up",
    )
    mount = tmp_path_factory.mktemp("small-disk")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)  # still busy: detach it


def fill(disk: Path) -> Path:
    """Fill ``disk`` to its last byte with one file, returned (delete it to free the disk)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (2**20, 4096, 1):
            try:
                while True:
                    f.write(b"\xff" * chunk)
            except OSError as exc:
                assert exc.errno == 28, exc
    assert shutil.disk_usage(disk).free == 0
    return filler


def step_rows(run_path: Path) -> dict[tuple[int, int], float]:
    """The loss of each (rank, step) row stored so far."""
    rows = load_traces(run_path, "steps")
    keys = zip(rows["rank"], rows["step"], rows["loss"], strict=True)
    return {(int(r), int(s)): float(v) for r, s, v in keys}


class Filler(threading.Thread):
    """Fills the disk once both ranks run and have stored rows, then records the statuses the
    store gives the run (``load_runs``, what ``workbench ls`` prints) until told to stop."""

    def __init__(self, disk: Path, run_path: Path) -> None:
        super().__init__(daemon=True, name="disk-filler")
        self.disk, self.run_path = disk, run_path
        self.rows_before: dict[tuple[int, int], float] = {}
        self.statuses: list[str] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def _ranks_writing(self) -> bool:
        states = read_rank_states(self.run_path)
        running = len(states) == 2 and all(s["status"] == "running" for s in states.values())
        return running and {r for r, _ in step_rows(self.run_path)} == {0, 1}

    def run(self) -> None:
        try:
            wait_for(self._ranks_writing, 120, "both ranks running with rows stored")
            self.rows_before = step_rows(self.run_path)
            self.filler = fill(self.disk)
            while not self.stop.is_set():
                runs = load_runs(self.run_path.parent.parent)  # what `workbench ls` lists
                self.statuses.append(str(runs.set_index("run_id").status[self.run_path.name]))
                time.sleep(0.2)
        except BaseException as exc:  # noqa: BLE001 (re-raised by the test)
            self.error = exc


@pytest.mark.slow
@pytest.mark.waits
def test_a_disk_that_fills_mid_run_is_a_named_failure(small_disk: Path, capsys) -> None:
    store = small_disk / "store"
    run_path = store / "full" / "filled"
    filler = Filler(small_disk, run_path)
    filler.start()
    argv = ["run", "--executor", WARM, "--world-size", "2", "--output-dir", str(store)]
    argv += ["--sweep", "full", "--run-name", "filled", "--no-progress", "--trace-flush-s", "0.1"]
    argv += ["--model", "tests.plugins:sleepy_mlp", "--dataset", "tests.plugins:synthetic_like_mlp"]
    argv += ["--model-options", '{"sleep_s": 0.02}', "--steps", "3000", "--warmup-steps", "1"]
    argv += ["--train-samples", "131072", "--global-batch-size", "64", "--no-eval-at-end"]
    try:
        code = main(argv)
        printed = capsys.readouterr()
    finally:
        filler.stop.set()
        filler.join(30)
    if filler.error is not None:
        raise filler.error
    assert code == 1, printed
    said = printed.err
    assert "no space left on the disk mounted at " + str(small_disk) in said, said
    assert "Traceback" not in said and "[Errno 28]" not in said, said

    # The run's end is recorded, with the full disk as its failure (the reserve gave the room).
    run = read_json(run_path / "run.json")
    assert run["status"] == "failed" and run["ended_at"] is not None, run
    assert str(small_disk) in run["failure"]["exception"], run["failure"]
    assert not (run_path / RESERVE_FILE).exists()
    # `ls` never said pending once the ranks had run, and says failed now.
    assert filler.statuses and "pending" not in filler.statuses, filler.statuses
    assert main(["ls", "--output-dir", str(store)]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if "filled" in line]
    assert len(listed) == 1 and "failed" in listed[0] and "pending" not in listed[0], listed

    # Every row stored before the disk filled is still there, unchanged; nothing is left running.
    after = step_rows(run_path)
    assert filler.rows_before and all(after.get(k) == v for k, v in filler.rows_before.items())
    wait_until_no_job_processes(run_path)
    assert job_processes(run_path) == []

    # Space freed: the store takes a new run's records again.
    filler.filler.unlink()
    write_json(store / "after.json", {"ok": True})


def _dead_pid() -> int:
    """The pid of a process that has ended."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_an_end_with_no_room_at_all_is_named_listed_failed_and_recorded_once_space_returns(
    small_disk: Path,
) -> None:
    """No reserve left (another writer took the room it gave): ``wait`` still ends with the
    named error, ``ls`` reads the ranks' records (gone from this machine: failed, not pending),
    and re-attaching once space is freed records the end."""
    store = small_disk / "store2"
    config = base_config(store, world_size=2, run_name="no-room", sweep="room")
    run_path = store / "room" / "no-room"
    write_json(
        run_path / "run.json",
        {"run_id": "no-room", "sweep": "room", "status": "pending", "executor": "local",
         "config": config.to_dict(), "ended_at": None, "submitted_at": time.time()},
    )  # fmt: skip
    for rank in (0, 1):
        state = {
            "rank": rank,
            "host": socket.gethostname(),
            "pid": _dead_pid(),
            "status": "running",
        }
        write_json(run_path / "ranks" / f"rank-{rank:05d}.json", state)
    filler = fill(small_disk)
    try:
        with pytest.raises(StoreFullError):  # the store's own error, an OSError with errno 28
            write_json(run_path / "other.json", {})
        with pytest.raises(RunFailedError) as err:
            attach(run_path).wait(timeout_s=30)
        message = str(err.value)
        assert f"no space left on the disk mounted at {small_disk}" in message, message
        assert "not recorded" in message, message
        assert json.loads((run_path / "run.json").read_text())["ended_at"] is None
        runs = load_runs(store)
        assert runs.status.tolist() == ["failed"], runs
    finally:
        filler.unlink()
    assert attach(run_path).wait(raise_on_failure=False) == "failed"
    run = read_json(run_path / "run.json")
    assert run["status"] == "failed" and run["ended_at"] is not None


def test_ls_tells_a_run_whose_ranks_are_gone_from_one_that_waits(tmp_path: Path) -> None:
    """Until a run's end is recorded, the store lists it by its ranks' records: pending before
    any rank reported, running while a rank's process is alive (this one's), failed once a rank
    that said running is gone from this machine without reporting."""
    config = base_config(tmp_path, world_size=2, sweep="live").to_dict()
    ranks = {"queued": [], "alive": [os.getpid(), os.getpid()], "gone": [os.getpid(), _dead_pid()]}
    for name, pids in ranks.items():
        run_path = tmp_path / "live" / name
        write_json(
            run_path / "run.json",
            {"run_id": name, "status": "pending", "config": config, "ended_at": None},
        )
        for rank, pid in enumerate(pids):
            state = {"rank": rank, "host": socket.gethostname(), "pid": pid, "status": "running"}
            write_json(run_path / "ranks" / f"rank-{rank:05d}.json", state)
    listed = load_runs(tmp_path).set_index("run_id").status.to_dict()
    assert listed == {"queued": "pending", "alive": "running", "gone": "failed"}, listed
