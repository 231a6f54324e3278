"""Sweeps: spec validation, grid expansion and run ids (fast); papermill execution, failure,
timeout, Ctrl-C and resume, and notebook 02 itself (slow: real kernels and real 2-rank runs)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml
from nbformat.v4 import new_code_cell, new_notebook

from tests.helpers import WARM, job_processes, stays
from workbench.cli import main
from workbench.errors import ConfigError
from workbench.sweeps.runner import (
    FAILED_NOTEBOOK_FILE,
    NOTEBOOK_FILE,
    NOTEBOOK_PARAMETERS,
    POINT_FILE,
    check_notebook,
    plan,
    point_state,
    run_sweep,
)
from workbench.sweeps.spec import SweepSpec

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_02 = ROOT / "notebooks" / "02_scaling_sweep.ipynb"
QUICKSTART = ROOT / "experiments" / "sweeps" / "quickstart.yaml"
#: Small and quick: 512 samples, 6 steps (2 warm-up), one evaluation at the end; device cpu, so
#: that the kernel need not import torch to look for GPUs.
SMALL = {
    "model": "mlp",
    "train_samples": 512,
    "eval_samples": 128,
    "max_steps": 6,
    "warmup_steps": 2,
    "eval_batch_size": 64,
    "timeout_min": 3,
    "trace_flush_s": 0.2,
    "device": "cpu",
}


def spec_of(tmp_path: Path, **changes) -> SweepSpec:
    data = {
        "name": "s",
        "output_dir": str(tmp_path / "store"),
        "fixed": {"model": "mlp"},
        "grid": {"world_size": [1, 2], "per_device_batch_size": [32, 64]},
    }
    data.update(changes)
    return SweepSpec.from_dict(data)


def write_notebook(path: Path, parameters: str, *cells: str) -> Path:
    nb = new_notebook(
        cells=[
            new_code_cell(parameters, metadata={"tags": ["parameters"]}),
            *(new_code_cell(c) for c in cells),
        ],
        metadata={
            "kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}
        },
    )
    nbformat.write(nb, path)
    return path


SWEEP_PARAMETERS = "\n".join(f"{name} = None" for name in NOTEBOOK_PARAMETERS)


def error_outputs(nb_path: Path) -> list[dict]:
    nb = nbformat.read(nb_path, as_version=4)
    return [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]


# -- spec parsing and validation (fast)


def test_quickstart_spec_parses_into_four_small_points() -> None:
    spec = SweepSpec.from_yaml(QUICKSTART)
    points = spec.points()
    assert spec.executor == "local" and spec.notebook == "notebooks/02_scaling_sweep.ipynb"
    assert [p.values for p in points] == [
        {"model": "transformer", "world_size": 1},
        {"model": "transformer", "world_size": 2},
        {"model": "mlp", "world_size": 1},
        {"model": "mlp", "world_size": 2},
    ]
    # small: each run stops once known to +-5 %, within 6 s or 1,000 steps, 3 launches at most
    assert all(p.config.per_device_batch_size == 32 for p in points)
    assert all(p.config.until_known == 0.05 and p.config.until_known_max_s <= 6 for p in points)
    assert all(p.config.total_steps <= 1000 and p.config.until_known_launches == 3 for p in points)
    assert spec.notebook_path() == NOTEBOOK_02
    assert spec.to_dict()["grid"] == {"model": ["transformer", "mlp"], "world_size": [1, 2]}


def test_unknown_top_level_key_is_an_error_listing_the_valid_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        spec_of(tmp_path, gird={"world_size": [1]}, exector="local")
    assert info.value.fields == ["exector", "gird"]
    message = str(info.value)
    for key in (
        "name",
        "grid",
        "fixed",
        "notebook",
        "executor",
        "executor_options",
        "output_dir",
        "description",
    ):
        assert key in message.split("valid:")[1]


def test_misspelled_config_fields_are_errors_listing_the_valid_names(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        spec_of(
            tmp_path,
            fixed={"modle": "mlp", "max_step": 5},
            grid={"world_sise": [1, 2], "per_device_batch_size": [32]},
        )
    assert info.value.fields == ["fixed.modle", "fixed.max_step", "grid.world_sise"]
    valid = str(info.value.problems[0].allowed)
    assert "world_size" in valid and "max_steps" in valid and "per_device_batch_size" in valid


def test_yaml_typo_is_an_error_not_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("name: s\nfixed:\n  modle: mlp\ngrid:\n  world_size: [1]\n")
    with pytest.raises(ConfigError, match=r"fixed\.modle='mlp': unknown RunConfig field"):
        SweepSpec.from_yaml(path)


@pytest.mark.parametrize(
    ("changes", "field", "text"),
    [
        ({"fixed": {"sweep": "x"}}, "fixed.sweep", "set by the sweep"),
        ({"grid": {"run_name": ["a", "b"]}}, "grid.run_name", "set by the sweep"),
        ({"fixed": {"world_size": 2}}, "grid.world_size", "also in fixed"),
        ({"grid": {"world_size": 2}}, "grid.world_size", "a non-empty list"),
        ({"grid": {"world_size": []}}, "grid.world_size", "a non-empty list"),
        ({"grid": {"world_size": [1, 1]}}, "grid.world_size", "twice"),
        ({"executor": "slurmm"}, "executor", "must be one of"),
        (
            {"executor_options": {"signal_delay": 3}},
            "executor_options.signal_delay",
            "not an option of the local executor; valid:",
        ),
        ({"name": "a/b"}, "name", "a folder name"),
        ({"name": "ok\n"}, "name", "a folder name"),
        ({"name": "-x"}, "name", "starting with a letter or digit"),
        (
            {"executor": "slurm", "executor_options": {"env": ["A=1"]}},
            "executor_options.env",
            "must be a dict",
        ),
        ({"cell_timeout_s": 0}, "cell_timeout_s", "> 0"),
    ],
)
def test_spec_problems_name_the_key(tmp_path: Path, changes: dict, field: str, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        spec_of(tmp_path, **changes)
    assert field in info.value.fields
    assert text in str(info.value)


def test_grid_expands_in_order_with_fixed_fields_and_sweep_names(tmp_path: Path) -> None:
    spec = spec_of(
        tmp_path,
        fixed={"model": "mlp", "max_steps": 7},
        grid={
            "precision": ["fp32", "bf16"],
            "world_size": [1, 2, 4],
            "per_device_batch_size": [16],
        },
    )
    points = spec.points()
    assert len(points) == 6
    assert [(p.config.precision, p.config.world_size) for p in points] == [
        ("fp32", 1),
        ("fp32", 2),
        ("fp32", 4),
        ("bf16", 1),
        ("bf16", 2),
        ("bf16", 4),
    ]
    for i, p in enumerate(points):
        assert p.index == i
        assert p.config.max_steps == 7 and p.config.sweep == "s"
        assert p.config.run_name == p.run_id
        assert p.config.output_dir == str(tmp_path / "store")
        assert p.path == tmp_path / "store" / "s" / p.run_id


def test_empty_grid_is_one_point(tmp_path: Path) -> None:
    points = spec_of(tmp_path, grid={}, fixed={"model": "mlp", "per_device_batch_size": 8}).points()
    assert len(points) == 1 and re.fullmatch(r"point-[0-9a-f]{8}", points[0].run_id)


def test_run_ids_are_readable_deterministic_and_distinct(tmp_path: Path) -> None:
    a = [p.run_id for p in spec_of(tmp_path).points()]
    b = [p.run_id for p in spec_of(tmp_path / "elsewhere", description="moved").points()]
    assert a == b  # where the store is, or a description, does not change what a run is
    assert len(set(a)) == 4
    assert [i.rsplit("-", 1)[0] for i in a] == ["w1_b32", "w1_b64", "w2_b32", "w2_b64"]
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*-[0-9a-f]{8}", i) for i in a)
    # A field at its default is no change (a field added to RunConfig later keeps the ids)...
    same = spec_of(tmp_path, fixed={"model": "mlp", "seed": 0, "learning_rate": 0.05}).points()
    assert [p.run_id for p in same] == a
    # ...any other change changes the hash: a re-run must not take it for the old point.
    c = [p.run_id for p in spec_of(tmp_path, fixed={"model": "mlp", "seed": 1}).points()]
    assert [i.rsplit("-", 1)[0] for i in c] == [i.rsplit("-", 1)[0] for i in a]
    assert not set(c) & set(a)


def test_run_ids_of_odd_values_are_valid_folder_names(tmp_path: Path) -> None:
    spec = spec_of(
        tmp_path,
        grid={
            "model_options": [{"hidden_dim": 8}, {"hidden_dim": 16}],
            "learning_rate": [0.1],
            "model": ["mlp"],
        },
        fixed={"per_device_batch_size": 8},
    )
    ids = [p.run_id for p in spec.points()]
    assert ids[0].startswith("model_options-hiddendim8_lr0.1_mlp-")
    assert len(set(ids)) == 2


def test_every_bad_point_is_reported_at_once_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        spec_of(
            tmp_path,
            grid={"world_size": [1, 0], "precision": ["fp32", "fp8"]},
            fixed={"model": "mlp", "per_device_batch_size": 8},
        )
    fields = info.value.fields
    # point 0 (1, fp32) is fine; 1 has a bad precision, 2 a bad world size, 3 both
    assert [f.split(":")[0] for f in fields] == [
        "point 1 (world_size=1, precision='fp8')",
        "point 2 (world_size=0, precision='fp32')",
        "point 3 (world_size=0, precision='fp8')",
        "point 3 (world_size=0, precision='fp8')",
    ]
    assert any(f.endswith(": precision") for f in fields)
    assert any(f.endswith(": world_size") for f in fields)


def test_point_problems_and_spec_problems_come_together(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        spec_of(
            tmp_path,
            executor="nope",
            grid={"world_size": [0]},
            fixed={"model": "mlp", "per_device_batch_size": 8},
        )
    assert info.value.fields[0] == "executor"
    assert info.value.fields[1].startswith("point 0 (world_size=0)")


def test_notebook_lacking_a_sweep_parameter_is_an_error_listing_its_parameters(
    tmp_path: Path,
) -> None:
    nb = write_notebook(
        tmp_path / "nb.ipynb",
        "output_dir = 'x'\nsweep = 's'\nrun_name = None\n"
        "executor = 'local'\nexecutor_options = {}\nconfg = {}\n",
        "print(1)",
    )
    with pytest.raises(ConfigError) as info:
        check_notebook(nb)
    assert info.value.fields == ["config"]
    assert (
        "the notebook has: output_dir, sweep, run_name, executor, executor_options, confg"
        in str(info.value)
    )
    bare = nbformat.v4.new_notebook(cells=[new_code_cell("x = 1")])
    nbformat.write(bare, tmp_path / "bare.ipynb")
    with pytest.raises(ConfigError, match="no cell is tagged 'parameters'"):
        check_notebook(tmp_path / "bare.ipynb")
    # run_sweep checks before any point runs
    with pytest.raises(ConfigError, match="confg"):
        run_sweep(spec_of(tmp_path, notebook=str(nb)), progress=False)
    assert not (tmp_path / "store").exists()


def test_missing_notebook_names_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.ipynb"):
        spec_of(tmp_path, notebook="nope.ipynb").notebook_path()


def test_notebook_02_has_the_parameters_and_no_outputs() -> None:
    params = check_notebook(NOTEBOOK_02)
    for name in (
        "model",
        "world_sizes",
        "per_device_batch_sizes",
        "precisions",
        "max_steps",
        "executor",
        "executor_options",
        "sweep",
        "output_dir",
        "run_name",
        "config",
    ):
        assert name in params
    nb = nbformat.read(NOTEBOOK_02, as_version=4)
    assert all(
        not c.get("outputs") and c.get("execution_count") is None
        for c in nb.cells
        if c.cell_type == "code"
    )
    assert nb.metadata.kernelspec.name == "python3"


def test_point_state(tmp_path: Path) -> None:
    path = tmp_path / "p"
    assert point_state(path) == "missing"
    path.mkdir()
    assert point_state(path) == "stale"
    (path / "run.json").write_text(json.dumps({"status": "completed", "ended_at": 1.0}))
    assert point_state(path) == "stale"  # no executed notebook: the point did not finish
    (path / NOTEBOOK_FILE).write_text("{}")
    assert point_state(path) == "complete"
    (path / "run.json").write_text(json.dumps({"status": "failed", "ended_at": 1.0}))
    assert point_state(path) == "stale"
    (path / "run.json").write_text(json.dumps({"status": "completed", "ended_at": None}))
    assert point_state(path) == "stale"
    (path / "run.json").write_text("{trunc")
    assert point_state(path) == "stale"


def test_cli_dry_run_lists_points_and_runs_nothing(tmp_path: Path, capsys) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "dry",
                "output_dir": str(tmp_path / "store"),
                "notebook": str(NOTEBOOK_02),
                "fixed": SMALL,
                "grid": {"world_size": [1, 2], "per_device_batch_size": [32]},
            }
        )
    )
    assert main(["sweep", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    ids = [p.run_id for p in SweepSpec.from_yaml(path).points()]
    assert all(f"{i}  run" in out for i in ids)
    assert not (tmp_path / "store").exists()
    path.write_text("name: dry\ngrid: {world_size: [1]}\nfixd: {}\n")
    assert main(["sweep", str(path), "--dry-run"]) == 2
    assert "fixd" in capsys.readouterr().err


# -- real papermill (slow)


@pytest.mark.timing
@pytest.mark.slow
def test_failing_and_hanging_points_do_not_stop_the_sweep(tmp_path: Path) -> None:
    """A stand-in notebook (no training): seed 0 writes a completed run, seed 1 raises, seed 2
    hangs past the cell timeout."""
    nb = write_notebook(
        tmp_path / "fake.ipynb",
        SWEEP_PARAMETERS,
        "import json, os, time\n"
        "from pathlib import Path\n"
        "if config['seed'] == 1:\n    raise ValueError('bad point')\n"
        "if config['seed'] == 2:\n    time.sleep(120)\n"
        "run = Path(output_dir) / sweep / run_name\n"
        "(run / 'run.json').write_text(json.dumps({'status': 'completed', 'ended_at': 1.0,\n"
        "                                          'config': config}))",
    )
    spec = spec_of(
        tmp_path,
        notebook=str(nb),
        cell_timeout_s=4,
        fixed={"model": "mlp", "per_device_batch_size": 8},
        grid={"seed": [0, 1, 2]},
    )
    old = spec.sweep_dir / "from-an-older-spec"
    old.mkdir(parents=True)
    (old / "run.json").write_text(json.dumps({"status": "failed", "ended_at": 1.0}))
    start = time.monotonic()
    result = run_sweep(spec, progress=False)
    assert time.monotonic() - start < 60
    assert result.other_runs == ["from-an-older-spec"]
    ok, bad, hung = spec.points()
    assert [o.status for o in result.outcomes] == ["completed", "failed", "failed"]
    assert result.ran == [ok.run_id] and not result.ok
    assert result.failed[bad.run_id] == "ValueError: bad point"
    assert result.failed[hung.run_id].startswith("CellTimeoutError: A cell timed out")
    assert (ok.path / NOTEBOOK_FILE).exists() and not error_outputs(ok.path / NOTEBOOK_FILE)
    for p in (bad, hung):
        assert not (p.path / NOTEBOOK_FILE).exists()
        assert (p.path / FAILED_NOTEBOOK_FILE).exists()
        assert point_state(p.path) == "stale"
    assert error_outputs(bad.path / FAILED_NOTEBOOK_FILE)[0]["ename"] == "ValueError"
    point = json.loads((bad.path / POINT_FILE).read_text())
    assert point["index"] == 1 and point["values"] == {"seed": 1}
    assert point["spec"]["grid"] == {"seed": [0, 1, 2]}
    assert point["parameters"]["run_name"] == bad.run_id
    assert [what for _, what in plan(spec)] == ["skip", "run", "run"]
    assert result.summary_path is None  # no traces: nothing to tabulate, and no error either
    assert result.summary_error is None


def test_a_budget_stops_the_sweep_and_names_the_points_left(tmp_path: Path) -> None:
    """A stand-in notebook whose run held 5 device-seconds; a budget of 3: the first point runs,
    the two after it are left, named, and that is no failure."""
    nb = write_notebook(
        tmp_path / "fake.ipynb",
        SWEEP_PARAMETERS,
        "import json\n"
        "from pathlib import Path\n"
        "run = Path(output_dir) / sweep / run_name\n"
        "(run / 'run.json').write_text(json.dumps({'status': 'completed', 'ended_at': 1.0,\n"
        "                                          'device_s': 5.0, 'config': config}))",
    )
    spec = spec_of(
        tmp_path,
        notebook=str(nb),
        budget_device_s="3 device-seconds",
        fixed={"model": "mlp", "per_device_batch_size": 8},
        grid={"seed": [0, 1, 2]},
    )
    result = run_sweep(spec, progress=False)
    first, second, third = spec.points()
    assert [o.status for o in result.outcomes] == ["completed", "left", "left"]
    assert result.ok and "2 left for the budget" in str(result)
    assert result.budget_note == (
        "budget spent: 5 of 3 device-seconds; the study stopped short of: "
        f"{second.run_id}: not measured; {third.run_id}: not measured"
    )
    assert not second.path.exists() and not third.path.exists()
    with pytest.raises(ConfigError, match="budget_device_s"):
        spec_of(tmp_path, budget_device_s="a lot")


def _live_sweep_processes(points) -> list[int]:
    return [pid for p in points for pid in job_processes(p.path)]


@pytest.mark.slow
@pytest.mark.waits
def test_interrupted_sweep_resumes_without_rerunning_completed_points(tmp_path: Path) -> None:
    """Ctrl-C once the second point (2 ranks) has launched, then run again: the first point is
    kept as it was, nothing half-done looks complete or keeps running, and all three points end
    complete with a summary. Each point asks for a second launch (a goal of +-0.1 % that 6
    steps cannot reach): the sweep launches them once every point's notebook has run, in
    rounds, the first point's too."""
    spec_path = tmp_path / "grid.yaml"
    spec_path.write_text(
        yaml.safe_dump(
            {
                "name": "grid",
                "output_dir": str(tmp_path / "store"),
                "notebook": str(NOTEBOOK_02),
                "fixed": {**SMALL, "until_known": 0.001, "until_known_launches": 2},
                # three points: one kept, one interrupted (2 ranks), one never started
                "grid": {"world_size": [2], "per_device_batch_size": [32, 64]},
                "include": [{"world_size": 1, "per_device_batch_size": 32}],
            },
            sort_keys=False,
        )
    )
    spec = SweepSpec.from_yaml(spec_path)
    points = spec.points()
    first, second = points[0], points[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", "sweep", str(spec_path), "--no-progress"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A shell that starts a job in the background makes it ignore SIGINT, and children
        # inherit that: Ctrl-C is restored here so the test means the same wherever it runs.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 150
        while not (point_state(first.path) == "complete" and (second.path / "run.json").exists()):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the first point did not complete in time"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert "interrupted" in out
    # Nothing of the interrupted point is left running (its ranks were starting: no pid of
    # theirs was recorded yet), nothing writes into its folder, and it does not look complete.
    assert _live_sweep_processes(points) == []
    before = sorted(str(f) for f in second.path.rglob("*"))
    stays(
        lambda: sorted(str(f) for f in second.path.rglob("*")) == before,
        3,
        "no file appearing in or leaving the interrupted point's folder",
    )
    assert point_state(first.path) == "complete"
    assert [point_state(p.path) for p in points[1:]] == ["stale", "missing"]
    assert not (second.path / NOTEBOOK_FILE).exists()
    second_run = json.loads((second.path / "run.json").read_text())
    assert second_run["status"] != "completed" and second_run["ended_at"] is not None
    kept_run = json.loads((first.path / "run.json").read_text())
    kept_mtime = (first.path / NOTEBOOK_FILE).stat().st_mtime_ns

    result = run_sweep(spec, progress=False)

    assert result.skipped == [first.run_id]
    assert result.ran == [p.run_id for p in points[1:]] and result.ok, result.failed
    assert (
        json.loads((first.path / "run.json").read_text())["submitted_at"]
        == kept_run["submitted_at"]
    )
    assert (first.path / NOTEBOOK_FILE).stat().st_mtime_ns == kept_mtime
    for p in points:
        assert point_state(p.path) == "complete"
        run = json.loads((p.path / "run.json").read_text())
        assert run["config"]["world_size"] == p.values["world_size"]
        assert run["config"]["run_name"] == p.run_id and run["environment"]["host"]
        assert error_outputs(p.path / NOTEBOOK_FILE) == []
        assert not list(p.path.glob("notebook.*.ipynb"))  # no partial or failed copies left
        record = json.loads((p.path / POINT_FILE).read_text())
        assert record["index"] == p.index and record["spec"]["name"] == "grid"
    import pandas as pd

    summary = pd.read_csv(result.summary_path)
    assert sorted(zip(summary["world_size"], summary["per_device_batch_size"], strict=True)) == [
        (1, 32),
        (2, 32),
        (2, 64),
    ]
    assert list(summary["runs"]) == [2, 2, 2], "each point's two launches pooled"
    # the further launches came after every point's first, in the points' order
    firsts = [json.loads((p.path / "run.json").read_text())["submitted_at"] for p in points]
    again = [
        json.loads((p.path.parent / f"{p.run_id}-launch2" / "run.json").read_text()) for p in points
    ]
    assert all(a["status"] == "completed" for a in again)
    starts = [a["submitted_at"] for a in again]
    assert min(starts) > max(firsts) and starts == sorted(starts), (firsts, starts)
    assert not any((p.path.parent / f"{p.run_id}-launch2" / NOTEBOOK_FILE).exists() for p in points)
    assert result.report_path == spec.sweep_dir / "report.html"
    assert result.report_path.stat().st_size > 10_000
    assert _live_sweep_processes(points) == []


@pytest.mark.slow
@pytest.mark.waits
def test_notebook_02_runs_its_grid_interactively_with_papermill(tmp_path: Path) -> None:
    import papermill

    from workbench.store.load import load_runs

    out = tmp_path / "out.ipynb"
    papermill.execute_notebook(
        str(NOTEBOOK_02),
        str(out),
        kernel_name="python3",
        progress_bar=False,
        execution_timeout=300,
        cwd=str(tmp_path),
        parameters={
            "world_sizes": [1, 2],
            "per_device_batch_sizes": [32],
            "max_steps": 6,
            "executor": WARM,
            "output_dir": str(tmp_path / "store"),
            "sweep": "nb",
            "config": {k: v for k, v in SMALL.items() if k not in ("model", "max_steps")},
        },
    )
    runs = load_runs(tmp_path / "store", ["nb"])
    assert sorted(runs["world_size"]) == [1, 2]
    assert set(runs["status"]) == {"completed"}
    assert set(runs["per_device_batch_size"]) == {32}
    assert error_outputs(out) == []
    nb = nbformat.read(out, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figures) >= 4
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    # The kernel ran this interpreter (the venv's python), not some other python3 kernel.
    assert f"kernel python: {sys.executable}" in text
    tables = [
        o
        for o in outputs
        if "text/html" in o.get("data", {}) and "speedup" in o["data"]["text/html"]
    ]
    assert tables, "the scaling table was not shown"
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    assert any(
        "application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in last.outputs
    ), "the dashboard was not shown"
    assert os.listdir(tmp_path / "store" / "nb")
