"""A scaling study over nodes, as a user types it: ``workbench scale --world-sizes 1,2,4,8,16
--tasks-per-node 4`` fills a node, then whole nodes; ``--nodes 1,2,4 --tasks-per-node 4`` says
the same in nodes; ``--dry-run`` prints each layout's sbatch script; a sweep spec giving
``tasks_per_node`` and a grid of world sizes or nodes lays its points out the same way; and what
cannot be laid out, or run on the executor asked, is refused before anything starts. The layouts
here are worked out by hand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.config.run_config import RunConfig
from workbench.errors import ConfigError
from workbench.run.study import layout, scaling_configs
from workbench.sweeps.spec import SweepSpec

SMALL = ["--model", "mlp", "--per-device-batch-size", "16", "--steps", "6"]


def test_a_node_is_filled_then_whole_nodes() -> None:
    # (world size, ranks per node) -> (nodes, ranks on each)
    assert [layout(n, 4) for n in (1, 2, 3, 4, 8, 12, 16)] == [
        (1, 1),
        (1, 2),
        (1, 3),
        (1, 4),
        (2, 4),
        (3, 4),
        (4, 4),
    ]
    assert [layout(n, 1) for n in (1, 2, 4)] == [(1, 1), (2, 1), (4, 1)]
    assert [layout(n, None) for n in (1, 8)] == [(1, 1), (1, 8)], "no ranks per node: one node"
    with pytest.raises(ConfigError) as refused:
        layout(6, 4)
    assert "world_size=6" in str(refused.value) and "a multiple of 4 (8, 12" in str(refused.value)


def test_scaling_configs_lay_out_each_world_size() -> None:
    weak = scaling_configs(
        RunConfig(per_device_batch_size=16, world_size=16), [1, 2, 4, 8, 16], tasks_per_node=4
    )
    # (world size, nodes, ranks per node, per-device batch, global batch)
    assert [
        (c.world_size, c.nodes, c.tasks_per_node, c.per_device_batch_size, c.global_batch_size)
        for c in weak
    ] == [
        (1, 1, 1, 16, 16),
        (2, 1, 2, 16, 32),
        (4, 1, 4, 16, 64),
        (8, 2, 4, 16, 128),
        (16, 4, 4, 16, 256),
    ]
    strong = scaling_configs(RunConfig(global_batch_size=64, world_size=8), [2, 8], 2)
    assert [(c.nodes, c.tasks_per_node, c.per_device_batch_size) for c in strong] == [
        (1, 2, 32),
        (4, 2, 8),
    ]
    assert {c.run_name for c in weak} == {None}, "launch names each point's run"


def test_every_world_size_that_cannot_be_laid_out_is_named_at_once() -> None:
    config = RunConfig(per_device_batch_size=16, world_size=10, strategy="dp", device="cuda")
    with pytest.raises(ConfigError) as refused:
        scaling_configs(config, [1, 2, 4, 6, 8, 10], tasks_per_node=4)
    said = str(refused.value)
    assert "world_size=6" in said and "world_size=10" in said, said
    # DataParallel drives one node's GPUs: the 2-node layout of 8 ranks is refused, named.
    assert "world_size 8 (2 nodes x 4 ranks): nodes=2: strategy='dp'" in said, said
    assert len(refused.value.problems) == 3, said


def sbatch_layouts(text: str) -> list[tuple[str, int, int, str]]:
    """Each script the dry run printed: (its header's world sizes, #SBATCH --nodes,
    --ntasks-per-node, --job-name)."""
    out = []
    for block in text.split("\n# world_size ")[1:]:
        said = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)$", block, re.M))
        sizes = block.split(" ", 1)[0]
        out.append((sizes, int(said["nodes"]), int(said["ntasks-per-node"]), said["job-name"]))
    return out


def dry_run(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> str:
    command = ["scale", "--executor", "slurm", "--dry-run", "--sweep", "s1", *SMALL, *argv]
    assert main([*command, "--output-dir", str(tmp_path)]) == 0, capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [], "a dry run writes nothing"
    return "\n" + capsys.readouterr().out


def test_dry_run_prints_a_one_node_and_a_two_node_layout(tmp_path: Path, capsys) -> None:
    text = dry_run(capsys, tmp_path, "--world-sizes", "1,2,4", "--tasks-per-node", "2")
    # World 1 and 2 on one node (1 and 2 ranks), world 4 on 2 nodes x 2: one job array each
    # (submitted as one job each: an array of one is a plain job), named after the sweep.
    assert sbatch_layouts(text) == [("1", 1, 1, "s1"), ("2", 1, 2, "s1"), ("4", 2, 2, "s1")]
    assert "# world_size 4 (2 nodes x 2 ranks): one job\n#!/bin/bash" in text, text


def test_nodes_say_the_same_study_in_nodes(tmp_path: Path, capsys) -> None:
    in_nodes = dry_run(capsys, tmp_path, "--nodes", "1,2,4", "--tasks-per-node", "4")
    in_ranks = dry_run(capsys, tmp_path, "--world-sizes", "4,8,16", "--tasks-per-node", "4")
    assert sbatch_layouts(in_nodes) == [("4", 1, 4, "s1"), ("8", 2, 4, "s1"), ("16", 4, 4, "s1")]
    assert sbatch_layouts(in_ranks) == sbatch_layouts(in_nodes)
    # As `run --nodes 2` takes it: one rank per node unless --tasks-per-node says more.
    assert sbatch_layouts(dry_run(capsys, tmp_path, "--nodes", "1,2")) == [
        ("1", 1, 1, "s1"),
        ("2", 2, 1, "s1"),
    ]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["--executor", "slurm", "--dry-run", "--world-sizes", "1,2,4,6", "--tasks-per-node"]
            + ["4"],
            "world_size=6: more ranks than one node of tasks_per_node=4 holds must fill whole "
            "nodes: 1 to 4 (one node) or a multiple of 4 (8, 12, ...)",
        ),
        (
            ["--executor", "slurm", "--world-sizes", "1,2", "--nodes", "1,2"],
            "--world-sizes 1,2 and --nodes 1,2: give the study's sizes one way",
        ),
        (
            ["--executor", "slurm", "--nodes", "1,2", "--tasks-per-node", "0"],
            "--tasks-per-node 0: ranks per node, a whole number >= 1",
        ),
        # Not dry: the local and pool executors run on this machine, one node, as `run
        # --nodes 2` says; the 2-node world size is refused before the 1-rank run starts.
        (
            ["--executor", "local", "--tasks-per-node", "1", "--world-sizes", "1,2"],
            "world_size 2 (2 nodes x 1 rank): nodes=2: the local executor runs on one node",
        ),
        (
            ["--executor", "pool", "--tasks-per-node", "2", "--world-sizes", "1,2,4"],
            "world_size 4 (2 nodes x 2 ranks): nodes=2: the pool executor runs on one node",
        ),
    ],
)
def test_what_cannot_run_is_named_before_anything_starts(
    argv: list[str], said: str, tmp_path: Path, capsys
) -> None:
    assert main(["scale", *SMALL, *argv, "--no-progress", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert said in err, err
    assert list(tmp_path.iterdir()) == [], "nothing was started"


def spec(grid: dict, executor: str = "slurm", **fixed: object) -> SweepSpec:
    return SweepSpec.from_dict(
        {
            "name": "layouts",
            "executor": executor,
            "fixed": {"model": "mlp", "per_device_batch_size": 16, **fixed},
            "grid": grid,
        }
    )


def test_a_sweep_spec_lays_out_its_points_as_scale_does() -> None:
    sizes = [1, 2, 4, 8, 16]
    by_world = spec({"world_size": sizes}, tasks_per_node=4).points()
    cli = scaling_configs(RunConfig(per_device_batch_size=16, world_size=16), sizes, 4)
    layouts = [(c.world_size, c.nodes, c.tasks_per_node) for c in cli]
    assert layouts == [(1, 1, 1), (2, 1, 2), (4, 1, 4), (8, 2, 4), (16, 4, 4)]
    assert [(p.config.world_size, p.config.nodes, p.config.tasks_per_node) for p in by_world] == (
        layouts
    )
    by_nodes = spec({"nodes": [1, 2, 4]}, tasks_per_node=4).points()
    assert [(p.config.world_size, p.config.nodes) for p in by_nodes] == [(4, 1), (8, 2), (16, 4)]
    # The same configs: the same hash in their run ids, whichever way the grid said them.
    assert [p.run_id.split("-")[-1] for p in by_nodes] == [
        p.run_id.split("-")[-1] for p in by_world[2:]
    ]


def test_a_sweep_spec_names_each_point_that_cannot_be_laid_out_or_run() -> None:
    with pytest.raises(ConfigError) as refused:
        spec({"world_size": [2, 6, 8]}, tasks_per_node=4, executor="slurm")
    said = str(refused.value)
    assert "point 1 (world_size=6): world_size=6: more ranks than one node" in said, said
    assert len(refused.value.problems) == 1, said
    with pytest.raises(ConfigError) as refused:
        spec({"world_size": [2, 4]}, tasks_per_node=2, executor="local")
    said = str(refused.value)
    assert "point 1 (world_size=4): nodes=2: the local executor runs on one node" in said, said
    assert len(refused.value.problems) == 1, said
