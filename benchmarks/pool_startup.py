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

Usage: ``python benchmarks/pool_startup.py [--repeats 5] [--smoke] [--json out.json]``;
``--smoke`` (alias ``--quick``): one repeat at 1 rank, no untimed launches (a check of the
harness: the first launches carry this process's imports).
"""

from __future__ import annotations

import argparse
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
        for variant in VARIANTS:
            got = [out for w, v, out in rows if w == ws and v == variant]
            first = statistics.median(o["to_first_step_all_s"] for o in got)
            result = statistics.median(o["to_result_s"] for o in got)
            medians[variant] = (first, result)
            lines.append(f"{ws:>5} {variant:<9} {first:>15.2f} {result:>11.2f} {len(got):>3}")
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
    a = parser.parse_args(argv)
    from workbench import WarmPool

    repeats = 1 if a.smoke else a.repeats
    sizes = [1] if a.smoke else [int(w) for w in a.world_sizes.split(",")]
    base = dict(model="mlp", batch=32, steps=5, warmup=2, train_samples=4096)
    rows: list[tuple[int, str, dict[str, Any]]] = []
    with WarmPool(size=max(sizes), idle_s=3600) as pool:
        for variant in () if a.smoke else ("pool", "local"):  # untimed: this process's imports
            measure(variant, {**base, "world_size": 1}, pool)
        for r in range(repeats):
            for ws in sizes:
                order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
                for variant in order:
                    out = measure(variant, {**base, "world_size": ws}, pool)
                    rows.append((ws, variant, out))
                    print(
                        f"  repeat {r} ranks {ws} {variant:<9} first step on all ranks "
                        f"{out['to_first_step_all_s']:5.2f} s, result {out['to_result_s']:5.2f} s",
                        flush=True,
                    )
    print(table(rows))
    cpu = worker_cpu(1 if a.smoke else 4)
    print(
        f"cpu per worker: forked {cpu['forked_s']:.2f} s, fresh interpreter {cpu['fresh_s']:.2f} s"
        f" (the template's imports, once a pool: {cpu['template_s']:.2f} s)"
    )
    result = {"job": base, "repeats": repeats, "rows": rows, "cpu": cpu}
    write_result(a.json, "pool_startup", result)
    return result


if __name__ == "__main__":
    main()
