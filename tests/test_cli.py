"""The `workbench` command as a user types it: scale, ls, report, run, repartition and sweep
--force, each in a subprocess on a store under the test's temporary folder; and the scaling
study behind `scale` (workbench/run/study.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from workbench.analysis.measured.windows import measured_steps
from workbench.config.run_config import RunConfig
from workbench.run.study import scaling_configs

from .helpers import WARM
from .parquet_rows import expected_rows
from .test_sweep import SWEEP_PARAMETERS, write_notebook

ROOT = Path(__file__).resolve().parent.parent
#: A tiny run: 4 measured steps after 2 warm-up steps, small evaluation.
TINY = [
    "--model", "mlp", "--train-samples", "512", "--eval-samples", "64",
    "--per-device-batch-size", "16", "--max-steps", "6", "--warmup-steps", "2",
    "--eval-batch-size", "64",
]  # fmt: skip


def workbench(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """``workbench ARGS`` as the console script runs it, with the venv's python."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "workbench.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        cwd=ROOT,
    )


def run_record(store: Path, sweep: str, run_id: str) -> dict:
    return json.loads((store / sweep / run_id / "run.json").read_text())


#: A number in exponent form, which no cell a person reads may show.
EXPONENT = re.compile(r"e[+-]\d\d")


def check_progress(stderr: str, desc: str, steps: int) -> None:
    """The progress on stderr, as a log (no terminal) gets it: one line per redraw, starting at
    0 of the run's steps and ending with all of them done, no carriage returns."""
    lines = [x for x in stderr.splitlines() if x.startswith(f"{desc}:")]
    assert lines, stderr[-3000:]
    assert f" 0/{steps} " in lines[0] and "starting" in lines[0], lines[0]
    assert f" {steps}/{steps} " in lines[-1] and "completed" in lines[-1], lines[-1]
    assert "step/s" in lines[-1] or "s/step" in lines[-1], "tqdm's rate"
    assert "\r" not in stderr


def check_per_rank_table(text: str, run: Path) -> None:
    """The per-rank table: a header row, then one row per rank, its times in ms (the mean of
    the rank's measured steps, read here from the traces, to the 3 digits printed). Measured:
    after the traced warm-up and the slow steps detected after it (``measured_steps``, whose
    rule tests/test_warmup_truth.py plants)."""
    lines = [x for x in text.splitlines()[1:] if x.strip()]
    header = lines[0].split()
    assert header[:7] == ["rank", "data", "forward", "backward", "optimizer", "comm", "step"]
    assert [x.split()[0] for x in lines[1:]] == ["0", "1"], "no index row, one row per rank"
    steps = pd.concat(pd.read_parquet(p) for p in (run / "traces").glob("steps-rank*.parquet"))
    measured = measured_steps(steps)
    for line in lines[1:]:
        cells = line.split()
        mean_ms = measured.loc[measured["rank"] == int(cells[0]), "step_s"].mean() * 1000
        assert float(cells[6]) == pytest.approx(mean_ms, rel=0.01), (line, mean_ms)
        assert cells[7].endswith("/s") and cells[-1] == "GiB", line


# ----------------------------------------------------------------------------- the study


def test_scaling_configs_keep_what_the_config_fixed() -> None:
    weak = scaling_configs(RunConfig(per_device_batch_size=16, world_size=2), [1, 2, 4])
    assert [(c.world_size, c.per_device_batch_size, c.global_batch_size) for c in weak] == [
        (1, 16, 16),
        (2, 16, 32),
        (4, 16, 64),
    ]
    strong = scaling_configs(RunConfig(global_batch_size=64, world_size=4), [1, 2, 4])
    assert [(c.world_size, c.per_device_batch_size, c.global_batch_size) for c in strong] == [
        (1, 64, 64),
        (2, 32, 64),
        (4, 16, 64),
    ]
    assert {c.run_name for c in weak} == {None}, "launch names each point's run"


# ----------------------------------------------------------------------------- scale, ls, report


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    store = tmp_path_factory.mktemp("cli-store")
    done = workbench(
        "scale", "--world-sizes", "1,2", "--sweep", "cli", "--output-dir", str(store),
        "--executor", WARM, *TINY,
    )  # fmt: skip
    return store, done


@pytest.mark.slow
@pytest.mark.waits
def test_scale_runs_one_config_per_world_size_then_writes_a_report(scaled) -> None:
    store, done = scaled
    assert done.returncode == 0, done.stderr[-3000:]
    runs = sorted(p.name for p in (store / "cli").iterdir() if (p / "run.json").exists())
    records = [run_record(store, "cli", r) for r in runs]
    assert sorted(r["config"]["world_size"] for r in records) == [1, 2]
    assert {r["status"] for r in records} == {"completed"}
    assert {r["config"]["per_device_batch_size"] for r in records} == {16}, "weak scaling"
    for run_id in runs:
        assert f"{run_id}: completed" in done.stdout
    for i in (1, 2):
        check_progress(done.stderr, f"run {i}/2", 6)
    assert not EXPONENT.search(done.stdout), done.stdout
    # the finding, in words, before where the files are
    assert "finding:\n  2 ranks: " in done.stdout and "the throughput of 1 rank" in done.stdout
    assert done.stdout.index("finding:") < done.stdout.index("results:")
    report = store / "cli" / "report.html"
    assert f"report: {report}" in done.stdout
    page = report.read_text()
    assert "<h2>Scaling</h2>" in page and page.count("<tr>") >= 3  # header + two points


@pytest.mark.slow
@pytest.mark.waits
def test_ls_lists_every_run_with_its_status(scaled) -> None:
    store, _ = scaled
    listed = workbench("ls", "--output-dir", str(store))
    assert listed.returncode == 0, listed.stderr
    for run in (store / "cli").iterdir():
        if (run / "run.json").exists():
            line = next(x for x in listed.stdout.splitlines() if run.name in x)
            assert "completed" in line, line
    assert "cli" in listed.stdout
    assert not EXPONENT.search(listed.stdout), listed.stdout
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:3] == ["sweep", "run", "status"] and "samples/s" in header
    assert len(rows) == 2, "one row per run, no index row"
    for row in rows:
        run_id = row.split()[1]
        rate = run_record(store, "cli", run_id)["summary"]["samples_per_s"]
        assert f" {round(rate):,}/s " in row, (row, rate)  # e.g. 15,290/s
        assert re.search(r" \d+ %$", row), "the accuracy as a percentage"
    other = workbench("ls", "--output-dir", str(store), "--sweep", "nothing-here")
    assert all(run.name not in other.stdout for run in (store / "cli").iterdir())


@pytest.mark.slow
@pytest.mark.waits
def test_report_of_a_sweep_and_of_a_run_folder(scaled, tmp_path: Path) -> None:
    store, _ = scaled
    out = tmp_path / "again.html"
    done = workbench("report", "cli", "--output-dir", str(store), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 0 and "<h2>Scaling</h2>" in out.read_text()
    run_dir = next(p for p in (store / "cli").iterdir() if (p / "run.json").exists())
    one = tmp_path / "one.html"
    assert workbench("report", str(run_dir), "-o", str(one)).returncode == 0
    assert run_dir.name in one.read_text()
    missing = workbench("report", "no-such-sweep", "--output-dir", str(store), "-o", str(one))
    assert missing.returncode != 0 and "no runs found" in missing.stderr
    shared = tmp_path / "shared" / "report.html"
    args = ("report", "cli", "--output-dir", str(store), "-o", str(shared))
    assert workbench(*args, "--plotly-js", "directory").returncode == 0
    assert (shared.parent / "plotly.min.js").stat().st_size > 1e6  # plotly.js, beside it
    assert shared.stat().st_size < out.stat().st_size / 4, "the report no longer inlines it"
    assert 'src="plotly.min.js"' in shared.read_text()


# ----------------------------------------------------------------------------- run


@pytest.mark.slow
@pytest.mark.waits
def test_run_launches_one_run_and_prints_its_summary(tmp_path: Path) -> None:
    done = workbench(
        "run", "--world-size", "2", "--run-name", "one", "--sweep", "cli-run",
        "--output-dir", str(tmp_path), "--executor", WARM, *TINY,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    record = run_record(tmp_path, "cli-run", "one")
    assert record["status"] == "completed" and record["config"]["world_size"] == 2
    assert "throughput:" in done.stdout and "samples/s" in done.stdout
    per_rank = done.stdout.split("per rank:")[1].split("results:")[0]
    assert len([x for x in per_rank.splitlines() if x.strip()[:1] in ("0", "1")]) == 2
    assert f"results: {tmp_path / 'cli-run' / 'one'}" in done.stdout
    assert not EXPONENT.search(done.stdout), done.stdout
    check_per_rank_table(per_rank, tmp_path / "cli-run" / "one")
    check_progress(done.stderr, "steps", 6)
    again = workbench(
        "run", "--run-name", "one", "--sweep", "cli-run", "--output-dir", str(tmp_path), *TINY
    )
    assert again.returncode == 2 and "one" in again.stderr and "--resume" in again.stderr


@pytest.mark.slow
def test_on_off_flags_and_the_hidden_fault_flag_reach_the_run(tmp_path: Path) -> None:
    """``--static-graph`` and ``--no-eval-at-end`` as the run records its config; ``--fault``
    (not in help) accepted, planted for an attempt that never comes, so the run completes."""
    fault = {"rank": 0, "step": 2, "kind": "exit", "attempt": 5}
    done = workbench(
        "run", "--world-size", "1", "--run-name", "flags", "--sweep", "cli-flags",
        "--output-dir", str(tmp_path), "--static-graph", "--no-eval-at-end",
        "--fault", json.dumps(fault), "--no-progress", "--executor", WARM, *TINY,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    config = run_record(tmp_path, "cli-flags", "flags")["config"]
    assert (config["static_graph"], config["eval_at_end"]) == (True, False)
    assert config["fault"] == {**fault, "phase": "start"}, "the fault's phase: its default"
    assert "steps:" not in done.stderr, "--no-progress: no bar"


# ----------------------------------------------------------------------------- repartition


def test_repartition_makes_and_rewrites_row_groups(tmp_path: Path) -> None:
    data = tmp_path / "train.parquet"
    made = workbench("repartition", str(data), "--make", "1000")
    assert made.returncode == 0, made.stderr
    assert pq.ParquetFile(data).metadata.num_rows == 1000
    four = tmp_path / "four.parquet"
    assert workbench("repartition", str(data), "--row-groups", "4", "-o", str(four)).returncode == 0
    meta = pq.ParquetFile(four).metadata
    assert meta.num_row_groups == 4
    assert [meta.row_group(i).num_rows for i in range(4)] == [250] * 4
    assert workbench("repartition", str(four), "--rows-per-group", "100").returncode == 0
    assert pq.ParquetFile(four).metadata.num_row_groups == 10, "in place without -o"
    # Against the rows computed here: comparing with the source file alone would pass however
    # both files were made.
    rows = expected_rows(1000)
    assert pq.read_table(data).equals(rows)
    assert pq.read_table(four).equals(rows), "the rows are the same, in order"


# ----------------------------------------------------------------------------- sweep --force


@pytest.mark.slow
@pytest.mark.waits
def test_sweep_skips_completed_points_and_force_runs_them_again(tmp_path: Path) -> None:
    notebook = write_notebook(
        tmp_path / "nb.ipynb",
        SWEEP_PARAMETERS,
        "import json, time\nfrom pathlib import Path\n"
        "run = Path(output_dir) / sweep / run_name\n"
        "(run / 'run.json').write_text(json.dumps({'status': 'completed', 'ended_at': "
        "time.time(), 'config': config}))",
    )
    spec = tmp_path / "two.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "forced",
                "notebook": str(notebook),
                "output_dir": str(tmp_path / "store"),
                "fixed": {"model": "mlp", "per_device_batch_size": 8},
                "grid": {"seed": [0, 1]},
            }
        )
    )
    first = workbench("sweep", str(spec), "--no-progress")
    assert first.returncode == 0, first.stderr[-3000:]
    points = sorted((tmp_path / "store" / "forced").glob("*/notebook.ipynb"))
    assert len(points) == 2
    stamps = [p.stat().st_mtime_ns for p in points]
    again = workbench("sweep", str(spec), "--no-progress")
    assert "0 ran, 2 skipped" in again.stdout, again.stdout
    assert [p.stat().st_mtime_ns for p in points] == stamps
    forced = workbench("sweep", str(spec), "--no-progress", "--force")
    assert "2 ran, 0 skipped" in forced.stdout, forced.stdout
    assert all(p.stat().st_mtime_ns > s for p, s in zip(points, stamps, strict=True))


# ----------------------------------------------------------------------------- a dead kernel


@pytest.mark.slow
def test_a_dead_kernel_stops_the_current_run_and_the_sweep_goes_on(tmp_path: Path) -> None:
    """The point's notebook launches a long real run, then its kernel dies (SIGKILL): the run's
    ranks (in a session of their own, so they outlive the kernel) are ended, the run reads
    cancelled, the point failed naming the dead kernel, and the next point still runs."""
    from workbench.sweeps.runner import run_sweep
    from workbench.sweeps.spec import SweepSpec

    from .helpers import job_processes

    notebook = write_notebook(
        tmp_path / "dies.ipynb",
        SWEEP_PARAMETERS,
        "import os, signal, time\nfrom workbench import RunConfig, launch\n"
        "if config['seed'] == 0:\n"
        "    config = {**config, 'epochs': 50, 'max_steps': None}  # minutes: it cannot end first\n"
        "handle = launch(RunConfig.from_dict(config))\n"
        "if config['seed'] == 0:\n"
        "    deadline = time.monotonic() + 120\n"
        "    while time.monotonic() < deadline and not (\n"
        "        len(handle.rank_states()) == 2\n"
        "        and all(s['status'] == 'running' for s in handle.rank_states().values())):\n"
        "        time.sleep(0.2)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "handle.wait()",
    )
    spec = SweepSpec.from_dict(
        {
            "name": "dead",
            "notebook": str(notebook),
            "output_dir": str(tmp_path / "store"),
            "cell_timeout_s": 300,
            "fixed": {
                "model": "mlp", "world_size": 2, "per_device_batch_size": 8,
                "train_samples": 512, "eval_samples": 64, "warmup_steps": 1,
            },
            "grid": {"seed": [0, 1], "epochs": [1]},
        }
    )  # fmt: skip
    points = spec.points()
    result = run_sweep(spec, progress=False)
    dead, after = points
    assert list(result.failed) == [dead.run_id], result
    assert "kernel" in result.failed[dead.run_id].lower(), result.failed
    assert job_processes(dead.path) == [], "no rank of the dead kernel's run is left"
    record = json.loads((dead.path / "run.json").read_text())
    assert record["status"] == "cancelled" and record["ended_at"] is not None
    assert json.loads((after.path / "run.json").read_text())["status"] == "completed"


# ----------------------------------------------------------------------------- the demo's spec


@pytest.mark.slow
@pytest.mark.waits
def test_the_demo_spec_runs_as_written_but_shorter(tmp_path: Path) -> None:
    """experiments/sweeps/quickstart.yaml (what `make demo` runs), every field as the user
    wrote it except fewer steps and samples and one launch a point (8 steps are too few for
    an interval; the launches are tests/test_until_known.py's), through the CLI into a
    temporary store."""
    spec = yaml.safe_load((ROOT / "experiments" / "sweeps" / "quickstart.yaml").read_text())
    spec["fixed"].update(max_steps=8, train_samples=1024, eval_samples=128, eval_batch_size=128)
    spec["fixed"].update(until_known_launches=1)
    spec["notebook"] = str(ROOT / spec["notebook"])
    short = tmp_path / "quickstart.yaml"
    short.write_text(yaml.safe_dump(spec))
    done = workbench("sweep", str(short), "--no-progress", "--output-dir", str(tmp_path / "s"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    sweep = tmp_path / "s" / spec["name"]
    records = [json.loads(p.read_text()) for p in sweep.glob("*/run.json")]
    layouts = sorted(
        (r["config"]["model"], r["config"]["world_size"], r["config"]["per_device_batch_size"])
        for r in records
    )
    assert layouts == [
        ("mlp", 1, 32),
        ("mlp", 2, 32),
        ("transformer", 1, 32),
        ("transformer", 2, 32),
    ]
    assert {r["status"] for r in records} == {"completed"}
    assert len(list(sweep.glob("*/notebook.ipynb"))) == 4
    summary = (sweep / "summary.csv").read_text().splitlines()
    assert len(summary) == 1 + 4, summary  # header and one row per point
    assert "<h2>Scaling</h2>" in (sweep / "report.html").read_text()
    finding = done.stdout.split("finding:\n", 1)[-1]
    for model in ("transformer", "mlp"):  # one sentence per curve, each naming its model
        assert f"model={model}" in finding and "2 ranks: " in finding, done.stdout
