"""Planted faults, explained: twelve runs, each with one fault planted on one rank at a known
step and phase (built-in models and a plain DDP script, 2 and 4 ranks), two ranks killed or
aborted late (their trace rows kept), and twenty clean runs, which must name no culprit.

Known answers by construction: the culprit is the rank the fault was planted on, at the
planted step and phase; a rank stuck before its gradients are all-reduced leaves its peers in
that step's gradient all-reduce. The sequence numbers are checked against each other: a rank
stuck in the data loading and one stuck in the forward of the same step leave their peers in
the same collective; one stuck in the optimizer step leaves them in the next step's, one
collective later (the mlp's gradients fit one DDP bucket, the script's too, and the script
also gathers its loss each step: two a step). Runs go in waves on warm pool workers, each
wave's waits side by side, so the suite waits about one collective timeout a wave.
"""

from __future__ import annotations

import html
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from workbench.cli import main
from workbench.config.run_config import RunConfig
from workbench.run import handle as run_handle
from workbench.run.hang_words import explain_hang
from workbench.run.launch import launch
from workbench.store.files import read_rank_states
from workbench.store.flight_file import flight_path, read_flight

from .helpers import ROOT, WARM

pytestmark = [pytest.mark.slow, pytest.mark.waits]

TIMEOUT_S = 8  # the collective timeout: a hang is named within it + 30 s
SCRIPT = str(ROOT / "tests" / "scripts" / "hangs.py")
LATE = 21  # the step a rank is killed at, after 20 steps of 0.5 s each
SLOW_STEP_S = 0.5

#: name -> (world size, planted rank, step, fault): a built-in run's FaultInjection fields,
#: or the script's ``--fault``
FAULTS: dict[str, tuple[int, int, int, Any]] = {
    "b-data-2": (2, 1, 10, {"kind": "hang", "phase": "data"}),
    "b-forward-4": (4, 2, 10, {"kind": "hang", "phase": "forward"}),
    "b-optimizer-2": (2, 1, 10, {"kind": "hang", "phase": "optimizer"}),
    "b-exit-4": (4, 3, 10, {"kind": "exit", "phase": "forward"}),
    "b-kill-2": (2, 0, 10, {"kind": "kill", "phase": "backward"}),
    "b-kill-late-2": (2, 1, LATE, {"kind": "kill", "phase": "start"}),
    "s-data-2": (2, 1, 8, "data"),
    "s-forward-4": (4, 2, 8, "forward"),
    "s-optimizer-2": (2, 0, 8, "optimizer"),
    "s-lone-2": (2, 1, 8, "lone"),
    "s-different-4": (4, 3, 8, "different"),
    "s-exit-2": (2, 1, 8, "exit"),
    "s-exit-4": (4, 2, 8, "exit"),
    "s-abort-late-2": (2, 1, LATE, "abort"),
}
#: Twenty clean runs, built-in and script, 2 ranks and (one in ten) 4: no culprit may be named.
CLEAN = [f"clean-{'bs'[k % 2]}-{4 if k % 10 == 9 else 2}-{k}" for k in range(20)]
FAULTS.update({n: (int(n.split("-")[2]), 0, 0, None if "-b-" in n else "none") for n in CLEAN})
WAVES = [
    ["b-kill-late-2", "s-abort-late-2", "b-data-2"],
    ["b-forward-4", "s-lone-2", "s-exit-2"],
    ["b-optimizer-2", "s-data-2", "s-different-4"],
    ["b-exit-4", "s-forward-4", "b-kill-2"],
    ["s-optimizer-2", "s-exit-4"],
]
for k, name in enumerate(CLEAN):  # beside the faults: each wave lasts a collective timeout
    WAVES[k % len(WAVES)].append(name)
#: name -> (culprit's phase, kind, op of the collective)
EXPECTED = {
    "b-data-2": ("data loading", "missing", "all_reduce"),
    "b-forward-4": ("forward", "missing", "all_reduce"),
    "b-optimizer-2": ("optimizer step", "missing", "all_reduce"),
    "b-exit-4": ("forward", "missing", "all_reduce"),
    "b-kill-2": ("backward", "missing", "all_reduce"),
    "b-kill-late-2": ("data loading", "missing", "all_reduce"),
    "s-data-2": ("data loading", "missing", "all_reduce"),
    "s-forward-4": ("forward", "missing", "all_reduce"),
    "s-optimizer-2": ("after backward", "missing", "all_gather_into_tensor"),
    "s-lone-2": ("between steps", "mismatch", "all_reduce"),
    "s-different-4": ("between steps", "mismatch", "all_reduce"),
    "s-exit-2": ("after training", "mismatch", "barrier"),
    "s-exit-4": ("after training", "mismatch", "barrier"),
    "s-abort-late-2": ("data loading", "missing", "all_reduce"),
}


def _config(store: Path, name: str) -> RunConfig:
    """The run of ``name``: its fault planted; the late ones with steps of 0.5 s and the
    default trace flush (every second)."""
    world, rank, step, fault = FAULTS[name]
    clean = name in CLEAN  # short, and no network benchmark after: the suite's CPU is shared
    common = dict(output_dir=str(store), sweep="hangs", run_name=name, world_size=world,
                  collective_timeout_s=TIMEOUT_S, network_benchmark=not clean)  # fmt: skip
    late, steps = step == LATE, 8 if clean else 24
    if name.startswith(("s-", "clean-s-")):
        args = ["--fault", fault, "--rank", str(rank), "--step", str(step), "--steps", str(steps)]
        if late:
            args += ["--step-sleep-ms", str(SLOW_STEP_S * 1000)]
        return RunConfig(script=SCRIPT, script_args=tuple(args), **common)
    planted = None if fault is None else {"rank": rank, "step": step, **fault}
    sleepy = dict(model="tests.plugins:sleepy_mlp", dataset="tests.plugins:synthetic_like_mlp",
                  model_options={"sleep_s": SLOW_STEP_S})  # fmt: skip
    return RunConfig(**(sleepy if late else {"model": "mlp"}), per_device_batch_size=16,
                     train_samples=2048, max_steps=steps, eval_samples=64, eval_at_end=False,
                     fault=planted, **common)  # fmt: skip


def _outcome(handle: Any) -> dict[str, Any]:
    try:
        status = handle.wait(timeout_s=TIMEOUT_S + 90, raise_on_failure=False)
    except TimeoutError:
        status = "still running"
    run = json.loads((handle.path / "run.json").read_text())
    return {"status": status, "failure": run.get("failure"), "ended": time.monotonic()}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    store = tmp_path_factory.mktemp("hangs")
    out: dict[str, dict[str, Any]] = {}
    with pytest.MonkeyPatch.context() as mp:
        # a hung rank never ends on its own: the grace after its peers' failure only delays
        # the kill, so 2 s of it (not 10) prove the same
        mp.setattr(run_handle, "FAILURE_GRACE_S", 2.0)
        for wave in WAVES:
            launched = {name: (launch(_config(store, name), WARM), time.monotonic())
                        for name in wave}  # fmt: skip
            with ThreadPoolExecutor(len(wave)) as pool:
                handles = [h for h, _ in launched.values()]
                ends = dict(zip(wave, pool.map(_outcome, handles), strict=True))
            for name, (handle, at) in launched.items():
                out[name] = {**ends[name], "handle": handle, "elapsed_s": ends[name]["ended"] - at}
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_culprit_its_collective_step_and_phase_are_named(outcomes: dict, name: str) -> None:
    got = outcomes[name]
    world, rank, step, _ = FAULTS[name]
    phase, kind, op = EXPECTED[name]
    assert got["status"] == "failed", (name, got["status"])
    failure = got["failure"] or {}
    hang = failure.get("hang")
    assert hang is not None, (name, failure.get("exception"))
    assert (hang["rank"], hang["step"], hang["phase"]) == (rank, step, phase), (name, hang)
    assert (hang["kind"], hang["op"]) == (kind, op), (name, hang)
    assert hang["group"] == list(range(world)) and hang["seq"] > 0, (name, hang)
    assert failure["rank"] == rank and f"collective {hang['seq']}" in failure["exception"]
    assert got["elapsed_s"] < TIMEOUT_S + 30, (name, got["elapsed_s"], "from its launch")


def test_sequence_numbers_line_up_with_the_step_they_were_issued_in(outcomes: dict) -> None:
    seq = {name: (outcomes[name]["failure"] or {}).get("hang", {}).get("seq") for name in EXPECTED}
    # the built-in mlp: one gradient all-reduce a step
    assert seq["b-data-2"] == seq["b-forward-4"] == seq["b-exit-4"] == seq["b-kill-2"], seq
    assert seq["b-optimizer-2"] == seq["b-data-2"] + 1, seq
    # the script: its gradients' all-reduce, then its loss gathered, every step
    assert seq["s-data-2"] == seq["s-forward-4"], seq
    assert seq["s-optimizer-2"] == seq["s-data-2"] + 1, "the gather after the step's all-reduce"
    assert seq["s-lone-2"] == seq["s-different-4"] == seq["s-data-2"] + 1, seq
    assert seq["s-exit-2"] == seq["s-exit-4"] == seq["s-data-2"] + 2, "the next step's all-reduce"


def test_the_stuck_ranks_stack_shows_the_scripts_frame_on_top(outcomes: dict) -> None:
    text = outcomes["s-data-2"]["failure"]["exception"]
    stack = text.split("Its stack, most recent call first: ", 1)[1]
    assert stack.startswith("hangs.py:"), text
    assert stack.split(" < ")[0].endswith(" in stuck") and " in collate < " in stack, stack


def test_clean_runs_name_no_culprit(outcomes: dict) -> None:
    for name in CLEAN:
        got = outcomes[name]
        assert got["status"] == "completed" and got["failure"] is None, (name, got)
        path, world = got["handle"].path, FAULTS[name][0]
        records = {r: read_flight(flight_path(path / "flight", r)) for r in range(world)}
        assert all(records.values()), (name, "every rank left its record")
        assert all(rec["phase"] == "after training" for rec in records.values()), name
        assert explain_hang(records, read_rank_states(path), world) is None, name


def test_the_same_words_in_the_error_the_runs_table_and_the_report(
    outcomes: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    handle = outcomes["s-data-2"]["handle"]
    failure = outcomes["s-data-2"]["failure"]
    assert failure["exception"] in str(handle.failure_error())
    store = str(handle.path.parent.parent)
    assert main(["ls", "--output-dir", store, "--sweep", "hangs"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if " s-data-2 " in line)
    assert row.rstrip().endswith(failure["hang"]["summary"]), row
    assert failure["hang"]["summary"] == (
        f"rank 1 did not arrive at collective {failure['hang']['seq']} (all_reduce): "
        "data loading, step 8"
    )
    page = tmp_path / "report.html"
    assert main(["report", "hangs", "--output-dir", store, "-o", str(page), "--no-progress"]) == 0
    assert html.escape(failure["exception"]) in page.read_text(), "the report says it whole"


def test_a_rank_killed_or_aborted_keeps_its_rows_to_its_last_second(outcomes: dict) -> None:
    """Killed (SIGKILL, built-in) or aborted (``os.abort()``, a script) at the start of step 21
    after 20 steps of 0.5 s: the trace flushed every second keeps its rows up to step 18 at
    least (one second of steps, and the step a flush holds back for its gap)."""
    for name in ("b-kill-late-2", "s-abort-late-2"):
        _, rank, step, _ = FAULTS[name]
        steps = outcomes[name]["handle"].traces()
        mine = sorted(steps.loc[steps["rank"] == rank, "step"])
        assert mine and mine == list(range(1, mine[-1] + 1)), (name, mine)
        assert mine[-1] >= step - 3, (name, "rows up to", mine[-1])
