"""Slurm from the terminal: ``workbench run``, ``scale`` and ``tune`` take ``--executor slurm``
with the Slurm options as flags; ``--dry-run`` prints the sbatch script and submits nothing; a
Slurm flag given wrongly is named before anything is submitted; and a run and a scaling study
typed at a login node's prompt complete on the local Slurm cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.cli import main
from workbench.store.files import read_json
from workbench.store.load import load_runs

from .slurm_support import all_job_ids

SMALL = [
    "--train-samples", "512", "--eval-samples", "128", "--global-batch-size", "64",
    "--steps", "6", "--warmup-steps", "2", "--eval-batch-size", "64", "--trace-flush-s", "0.2",
]  # fmt: skip


# -- no cluster needed: the script, and the refusals


def test_run_dry_run_prints_the_sbatch_script_and_writes_nothing(tmp_path: Path, capsys) -> None:
    argv = ["run", "--executor", "slurm", "--dry-run", "--nodes", "2", "--tasks-per-node", "4"]
    argv += ["--partition", "gpu", "--account", "proj", "--gpus-per-node", "4", "--mem-gb", "64"]
    argv += ["--setup", "module load cuda/12.4", "--setup", "source env/bin/activate"]
    argv += ["--sbatch-arg", "reservation=r1", "--sbatch-arg=--exclusive"]
    argv += ["--env", "NCCL_DEBUG=INFO", "--srun-arg=--cpu-bind=cores", "--time-min", "90"]
    argv += ["--output-dir", str(tmp_path)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj",
        "#SBATCH --mem=64GB",
        "#SBATCH --time=90",
        "#SBATCH --reservation=r1",
        "#SBATCH --exclusive",
        "module load cuda/12.4\nsource env/bin/activate",
        "export NCCL_DEBUG=INFO",
        "--kill-on-bad-exit=1 --cpu-bind=cores",
    ):
        assert line in text, (line, text)
    assert list(tmp_path.iterdir()) == [], "a dry run writes nothing"


def test_scale_dry_run_prints_a_script_per_world_size(tmp_path: Path, capsys) -> None:
    argv = ["scale", "--executor", "slurm", "--dry-run", "--world-sizes", "1,2", "--partition"]
    assert main([*argv, "debug", "--output-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "# world_size 1" in text and "# world_size 2" in text
    assert text.count("#SBATCH --partition=debug") == 2
    assert "#SBATCH --ntasks-per-node=1" in text and "#SBATCH --ntasks-per-node=2" in text
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "--partition", "gpu"], "--partition: Slurm options, given with --executor local"),
        (
            ["scale", "--executor", "pool", "--account", "a", "--setup", "x"],
            "--account, --setup: Slurm options, given with --executor pool",
        ),
        (["tune", "some-run", "--qos", "high"], "--qos: Slurm options, given with --executor pool"),
        (["run", "--dry-run"], "--dry-run: prints the sbatch script of --executor slurm"),
        (["run", "--executor", "slurm", "--sbatch-arg", "=1"], "--sbatch-arg '=1': expected KEY"),
        (["run", "--executor", "slurm", "--env", "NCCL_DEBUG"], "--env 'NCCL_DEBUG': expected"),
    ],
)
def test_a_slurm_flag_given_wrongly_is_named_before_anything_starts(
    argv: list[str], said: str, tmp_path: Path, capsys
) -> None:
    assert main([*argv, "--output-dir", str(tmp_path)]) == 2
    assert said in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [], "nothing was started"


# -- on the local Slurm cluster


@pytest.mark.slow
def test_run_and_scale_from_the_terminal_complete_on_the_cluster(
    slurm_cluster, tmp_path: Path, capsys
) -> None:
    store = tmp_path / "store"
    before = all_job_ids()
    common = ["--executor", "slurm", "--partition", "debug", "--poll-s", "2", "--no-progress"]
    common += ["--time-min", "5", "--output-dir", str(store), *SMALL]
    assert main(["run", *common, "--world-size", "2", "--sweep", "one", "--env", "A=1"]) == 0
    said = capsys.readouterr().out
    assert "executor=slurm" in said and "throughput:" in said, said
    (run,) = [read_json(p) for p in (store / "one").glob("*/run.json")]
    assert (run["executor"], run["status"]) == ("slurm", "completed")
    assert run["config"]["world_size"] == 2
    assert run["job_id"] not in before

    # One rank a node: the 2-rank point is a 2-node job (the seeds' study across nodes).
    scale = ["scale", *common, "--world-sizes", "1,2", "--tasks-per-node", "1", "--sweep", "two"]
    assert main(scale) == 0
    said = capsys.readouterr().out
    assert "finding:" in said and (store / "two" / "report.html").exists(), said
    assert sorted(load_runs(store, ["two"])["world_size"]) == [1, 2]
    runs = [read_json(p) for p in (store / "two").glob("*/run.json")]
    assert {(r["executor"], r["status"]) for r in runs} == {("slurm", "completed")}, runs
    layouts = {r["config"]["world_size"]: r["config"]["nodes"] for r in runs}
    assert layouts == {1: 1, 2: 2}, layouts
    # Submitted at once (one job array per layout), not one after another's end.
    assert max(r["submitted_at"] for r in runs) < min(r["ended_at"] for r in runs), runs
    assert len(set(all_job_ids()) - set(before)) == 3
