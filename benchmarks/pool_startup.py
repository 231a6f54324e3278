"""Pool start-up: from ``launch()`` to the first step on every rank, and to the result
(``wait()`` returning), for the pool executor (warm workers), the local executor (submitit, a
fresh interpreter per rank) and ``torchrun`` launching a bare DDP script (``plain_ddp.py``), at 1
and 2 ranks.

The job is tiny (mlp, 5 steps) so that the figures are the launch itself. A workbench rank's first
step is its ``t0_unix`` (its summary) plus the first step's ``t_start_s`` (its trace). The three
launchers alternate, their order rotated every repeat; figures are medians over repeats. Before
each pool launch the pool's workers are waited for until each sits idle, blocked reading its task
(``/proc/PID/wchan``): the figure is a warm start, which is what the pool is for. One untimed
launch per executor first imports, in this process, what ``launch()`` itself imports.

Then the CPU a worker costs: a fork of the pool's template (its user and system time from
``/proc``, once it waits for its task) against a fresh interpreter that imports what a worker
imports (what each worker cost before the template, and what every local rank still pays); and
the template's own imports, paid once a pool.

``--against REV`` times the pool's first step of this checkout against the code at git revision
REV (a temporary worktree): pairs of runs of this script, each importing its own side's code,
each side first in half of the pairs in a random order.

Usage: ``python benchmarks/pool_startup.py [--repeats 5] [--smoke] [--json out.json]``,
``python benchmarks/pool_startup.py --against REV --pairs 4 --repeats 3 --world-sizes 2``;
``--smoke`` (alias ``--quick``): one repeat at 1 rank, no untimed launches (a check of the
harness: the first launches carry this process's imports).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402
from _jobs import run_torchrun, workbench_config  # noqa: E402

VARIANTS = ("pool", "local", "torchrun")


def _blocked_reading(pid: int) -> bool:
    """Whether the process sleeps in select/poll (a warm worker waiting for its task)."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state == "S" and ("select" in wchan or "poll" in wchan)


def wait_warm(pool: Any, timeout_s: float = 300.0) -> None:
    """Wait until the pool holds its ``size`` workers, each blocked reading its task."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = pool.pids()
        if len(pids) >= pool.size and all(_blocked_reading(p) for p in pids):
            return
        time.sleep(0.2)
    raise TimeoutError(f"the pool's workers were not warm after {timeout_s:g} s: {pool!r}")


def run_launch(executor: str, job: dict[str, Any], **options: Any) -> dict[str, Any]:
    """``launch()`` then ``wait()`` on ``executor``; the two latencies."""
    from workbench import launch

    with tempfile.TemporaryDirectory(prefix="wb-bench-pool-") as tmp:
        config = workbench_config(output_dir=tmp, **job)
        t_launch = time.time()
        run = launch(config, executor=executor, **options)
        status = run.wait(timeout_s=600)
        t_result = time.time()
        summaries = run.result()
        steps = run.traces()
    first = steps[steps["step"] == steps["step"].min()]
    first_step_unix = [
        summaries[int(r.rank)]["t0_unix"] + float(r.t_start_s) for r in first.itertuples()
    ]
    return {
        "status": status,
        "to_first_step_all_s": max(first_step_unix) - t_launch,
        "to_result_s": t_result - t_launch,
    }


def measure(variant: str, job: dict[str, Any], pool: Any) -> dict[str, Any]:
    """One launch of ``job`` by ``variant``."""
    if variant == "torchrun":
        return run_torchrun(**job)
    if variant == "pool":
        wait_warm(pool)
        return run_launch("pool", job, pool=pool)
    return run_launch("local", job)


#: What a worker imports before its task (``workbench.rank.pool_worker._warm_up``).
WORKER_IMPORTS = "import torch, torch._dynamo, torch.nn.parallel, workbench.rank.run_rank"


def _cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_cpu(workers: int) -> dict[str, float]:
    """CPU seconds of a forked worker, of the template, and of a fresh interpreter's imports
    (medians over ``workers``)."""
    import resource

    from workbench import WarmPool

    with WarmPool(size=workers, idle_s=3600) as pool:
        wait_warm(pool)
        forked = statistics.median(_cpu_s(pid) for pid in pool.pids())
        template = _cpu_s(pool.template_pid)
    fresh = []
    for _ in range(workers):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", WORKER_IMPORTS], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        fresh.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return {"forked_s": forked, "template_s": template, "fresh_s": statistics.median(fresh)}


def table(rows: list[tuple[int, str, dict[str, Any]]]) -> str:
    """Medians per world size and launcher, and the pool's ratio to torchrun."""
    lines = [
        f"{'ranks':>5} {'launcher':<9} {'first step (s)':>15} {'result (s)':>11} {'n':>3}",
    ]
    for ws in sorted({r[0] for r in rows}):
        medians = {}
        for variant in [v for v in VARIANTS if any(r[1] == v for r in rows)]:
            got = [out for w, v, out in rows if w == ws and v == variant]
            first = statistics.median(o["to_first_step_all_s"] for o in got)
            result = statistics.median(o["to_result_s"] for o in got)
            medians[variant] = (first, result)
            lines.append(f"{ws:>5} {variant:<9} {first:>15.2f} {result:>11.2f} {len(got):>3}")
        if "pool" in medians and "torchrun" in medians:
            ratio = medians["pool"][0] / medians["torchrun"][0]
            lines.append(f"{ws:>5} pool/torchrun first step: {ratio:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--world-sizes", default="1,2")
    parser.add_argument(
        "--smoke",
        "--quick",
        dest="smoke",
        action="store_true",
        help="one repeat at 1 rank, no untimed launches",
    )
    parser.add_argument("--json", help="write the result here")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated launchers to time"
    )
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU-per-worker figures")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="the pool's first step here against the code at git revision REV, in --pairs "
        "interleaved pairs of runs of this script (--variants pool), each side first in half",
    )
    parser.add_argument("--pairs", type=int, default=4, help="pairs for --against")
    a = parser.parse_args(argv)
    if a.against:
        return against(a.against, a.pairs, a.repeats, a.world_sizes, a.json)
    from workbench import WarmPool

    repeats = 1 if a.smoke else a.repeats
    sizes = [1] if a.smoke else [int(w) for w in a.world_sizes.split(",")]
    variants = tuple(v for v in VARIANTS if v in a.variants.split(","))
    base = dict(model="mlp", batch=32, steps=5, warmup=2, train_samples=4096)
    rows: list[tuple[int, str, dict[str, Any]]] = []
    with WarmPool(size=max(sizes), idle_s=3600) as pool:
        for variant in () if a.smoke else ("pool", "local"):  # untimed: this process's imports
            if variant in variants:
                measure(variant, {**base, "world_size": 1}, pool)
        for r in range(repeats):
            for ws in sizes:
                k = r % len(variants)
                order = variants[k:] + variants[:k]
                for variant in order:
                    out = measure(variant, {**base, "world_size": ws}, pool)
                    rows.append((ws, variant, out))
                    print(
                        f"  repeat {r} ranks {ws} {variant:<9} first step on all ranks "
                        f"{out['to_first_step_all_s']:5.2f} s, result {out['to_result_s']:5.2f} s",
                        flush=True,
                    )
    print(table(rows))
    cpu = None if a.no_cpu else worker_cpu(1 if a.smoke else 4)
    if cpu is not None:
        print(
            f"cpu per worker: forked {cpu['forked_s']:.2f} s, fresh interpreter "
            f"{cpu['fresh_s']:.2f} s (the template's imports, once a pool: "
            f"{cpu['template_s']:.2f} s)"
        )
    import workbench

    where = str(Path(workbench.__file__).resolve().parents[1])  # which checkout's code ran
    result = {"job": base, "repeats": repeats, "rows": rows, "cpu": cpu, "workbench_from": where}
    write_result(a.json, "pool_startup", result)
    return result


def _pool_run(tree: Path | None, repeats: int, sizes: str) -> list[float]:
    """This script's pool launches in a process of their own, importing the workbench from
    ``tree`` (this checkout where None): each launch's seconds to the first step on all ranks."""
    env = dict(os.environ)
    if tree is not None:
        env["WORKBENCH_BENCH_TREE"] = env["PYTHONPATH"] = str(tree)
    with tempfile.TemporaryDirectory(prefix="wb-bench-pool-side-") as tmp:
        out = Path(tmp) / "side.json"
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--variants",
            "pool",
            "--no-cpu",
            "--json",
            str(out),
        ]
        argv += ["--repeats", str(repeats), "--world-sizes", sizes]
        # From a folder of its own: the working directory comes first on the path of this
        # process and of the pool's template, ahead of PYTHONPATH.
        subprocess.run(argv, env=env, cwd=tmp, check=True, stdout=subprocess.DEVNULL)
        side = json.loads(out.read_text())
    want = tree or Path(__file__).resolve().parents[1]
    assert Path(side["workbench_from"]) == want, f"imported {side['workbench_from']}, not {want}"
    return [float(out_["to_first_step_all_s"]) for _, _, out_ in side["rows"]]


def against(rev: str, pairs: int, repeats: int, sizes: str, json_path: str | None) -> Any:
    """The pool's first step, this checkout against ``rev``, in interleaved pairs (each side
    first in half of them, in a random order): medians, worst launches, pairwise ratios."""
    import random

    from _common import ROOT, ratio_stats

    with tempfile.TemporaryDirectory(prefix="wb-bench-before-") as tmp:
        tree = Path(tmp) / "before"
        git = ["git", "-C", str(ROOT)]
        subprocess.run([*git, "worktree", "add", "--detach", str(tree), rev], check=True)
        try:
            firsts = [True] * (pairs - pairs // 2) + [False] * (pairs // 2)
            random.shuffle(firsts)
            sides: dict[str, list[list[float]]] = {"before": [], "after": []}
            for i, before_first in enumerate(firsts):
                for side in ("before", "after") if before_first else ("after", "before"):
                    got = _pool_run(tree if side == "before" else None, repeats, sizes)
                    sides[side].append(got)
                    print(f"  pair {i} {side:<6} first step {', '.join(f'{g:.2f}' for g in got)} s")
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(tree)], check=False)
    med = {k: [statistics.median(v) for v in runs] for k, runs in sides.items()}
    flat = {k: [g for v in runs for g in v] for k, runs in sides.items()}
    ratios = ratio_stats([a / b for a, b in zip(med["after"], med["before"], strict=True)])
    for k in ("before", "after"):
        print(
            f"{k} ({rev if k == 'before' else 'this checkout'}): first step median "
            f"{statistics.median(flat[k]):.2f} s, worst {max(flat[k]):.2f} s "
            f"({len(flat[k])} launches)"
        )
    print(
        f"after/before (medians of each run, {ratios['n']} pairs): {ratios['median']:.2f} "
        f"(95 % interval {ratios['ci95_lo']:.2f}-{ratios['ci95_hi']:.2f})"
    )
    result = {"against": rev, "sides": sides, "ratio": ratios}
    write_result(json_path, "pool_startup_against", result)
    return result


if __name__ == "__main__":
    main()
