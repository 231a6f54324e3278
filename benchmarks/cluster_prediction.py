"""Predictions checked where they were never fitted: 4 and 8 nodes of the emulated cluster
(``scripts/emulated-cluster.sh``: Slurm nodes in network namespaces, each link shaped by tbf),
fitted on 1 and 2 nodes at one link rate.

For each regime (gradients small enough to be latency-bound, large enough to be
bandwidth-bound) the planted workload (``model="planted"``: its compute does not depend on how
many ranks share the cores) runs one rank a node through the real Slurm back end:

- at the fit rate, on 1 and 2 nodes (the sweep ``workbench predict`` reads), and on 4 and 8;
- at each other rate, on 2 nodes (that link's bus bandwidth, measured by the run's own
  micro-benchmark at the gradient's buckets: what a user brings with ``--busbw``), 4 and 8.

Every 4- and 8-node point is then predicted by ``workbench.analysis.predict.predict`` from the
fit sweep and the point's link's bus bandwidth, and compared with its measured training
samples/s: ``error = predicted / measured - 1``. The goal: median |error| <= 5 %, worst <= 10 %,
over at least 8 held-out points. Needs root, tc, nsenter, Slurm and munge.

Usage: ``python benchmarks/cluster_prediction.py [--smoke] [--out F]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
from _common import ROOT, machine, write_result

from workbench.analysis.network import NetworkModel
from workbench.analysis.predict import predict, target_network
from workbench.store.files import read_json
from workbench.store.load import iter_run_dirs, load_runs, load_traces

SCRIPT = ROOT / "scripts" / "emulated-cluster.sh"
#: Gradient KiB and planted compute (us) per regime: 16 KiB in one bucket is a few messages'
#: latency; 8 MiB takes 80-330 ms on the links below.
REGIMES = {
    "latency-bound": {"gradient_kib": 16, "forward_us": 4000, "backward_us": 8000},
    "bandwidth-bound": {"gradient_kib": 8192, "forward_us": 20000, "backward_us": 40000},
}
FULL = {"fit": 400, "others": [200, 800], "nodes": [4, 8], "steps": 24}
#: A check of the harness: one regime at the fit rate, fitted on 1 and 2 nodes, one held-out size.
SMOKE = {"fit": 400, "others": [], "nodes": [3], "steps": 10, "regimes": ["bandwidth-bound"]}


def _cluster(emu: Path, *args: str) -> None:
    env = {**os.environ, "WORKBENCH_EMU_DIR": str(emu)}
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"emulated-cluster.sh {' '.join(args)}: {done.stderr[-2000:]}")


def _run(emu: Path, store: Path, sweep: str, nodes: int, options: dict, steps: int) -> None:
    """One run of the planted workload, one rank a node, through ``workbench run``."""
    env = {**os.environ, "SLURM_CONF": str(emu / "slurm.conf")}
    argv = ["run", "--executor", "slurm", "--partition", "emu", "--poll-s", "1", "--no-progress"]
    argv += ["--nodes", str(nodes), "--tasks-per-node", "1", "--model", "planted"]
    argv += ["--model-options", json.dumps(options), "--per-device-batch-size", "16"]
    argv += ["--steps", str(steps), "--warmup-steps", "4", "--time-min", "10"]
    argv += ["--trace-comm-every-steps", "1", "--sweep", sweep, "--output-dir", str(store)]
    argv += ["--run-name", f"n{nodes}"]
    subprocess.run(
        [sys.executable, "-m", "workbench.cli", *argv],
        check=True,
        capture_output=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )


def _sweeps(emu: Path, store: Path, plan: dict[str, Any]) -> None:
    """Every run of the plan: sweep ``<regime>-<rate>`` holds one link rate's runs."""
    regimes = plan.get("regimes", list(REGIMES))
    for rate in [plan["fit"], *plan["others"]]:
        _cluster(emu, "up", "--nodes", str(max(plan["nodes"])), "--rate", f"{rate}mbit")
        sizes = [1, 2, *plan["nodes"]] if rate == plan["fit"] else [2, *plan["nodes"]]
        for regime in regimes:
            for nodes in sizes:
                _run(emu, store, f"{regime}-{rate}", nodes, REGIMES[regime], plan["steps"])
                print(f"  {regime}, {rate} Mbit/s, {nodes} node(s): done", flush=True)


def held_out(store: Path, plan: dict[str, Any]) -> pd.DataFrame:
    """One row per held-out point: predicted and measured samples/s and the error."""
    rows = []
    for regime in plan.get("regimes", list(REGIMES)):
        fit = f"{regime}-{plan['fit']}"
        runs = load_runs(store, [fit])
        # one curve of 1 and 2 nodes (one rank a node: the node count is the world size)
        runs = runs[runs["world_size"] <= 2].drop(columns="nodes")
        steps = load_traces([Path(p) for p in runs["path"]], "steps")
        for rate in [plan["fit"], *plan["others"]]:
            sweep = f"{regime}-{rate}"
            these = load_runs(store, [sweep]).set_index("world_size")
            measured = _throughput(these, list(iter_run_dirs(store, [sweep])))
            at_two = _network(these, 2)
            for n in plan["nodes"]:
                at_n = _network(these, n)
                nets = {
                    "": _busbw_only(at_n),
                    "_hop": _with_hops(at_n),
                    "_2node": _busbw_only(at_two),
                }
                row = {"regime": regime, "rate_mbit": rate, "nodes": n}
                row["busbw_MBps"] = at_n["busbw_bytes_per_s"] / 1e6
                row["hop_us"] = at_n["latency_s"] * 1e6
                row["measured"] = measured[n]
                for k, net in nets.items():
                    got = predict(runs, steps, [n], net).dropna(subset=["samples_per_s"])
                    row[f"predicted{k}"] = float(got["samples_per_s"].iloc[0])
                    row[f"error{k}"] = row[f"predicted{k}"] / measured[n] - 1
                rows.append(row)
    return pd.DataFrame(rows)


def _network(runs: pd.DataFrame, world_size: int) -> dict[str, Any]:
    """The network the run at ``world_size`` measured before its first step (its own
    micro-benchmark: what nccl-tests on the target nodes would give a user)."""
    return dict(read_json(Path(runs.loc[world_size, "path"]) / "run.json")["network"])


def _busbw_only(network: dict[str, Any]) -> NetworkModel:
    """What a user brings with ``--busbw``: the bus bandwidth at the gradient's buckets."""
    return target_network(busbw_bytes_per_s=float(network["busbw_bytes_per_s"]))


def _with_hops(network: dict[str, Any]) -> NetworkModel:
    """The same measurement split in two: the per-hop latency (a one-element allreduce over
    its 2(n-1) hops) and the bandwidth of the rest of the buckets' time, so the model's
    2(N-1) hops per bucket grow with the world size as messages do."""
    n, hop = int(network["world_size"]), float(network["latency_s"])
    buckets = len(network["bucket_sizes_bytes"])
    rest = float(network["time_s"]) - 2 * (n - 1) * hop * buckets
    if not rest > 0:  # all latency: no bandwidth to tell, the bus bandwidth as measured
        return _busbw_only(network)
    busbw = float(network["bytes"]) / rest * 2 * (n - 1) / n
    return target_network(busbw_bytes_per_s=busbw, latency_s=hop)


def _throughput(runs: pd.DataFrame, dirs: list[Path]) -> dict[int, float]:
    """Measured training samples/s per world size, as the scaling table measures it."""
    from workbench.analysis.scaling import run_table

    steps = load_traces(dirs, "steps")
    table = run_table(runs.reset_index(), steps, group_by=[])
    return {int(r.world_size): float(r.samples_per_s) for r in table.itertuples()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one regime at the fit rate, 3 nodes")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    plan = SMOKE if args.smoke else FULL
    folder = Path(tempfile.mkdtemp(prefix="wb-emu-", dir="/tmp"))
    folder.chmod(0o755)  # munged's socket must be reachable by all
    emu = folder / "emu"
    try:
        _sweeps(emu, folder / "store", plan)
        table = held_out(folder / "store", plan)
    finally:
        _cluster(emu, "down")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    where = f"held out ({len(table)} points at {', '.join(map(str, plan['nodes']))} nodes)"
    columns = (
        ("error", "bus bandwidth at the point"),
        ("error_hop", "bus bandwidth + hop latency at the point"),
        ("error_2node", "bus bandwidth at 2 nodes"),
    )
    for column, model in columns:
        errors = table[column].abs()
        print(f"{where}, {model}: median |error| {errors.median():.1%}, worst {errors.max():.1%}")
    result = {"machine": machine(), "points": table.to_dict("records")}
    write_result(args.out, "cluster_prediction", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
