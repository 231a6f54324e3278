"""Where a script's step samples come from when no DDP wraps its model, in one process (no
process group, no DataLoader): the hooks installed as a rank installs them, small loops written
here as a user writes them, and the samples each step consumed worked out by hand. Also the
spawning and rendezvous rules of a script's own calls, and the preflight's static count."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import workbench.trace
from workbench.errors import ScriptError
from workbench.rank.spawn_check import spawn_counts, spawn_problems
from workbench.store.load import load_traces
from workbench.store.trace_files import consolidate
from workbench.trace import script_group
from workbench.trace.torch_hooks import ScriptHooks
from workbench.trace.tracer import Tracer

BATCH = 4


def _traced(tmp_path: Path, loop: Any) -> tuple[Any, ScriptHooks]:
    """Run ``loop()`` under the hooks of a 1-rank script run; its step rows and the hooks."""
    traces = tmp_path / "traces"
    traces.mkdir(parents=True)
    with Tracer(
        traces,
        run_id="r",
        rank=0,
        local_rank=0,
        host="h",
        world_size=1,
        attempt=0,
        flush_s=60.0,
        device=torch.device("cpu"),
        stop_on_nonfinite=False,
    ) as tracer:
        hooks = ScriptHooks(
            tracer,
            script="train.py",
            rank=0,
            world_size=1,
            warmup_steps=0,
            comm_every_steps=50,
            collective_timeout_s=60,
        ).install()
        try:
            loop()
        finally:
            hooks.close()
    consolidate(traces, 0)
    return load_traces(tmp_path, "steps"), hooks


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def test_a_plain_model_without_a_dataloader_counts_its_batch(tmp_path: Path) -> None:
    def loop() -> None:
        model = _mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            x = torch.randn(BATCH, 8)
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        with torch.no_grad():  # an evaluation: no step, nothing counted
            model.eval()
            model(torch.randn(100, 8))

    steps, hooks = _traced(tmp_path, loop)
    assert steps["samples"].tolist() == [BATCH] * 3
    assert steps["forward_s"].notna().all() and steps["data_s"].isna().all()
    assert steps["loss"].notna().all()
    assert not hooks.warnings


def test_only_the_outermost_forward_counts_and_a_container_stands_for_its_models(
    tmp_path: Path,
) -> None:
    """Two models in an ``nn.ModuleList`` (no forward of its own), stepped by two optimizers
    with a forward between them (a GAN's shape): two steps an iteration; the first model
    called is the root, its batch counted once, in the step its forward ran in."""

    def loop() -> None:
        nets = nn.ModuleList([_mlp(), nn.Sequential(nn.Linear(2, 1))])
        generator, critic = nets[0], nets[1]
        opt_g = torch.optim.SGD(nets[0].parameters(), lr=0.1)
        opt_c = torch.optim.SGD(nets[1].parameters(), lr=0.1)
        for _ in range(2):
            fake = generator(torch.randn(BATCH, 8))
            critic(fake.detach()).mean().backward()
            opt_c.step()
            critic(fake).mean().backward()
            opt_g.step()

    steps, hooks = _traced(tmp_path, loop)
    assert len(steps) == 4
    assert steps["samples"].tolist()[::2] == [BATCH, BATCH]
    assert steps["samples"].isna().tolist()[1::2] == [True, True]
    assert not hooks.warnings  # some steps counted: the others consumed nothing new


def test_a_step_nothing_could_count_is_said_and_note_tells_it(tmp_path: Path) -> None:
    class TakesAList(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 1)

        def forward(self, rows: list[list[float]]) -> torch.Tensor:
            return self.linear(torch.tensor(rows))

    def loop(noted: bool) -> None:
        model = TakesAList()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            rows = [[0.5] * 8 for _ in range(BATCH)]
            model(rows).mean().backward()
            if noted:
                workbench.trace.note(samples=len(rows))
            optimizer.step()

    steps, hooks = _traced(tmp_path / "a", lambda: loop(False))
    assert steps["samples"].isna().all()
    said = " ".join(hooks.warnings)
    assert "not counted" in said and "unknown, not 0" in said
    assert "workbench.trace.note(samples=" in said
    steps, hooks = _traced(tmp_path / "b", lambda: loop(True))
    assert steps["samples"].tolist() == [BATCH, BATCH] and not hooks.warnings


class _Hooks:
    """What ``script_group`` reads of the hooks: the rank's place in the run."""

    script, rank, world_size = "train.py", 1, 4
    local_rank, local_world_size = 1, 2
    rendezvous = ("127.0.0.1", 29511)

    def __init__(self) -> None:
        self.called: list[tuple[Any, ...]] = []


def test_spawn_runs_the_ranks_function_in_this_process_or_names_both_counts() -> None:
    hooks = _Hooks()
    spawn = script_group.adopt_spawn(hooks, "spawn")
    got: list[tuple[Any, ...]] = []
    assert spawn(lambda *a: got.append(a), args=("x", 7), nprocs=2) is None
    assert got == [(1, "x", 7)]  # the local rank first, then the script's arguments
    assert spawn(lambda *a: None, (), 2, False).join()  # join=False: a context, joined
    with pytest.raises(ScriptError) as err:
        spawn(lambda *a: None, nprocs=4)
    assert "nprocs=4" in str(err.value) and "2 rank(s) per node (4 on 2 node(s))" in str(err.value)
    assert "world_size 8" in str(err.value) and "(rank 1)" in str(err.value)


def test_the_scripts_own_rendezvous_gives_way_tokeep_the_runs(monkeypatch, capsys) -> None:
    hooks = _Hooks()
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", "12355")
    bound: dict[str, Any] = {"backend": "gloo", "rank": 1, "world_size": 4}
    script_group.keep_the_runs(hooks, bound)
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("127.0.0.1", "29511")
    assert bound["init_method"] is None and (bound["rank"], bound["world_size"]) == (1, 4)
    assert "asked for the rendezvous localhost:12355" in capsys.readouterr().err
    tcp = {"init_method": "tcp://10.0.0.9:8888"}
    script_group.keep_the_runs(hooks, tcp)
    assert tcp["init_method"] is None and "tcp://10.0.0.9:8888" in capsys.readouterr().err
    for wrong in ({"rank": 3}, {"world_size": 2}):
        with pytest.raises(ScriptError) as err:
            script_group.keep_the_runs(hooks, dict(wrong))
        assert "this process is rank 1 of the run's 4" in str(err.value)


SPAWNING = """
import torch.multiprocessing as mp
from torch.multiprocessing import spawn as start
N = 4
def main(rank, n): pass
if __name__ == "__main__":
    mp.spawn(main, args=(2,), nprocs=2)
    start(main, (N,), N)
    mp.spawn(main, nprocs=args.gpus)
"""


def test_the_preflight_reads_a_process_count_written_as_a_number(tmp_path: Path) -> None:
    assert spawn_counts(SPAWNING) == [(7, 2), (8, 4)]  # args.gpus: known only at the call
    script = tmp_path / "train.py"
    script.write_text(SPAWNING)
    problems = spawn_problems(str(script), world_size=2, nodes=1)
    assert len(problems) == 1 and problems[0].startswith("line 8 starts nprocs=4")
    assert "2 rank(s) per node (2 on 1 node(s))" in problems[0]
    assert "world_size 4" in problems[0]
    (two_nodes,) = spawn_problems(str(script), world_size=8, nodes=2)
    assert two_nodes.startswith("line 7 starts nprocs=2") and "world_size 4" in two_nodes


NOT_COUNTS_KNOWN_HERE = """
import gevent
import pexpect
import torch.multiprocessing as mp
n = 1
n *= 4
pexpect.spawn("ls", [], 30)        # another library's spawn
gevent.spawn(print, "q", 4)
mp.spawn(print, nprocs=n)           # n is rebound: known only at the call
if distributed:
    mp.spawn(print, nprocs=2)       # may not run at all
else:
    print(0)
"""


def test_the_preflight_leaves_what_it_cannot_know_to_the_call() -> None:
    """Only torch.multiprocessing's spawns count, and only with a count fixed in the script
    on a path that runs: other libraries' ``spawn``, a rebound name and a call under a
    condition are left to the check at the call (never a valid script refused)."""
    assert spawn_counts(NOT_COUNTS_KNOWN_HERE) == []
    assert spawn_counts("import torch\ntorch.multiprocessing.spawn(print, nprocs=3)\n") == [(2, 3)]


class _OwnHooks(nn.Linear):
    """A module whose ``register_forward_pre_hook`` takes the hook alone (a library's override
    of an older signature): the tracing cannot put its hook first on it."""

    def register_forward_pre_hook(self, hook: Any) -> Any:  # type: ignore[override]
        return super().register_forward_pre_hook(hook)


def test_tracing_work_that_fails_is_left_untraced_and_said_once(tmp_path: Path) -> None:
    """Watching the modules two optimizers step fails both times (a module whose hook method has
    another signature is the outermost): the loop trains on, its steps are traced from the
    optimizer, and the rank's warnings say once that the workbench could not watch them."""
    losses: list[float] = []

    def loop() -> None:
        first_model, second_model = _OwnHooks(8, 8), _OwnHooks(8, 2)
        first = torch.optim.SGD(first_model.parameters(), lr=0.1)
        second = torch.optim.SGD(second_model.parameters(), lr=0.1)
        for _ in range(3):
            loss = second_model(first_model(torch.randn(BATCH, 8))).pow(2).mean()
            loss.backward()
            first.step()
            second.step()
            losses.append(loss.item())

    steps, hooks = _traced(tmp_path, loop)
    assert len(losses) == 3 and len(steps) == 3
    said = [w for w in hooks.warnings if w.startswith("the workbench could not watch")]
    assert len(said) == 1, hooks.warnings
    assert "unexpected keyword argument 'prepend'" in said[0], said
    assert "the workbench's fault, not the script's" in said[0]


def test_a_bug_in_the_workbench_is_never_blamed_on_the_script(tmp_path: Path) -> None:
    """An exception raised in the workbench's own code is reported as the workbench's, with its
    file and line; the same exception raised in the script's code is the script's."""
    from workbench.config.run_config import RunConfig
    from workbench.rank.run_rank import explain
    from workbench.trace.forward_hooks import outermost

    config = RunConfig(script="train.py")
    held = nn.Linear(2, 2)  # a module holding parameters among the collector's objects
    with pytest.raises(TypeError) as ours:
        outermost(None, ())  # type: ignore[arg-type]
    said = explain(ours.value, config)
    assert said.startswith("the workbench's own code raised TypeError"), said
    assert "trace/forward_hooks.py:" in said and "not train.py: a workbench bug" in said, said
    script = tmp_path / "train.py"
    script.write_text("def main():\n    return None.forward\n")
    code = compile(script.read_text(), str(script), "exec")
    scope: dict[str, Any] = {}
    exec(code, scope)
    with pytest.raises(AttributeError) as theirs:
        scope["main"]()
    said = explain(theirs.value, config)
    assert said.startswith("train.py raised AttributeError"), said
    del held
