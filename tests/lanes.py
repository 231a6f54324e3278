"""``make test``: the suite in four lanes, in two phases, with the in-process lane beside both.

Measured per test (``make test-profile``, tests/README.md), the suite's time is of four kinds:

- **in-process**: tests that start no process (not ``slow``): one core, the pytest process's own;
- **waiting**: ``slow`` tests that mostly wait (on Slurm's scheduler, a collective timeout, a
  kernel restart, a planted hang) or keep about one core busy. Every test on the local Slurm
  cluster is here, so that the cluster starts once. Marked ``waits`` or ``slurm``, or using
  ``slurm_cluster``;
- **busy**: the other ``slow`` tests, which keep both cores busy (the example sweeps, the
  benchmark smokes) and claim no duration;
- **timing**: every ``timing`` test, whose claim is a duration measured on this host.

Phase one runs the waiting and busy lanes side by side; phase two the timing lane, with no other
lane at normal priority. The in-process lane runs from the start to its end at a low priority
(a CPU cgroup of its own weighted as niceness 10, made idle beside the timing lane: it then runs
only on CPU nobody else wants; where no cgroup can be made, niceness 10 then 19), on the cores
the others leave idle (the timing tests keep about one of the two busy).
Each lane is its own pytest process with its own temporary folder. ``pytest`` run directly still
runs everything in one process.

Usage: ``python -m tests.lanes [pytest arguments]`` (``make test PYTEST_ARGS=...``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Lane name -> the marker ``pytest_collection_modifyitems`` gives each test of it.
LANES = {
    "in-process": "lane_in_process",
    "waiting": "lane_waiting",
    "busy": "lane_busy",
    "timing": "lane_timing",
}
ROOT = Path(__file__).resolve().parent.parent
NO_TESTS = 5  # pytest's exit code when a lane selects nothing


def lane_of(item: pytest.Item) -> str:
    """The lane a collected test runs in (see the module's docstring)."""
    if "timing" in item.keywords:
        return "timing"
    if "slurm_cluster" in getattr(item, "fixturenames", ()):
        return "waiting"
    if "slow" not in item.keywords:
        return "in-process"
    if {"waits", "slurm"} & set(item.keywords):
        return "waiting"
    return "busy"


def mark_lanes(items: list[pytest.Item]) -> None:
    """Give each test its lane's marker, which ``-m`` selects a lane by."""
    for item in items:
        item.add_marker(LANES[lane_of(item)])


@dataclass
class Lane:
    name: str
    log: Path
    process: subprocess.Popen[bytes]
    started: float


def _command(name: str, basetemp: Path, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-m", LANES[name], f"--basetemp={basetemp}", *args]


#: Niceness of each lane. The in-process lane yields the CPU to every other: its tests have no
#: deadline and fill the cores the others leave idle. Where the kernel groups processes by
#: session (autogroup), niceness only counts inside a group, and the Slurm daemons' jobs are a
#: group of their own: the lane gets a session of its own and the niceness goes on its group.
NICE = {"in-process": 10, "waiting": 0, "busy": 0, "timing": 0}
#: The in-process lane's niceness beside the timing lane where no CPU cgroup can be made.
NICE_BESIDE_TIMING = 19
#: The lanes of each phase; the in-process lane runs through both.
PHASES = (("waiting", "busy"), ("timing",))
#: Where a CPU cgroup for the in-process lane is made (cgroup v1's cpu controller, then v2), the
#: file of its weight and the weight of niceness 10 there (110 of 1024; 11 of 100).
CGROUP_ROOTS = (
    (Path("/sys/fs/cgroup/cpu"), "cpu.shares", "112"),
    (Path("/sys/fs/cgroup"), "cpu.weight", "11"),
)


def cpu_cgroup() -> Path | None:
    """A CPU cgroup of this run's own for the in-process lane, weighted as niceness 10, that
    can be made idle (``cpu.idle``: what any other task wants preempts it at once); ``None``
    where none can be made (not root, no cpu controller): niceness then."""
    for root, weight_file, weight in CGROUP_ROOTS:
        group = root / f"workbench-lanes-{os.getpid()}"
        try:
            if not (root / "cgroup.procs").exists():
                continue
            if (
                weight_file == "cpu.weight"
                and "cpu" not in (root / "cgroup.subtree_control").read_text().split()
            ):
                (root / "cgroup.subtree_control").write_text("+cpu")
            group.mkdir()
            if not (group / "cpu.idle").exists():
                group.rmdir()
                continue
            (group / weight_file).write_text(weight)
            return group
        except OSError:
            if group.exists():
                group.rmdir()
    return None


def _yield_cpu(nice: int, group: Path | None) -> None:
    """In the lane's process before it starts: lower its priority against every other group,
    and join ``group`` if given."""
    if not nice:
        return
    os.setsid()
    if group is not None:
        try:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:  # the group went away: niceness alone still yields
            pass
    try:
        Path("/proc/self/autogroup").write_text(str(nice))
    except OSError:  # no autogroup: niceness counts against every process
        pass
    os.nice(nice)


def _make_idle(lane: Lane, group: Path | None) -> None:
    """Beside the timing lane: the in-process lane runs only on the CPU nobody else wants. A
    planted 30 ms sleep in forward was measured 31.1 ms alone, 31.6 ms beside a busy loop at
    niceness 19 and 31.3 ms beside one in an idle cgroup (the medians of 3 runs of 12 steps)."""
    if group is not None:
        (group / "cpu.idle").write_text("1")
        return
    try:
        Path(f"/proc/{lane.process.pid}/autogroup").write_text(str(NICE_BESIDE_TIMING))
    except OSError:
        pass
    try:  # its own session: pgid == pid
        os.setpriority(os.PRIO_PGRP, lane.process.pid, NICE_BESIDE_TIMING)
    except OSError:
        pass


def _start(name: str, work: Path, args: list[str], group: Path | None = None) -> Lane:
    log = work / f"{name}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            _command(name, work / name, args),
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: _yield_cpu(NICE[name], group),
        )
    print(f"lane {name} started (log: {log})", flush=True)
    return Lane(name, log, process, time.monotonic())


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)  # 479.6 s is 8 min 0 s, not 7 min 60 s
    return f"{minutes} min {rest} s"


def _run_lanes(work: Path, args: list[str]) -> list[tuple[str, int, float]]:
    """Every lane, phase after phase, the in-process lane beside them all; each lane's log is
    printed whole as it ends."""
    began = time.monotonic()
    group = cpu_cgroup()
    how = f"the CPU cgroup {group}" if group else "niceness (no CPU cgroup could be made)"
    print(f"the in-process lane yields the CPU through {how}", flush=True)
    running = [_start("in-process", work, args, group)]
    phases = [list(phase) for phase in PHASES]
    started = list(running)
    done: list[tuple[str, int, float]] = []
    beat = time.monotonic()
    try:
        while running or phases:
            phase_lanes = [lane for lane in running if lane.name != "in-process"]
            if not phase_lanes and phases:
                if "timing" in phases[0]:
                    for lane in running:
                        _make_idle(lane, group)
                for name in phases.pop(0):
                    lane = _start(name, work, args)
                    running.append(lane)
                    started.append(lane)
                continue
            time.sleep(1)
            for lane in [lane for lane in running if lane.process.poll() is not None]:
                running.remove(lane)
                took = time.monotonic() - lane.started
                print(f"\n===== lane {lane.name}: ended in {_minutes(took)} =====", flush=True)
                sys.stdout.write(lane.log.read_text(errors="replace"))
                done.append((lane.name, lane.process.returncode, took))
            if running and time.monotonic() - beat > 120:
                beat = time.monotonic()
                left = ", ".join(lane.name for lane in running)
                print(f"  ... still running after {_minutes(beat - began)}: {left}", flush=True)
    finally:
        for lane in started:
            if lane.process.poll() is None:  # interrupted: stop the lane, keep what it printed
                lane.process.terminate()
                lane.process.wait(timeout=60)
                print(f"\n===== lane {lane.name}: stopped =====")
                sys.stdout.write(lane.log.read_text(errors="replace"))
        if group is not None:
            try:
                group.rmdir()
            except OSError:  # a process of a stopped lane still in it: the kernel keeps it
                pass
    return done


def _counts(log: Path) -> dict[str, int]:
    """Outcome counts of pytest's last summary line in a lane's log ("3 passed, 1 skipped")."""
    summaries = [ln for ln in log.read_text(errors="replace").splitlines() if " in " in ln]
    last = summaries[-1] if summaries else ""
    found = re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", last)
    return {word: int(n) for n, word in found}


def main(args: list[str]) -> int:
    # Stopped from outside (a CI's time limit): the lanes are stopped too, their logs printed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    work = Path(tempfile.mkdtemp(prefix="wbt-"))
    began = time.monotonic()
    results = _run_lanes(work, args)
    print("\n===== lanes =====")
    total: dict[str, int] = {}
    for name, code, took in results:
        said = "passed" if code in (0, NO_TESTS) else f"FAILED (pytest exit code {code})"
        counts = _counts(work / f"{name}.log")
        for word, n in counts.items():
            total[word] = total.get(word, 0) + n
        tests = ", ".join(f"{n} {word}" for word, n in counts.items())
        print(f"{name:>10}: {said}, {_minutes(took)} ({tests or 'no tests'})")
    tests = ", ".join(f"{n} {word}" for word, n in total.items())
    print(f"{'all':>10}: {tests} in {_minutes(time.monotonic() - began)} of tests")
    failed = [code for _, code, _ in results if code not in (0, NO_TESTS)]
    if failed:
        print(f"the lanes' temporary folders are kept in {work}")
        return failed[0]
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(sys.argv[1:]))
