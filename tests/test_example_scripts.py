"""The example scripts (a plain DDP + AMP script, an HF Trainer fine-tuning, an Accelerate script
with gradient accumulation) run unmodified at 1 and 2 ranks, locally and on the local Slurm
cluster, and a 1-vs-2-rank study of each reads like one of the built-in models."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

from workbench import RunConfig, launch, load_runs
from workbench.store.files import read_json
from workbench.store.load import load_traces
from workbench.ui.report import report_from_store

from .helpers import WARM

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "scripts"
#: Each example with arguments that keep a run to a few seconds on a CPU.
ARGS = {
    "ddp_amp.py": ["--steps", "30"],
    "hf_trainer.py": ["--steps", "150"],
    "accelerate_gpt2.py": ["--steps", "12"],
}


def _config(script: str, world_size: int, store: Path, sweep: str, *extra: str) -> RunConfig:
    return RunConfig(
        script=f"examples/scripts/{script}",
        script_args=[*ARGS[script], *extra],
        world_size=world_size,
        output_dir=str(store),
        sweep=sweep,
        timeout_min=10,
    )


@pytest.mark.parametrize("script", sorted(ARGS))
def test_examples_are_plain_programs_that_import_no_workbench(script: str) -> None:
    tree = ast.parse((EXAMPLES / script).read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if m.split(".")[0] == "workbench"], imported
    assert ast.get_docstring(tree) and "torchrun" in ast.get_docstring(tree)  # type: ignore[operator]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every example at 1 and 2 local ranks, one after the other, in one sweep (the HF Trainer
    also writes the Trainer's own metrics: the 2-rank run's are left)."""
    store = tmp_path_factory.mktemp("examples")
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for script in sorted(ARGS):
            for world_size in (1, 2):
                # the same arguments at both sizes (one curve); the 2-rank run writes last
                extra = ["--metrics-json", str(store / "trainer.json")]
                with_metrics = script == "hf_trainer.py"
                config = _config(script, world_size, store, "examples", *(extra * with_metrics))
                assert launch(config, WARM).wait(timeout_s=300) == "completed", config.script
    finally:
        os.chdir(cwd)
    return store


@pytest.mark.timing
@pytest.mark.slow
def test_each_example_is_traced_at_one_and_two_ranks(study: Path) -> None:
    runs = load_runs(study, ["examples"])
    assert sorted(runs["model"]) == sorted(f"script:{s[:-3]}" for s in ARGS for _ in (1, 2))
    assert (runs["status"] == "completed").all() and (runs["measured_steps"] > 0).all()
    steps = load_traces(runs["path"], "steps")
    measured = steps[~steps["warmup"]]
    for column in ("data_s", "forward_s", "backward_s", "optimizer_s", "samples", "loss"):
        assert measured[column].notna().mean() > 0.9, column
    two = measured[measured["world_size"] == 2]
    assert two.dropna(subset=["comm_exposed_s"]).groupby("run_id").size().min() >= 2
    # Accelerate: 2 micro-batches of 8 per optimizer step, 64 tokens each
    gpt2 = measured[measured["run_id"].str.startswith("accelerate_gpt2")]
    assert (gpt2["samples"] == 16).all() and (gpt2["tokens"] == 16 * 64).all()


@pytest.mark.timing
@pytest.mark.slow
def test_the_report_of_each_study_shows_speedup_phases_communication_and_finding(
    study: Path, tmp_path: Path
) -> None:
    page = Path(report_from_store(study / "examples", tmp_path / "r.html")).read_text()
    for heading in ("Finding", "Speedup", "Phases per run", "Scaling", "Communication"):
        assert f"<h2>{heading}" in page, heading
    finding = page.split('<section class="finding">', 1)[1].split("</section>", 1)[0]
    for name in ("ddp_amp", "hf_trainer", "accelerate_gpt2"):
        assert f"model=script:{name}" in finding and "2 ranks:" in finding, finding
    assert "exposed" in page and "traced from outside" in finding


@pytest.mark.timing
@pytest.mark.slow
def test_each_study_is_predicted_tuned_and_shown_as_a_built_in_ones(
    study: Path, capsys: pytest.CaptureFixture
) -> None:
    """The script zoo's matrix (``tests/test_script_zoo.py``) for the HF Trainer, Accelerate and
    the AMP script: ``predict`` at 4 ranks (each curve a figure), ``tune``'s plan from each
    2-rank run, and the Dashboard's first screen with its finding, through the commands."""
    from workbench.cli import main
    from workbench.ui.dashboard import Dashboard

    argv = ["predict", "examples", "--output-dir", str(study), "--world-sizes", "4", "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(ARGS), rows
    assert all(r["samples_per_s"] and r["samples_per_s"] > 0 for r in rows), rows
    runs = load_runs(study, ["examples"])
    for path in runs.loc[runs["world_size"] == 2, "path"]:
        assert main(["tune", path, "--top", "0", "--json"]) == 0, path
        plan = json.loads(capsys.readouterr().out)
        assert plan["base"]["world_size"] == 2 and "candidates" in plan, sorted(plan)
    board = Dashboard(study, sweeps=["examples"])
    assert board.children[0] is board.finding
    for name in ("ddp_amp", "hf_trainer", "accelerate_gpt2"):
        assert f"script:{name}" in board.finding.value, board.finding.value


@pytest.mark.timing
@pytest.mark.slow
def test_the_trainers_own_throughput_agrees_with_the_workbench_within_5_percent(
    study: Path,
) -> None:
    """The same steps, two clocks. The Trainer's ``train_samples_per_second``: every sample of
    the run over ``train_runtime``, from just before its first step (the model already wrapped)
    to just after its last, its warm-up steps included. The workbench's over the same window: the
    samples of every traced step of every rank, warm-up included, over rank 0's wall time from
    its first step's start to its last step's end."""
    trainer = json.loads((study / "trainer.json").read_text())["train_samples_per_second"]
    runs = load_runs(study, ["examples"])
    ours = runs.loc[(runs["model"] == "script:hf_trainer") & (runs["world_size"] == 2)]
    steps = load_traces(ours["path"], "steps")
    assert steps.groupby("rank")["step"].nunique().tolist() == [150, 150]
    first = steps[steps["rank"] == 0]
    window_s = (first["t_start_s"] + first["step_s"]).max() - first["t_start_s"].min()
    measured = steps["samples"].sum() / window_s
    print(f"Trainer {trainer:,.1f}/s, workbench {measured:,.1f}/s over the same {len(first)} steps")
    assert measured == pytest.approx(trainer, rel=0.05), f"workbench {measured}, Trainer {trainer}"


@pytest.mark.slow
@pytest.mark.slurm
def test_each_example_runs_on_the_slurm_cluster_at_one_and_two_ranks(
    slurm_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    partition = os.environ.get("WORKBENCH_SLURM_PARTITION", "debug")
    handles = [
        launch(
            _config(script, world_size, tmp_path, "slurm-examples"),
            executor="slurm",
            partition=partition,
            poll_s=2.0,
        )
        for script in sorted(ARGS)
        for world_size in (1, 2)
    ]
    for handle in handles:
        assert handle.wait(timeout_s=600) == "completed", handle.run_id
        ranks = handle.traces().groupby("rank")["step"].max()
        assert len(ranks) == handle.config.world_size and ranks.min() > 0, handle.run_id
        assert read_json(handle.path / "run.json")["executor"] == "slurm"
