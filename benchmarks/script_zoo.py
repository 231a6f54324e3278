"""The zoo of script shapes against their own clocks: each script of ``tests/scripts/zoo/`` (and
the HF Trainer example) at 2 ranks, under bare ``torchrun`` and under ``workbench run --script``
(the CLI), in interleaved pairs (which side runs first: each side in half the pairs, in a random
order, as ``workbench tune`` does).

Every script prints its own throughput over its own steps (``own_samples_per_s=``: the samples
of every rank after its ``--warmup`` steps over rank 0's clock; the Trainer's
``train_samples_per_second``: every step over its ``train_runtime``). Per shape:

- ``traced/bare``: the median of the pairs' ratios of the script's own figure, traced over bare,
  with its bootstrap 95 % interval (``_common.ratio_stats``): what tracing costs the script;
- ``workbench/own``: in each traced run, the workbench's throughput over the same steps (the
  traced samples of every rank over rank 0's window, from the first step after the script's
  warm-up to the last step's end, as ``tests/test_example_scripts.py`` does) over the script's own
  figure in that run; and the workbench's headline (``run.json``: its warm-up left out) over it;
- whether the workbench saw samples at all (``0 samples/s`` for an unknown count is a failure).

``mp_spawn.py`` is run as ``python mp_spawn.py --world-size 2`` (bare) and as ``workbench run
--script mp_spawn.py --world-size 2 -- --world-size 2`` (traced), each with a free port.

``--until-known 0.01``: pairs until the interval of traced/bare is within +-1 % of it (at most
``--pairs`` and ``--max-minutes`` a shape), the verdict "not resolved" where it is not: a
tracing cost is claimed only where it is known.

Usage: ``python benchmarks/script_zoo.py [--pairs 5] [--steps 200] [--warmup 20] [--shapes a,b]
[--until-known F [--max-minutes M]] [--smoke] [--json F]``. Results (JSON) go to ``--json`` or to
``experiments/results/benchmarks/script_zoo-<time>.json`` (git-ignored; ``--smoke`` writes none
unless asked). The exit status is 1 when a shape could not be measured (a run failed twice).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _common import ROOT, fmt_ratio, machine, ratio_stats, write_result

from workbench.ports import free_port
from workbench.tune.measure import pair_order

ZOO = "tests/scripts/zoo"
OWN = re.compile(r"own_samples_per_s=([\d.]+)")
TRAINER = re.compile(r'"train_samples_per_second": ([\d.]+)')
#: The step columns whose presence each shape's result records.
PHASES = (
    "data_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "comm_s",
    "comm_exposed_s",
    "all_gather_s",
    "reduce_scatter_s",
    "samples",
    "tokens",
    "loss",
)
#: Where results go unless ``--json`` says (git-ignored).
RESULTS = ROOT / "experiments" / "results" / "benchmarks"
#: The verdict's bound on traced/bare of the script's own figure (>= 1 - LIMIT), and how well
#: it must be known: its 95 % interval within +-KNOWN.
LIMIT, KNOWN = 0.02, 0.01


@dataclass(frozen=True)
class Shape:
    """One script of the zoo: its path, extra arguments, how it says its own figure and the
    warm-up it leaves out of it (None: its own ``--warmup``; 0: it counts every step)."""

    script: str
    args: tuple[str, ...] = ()
    own: re.Pattern[str] = OWN
    spawn: bool = False
    warmup: int | None = None


SHAPES = {
    "ddp_when_distributed": Shape(f"{ZOO}/ddp_when_distributed.py"),
    "no_dataloader": Shape(f"{ZOO}/no_dataloader.py"),
    "iterable_dataset": Shape(f"{ZOO}/iterable_dataset.py"),
    "two_models": Shape(f"{ZOO}/two_models.py"),
    "compiled_bf16": Shape(f"{ZOO}/compiled_bf16.py"),
    "eval_every_n": Shape(f"{ZOO}/eval_every_n.py"),
    "grad_accum_no_sync": Shape(f"{ZOO}/grad_accum_no_sync.py"),
    "mp_spawn": Shape(f"{ZOO}/mp_spawn.py", ("--world-size", "2"), spawn=True),
    "lightning_ddp": Shape(f"{ZOO}/lightning_ddp.py"),
    "odd_modules": Shape(f"{ZOO}/odd_modules.py"),
    "hf_trainer": Shape("examples/scripts/hf_trainer.py", own=TRAINER, warmup=0),
    # plain FSDP2 (fully_shard per block, then the root), no DataLoader
    "fsdp": Shape("tests/scripts/fsdp_no_dataloader.py", ("--width", "33")),
}
#: What ``--smoke`` runs: one shape, one pair, a few steps (a check of the harness).
SMOKE_SHAPE = "no_dataloader"


def script_args(shape: Shape, steps: int, warmup: int) -> list[str]:
    """The script's own arguments for one run (a fresh port for mp.spawn's rendezvous)."""
    args = [*shape.args, "--steps", str(steps)]
    if shape.warmup is None:
        args += ["--warmup", str(warmup)]
    if shape.spawn:
        args += ["--port", str(free_port())]
    return args


def command(shape: Shape, traced: bool, args: list[str], store: Path, warmup: int) -> list[str]:
    """The command line of one run: bare torchrun (or python, for mp.spawn) or the CLI (its
    warm-up steps the script's own, so that its headline leaves out the same steps)."""
    bin_dir = Path(sys.executable).parent
    if traced:
        return [
            str(bin_dir / "workbench"),
            "run",
            "--script",
            shape.script,
            "--world-size",
            "2",
            "--output-dir",
            str(store),
            "--no-progress",
            "--warmup-steps",
            str(warmup),
            "--",
            *args,
        ]
    if shape.spawn:
        return [sys.executable, shape.script, *args]
    return [str(bin_dir / "torchrun"), "--standalone", "--nproc-per-node", "2", shape.script, *args]


def run_once(shape: Shape, traced: bool, steps: int, warmup: int, store: Path) -> dict[str, Any]:
    """One run (a second try if the first fails); its own figure and, traced, the workbench's."""
    # The same environment on both sides: one thread per rank (the workbench's default), no
    # rendezvous left over from the caller.
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    own_warmup = warmup if shape.warmup is None else shape.warmup
    said = ""
    for _attempt in (1, 2):
        cmd = command(shape, traced, script_args(shape, steps, warmup), store, own_warmup)
        started = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
        wall = time.perf_counter() - started
        said = (
            f"{' '.join(cmd)}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
        if done.returncode != 0:
            continue
        try:
            got = traced_figures(done.stdout, steps, own_warmup) if traced else {}
            text = got.pop("logs", done.stdout)
            found = shape.own.search(text)
            if found is None:
                raise ValueError("the script printed no figure of its own")
            return {"own": float(found.group(1)), "wall_s": wall, **got}
        except (ValueError, OSError, KeyError) as e:
            said = f"{said}\n{type(e).__name__}: {e}"
    return {"error": said}


def traced_figures(stdout: str, steps: int, warmup: int) -> dict[str, Any]:
    """From a traced run's folder (its path on the CLI's last line): the workbench's headline
    throughput, its throughput over the script's own window, and the ranks' logs.

    The window: the steps after the script's ``warmup`` ones. A script whose iteration steps
    ``k`` optimizers with work between them (a GAN) is ``k`` workbench steps an iteration: the
    window then starts after ``k * warmup`` of them (``k``: the workbench's steps over the
    script's). The samples of every rank in it over rank 0's time from its first step's start to
    its last step's end."""
    from workbench.store.files import read_json
    from workbench.store.load import load_traces

    found = re.search(r"^results: (.+)$", stdout, re.M)
    if found is None:
        raise ValueError("the CLI printed no results folder")
    run = Path(found.group(1).strip())
    summary = read_json(run / "run.json").get("summary") or {}
    traced = load_traces(run, "steps")
    logs = "\n".join(p.read_text(errors="replace") for p in sorted(run.glob("logs/*_log.*")))
    if traced.empty:
        raise ValueError(f"the workbench traced no step in {run}")
    per_iteration = max(round(traced.loc[traced["rank"] == 0, "step"].nunique() / steps), 1)
    window = traced[traced["step"] > per_iteration * warmup]
    first = window[window["rank"] == 0]
    seconds = (first["t_start_s"] + first["step_s"]).max() - first["t_start_s"].min()
    samples = float(window["samples"].sum())  # NaN rows (no count) add nothing
    return {
        "wb_headline": summary.get("samples_per_s"),
        "wb_window": samples / seconds if seconds > 0 else float("nan"),
        "wb_steps": int(first["step"].nunique()),
        "wb_steps_per_iteration": per_iteration,
        "wb_samples": samples,
        # which figures the workbench has for the window's steps (share of rows with a value)
        "wb_present": {c: float(window[c].notna().mean()) for c in PHASES if c in window},
        "logs": logs,
    }


def known(rows: list[dict[str, Any]], within: float) -> bool:
    """Whether traced/bare is known: the bootstrap 95 % interval of the pairs' median ratio
    within +-``within`` of it (3 pairs at least)."""
    if len(rows) < 3:
        return False
    s = ratio_stats([r["ratio"] for r in rows])
    return (s["ci95_hi"] - s["ci95_lo"]) / 2 <= within * s["median"]


def measure_shape(
    name: str,
    pairs: int,
    steps: int,
    warmup: int,
    store: Path,
    rng: random.Random,
    until: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """Interleaved pairs of one shape; the pairs' figures and their summaries. ``pairs`` of
    them, or with ``until = (within, minutes)`` pairs until traced/bare is :func:`known` within
    +-``within``, at most ``pairs`` and ``minutes`` (the summary's ``stopped`` says which)."""
    shape = SHAPES[name]
    rows: list[dict[str, Any]] = []
    started, stopped = time.monotonic(), "pairs"
    for i, first in enumerate(pair_order(pairs, rng)):
        if until is not None and known(rows, until[0]):
            stopped = "known"
            break
        if until is not None and time.monotonic() - started > until[1] * 60:
            stopped = "minutes"
            break
        order = (False, True) if first == "base" else (True, False)
        got = {traced: run_once(shape, traced, steps, warmup, store) for traced in order}
        failed = [got[t]["error"] for t in order if "error" in got[t]]
        if failed:
            print(f"  {name}: a run failed twice:\n{failed[0]}", file=sys.stderr, flush=True)
            return {"error": failed[0][-3000:], "pairs": rows}
        bare, traced = got[False], got[True]
        row = {
            "bare_first": first == "base",
            "bare_own": bare["own"],
            "traced_own": traced["own"],
            "ratio": traced["own"] / bare["own"],
            **{k: traced[k] for k in ("wb_headline", "wb_window", "wb_steps", "wb_samples")},
            "wb_steps_per_iteration": traced["wb_steps_per_iteration"],
            "wb_present": traced["wb_present"],
        }
        rows.append(row)
        print(
            f"  {name} pair {i + 1}/{pairs}: own {bare['own']:,.0f} bare, "
            f"{traced['own']:,.0f} traced ({row['ratio']:.3f}); workbench "
            f"{_rate(row['wb_window'])} over the same steps, {_rate(row['wb_headline'])} headline",
            flush=True,
        )
    if until is not None and stopped == "pairs" and known(rows, until[0]):
        stopped = "known"
    return {**summarise(rows), "stopped": stopped}


def _rate(v: float | None) -> str:
    return "n/a" if v is None or not np.isfinite(v) else f"{v:,.0f}/s"


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A shape's figures from its pairs: traced/bare of its own figure, workbench/own."""

    def ratios(key: str) -> list[float]:
        vals = [r[key] / r["traced_own"] for r in rows if r[key] is not None]
        return [v for v in vals if np.isfinite(v)]

    return {
        "pairs": rows,
        "bare_own": float(np.median([r["bare_own"] for r in rows])),
        "traced_over_bare": ratio_stats([r["ratio"] for r in rows]),
        "wb_window_over_own": ratio_stats(ratios("wb_window")),
        "wb_headline_over_own": ratio_stats(ratios("wb_headline")),
        "zero_samples": any(not (r["wb_samples"] or 0) > 0 for r in rows),
        "wb_present": {
            c: float(np.median([r["wb_present"].get(c, 0.0) for r in rows])) for c in PHASES
        },
    }


def verdict(r: dict[str, Any]) -> str:
    """Within 2 % when the median of traced/bare is; "(CI ...)" says whether the interval is too."""
    if "error" in r:
        return "FAILED"
    if r["zero_samples"]:
        return "0 samples"
    s = r["traced_over_bare"]
    half = (s["ci95_hi"] - s["ci95_lo"]) / 2
    if half > KNOWN * s["median"]:
        return f"not resolved (+-{half / s['median']:.1%} after {s['n']} pairs)"
    return "yes" if s["median"] >= 1 - LIMIT else "no"


def print_table(results: dict[str, dict[str, Any]], pairs: int, steps: int) -> None:
    print(
        f"script shapes, 2 ranks, {pairs} interleaved pair(s) of {steps} steps each "
        "(median of pair ratios [IQR, bootstrap CI95])"
    )
    print(
        f"{'shape':<22} {'own bare':>11}  {'traced/bare (own)':<44} {'wb/own same steps':<18} "
        f"{'wb headline/own':<16} >= 0.98, known to +-1 %"
    )
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<22} {'failed':>11}  {r['error'].splitlines()[0][:90]}")
            continue
        w, h = r["wb_window_over_own"], r["wb_headline_over_own"]
        print(
            f"{name:<22} {r['bare_own']:>9,.0f}/s  {fmt_ratio(r['traced_over_bare']):<44} "
            f"{_median(w):<18} {_median(h):<16} {verdict(r)}"
        )


def print_present(results: dict[str, dict[str, Any]]) -> None:
    """Per shape, the share of the window's traced steps that has each figure (the comm timers
    are sampled: one step in ``trace_comm_every_steps``)."""
    print("figures the workbench has, share of the measured steps (median over pairs):")
    for name, r in results.items():
        if "wb_present" in r:
            shares = ", ".join(f"{c} {v:.0%}" for c, v in r["wb_present"].items())
            print(f"  {name}: {shares}")


def _median(s: dict[str, float]) -> str:
    return f"{s['median']:.3f}" if s.get("n") else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200, help="steps of each run")
    parser.add_argument("--warmup", type=int, default=20, help="steps left out of own figures")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated")
    parser.add_argument("--seed", type=int, default=0, help="of the pairs' order")
    parser.add_argument(
        "--until-known",
        type=float,
        metavar="FRACTION",
        help="pairs until traced/bare's 95 %% interval is within +-FRACTION (e.g. 0.01), at "
        "most --pairs of them and --max-minutes a shape",
    )
    parser.add_argument(
        "--max-minutes", type=float, default=20.0, help="a shape, with --until-known"
    )
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_SHAPE}: 1 pair, 12 steps")
    parser.add_argument("--json", help="write the result here")
    a = parser.parse_args()
    names = [SMOKE_SHAPE] if a.smoke else [s for s in a.shapes.split(",") if s]
    unknown = sorted(set(names) - set(SHAPES))
    if unknown:
        parser.error(f"--shapes: unknown {unknown}; the shapes are {', '.join(SHAPES)}")
    pairs, steps, warmup = (1, 12, 4) if a.smoke else (a.pairs, a.steps, a.warmup)
    if not 0 < warmup < steps:
        parser.error(f"--warmup must be between 1 and --steps - 1, got {warmup}")
    rng = random.Random(a.seed)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            until = None if a.until_known is None else (a.until_known, a.max_minutes)
            results[name] = measure_shape(name, pairs, steps, warmup, Path(folder), rng, until)
    print_table(results, pairs, steps)
    print_present(results)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = a.json or str(RESULTS / f"script_zoo-{stamp}.json")
    if a.smoke and not a.json:  # a check of the harness leaves no result behind
        out = ""
    else:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        print(f"results: {out}")
    args = {"pairs": pairs, "steps": steps, "warmup": warmup, "command": sys.argv}
    write_result(out, "script_zoo", {"machine": machine(), "args": args, "shapes": results})
    if any("error" in r for r in results.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
