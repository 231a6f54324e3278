"""Tune's predictions against its measurements: every candidate a tune tried, its predicted gain
(the scaling model, before any run) beside its measured gain and interval, and the mean absolute
error of the predictions.

A base run of the demo's 2-rank mlp (per-device batch 32, communication-bound on 2 cores) and of
its 2-rank transformer (close to break-even), each tuned with every candidate a communication-bound
diagnosis calls for, whatever its own (given as ``changes``: measured whatever their prediction, so
every prediction meets a measurement) in ``--repeats`` interleaved pairs on the warm pool. Beside
each prediction, the one made without the tune's batch probe (all of the compute assumed to grow
with the batch), against the same measurements. ``--smoke``: the mlp only, 2 pairs, the last
candidate (accumulation: a prediction beside a measurement, all the harness needs to show; its
figures are not for the table).

Usage: ``python benchmarks/tune_accuracy.py [--repeats 3] [--smoke] [--only TEXT]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402

DEMO = dict(
    per_device_batch_size=32,
    train_samples=4096,
    eval_samples=512,
    max_steps=30,
    warmup_steps=3,
    seed=0,
    timeout_min=5,
)


def _base(model: str, world_size: int, store: Path) -> Path:
    from workbench.config.run_config import RunConfig
    from workbench.run.launch import launch

    config = RunConfig(
        model=model, world_size=world_size, sweep="bench", output_dir=str(store), **DEMO
    )
    handle = launch(config, executor="pool")
    handle.wait(timeout_s=600)
    return handle.path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=1800.0, help="seconds per tune")
    parser.add_argument("--smoke", action="store_true", help="a quick run; figures not for use")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--only", help="the candidates whose label holds this text (all: none)")
    a = parser.parse_args(argv)
    from workbench.analysis.advice.candidates import candidates_for, predicted_gain
    from workbench.config.run_config import RunConfig
    from workbench.run.backends.pool import warm_pool
    from workbench.tune import tune
    from workbench.tune.tuner import _load_base

    repeats = 2 if a.smoke else a.repeats
    bases = [("mlp", 2)] if a.smoke else [("mlp", 2), ("transformer", 2)]
    rows: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, warm_pool(size=2):
        for model, n in bases:
            path = _base(model, n, Path(tmp))
            # every communication candidate, whatever this base's diagnosis: each prediction
            # meets a measurement
            config = RunConfig.load(path / "config.json").to_dict()
            listed = candidates_for("exposed_transfer", config)
            changes = [c.change for c in listed if not a.only or a.only in c.label]
            result = tune(
                path,
                budget_s=a.budget,
                repeats=repeats,
                changes=changes[-1:] if a.smoke else changes,
                progress=lambda line: print(line, file=sys.stderr, flush=True),
            )
            results.append(result.to_dict())
            # the same candidates as predicted without the batch probe (all of the compute
            # grows with the batch), beside the same measurements
            inputs = _load_base(path)[2].inputs
            # and with the benchmark's hop latency folded into its bandwidth (before the split)
            folded = _folded(path, inputs, result.batch_cost)
            for c in result.candidates:
                if c["verdict"] == "skipped":
                    continue
                assumed = predicted_gain(c["change"], inputs)[0]
                row = {"run": f"{model} {n} rank(s)", **{k: c[k] for k in _KEYS}}
                row["folded_gain"] = predicted_gain(c["change"], folded)[0]
                rows.append({**row, "assumed_gain": assumed})
    mae, mae_assumed = _mae(rows, "predicted_gain"), _mae(rows, "assumed_gain")
    mae_folded = _mae(rows, "folded_gain")
    print("| run | candidate | predicted | without the probe | latency folded |", end="")
    print(" measured (95 % interval) | verdict |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['run']} | {r['label']} | {r['predicted_gain']:+.1%} | "
            f"{r['assumed_gain']:+.1%} | {r['folded_gain']:+.1%} | "
            f"{r['measured_gain']:+.1%} ({r['low']:+.1%} to {r['high']:+.1%}) | {r['verdict']} |"
        )
    for r in results:
        cost = r.get("batch_cost") or {}
        probed = f"; batch probe: {cost}" if cost else ""
        print(f"{r['run_id']}: diagnosis {r['diagnosis'].get('cause')}, {r['said'] or ''}{probed}")
    print(
        f"mean absolute error of the predicted gains: {mae:.1%} over {len(rows)} candidates "
        f"({mae_assumed:.1%} as predicted without the batch probe, {mae_folded:.1%} with the "
        "benchmark's hop latency folded into its bandwidth)"
    )
    write_result(
        a.json,
        "tune_accuracy",
        {"rows": rows, "mae": mae, "mae_assumed": mae_assumed, "mae_folded": mae_folded}
        | {"repeats": repeats}
        | {"smoke": a.smoke},
    )
    return 0


def _folded(path: Path, inputs: Any, batch_cost: dict[str, Any]) -> Any:
    """``inputs`` with the probe's split, on the run's benchmarked bus bandwidth alone (its hop
    latency folded into it): the network model before the latency was split off."""
    import dataclasses
    import json

    from workbench.analysis.model.batch_cost import BatchCost
    from workbench.analysis.model.network import NetworkModel

    busbw = (json.loads((path / "run.json").read_text()).get("network") or {}).get(
        "busbw_bytes_per_s"
    )
    if busbw:
        network = NetworkModel(name="benchmark", bandwidth_bytes_per_s=busbw, latency_s=0.0)
        inputs = dataclasses.replace(inputs, network=network)
    if batch_cost:
        cost = BatchCost(**{**batch_cost, "batches": tuple(batch_cost["batches"])})
        inputs = dataclasses.replace(inputs, batch_cost=cost)
    return inputs


def _mae(rows: list[dict[str, Any]], key: str) -> float:
    """The mean of |``key`` - measured gain| over the rows where both are numbers."""
    errors = [abs(r[key] - r["measured_gain"]) for r in rows]
    errors = [e for e in errors if math.isfinite(e)]
    return sum(errors) / len(errors) if errors else float("nan")


_KEYS = (
    "label",
    "change",
    "predicted_gain",
    "measured_gain",
    "low",
    "high",
    "verdict",
    "base_samples_per_s",
    "candidate_samples_per_s",
    "note",
)

if __name__ == "__main__":
    sys.exit(main())
