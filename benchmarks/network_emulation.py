# ruff: noqa: E402  (the imports follow the sys.path line that makes the script runnable)
"""The scaling model on networks it never saw: 2-rank runs inside a Linux network namespace whose
loopback is shaped with ``tc qdisc ... tbf``, the model fitted on some link rates and checked on
others.

For each link rate a fresh namespace (``ip netns``, root needed), its loopback shaped by tbf, and
one ``workbench run`` of the mlp at 2 ranks inside it (each run measures its own allreduce bus
bandwidth after its last step). Fit: the run at the fit rate is the model's base (its compute
= step less the measured exposed communication, its overlap from its own sampled steps).
Check: for each held-out rate, the model's predicted throughput on that link's bus bandwidth
(the micro-benchmark run there after the last step: what ``workbench predict --busbw`` takes
from a target cluster), against the throughput measured there. Prints predicted
vs measured per point and the median and worst absolute error (goal: median <= 10 %, worst
<= 20 % of the measured throughput).

    python benchmarks/network_emulation.py            # 5 rates, 60 steps per run (a few min)
    python benchmarks/network_emulation.py --smoke    # 2 rates, 30 steps (about half a minute)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd

from workbench.analysis import run_table
from workbench.analysis.measured.windows import measured_steps, measured_window, sampled_comm
from workbench.analysis.model.network import NetworkModel, ring_allreduce_time
from workbench.analysis.model.scaling_model import predict_scaling
from workbench.store.load import iter_run_dirs, load_runs, load_traces

#: Link rates (Mbit/s): the fit one (the model's base), then the held-out ones.
FULL = {"fit": [4000], "check": [2000, 1000, 400, 200]}
SMOKE = {"fit": [800], "check": [400]}
#: An mlp with about 1.1 MB of fp32 gradients (32x512 + 512x512 + 512x4 weights): its allreduce
#: is bandwidth-bound on these links, so the throughput follows the network (the default mlp's
#: 26 kB is latency-bound: every rate looks alike).
MODEL_OPTIONS = '{"hidden_dim": 512}'


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


def run_at(rate_mbit: int, out: Path, steps: int, model: str) -> str:
    """One 2-rank run inside a namespace whose loopback is shaped to ``rate_mbit``."""
    ns = f"wbemu{os.getpid()}-{rate_mbit}"
    _sh("ip", "netns", "add", ns)
    try:
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        _sh(
            "ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "lo", "root", "tbf",
            "rate", f"{rate_mbit}mbit", "burst", "1mb", "latency", "200ms",
        )  # fmt: skip
        name = f"{model}-{rate_mbit}mbit"
        cmd = [
            "ip", "netns", "exec", ns, sys.executable, "-m", "workbench.cli", "run",
            "--model", model, "--model-options", MODEL_OPTIONS, "--world-size", "2",
            "--steps", str(steps),
            "--sweep", "emulation", "--run-name", name, "--output-dir", str(out), "--no-progress",
        ]  # fmt: skip
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}  # gloo's device: the shaped loopback
        subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=ROOT)
        return name
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def measure(names: dict[int, str], out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per rate: measured training samples/s and the run's own busbw; and all the steps."""
    runs = load_runs(out, ["emulation"])
    steps = load_traces(list(iter_run_dirs(out, ["emulation"])), "steps")
    table = run_table(runs, steps, group_by=[]).set_index("run_id")
    rows = []
    for rate, name in names.items():
        run_id = runs.loc[runs["run_name"] == name, "run_id"].iloc[0]
        rows.append(
            {
                "rate_mbit": rate,
                "run_id": run_id,
                "measured": float(table.loc[run_id, "samples_per_s"]),
                "busbw": float(runs.set_index("run_id").loc[run_id, "network_busbw_bytes_per_s"]),
            }
        )
    return pd.DataFrame(rows).set_index("rate_mbit"), steps


def _hidden_seconds_model(base: pd.DataFrame) -> Any:
    """The contrast model: the base hides a fixed number of seconds of allreduce behind its
    backward (span - exposed on its sampled steps), whatever the allreduce's length; exposed
    = max(ring - hidden, 0). Returns busbw -> predicted samples/s at 2 ranks."""
    m = measured_steps(base)
    sampled = sampled_comm(m)
    exposed = float(sampled["comm_exposed_s"].median())
    hidden = float(sampled["comm_s"].median()) - exposed
    window = measured_window(base).iloc[0]
    compute = float(window["wall_step_s"]) - exposed
    nbytes = float(m["comm_bytes"].median())
    per_step = float(window["samples"] / window["steps"])

    def predicted(busbw: float) -> float:
        ring = float(ring_allreduce_time(nbytes, 2, busbw, 0.0))
        return per_step / (compute + max(ring - hidden, 0.0))

    return predicted


def held_out_table(plan: dict[str, list[int]], steps_per_run: int, model: str) -> pd.DataFrame:
    """Run every rate of ``plan`` (``fit``: the base, ``check``: held out), fit on the base and
    predict each rate from its own measured bus bandwidth: one row per rate with predicted and
    measured training samples/s and the relative error (predicted / measured - 1)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        names = {r: run_at(r, out, steps_per_run, model) for r in plan["fit"] + plan["check"]}
        points, steps = measure(names, out)
    base_rate = max(plan["fit"])
    base = steps[steps["run_id"] == points.loc[base_rate, "run_id"]]
    hidden_model = _hidden_seconds_model(base)
    rows: list[dict[str, Any]] = []
    for rate in plan["fit"] + plan["check"]:
        # the network as measured there (what --busbw takes from the target cluster): the
        # run's own allreduce micro-benchmark at its bucket sizes; the workload never ran there
        busbw = float(points.loc[rate, "busbw"])
        net = NetworkModel(name=f"{rate}mbit", bandwidth_bytes_per_s=busbw, latency_s=0.0)
        predicted = float(predict_scaling(base, net, [2])["samples_per_s"].iloc[0])
        measured = float(points.loc[rate, "measured"])
        rows.append(
            {
                "rate_mbit": rate,
                "role": "base" if rate in plan["fit"] else "held out",
                "busbw_MBps": busbw / 1e6,
                "predicted_samples_per_s": predicted,
                "measured_samples_per_s": measured,
                "error": predicted / measured - 1,
                "predicted_hidden_s": hidden_model(busbw),
                "error_hidden_s": hidden_model(busbw) / measured - 1,
            }
        )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="2 rates, 30 steps")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--steps", type=int)
    args = parser.parse_args(argv)
    plan = SMOKE if args.smoke else FULL
    table = held_out_table(plan, args.steps or (30 if args.smoke else 60), args.model)
    base_rate = max(plan["fit"])
    print(f"base: the {base_rate} Mbit/s run; each point's network: its own micro-benchmark")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    for column, model in (("error", "overlap fraction"), ("error_hidden_s", "hidden seconds")):
        held = table.loc[table["role"] == "held out", column].abs()
        print(
            f"held out, {model} model: median |error| {held.median():.1%}, worst {held.max():.1%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
