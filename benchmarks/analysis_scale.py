"""How long analysing a large sweep takes, against reading its Parquet files with pyarrow alone.

Builds a sweep in the store's own layout (``_scale_store``: runs at 1, 2, 4 ... ``--max-ranks``
ranks x ``--steps`` steps, DDP's timers sampled every 50 steps as the tracer writes them, one
planted slow rank at 1.35x in the largest run), then measures, each in a fresh process (wall time
and peak RSS):

1. pyarrow alone: read every file of the store (the floor for any loader);
2. the straggler ranking through the engine (``stragglers_in_store``), and each run's measured
   window and throughput (``measured_window_in_store``);
3. the straggler ranking the frames way (``load_traces`` then ``stragglers``), with ``--frames``;
4. ``workbench report`` end to end (with ``--report``): time, peak RSS, HTML size, and whether
   the finding names the planted straggler;
5. the floor of any report that reads the step rows when it runs (with ``--floor``): import the
   report's modules, then read only the columns the analysis uses (every step column but
   :data:`UNREAD`) once, and nothing else (no figure): with pyarrow, and in one engine pass
   taking each column's largest value.

With ``--repeat N`` every stage runs N rounds (the order reversed every other round), each
timed against the same round's pyarrow read: the median time and ratio and the ratios' range.
``--digested``: only the stages that read a store's digests (the read, the report with digests
present, the Dashboard's first screen; the digests are built first where missing).
``--against DIR``: each of those stages also runs on the code of the checkout ``DIR`` (the code
before), in the same rounds, and each round's ratio now / before is printed.

Prints each figure and the ratios to (1). ``--smoke``: a small sweep (seconds). Usage:
``python benchmarks/analysis_scale.py [--smoke] [--max-ranks 512 --steps 10000] [--store DIR]
[--report] [--frames] [--floor] [--digested] [--against DIR] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _scale_store import SWEEP, planted, write_sweep  # noqa: E402

from workbench.store.digests.on_disk import DIGEST_DIR, digest_bytes  # noqa: E402

#: The step columns no query of the analysis reads (the rest are read by the report's passes).
UNREAD = ("local_rank", "epoch", "tokens", "lr", "mem_alloc_bytes")

#: Each measured stage, run as ``python -c`` in a fresh process: it prints one JSON line with
#: its wall time (s), the process's CPU time (s: on a loaded host, less noisy than the wall
#: time) and peak RSS (MiB).
_STAGE = """
import json, resource, sys, time
from pathlib import Path
root = Path(sys.argv[1])
dirs = sorted(p for p in (root / {sweep!r}).iterdir() if p.is_dir())
start = time.perf_counter()
out = {{}}
{body}
out["seconds"] = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_SELF)
out["cpu_s"] = usage.ru_utime + usage.ru_stime  # the whole process, import included
out["peak_rss_mib"] = usage.ru_maxrss / 1024
print(json.dumps(out, default=str))
"""

STAGES = {
    "pyarrow read": """
import pyarrow.parquet as pq
files = sorted(root.glob("*/*/traces/steps-rank*.parquet"))
out["rows"] = sum(pq.read_table(f).num_rows for f in files)
out["files"] = len(files)
""",
    "stragglers (engine)": """
from workbench.analysis.stragglers.slow_ranks import stragglers_in_store
found = stragglers_in_store(dirs)
out["found"] = found[["run_id", "rank", "ratio"]].values.tolist()
""",
    "window (engine)": """
from workbench.analysis.measured.windows import measured_window_in_store
window = measured_window_in_store(dirs)
out["samples_per_s"] = window[["run_id", "samples_per_s"]].values.tolist()
""",
    "stragglers (frames)": """
from workbench.analysis.stragglers.slow_ranks import stragglers
from workbench.store.load import load_traces
found = stragglers(load_traces(dirs))
out["found"] = found[["run_id", "rank", "ratio"]].values.tolist()
""",
    "floor: pyarrow columns": """
import pyarrow.parquet as pq
import workbench.ui.report  # noqa: F401  (the report's modules: analysis, engine, figures)
from workbench.schema import trace_columns
columns = [c for c in trace_columns("steps") if c not in {unread!r}]
files = sorted(root.glob("*/*/traces/steps-rank*.parquet"))
out["rows"] = sum(pq.read_table(f, columns=columns).num_rows for f in files)
out["columns"] = len(columns)
""",
    "floor: one engine pass": """
import workbench.ui.report  # noqa: F401
from workbench.schema import trace_columns
from workbench.store.engine import steps_view
columns = [c for c in trace_columns("steps") if c not in {unread!r}]
con = steps_view(dirs)
largest = ", ".join(f"max({{c}})" for c in columns)
row = con.execute(f"SELECT count(*), {{largest}} FROM steps").fetchone()
out["rows"] = row[0]
""",
    "report, digests built": """
from workbench.ui.report import report_from_store
html = report_from_store(root / {sweep!r}, root / "report.html")
out["html_mb"] = html.stat().st_size / 1e6
out["straggler_named"] = {expect!r} in html.read_text()
out["from_digests"] = "read from their digests" in html.read_text()
""",
    "report, digests present": """
from workbench.ui.report import report_from_store
html = report_from_store(root / {sweep!r}, root / "report.html")
out["html_mb"] = html.stat().st_size / 1e6
out["straggler_named"] = {expect!r} in html.read_text()
out["from_digests"] = "read from their digests" in html.read_text()
""",
    "report, from the rows": """
from workbench.analysis.stragglers.slow_ranks import stragglers_in_store
from workbench.analysis.measured.stored import StoredSteps
from workbench.analysis.run_digests import RULES
from workbench.store.digests.serve import open_rows
from workbench.store.load import load_runs, load_traces
from workbench.ui.report import write_report
runs = load_runs(root, [{sweep!r}])
evals = load_traces(dirs, "eval")
with StoredSteps(open_rows(dirs, RULES, evals)) as steps:
    found = stragglers_in_store(dirs, stored=steps)
    html = write_report(runs, steps, evals, root / "rows.html", found=found)
out["html_mb"] = html.stat().st_size / 1e6
out["straggler_named"] = {expect!r} in html.read_text()
""",
    "dashboard, first screen": """
from workbench.ui.dashboard import Dashboard
board = Dashboard(output_dir=root)
fig, table = board.build()
out["figure_traces"] = len(fig.spec["data"] if hasattr(fig, "spec") else fig.data)
out["runs_in_table"] = 0 if table is None else len(table)
out["straggler_named"] = {expect!r} in board.finding.value
""",
}
#: The stages that read the runs' digests: the first removes them, so the report builds them.
DIGEST_STAGES = ["report, digests built", "report, digests present", "dashboard, first screen"]


#: A stage run on the code of ``--against``: its name ends so.
BEFORE = " (before)"


def stage(
    name: str, root: Path, expect: str = "", against: Path | None = None
) -> dict[str, object]:
    """Run one stage in a fresh process; its figures. ``expect``: what the finding must say.
    A name ending in :data:`BEFORE` runs the stage on the code of ``against``."""
    code_root = ROOT
    if name.endswith(BEFORE):
        name, code_root = name.removesuffix(BEFORE), against or ROOT
    if name == DIGEST_STAGES[0]:  # a store without digests: this report builds them
        for folder in root.glob(f"{SWEEP}/*/{DIGEST_DIR}"):
            shutil.rmtree(folder)
    body = STAGES[name].format(sweep=SWEEP, expect=expect, unread=UNREAD)
    code = _STAGE.format(sweep=SWEEP, body=body)
    done = subprocess.run(
        [sys.executable, "-c", code, str(root)],
        capture_output=True,
        text=True,
        cwd=str(code_root),  # its own package first, whatever the working directory
        env={"PYTHONPATH": str(code_root), "PATH": "/usr/bin:/bin"},
    )
    if done.returncode:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a small sweep: seconds")
    parser.add_argument("--max-ranks", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--store", type=Path, help="build (or reuse) the store here")
    parser.add_argument(
        "--report",
        action="store_true",
        help="also time `workbench report` (building the runs' digests, then reading them), the "
        "Dashboard's first screen, and the report from the rows",
    )
    parser.add_argument(
        "--comm-every",
        type=int,
        default=50,
        help="DDP's timers every N steps in the store built (1: on every step)",
    )
    parser.add_argument("--frames", action="store_true", help="also time the frames path")
    parser.add_argument(
        "--floor", action="store_true", help="also time the least a report reading the rows does"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds; each stage's ratio to the same round's read"
    )
    parser.add_argument(
        "--digested",
        action="store_true",
        help="only the read, the report with digests present and the Dashboard's first screen",
    )
    parser.add_argument(
        "--against", type=Path, help="a checkout of the code before: its digested stages too"
    )
    args = parser.parse_args()
    if args.smoke:
        args.max_ranks, args.steps = 8, 300
        args.report = args.frames = args.floor = True
    counts = [2**i for i in range(args.max_ranks.bit_length()) if 2**i <= args.max_ranks]
    with tempfile.TemporaryDirectory() as tmp:
        root = args.store or Path(tmp)
        if not (root / SWEEP).exists():
            write_sweep(root, counts, args.steps, every=args.comm_every)
        names = ["pyarrow read", "stragglers (engine)", "window (engine)"]
        names += ["stragglers (frames)"] * args.frames
        names += [*DIGEST_STAGES, "report, from the rows"] * args.report
        names += ["floor: pyarrow columns", "floor: one engine pass"] * args.floor
        run_id, rank = planted(counts)
        expect = f"rank {rank} of run {run_id} is a straggler"
        if args.digested or args.against:
            names = ["pyarrow read", *DIGEST_STAGES[1:]]
            names += [n + BEFORE for n in DIGEST_STAGES[1:]] * bool(args.against)
            stage(DIGEST_STAGES[1], root, expect)  # builds any digest missing: untimed
        stage("pyarrow read", root)  # warm the page cache: untimed
        rounds = []
        for round_ in range(max(1, args.repeat)):  # the read beside each stage, order swapped
            order = names if round_ % 2 == 0 else names[::-1]
            rounds.append({name: stage(name, root, expect, args.against) for name in order})
        folders = [d for d in (root / SWEEP).iterdir() if d.is_dir()]
        digests = sum(digest_bytes(d) for d in folders)
        traces = sum(p.stat().st_size for p in (root / SWEEP).glob("*/traces/*"))
    got = rounds[-1]

    def ratio(r: dict[str, dict[str, object]], name: str) -> float:
        return float(r[name]["seconds"]) / float(r["pyarrow read"]["seconds"])  # type: ignore[arg-type]

    ratios = {name: sorted(ratio(r, name) for r in rounds) for name in names}
    rows = got["pyarrow read"]["rows"]
    print(
        f"{rows:,} step rows in {got['pyarrow read']['files']} files "
        f"({len(counts)} runs, 1 to {max(counts)} ranks x {args.steps:,} steps)"
    )
    for name in names:
        seconds = sorted(float(r[name]["seconds"]) for r in rounds)
        peak = max(float(r[name]["peak_rss_mib"]) for r in rounds)
        extra = ""
        if "html_mb" in got[name]:
            extra = f", HTML {got[name]['html_mb']:.1f} MB"
        ratio = ratios[name]
        spread = f" ({ratio[0]:.2f}-{ratio[-1]:.2f})" if len(ratio) > 1 else ""
        each = f" ({seconds[0]:.2f}-{seconds[-1]:.2f} s)" if len(seconds) > 1 else ""
        cpu = sorted(float(r[name].get("cpu_s", "nan")) for r in rounds)  # type: ignore[arg-type]
        print(
            f"  {name:<24} {seconds[len(seconds) // 2]:8.2f} s{each}  "
            f"{ratio[len(ratio) // 2]:6.2f}x pyarrow{spread}  peak RSS {peak:7.0f} MiB{extra}"
            f"  CPU {cpu[len(cpu) // 2]:.2f} s ({cpu[0]:.2f}-{cpu[-1]:.2f})"
        )
    for name in names:
        if name.endswith(BEFORE):
            for what in ("seconds", "cpu_s"):
                now = sorted(
                    float(r[name.removesuffix(BEFORE)][what]) / float(r[name][what])  # type: ignore[arg-type]
                    for r in rounds
                )
                each = ", ".join(f"{v:.2f}" for v in now)
                print(f"  {name.removesuffix(BEFORE)}: now / before, {what}, per round: {each}")
    if "stragglers (engine)" in got:
        found = got["stragglers (engine)"]["found"]
        print(f"stragglers found: {found}")
        assert [r[:2] for r in found] == [[run_id, rank]], "planted straggler not found"
    for name in names[1:]:
        if "straggler_named" in got[name] and not args.report:
            assert got[name]["straggler_named"], f"{name} does not name the planted straggler"
    if args.report:
        share = 100 * digests / traces
        print(f"digests: {digests / 2**20:.2f} MiB, {share:.2f} % of the trace files")
        for name in [*DIGEST_STAGES, "report, from the rows"]:
            named = got[name]["straggler_named"]
            print(f"{name}: names the planted straggler: {named}")
            assert named, f"{name} does not name the planted straggler"
        for name in DIGEST_STAGES[:2]:
            assert got[name]["from_digests"], f"{name} did not read the runs' digests"


if __name__ == "__main__":
    main()
