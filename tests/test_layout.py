"""The package's house rules: import contracts, no cycles, small modules and functions, no private
names across modules, and a dashboard kernel that loads traces without torch."""

from __future__ import annotations

import ast
import glob
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workbench"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
#: Functions allowed to be longer, and why (none today).
LONG_FUNCTIONS: dict[str, str] = {}


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.append((name, path))
    return out


def test_import_contracts_hold() -> None:
    """import-linter's contracts (pyproject.toml): layers, no torch below ui, submitit only in
    jobs, papermill only in sweeps.execute, no cycles between siblings."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "lint-imports is missing: install the dev extra (pip install -e '.[dev]')"
    result = subprocess.run(
        [exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "BROKEN" not in result.stdout


def test_the_import_checker_catches_a_forbidden_import(tmp_path: Path) -> None:
    """A positive control: a copy of the package with ``import torch`` in an analysis module
    breaks the no-torch contract, and one whose measured floor imports the advice breaks the
    analysis's floors."""
    copy = tmp_path / "src"
    shutil.copytree(PACKAGE, copy / "workbench", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    victim = copy / "workbench" / "analysis" / "__init__.py"
    victim.write_text(victim.read_text() + "\nimport torch  # noqa\n")
    below = copy / "workbench" / "analysis" / "measured" / "units.py"
    below.write_text(below.read_text() + "\nimport workbench.analysis.advice.finding  # noqa\n")
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe
    env = {"PYTHONPATH": str(copy), "PATH": str(Path(sys.executable).parent)}
    result = subprocess.run(
        [exe, "--no-cache"], cwd=copy, capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode != 0
    assert "workbench.analysis -> torch" in result.stdout
    floors = result.stdout[result.stdout.index("Floors of the analysis") :]
    assert "BROKEN" in floors.splitlines()[0] + floors.splitlines()[1], floors[:400]
    assert "workbench.analysis.measured.units -> workbench.analysis.advice.finding" in result.stdout


def test_the_analysis_stands_on_its_floors() -> None:
    """The analysis keeps at most 8 modules at its top; the rest stand in its floors, each a
    sub-package with a docstring that says what it may import (pyproject.toml's contract
    "Floors of the analysis" checks it)."""
    top = sorted(p.name for p in (PACKAGE / "analysis").glob("*.py"))
    assert len(top) <= 8, top
    floors = [p for p in (PACKAGE / "analysis").iterdir() if (p / "__init__.py").exists()]
    assert floors
    for floor in floors:
        doc = ast.get_docstring(ast.parse((floor / "__init__.py").read_text()))
        assert doc and "import" in doc.lower(), (floor.name, doc)


def test_no_module_is_too_long() -> None:
    long = {
        name: n
        for name, path in _modules()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def _functions(tree: ast.AST, prefix: str):  # type: ignore[no-untyped-def]
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}.{node.name}", node
            yield from _functions(node, f"{prefix}.{node.name}")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}.{node.name}")


def test_no_function_is_too_long() -> None:
    long = {}
    for name, path in _modules():
        for qualname, node in _functions(ast.parse(path.read_text()), name):
            lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            if lines > MAX_FUNCTION_LINES and qualname not in LONG_FUNCTIONS:
                long[qualname] = lines
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_private_name_is_imported_across_modules() -> None:
    found = []
    for name, path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workbench"):
                for alias in node.names:
                    if alias.name.startswith("_") and node.module != name:
                        found.append(f"{name}: from {node.module} import {alias.name}")
    assert not found, found


def test_only_rank_distributed_touches_torch_distributed() -> None:
    users = []
    for name, path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            if any(m == "torch.distributed" or m.startswith("torch.distributed.") for m in mods):
                users.append(name)
    # The hooks that trace a user's script wrap the script's own init_process_group (its timeout,
    # the barrier that aligns the trace clocks: script_group) and check that it joined: they
    # touch it too; so does the flight recorder, which wraps the collectives of every rank.
    hooks = {
        "workbench.trace.torch_hooks",
        "workbench.trace.script_group",
        "workbench.trace.flight",
    }
    assert set(users) == {"workbench.rank.distributed", *hooks}, users


def _write_traces(run: Path) -> None:
    """A run folder with a consolidated (Parquet) rank, a live Arrow stream and an older
    version's live JSONL file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from workbench import schema

    traces = run / schema.TRACES_DIR
    traces.mkdir(parents=True)
    row = {c: None for c in schema.STEP_COLUMNS}
    row.update(run_id=run.name, rank=0, world_size=2, attempt=0, step=1, warmup=False)
    row.update(t_start_s=0.0, step_s=0.01, samples=32)
    pq.write_table(pa.Table.from_pylist([row]), traces / schema.steps_file(0))
    live = {**row, "rank": 1}
    (traces / schema.steps_file(1, "jsonl")).write_text(json.dumps(live) + "\n")
    from workbench.store.arrow_stream import StreamWriter

    writer = StreamWriter(traces / schema.live_steps_file(2), schema.STEP_COLUMNS)
    writer.write({c: [v] for c, v in {**row, "rank": 2}.items()}, 1)
    writer.close()
    (run / schema.RUN_FILE).write_text(json.dumps({"run_id": run.name, "status": "running"}))


def test_loading_live_and_finished_traces_does_not_import_torch(tmp_path: Path) -> None:
    run = tmp_path / "store" / "sweep" / "run-1"
    _write_traces(run)
    code = textwrap.dedent(
        f"""
        import sys
        import workbench
        from workbench import analysis
        from workbench.store import load_runs, load_traces
        from workbench.ui import plots
        steps = load_traces({str(run)!r})
        assert sorted(steps["rank"]) == [0, 1, 2], steps
        runs = load_runs({str(tmp_path / "store")!r})
        analysis.measured_window(steps)
        print("torch" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False", out.stdout + out.stderr


@pytest.mark.parametrize("name", ["workbench", "workbench.store", "workbench.analysis"])
def test_importing_the_front_does_not_import_torch(name: str) -> None:
    code = f"import sys, {name}; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False"


def test_a_launch_imports_no_torch_in_the_caller_without_a_gpu(tmp_path: Path) -> None:
    """A notebook kernel or the CLI that launches (the task pickled, the preflight's device checks,
    the run's records) imports torch only to count GPUs where a GPU's device node exists: each
    sweep point's kernel paid 1.8 s for it. Where one exists, torch counts them, as before."""
    gpu_nodes = any(glob.glob(p) for p in ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg"))
    code = (
        "import sys\n"
        "from workbench.config import RunConfig\n"
        "from workbench.run.launch import _prepare\n"
        "for executor in ('local', 'pool'):\n"
        f"    c = RunConfig(model='mlp', world_size=2, per_device_batch_size=8, max_steps=5,\n"
        f"                  output_dir={str(tmp_path)!r}, sweep=executor)\n"
        "    _prepare(c, executor, {}, False)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == [str(gpu_nodes)], out.stdout + out.stderr
    assert len(list(tmp_path.glob("*/*/run.json"))) == 2  # both launches were prepared


def test_a_ranks_code_imports_no_analysis_and_the_front_still_names_everything() -> None:
    """A rank imports ``workbench.rank.run_rank``: it must not pay for pandas, plotly or the
    analysis (the package's names are imported on first use); ``from workbench import ...``
    still finds every name of ``__all__`` (positive control: pandas comes with ``load_runs``)."""
    code = (
        "import sys, workbench.rank.run_rank\n"
        "print(sorted(m for m in ('pandas', 'plotly', 'workbench.analysis') if m in sys.modules))\n"
        "import workbench\n"
        "print(all(callable(getattr(workbench, n)) for n in workbench.__all__))\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["[]", "True", "True"], out.stdout + out.stderr
