"""How large the report of a 1,024-rank run is, and how long a browser takes to draw it.

Builds, in memory, the trace frames of a weak-scaling pair: a 1-rank base and a run of
``--ranks`` ranks (default 1,024, 8 per host) x ``--steps`` steps, as a real DDP run writes
them: every rank's step ends when the slowest rank's compute plus the allreduce transfer is done,
DDP's own timers (``comm_s``, ``backward_compute_s``, ``comm_exposed_s``) only on the steps the
tracer samples (1-10, then every 50th), RSS per rank, a loss that falls, and one rank planted
1.3x slower from a third of the run on. Then it writes the report (``write_report``, plotly.js
inline) and prints: the rows, the time to build and write it, the HTML's size (the target:
<= 20 MB) and each figure's share, whether the planted straggler is named, and, where
Playwright and Chromium are installed, the time from opening the file to every figure drawn.

Usage: ``python benchmarks/report_scale.py [--ranks 1024] [--steps 1000] [--smoke]
[--json out.json]``; ``--smoke``: 1,024 ranks x 60 steps (seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402  (puts the repository on sys.path)

from workbench.schema import STEP_COLUMNS  # noqa: E402
from workbench.ui.report import build_figures, write_report  # noqa: E402

#: HTML size the issue sets for a 1,024-rank report.
TARGET_BYTES = 20 * 10**6
#: DDP's timers are read on these steps (the tracer's default sampling).
SAMPLED_FIRST, SAMPLED_EVERY = 10, 50
CHROMIUM = "/usr/bin/chromium"
RANKS_PER_HOST = 8
FSDP_KINDS = ("all_gather", "reduce_scatter")


def make_steps(run_id: str, ranks: int, steps: int, straggler: int | None) -> pd.DataFrame:
    """One run's step rows, in the schema's columns and dtypes (see the module's docstring)."""
    rng = np.random.default_rng(ranks)
    step = np.arange(1, steps + 1)
    compute = 0.040 * (1 + 0.03 * rng.standard_normal((ranks, steps)))  # s, rank x step
    if straggler is not None:
        compute[straggler, steps // 3 :] *= 1.3
    transfer = 0.004 if ranks > 1 else 0.0
    step_s = compute.max(axis=0) + transfer  # everyone waits for the slowest, then transfers
    wait = step_s[None, :] - transfer - compute  # rank x step
    sampled = (step <= SAMPLED_FIRST) | (step % SAMPLED_EVERY == 0)
    data, forward, optimizer = 0.1 * compute, 0.3 * compute, 0.1 * compute
    backward_compute = compute - data - forward - optimizer
    exposed = wait + transfer
    rank = np.repeat(np.arange(ranks), steps)

    def flat(a: np.ndarray) -> np.ndarray:
        return a.reshape(-1)

    def timer(a: np.ndarray) -> np.ndarray:
        return flat(np.where(sampled[None, :], a, np.nan)) if ranks > 1 else np.nan

    n = ranks * steps
    frame = pd.DataFrame(
        {
            "run_id": run_id,
            "rank": rank,
            "local_rank": rank % RANKS_PER_HOST,
            "host": np.char.add("node", (rank // RANKS_PER_HOST).astype(str)),
            "world_size": ranks,
            "attempt": 0,
            "epoch": 0,
            "step": np.tile(step, ranks),
            "warmup": np.tile(step <= 2, ranks),
            "t_start_s": np.tile(np.concatenate([[0.0], np.cumsum(step_s)[:-1]]), ranks),
            "data_s": flat(data),
            "forward_s": flat(forward),
            "backward_s": flat(backward_compute + exposed),
            "optimizer_s": flat(optimizer),
            "step_s": np.tile(step_s, ranks),
            "gap_s": np.tile(np.where(step < steps, 0.0, np.nan), ranks),
            "save_s": np.nan,
            "comm_s": timer(exposed + 0.6 * backward_compute),
            "backward_compute_s": timer(backward_compute),
            "comm_exposed_s": timer(exposed),
            "comm_bytes": 4_000_000 if ranks > 1 else 0,
            "comm_buckets": 2,
            # a DDP run: no FSDP2 collective (schema 2); 0, as tests/frames.py writes it (the
            # tracer writes null, which these int64 columns cannot hold in pandas)
            **{f"{k}_{w}": 0 for k in FSDP_KINDS for w in ("bytes", "s", "exposed_s", "calls")},
            "samples": 32,
            "tokens": 32 * 64,
            "loss": np.tile(2.0 * np.exp(-step / steps) + 0.01 * rng.standard_normal(steps), ranks),
            "lr": 1e-3,
            "mem_alloc_bytes": np.nan,
            "mem_reserved_bytes": np.nan,
            "mem_peak_bytes": np.nan,
            "mem_device_bytes": np.nan,
            "rss_bytes": np.repeat(1.2e9 + 1e6 * rng.random(ranks), steps),
        },
        index=pd.RangeIndex(n),
    )
    return frame[list(STEP_COLUMNS)].astype(STEP_COLUMNS)


def make_runs(sizes: list[int]) -> pd.DataFrame:
    """The runs frame of the pair: one config but the world size (weak scaling)."""
    return pd.DataFrame(
        [
            {
                "run_id": f"w{n}",
                "sweep": "report-scale",
                "status": "completed",
                "world_size": n,
                "nodes": max(1, n // RANKS_PER_HOST),
                "model": "transformer",
                "precision": "fp32",
                "per_device_batch_size": 32,
                "global_batch_size": 32 * n,
                "optimizer": "adamw",
                "learning_rate": 1e-3,
                "train_samples": 32 * n * 1000,
            }
            for n in sizes
        ]
    )


def browser_seconds(path: Path, n_figures: int) -> float | str:
    """Seconds from opening the report in headless Chromium to every figure drawn, or why not."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "no playwright"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no {CHROMIUM}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            start = time.perf_counter()
            page.goto(path.as_uri(), wait_until="load")
            page.wait_for_function(
                f"document.querySelectorAll('.plotly .main-svg').length >= {n_figures}",
                timeout=120_000,
            )
            return time.perf_counter() - start
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true", help="1,024 ranks x 60 steps (seconds)")
    parser.add_argument("--quick", action="store_true", help="the same as --smoke")
    parser.add_argument("--no-browser", action="store_true", help="skip the Chromium timing")
    parser.add_argument("--json", help="write the result here")
    a = parser.parse_args(argv)
    steps_n = 60 if a.smoke or a.quick else a.steps
    straggler = a.ranks * 2 // 3 + 1
    start = time.perf_counter()
    steps = pd.concat(
        [
            make_steps("w1", 1, steps_n, None),
            make_steps(f"w{a.ranks}", a.ranks, steps_n, straggler),
        ],
        ignore_index=True,
    )
    runs = make_runs([1, a.ranks])
    made_s = time.perf_counter() - start
    print(
        f"{len(steps):,} step rows ({a.ranks:,} ranks x {steps_n:,} steps and a 1-rank base), "
        f"made in {made_s:.1f} s; straggler planted: rank {straggler}, 1.3x from step "
        f"{steps_n // 3 + 1}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="wb-report-scale-") as tmp:
        path = Path(tmp) / "report.html"
        start = time.perf_counter()
        write_report(runs, steps, None, path)
        write_s = time.perf_counter() - start
        size = path.stat().st_size
        page = path.read_text(encoding="utf-8")
        figs, tables = build_figures(runs, steps, None)
        shares = {h: len(f.to_json()) for h, f in figs}
        named = f"rank {straggler}" in page or bool(
            len(tables["stragglers"]) and straggler in set(tables["stragglers"]["rank"])
        )
        drawn = "skipped" if a.no_browser else browser_seconds(path, len(figs))
    result = {
        "ranks": a.ranks,
        "steps": steps_n,
        "rows": len(steps),
        "write_s": write_s,
        "html_bytes": size,
        "target_bytes": TARGET_BYTES,
        "figure_json_bytes": shares,
        "straggler_named": named,
        "browser_s": drawn,
        "machine": machine(),
    }
    print(
        f"report written in {write_s:.1f} s: {size / 1e6:.2f} MB of HTML "
        f"(target <= {TARGET_BYTES / 1e6:.0f} MB: {'met' if size <= TARGET_BYTES else 'MISSED'})"
    )
    for heading, n in sorted(shares.items(), key=lambda hn: -hn[1]):
        print(f"  {heading}: {n / 1e3:,.0f} kB of figure JSON")
    print(f"planted straggler rank {straggler} named: {named}")
    shown = f"{drawn:.1f} s" if isinstance(drawn, float) else drawn
    print(f"Chromium, open to every figure drawn: {shown}")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2, default=str))
    return result


if __name__ == "__main__":
    main()
