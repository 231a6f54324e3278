"""The same answer for less: a study measured until known against the fixed-length study a user
would otherwise run, side by side in one benchmark run, through the terminal.

- fixed: ``workbench scale --world-sizes 1,2,4 --steps 500`` three times into one sweep (three
  repeats a point, each 500 steps: the way a careful study is written by hand);
- adaptive: ``workbench scale --world-sizes 1,2,4 --until-known 5% --until-known-launches 3``
  into another (each run until its throughput is known to +-5 %, a point launched again in
  rounds while its launches disagree), between the fixed study's first and second repeats.

Each study's speedups at 2 and 4 ranks come from its stored sweep through the public API
(``load_runs``, ``load_traces``, ``scaling_table``), its cost from the runs' own ``device_s``.
Reported: adaptive / fixed device-seconds, and each speedup's difference (the goal: within 2 %
at <= 1/5 of the device-seconds).

Usage: ``python benchmarks/adaptive_study.py [--smoke] [--model transformer] [--out F]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, write_result

from workbench import load_runs, load_traces
from workbench.analysis import scaling_table

FULL = {"sizes": "1,2,4", "steps": 500, "repeats": 3, "until": "5%", "launches": 3}
FULL["executor"] = "local"
SMOKE = {"sizes": "1,2", "steps": 20, "repeats": 1, "until": "20%", "launches": 1}
# the smoke checks the script's path, not the figure: warm pool workers start in a tenth of a second
SMOKE["executor"] = "pool"


def _scale(store: Path, sweep: str, model: str, sizes: str, *flags: str) -> float:
    """One ``workbench scale`` into ``store``/``sweep``; its wall time, seconds."""
    argv = [sys.executable, "-m", "workbench.cli", "scale", "--model", model]
    argv += ["--world-sizes", sizes, "--sweep", sweep, "--output-dir", str(store)]
    argv += ["--per-device-batch-size", "32", "--eval-samples", "64", "--no-progress", *flags]
    start = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return time.monotonic() - start


def _study(store: Path, sweep: str) -> dict[str, Any]:
    """A stored study's speedups by world size, its launches and device-seconds."""
    runs = load_runs(store, [sweep])
    table = scaling_table(runs, load_traces(list(runs["path"]), "steps")).set_index("world_size")
    return {
        "speedup": {int(n): float(table.loc[n, "speedup"]) for n in table.index},
        "launches": len(runs),
        "device_s": float(runs["device_s"].sum()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="mlp, 1 and 2 ranks, short runs")
    parser.add_argument("--model", default="transformer", help="built-in model (transformer)")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    plan = SMOKE if args.smoke else FULL
    model = "mlp" if args.smoke else args.model
    store = Path(tempfile.mkdtemp(prefix="wb-adaptive-"))
    on = ["--executor", plan["executor"]]
    fixed = ["--steps", str(plan["steps"]), "--train-samples", str(32 * 4 * plan["steps"]), *on]
    adaptive = ["--until-known", plan["until"], "--until-known-launches", str(plan["launches"])]
    adaptive += on
    wall = {"fixed": 0.0, "adaptive": 0.0}
    for k in range(plan["repeats"]):
        wall["fixed"] += _scale(store, "fixed", model, plan["sizes"], *fixed)
        if k == 0:  # between the fixed study's first and second repeats
            wall["adaptive"] = _scale(store, "adaptive", model, plan["sizes"], *adaptive)
    studies = {name: _study(store, name) for name in ("fixed", "adaptive")}
    ratio = studies["adaptive"]["device_s"] / studies["fixed"]["device_s"]
    print(f"store: {store}")
    for name, s in studies.items():
        said = ", ".join(f"{n} ranks {v:.3f}x" for n, v in s["speedup"].items() if n > 1)
        print(f"{name}: {said}; {s['launches']} launches, {s['device_s']:,.0f} device-seconds")
    gaps = {
        n: studies["adaptive"]["speedup"][n] / v - 1
        for n, v in studies["fixed"]["speedup"].items()
        if n > 1
    }
    print(
        f"adaptive / fixed device-seconds: {ratio:.3f}; speedup, adaptive / fixed - 1: "
        + ", ".join(f"{n} ranks {g:+.1%}" for n, g in gaps.items())
    )
    write_result(
        args.out,
        "adaptive_study",
        {"plan": plan, "model": model, "studies": studies, "device_s_ratio": ratio,
         "speedup_gap": gaps, "wall_s": wall},
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
