"""Predictions checked where they were never fitted: 4 and 8 nodes of the emulated cluster
(``scripts/emulated-cluster.sh``: Slurm nodes in network namespaces, each link shaped by tbf),
fitted on 1 and 2 nodes at one link rate, everything through the commands a user types.

For each regime (gradients small enough to be latency-bound, large enough to be
bandwidth-bound) a plain training script with planted costs (``scripts/planted_ddp.py``: DDP only
when distributed; its compute does not depend on how many ranks share the cores) runs one rank
a node through the real Slurm back end:

- the fit: ``workbench scale --executor slurm --tasks-per-node 1 --world-sizes 1,2 --script S``
  at the fit rate (sweep ``<regime>-fit``): a 1-node and a 2-node run, one curve;
- held out: ``workbench run --executor slurm --nodes N --tasks-per-node 1 --script S`` at each
  held-out rate and node count (sweep ``<regime>-held-<rate>``).

Each held-out run is predicted by ``workbench predict <regime>-fit --world-sizes 2,N --busbw B
--json``, B the bus bandwidth the run measured itself (its micro-benchmark at the gradient's
buckets: what nccl-tests on the target nodes would give a user), and compared with its measured
training samples/s (the scaling table of its stored sweep): ``error = predicted / measured -
1``. A second prediction adds the hop latency the run measured (``--latency``, the busbw then
of the bytes alone). The goal, bandwidth-bound: median |error| <= 5 %, worst <= 10 %. Needs
root, tc, nsenter, Slurm and munge.

With ``--strategy fsdp`` the workload is the built-in planted model (the same planted compute
and gradient bytes, its layers FSDP's blocks) run with ``--strategy fsdp``: fitted on 1 and 2
nodes (sweep ``<regime>-fit``), held out on 4 nodes at each held-out rate, each point predicted
on its own FSDP collectives' bus bandwidth (all-gather and reduce-scatter, nccl-tests' terms).
A DDP study of the same model at 1 and 2 nodes (sweep ``<regime>-ddp-fit``) predicts the same
held-out FSDP runs too (``workbench predict ... --strategy fsdp``: ``error_from_ddp``), goal
<= 10 %. ``--strategy fsdp --script``: the same study of a user's FSDP2 script instead
(``scripts/planted_ddp.py --fsdp``: each planted layer ``fully_shard``ed, then the root; its
DDP study the same script without ``--fsdp``), through ``--script`` as a user runs it.

Usage: ``python benchmarks/cluster_prediction.py [--smoke] [--regime R] [--ddp-always]
[--strategy fsdp [--script]] [--out F]``;
``--from-store FOLDER`` predicts and compares again the store a run left (no cluster).
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

from workbench import load_runs, load_traces
from workbench.analysis import scaling_table

EMULATED = ROOT / "scripts" / "emulated-cluster.sh"
SCRIPT = Path(__file__).resolve().parent / "scripts" / "planted_ddp.py"
#: The script's arguments per regime: 16 KiB in one bucket is a few messages' latency; 8 MiB
#: takes 80-330 ms on the links below.
REGIMES = {
    "latency-bound": "--gradient-kib 16 --forward-us 4000 --backward-us 8000".split(),
    "bandwidth-bound": "--gradient-kib 8192 --forward-us 20000 --backward-us 40000".split(),
}
#: Link rates (Mbit/s) and node counts: fitted on 1 and 2 nodes at ``fit``, held out at ``held``
#: rates on ``nodes`` nodes.
FULL = {"fit": 400, "held": [200, 800], "nodes": [4, 8], "steps": 24}
#: A check of the harness: one regime, held out at the fit rate on 3 nodes (3 runs in all).
SMOKE = {
    "fit": 400,
    "held": [400],
    "nodes": [3],
    "steps": 10,
    "regimes": ["bandwidth-bound"],
    "hop": False,  # one prediction a point: each `workbench predict` is a process of its own
}
#: ``--strategy fsdp``: the planted model's options per regime (the script's costs above).
PLANTED = {
    "latency-bound": {"layers": 4, "forward_us": 4000, "backward_us": 8000, "gradient_kib": 16},
    "bandwidth-bound": {
        "layers": 4,
        "forward_us": 20000,
        "backward_us": 40000,
        "gradient_kib": 8192,
    },
}
#: ``--strategy fsdp``: held out on 4 nodes only (and the smoke on 3).
FSDP_FULL = {**FULL, "nodes": [4], "hop": False}
SLURM = ["--executor", "slurm", "--partition", "emu", "--poll-s", "1", "--time-min", "10"]


def _cluster(emu: Path, *args: str) -> None:
    env = {**os.environ, "WORKBENCH_EMU_DIR": str(emu)}
    done = subprocess.run(["bash", str(EMULATED), *args], capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"emulated-cluster.sh {' '.join(args)}: {done.stderr[-2000:]}")


def _workbench(emu: Path, *argv: str) -> str:
    """``workbench ARGV`` as typed at the cluster's login node; its standard output."""
    env = {**os.environ, "SLURM_CONF": str(emu / "slurm.conf")}
    cmd = [sys.executable, "-m", "workbench.cli", *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
    if done.returncode:
        tail = (done.stderr or done.stdout)[-3000:]
        raise RuntimeError(f"workbench {' '.join(argv)} exited {done.returncode}: {tail}")
    return done.stdout


def _built_in(store: Path, sweep: str, steps: int, regime: str, strategy: str) -> list[str]:
    """The flags every run of a built-in planted study shares (``--strategy fsdp`` mode)."""
    argv = [*SLURM, "--no-progress", "--model", "planted", "--strategy", strategy]
    argv += ["--model-options", json.dumps(PLANTED[regime]), "--per-device-batch-size", "8"]
    argv += ["--max-steps", str(steps), "--warmup-steps", "4", "--train-samples", "4096"]
    argv += ["--eval-samples", "64", "--eval-every-epochs", "0"]
    if strategy == "ddp":  # DDP's timers on every step: its overlap, as the script's study
        argv += ["--trace-comm-every-steps", "1"]
    return [*argv, "--sweep", sweep, "--output-dir", str(store)]


def _common(store: Path, sweep: str, steps: int, script_args: list[str]) -> list[str]:
    """The flags every run of the study shares, and the script's arguments after ``--``."""
    argv = [*SLURM, "--no-progress", "--script", str(SCRIPT), "--warmup-steps", "4"]
    argv += ["--trace-comm-every-steps", "1", "--sweep", sweep, "--output-dir", str(store)]
    return [*argv, "--", "--steps", str(steps), *script_args]


def _flags(
    store: Path, sweep: str, plan: dict[str, Any], regime: str, args: list[str]
) -> list[str]:
    """A run's flags: the script's study (``--fsdp`` where the strategy is FSDP and the plan
    holds the script out), or the built-in planted model's (``strategy``)."""
    strategy = plan.get("strategy")
    if strategy and not plan.get("script"):
        return _built_in(store, sweep, plan["steps"], regime, strategy)
    own = ["--fsdp"] if strategy == "fsdp" else []
    return _common(store, sweep, plan["steps"], [*REGIMES[regime], *own, *args])


def _fit(emu: Path, store: Path, plan: dict[str, Any], regime: str, args: list[str]) -> None:
    """The fit at 1 and 2 nodes (and, in the FSDP mode, DDP's study of the same model)."""
    fit = ["scale", "--tasks-per-node", "1", "--world-sizes", "1,2"]
    report = ["--report", str(store / f"{regime}-fit.html")]
    _workbench(emu, *fit, *report, *_flags(store, f"{regime}-fit", plan, regime, args))
    if plan.get("strategy") == "fsdp":
        ddp = {**plan, "strategy": "ddp"}
        _workbench(emu, *fit, *_flags(store, f"{regime}-ddp-fit", ddp, regime, args))


def _sweeps(emu: Path, store: Path, plan: dict[str, Any], script_args: list[str]) -> None:
    """The fit at its rate, then every held-out run at each held-out rate."""
    regimes = plan.get("regimes", list(REGIMES))
    rates = list(dict.fromkeys([plan["fit"], *plan["held"]]))
    for i, rate in enumerate(rates):  # up once, then the links shaped again in place
        nodes = ["up", "--nodes", str(max(plan["nodes"])), "--rate"] if i == 0 else ["rate"]
        _cluster(emu, *nodes, f"{rate}mbit")
        for regime in regimes:
            if rate == plan["fit"]:
                _fit(emu, store, plan, regime, script_args)
                print(f"  {regime}, {rate} Mbit/s, 1 and 2 nodes (the fit): done", flush=True)
            if rate not in plan["held"]:
                continue
            for nodes in plan["nodes"]:
                run = ["run", "--nodes", str(nodes), "--tasks-per-node", "1"]
                run += ["--run-name", f"n{nodes}"]
                held = _flags(store, f"{regime}-held-{rate}", plan, regime, script_args)
                _workbench(emu, *run, *held)
                print(f"  {regime}, {rate} Mbit/s, {nodes} nodes (held out): done", flush=True)


def _predicted(
    emu: Path, store: Path, fit: str, n: int, busbw: float, hop: float, strategy: str = ""
) -> dict[str, float]:
    """``workbench predict`` of the fit sweep at ``n`` ranks on ``busbw`` B/s and ``hop`` s
    (with ``strategy``: that strategy's row, ``--strategy`` given): its throughput and 95 %
    interval."""
    argv = ["predict", fit, "--output-dir", str(store), "--world-sizes", f"2,{n}"]
    argv += ["--busbw", f"{busbw:.6g}", "--latency", f"{hop:.6g}", "--json"]
    argv += ["--strategy", strategy] if strategy else []
    rows = json.loads(_workbench(emu, *argv))
    mine = [r for r in rows if r["world_size"] == n and r.get("strategy", strategy) == strategy]
    return {k: float(mine[0][k]) for k in ("samples_per_s", "low", "high")}


def _bytes_busbw(run: pd.Series) -> float:
    """The bus bandwidth of the bytes alone: the run's benchmark time less its ``2(n-1)`` hops
    of measured latency per bucket (the model adds them back)."""
    n, hop = int(run["world_size"]), float(run["network_latency_s"])
    rest = float(run["network_time_s"]) - 2 * (n - 1) * hop * int(run["network_buckets"])
    if not rest > 0:  # all latency: no bandwidth to tell, the bus bandwidth as measured
        return float(run["network_busbw_bytes_per_s"])
    return float(run["network_bytes"]) / rest * 2 * (n - 1) / n


def held_out(emu: Path, store: Path, plan: dict[str, Any]) -> pd.DataFrame:
    """One row per held-out run: its measured samples/s, predicted from the fit sweep by
    ``workbench predict`` on its own bus bandwidth (and with its hop latency), the errors."""
    rows = []
    for regime in plan.get("regimes", list(REGIMES)):
        for rate in plan["held"]:
            runs = load_runs(store, [f"{regime}-held-{rate}"])
            steps = load_traces([Path(p) for p in runs["path"]], "steps")
            measured = scaling_table(runs, steps, group_by=[]).set_index("world_size")
            for _, r in runs.iterrows():
                n, busbw = int(r["world_size"]), float(r["network_busbw_bytes_per_s"])
                row: dict[str, Any] = {"regime": regime, "rate_mbit": rate, "nodes": n}
                row["busbw_MBps"] = busbw / 1e6
                row["hop_us"] = float(r["network_latency_s"]) * 1e6
                row["measured"] = float(measured.loc[n, "samples_per_s"])
                fit, strategy = f"{regime}-fit", plan.get("strategy", "")
                said = {"": _predicted(emu, store, fit, n, busbw, 0.0, strategy)}
                hop = float(r["network_latency_s"])
                if strategy == "fsdp":  # the same runs, from the DDP study of the same model
                    ddp = f"{regime}-ddp-fit"
                    said["_from_ddp"] = _predicted(emu, store, ddp, n, busbw, 0.0, "fsdp")
                if plan.get("hop", True):
                    said["_hop"] = _predicted(emu, store, fit, n, _bytes_busbw(r), hop)
                for k, p in said.items():
                    row[f"predicted{k}"] = p["samples_per_s"]
                    row[f"error{k}"] = p["samples_per_s"] / row["measured"] - 1
                    # the 95 % interval: does it hold the measured figure, and how wide is it
                    row[f"covered{k}"] = p["low"] <= row["measured"] <= p["high"]
                    row[f"half_width{k}"] = (p["high"] - p["low"]) / 2 / p["samples_per_s"]
                rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one regime, 3 nodes, 3 runs")
    parser.add_argument(
        "--ddp-always", action="store_true", help="the script joins a group and wraps DDP at 1 rank"
    )
    parser.add_argument(
        "--from-store",
        metavar="DIR",
        help="no cluster, no runs: predict and compare the store a previous run left (its "
        "folder's store/)",
    )
    parser.add_argument(
        "--regime", action="append", choices=list(REGIMES), help="only this one (repeatable)"
    )
    parser.add_argument(
        "--strategy",
        choices=["fsdp"],
        help="fsdp: the built-in planted model with FSDP, and FSDP predicted from a DDP study",
    )
    parser.add_argument(
        "--script",
        action="store_true",
        help="with --strategy fsdp: a user's FSDP2 script (scripts/planted_ddp.py --fsdp, its "
        "DDP study the same script without it) instead of the built-in planted model",
    )
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    if args.script and not args.strategy:
        parser.error("--script holds out a script's FSDP study: give --strategy fsdp too")
    plan = SMOKE if args.smoke else (FSDP_FULL if args.strategy else FULL)
    if args.strategy:  # the held-out claim is the bandwidth-bound regime's
        plan = {**plan, "strategy": args.strategy, "regimes": ["bandwidth-bound"], "hop": False}
        plan["script"] = args.script
    if args.regime:
        plan = {**plan, "regimes": args.regime}
    if args.from_store:
        folder = Path(args.from_store)
        table = held_out(folder / "emu", folder / "store", plan)
    else:
        folder = Path(tempfile.mkdtemp(prefix="wb-emu-", dir="/tmp"))
        folder.chmod(0o755)  # munged's socket must be reachable by all
        print(f"store: {folder / 'store'}", flush=True)
        emu = folder / "emu"
        try:
            _sweeps(emu, folder / "store", plan, ["--ddp-always"] if args.ddp_always else [])
            table = held_out(emu, folder / "store", plan)
        finally:
            _cluster(emu, "down")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    nodes = ", ".join(map(str, plan["nodes"]))
    for regime, rows in table.groupby("regime", sort=False):
        where = f"{regime}: held out ({len(rows)} points at {nodes} nodes)"
        for column, model in (
            ("error", "bus bandwidth"),
            ("error_hop", "bus bandwidth + hop"),
            ("error_from_ddp", "FSDP from the DDP study, bus bandwidth"),
        ):
            if column not in rows.columns:
                continue
            errors = rows[column].abs()
            k = column.removeprefix("error")
            halves, covered = rows[f"half_width{k}"], rows[f"covered{k}"]
            print(
                f"{where}, {model} at the point: median |error| {errors.median():.1%}, "
                f"worst {errors.max():.1%}; its 95 % interval held the measured figure in "
                f"{int(covered.sum())} of {len(rows)}, median half-width {halves.median():.1%} "
                f"({halves.median() / errors.median():.1f}x the median error)"
            )
    result = {"machine": machine(), "plan": plan, "points": table.to_dict("records")}
    write_result(args.out, "cluster_prediction", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
