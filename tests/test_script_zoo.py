"""The zoo of real user scripts (``tests/scripts/zoo/``), each run unmodified with
``workbench run --script`` as a user types it, at 1 and 2 ranks: every step's samples counted
whatever wraps the model (DDP only when distributed, no DataLoader, an IterableDataset, two
models, a compiled model, evaluation inside the loop, accumulation with ``no_sync``, processes
started by ``torch.multiprocessing.spawn``, a Lightning Trainer, modules the tracing must leave
alone: a weak proxy, odd attributes, TorchScript), the throughput known, each phase there or said
absent, no run called incomplete; and tracing adds no graph break to a compiled DDP model.

One module fixture runs every script once per world size (few, small steps); the tests read
its runs. Expected figures are worked out by hand from each script's arguments."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from workbench.store.files import read_json
from workbench.store.load import load_traces

from .helpers import WARM

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
ZOO = Path("tests/scripts/zoo")  # relative: the runs start from the repository root
STEPS, BATCH = 12, 8  # optimizer steps (a GAN's iterations) and batch per rank
COMMON = ["--steps", str(STEPS), "--warmup", "1", "--batch-size", str(BATCH), "--width", "32"]
RUN_TIMEOUT_S = 300


@dataclass(frozen=True)
class Shape:
    """A zoo script, what it is given beyond ``COMMON`` at a world size, and what a step of it
    consumes, worked out by hand from those arguments."""

    extra: tuple[str, ...] = ()
    #: samples per rank in each counted step; steps per iteration (a GAN's two optimizers)
    per_step: int = BATCH
    steps_per_iteration: int = 1
    #: the phases every step has (the others may be absent, and are said to be)
    phases: tuple[str, ...] = ("data_s", "forward_s", "backward_s", "optimizer_s")
    spawn: bool = False
    env: dict[str, str] = field(default_factory=dict)


TRAINING = ("forward_s", "backward_s", "optimizer_s")
SHAPES = {
    "ddp_when_distributed": Shape(),
    "no_dataloader": Shape(phases=TRAINING),
    "iterable_dataset": Shape(),
    "two_models": Shape(
        extra=("--hidden", "32", "--latent", "8"), steps_per_iteration=2, phases=TRAINING
    ),
    "compiled_bf16": Shape(
        extra=("--blocks", "1", "--backend", "aot_eager", "--graph-breaks"),
        env={"TORCH_LOGS": "graph_breaks"},
    ),
    "eval_every_n": Shape(extra=("--eval-every", "2", "--eval-batches", "1")),
    "grad_accum_no_sync": Shape(extra=("--accum", "2"), per_step=2 * BATCH),
    "mp_spawn": Shape(spawn=True),
    # Trainer(devices=ranks per node, strategy="ddp"): the optimizer's closure holds the step
    "lightning_ddp": Shape(),
    # a weak proxy to the model, a module with odd attributes, a TorchScript submodule
    "odd_modules": Shape(phases=TRAINING),
    # not the zoo's: plain FSDP2 (``fully_shard``), no DataLoader, no DDP
    "../fsdp_no_dataloader": Shape(phases=TRAINING),
}


def _args(name: str, shape: Shape, world_size: int) -> list[str]:
    args = [*COMMON, *shape.extra]
    if shape.spawn:  # its own process count, and the tutorial's fixed port, on purpose
        args += ["--world-size", str(world_size), "--port", "12355"]
    return args


def _sweep(name: str) -> str:
    return Path(name).name


def _present() -> list[str]:
    """Every shape: a missing script fails the run of the zoo (never a test left out)."""
    missing = [name for name in SHAPES if not (ROOT / ZOO / f"{name}.py").is_file()]
    assert not missing, f"zoo scripts missing from {ZOO}: {missing}"
    return list(SHAPES)


@dataclass
class ZooRun:
    name: str
    world_size: int
    path: Path
    stdout: str


def _run(name: str, world_size: int, out: Path) -> ZooRun:
    shape = SHAPES[name]
    command = [str(Path(sys.executable).parent / "workbench"), "run"]
    if not shape.spawn:  # forks of a warm template: no imports per rank (6 CPU s a 2-rank run)
        command += ["--executor", WARM]
    command += ["--script", str(ZOO / f"{name}.py"), "--world-size", str(world_size)]
    # no network benchmark after the last step: nothing here reads it (test_script_runs does)
    command += ["--output-dir", str(out), "--sweep", _sweep(name), "--no-progress"]
    command += ["--no-network-benchmark", "--"]
    command += _args(name, shape, world_size)
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, **shape.env},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode == 0, f"{name} at {world_size}: {done.stdout}\n{done.stderr}"
    found = re.search(r"results in (\S+)", done.stdout)
    assert found, done.stdout
    return ZooRun(name, world_size, Path(found.group(1)), done.stdout)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], ZooRun]:
    """Every zoo script there is, run once at 1 and once at 2 ranks: two runs at a time, the
    1-rank run of one script beside the 2-rank run of another (each run waits part of its
    time: four runs took 42-74 s so against 75-83 s one after the other on a loaded 2-core
    host)."""
    out = tmp_path_factory.mktemp("zoo")
    names = _present()
    order = [(n, 1) for n in names]
    twos = [(n, 2) for n in names]
    order = [run for pair in zip(order, twos[1:] + twos[:1], strict=True) for run in pair]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda case: _run(*case, out), order))
    return {(run.name, run.world_size): run for run in done}


def _cases() -> list[tuple[str, int]]:
    return [(n, w) for n in SHAPES for w in (1, 2)]


@pytest.mark.parametrize(("name", "world_size"), _cases())
def test_every_step_counts_its_samples_from_what_it_consumed(zoo, name, world_size) -> None:
    shape, run = SHAPES[name], zoo[(name, world_size)]
    steps = load_traces(run.path, "steps")
    assert sorted(steps["rank"].unique()) == list(range(world_size))
    for rank, rows in steps.groupby("rank"):
        assert len(rows) == STEPS * shape.steps_per_iteration, (rank, rows)
        # one counted step an iteration (a GAN's generator step consumes no new batch)
        counted = rows["samples"].dropna()
        assert len(counted) == STEPS, rows[["step", "samples"]]
        assert set(counted) == {shape.per_step}, rows[["step", "samples"]]
    record = read_json(run.path / "run.json")
    assert record["status"] == "completed"
    assert not record["measurement_warnings"], record["measurement_warnings"]


@pytest.mark.parametrize(("name", "world_size"), _cases())
def test_the_throughput_is_known_and_is_the_measured_steps_samples(zoo, name, world_size) -> None:
    shape, run = SHAPES[name], zoo[(name, world_size)]
    summary = read_json(run.path / "run.json")["summary"]
    rate, wall = summary["samples_per_s"], summary["measured_wall_s"]
    assert rate is not None and math.isfinite(rate) and rate > 0, summary
    measured = summary["measured_steps"]
    # every rank's samples over the window, a step of each rank at a time (a GAN: one counted
    # step an iteration, so half its measured steps, rounded either way)
    per_rank = [
        shape.per_step * k
        for k in {
            math.floor(measured / shape.steps_per_iteration),
            math.ceil(measured / shape.steps_per_iteration),
        }
    ]
    assert any(math.isclose(rate * wall, n * world_size, rel_tol=1e-6) for n in per_rank), (
        rate * wall,
        per_rank,
        summary,
    )
    assert "incomplete" not in run.stdout
    assert " 0 samples/s" not in run.stdout


@pytest.mark.parametrize(("name", "world_size"), _cases())
def test_each_phase_is_measured_or_said_absent(zoo, name, world_size) -> None:
    shape, run = SHAPES[name], zoo[(name, world_size)]
    steps = load_traces(run.path, "steps")
    for phase in shape.phases:
        assert steps[phase].notna().all(), (phase, steps[["rank", "step", phase]])
    for phase in {"data_s", *TRAINING} - set(shape.phases):
        assert steps[phase].isna().all(), (phase, steps[["rank", "step", phase]])
        assert f"{phase.removesuffix('_s')} n/a" in run.stdout, run.stdout  # said, never 0


def test_no_finding_calls_a_completed_run_incomplete(zoo) -> None:
    from workbench.analysis.advice.finding import findings
    from workbench.analysis.run_digests import open_steps
    from workbench.store.load import iter_run_dirs, load_runs

    out = next(iter(zoo.values())).path.parents[1]
    for name in _present():
        runs = load_runs(out, [_sweep(name)])
        dirs = list(iter_run_dirs(out, [_sweep(name)]))
        evals = load_traces(dirs, "eval")
        with open_steps(dirs, evals) as steps:
            said = " ".join(findings(runs, steps, evals=evals))
        assert "incomplete" not in said, (name, said)
        if not SHAPES[name].spawn:  # its own count among its arguments: two curves
            assert "2 ranks:" in said and "the throughput of 1 rank" in said, (name, said)


@pytest.mark.parametrize("name", list(SHAPES))
def test_every_capability_works_for_every_shape(zoo, name, tmp_path: Path, capsys) -> None:
    """The matrix of shapes x capabilities, each through the command a user types (in this
    process): the report with its finding, ``predict`` at 4 ranks on a given network (the
    zoo's runs measure none; FSDP's terms and memory per rank for an FSDP2 script), ``tune``'s
    plan from the 2-rank run, and the Dashboard's first screen with its finding."""
    from workbench.cli import main
    from workbench.ui.dashboard import Dashboard

    two = zoo[(name, 2)]
    out, sweep = str(two.path.parents[1]), _sweep(name)
    report = tmp_path / "report.html"
    assert main(["report", sweep, "--output-dir", out, "-o", str(report)]) == 0
    page = report.read_text()
    assert "Finding" in page and "the throughput of 1 rank" in page or SHAPES[name].spawn
    capsys.readouterr()
    predict = ["predict", sweep, "--output-dir", out, "--world-sizes", "4", "--busbw", "1GB/s"]
    assert main([*predict, "--json"]) == 0
    rows = [r for r in json.loads(capsys.readouterr().out) if r["world_size"] == 4]
    # mp.spawn's own count is among its arguments: its 1-rank curve has no multi-rank run
    known = [r for r in rows if r["samples_per_s"] and r["samples_per_s"] > 0]
    assert known and (len(known) == len(rows) or SHAPES[name].spawn), rows
    if name.endswith("fsdp_no_dataloader"):
        assert {r["strategy"] for r in rows} == {"fsdp"} and rows[0]["total_bytes"] > 0, rows
    assert main(["tune", str(two.path), "--top", "0", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["base"]["world_size"] == 2 and "candidates" in plan, sorted(plan)
    board = Dashboard(out, sweeps=[sweep])
    assert board.children[0] is board.finding and "ranks" in board.finding.value


def _graph_breaks(text: str) -> int:
    found = re.findall(r"^graph_breaks=(\d+)$", text, flags=re.M)
    assert found, text[-2000:]
    return int(found[-1])


def test_tracing_adds_no_graph_break_to_a_compiled_ddp_model(zoo, tmp_path: Path) -> None:
    """The compiled script's own count of dynamo's graph breaks, traced at 1 rank, against the
    same script bare in the same set-up (one process, its own gloo group at world size 1)."""
    shape, traced = SHAPES["compiled_bf16"], zoo[("compiled_bf16", 1)]
    rank0 = "".join(p.read_text() for p in sorted((traced.path / "logs").glob("*_0_log.*")))
    env = {
        **os.environ,
        **shape.env,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "OMP_NUM_THREADS": "1",
    }
    bare = subprocess.run(
        [sys.executable, str(ZOO / "compiled_bf16.py"), *_args("compiled_bf16", shape, 1)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert bare.returncode == 0, bare.stderr[-3000:]
    assert _graph_breaks(rank0) == _graph_breaks(bare.stdout), (rank0[-3000:], bare.stdout)
    # TORCH_LOGS=graph_breaks names where each break is: none in the workbench's hooks
    at = re.findall(r"Graph break.*?user code at (\S+)", rank0, flags=re.S)
    assert not [where for where in at if "workbench" in where], at


def _free_port() -> int:
    from workbench.ports import free_port

    return free_port()
