"""Run every benchmark (each in its own process, one after the other) and print one table of
figures against their targets.

Usage: ``python benchmarks/run_all.py [--quick | --smoke] [--only
tracing,fidelity,latency,analysis,memory,zoo] [--out results.json]``. ``--quick`` runs every
benchmark at its ``--smoke`` size (a minute or two): the figures it prints are not resolvable to
1 %.
``--smoke`` checks this runner in seconds: the same, over ``memory`` alone unless ``--only`` names
others (each benchmark's own ``--smoke`` is tested on its own). The exit status is 1 when a
benchmark failed. Each benchmark also runs alone: ``python benchmarks/<name>.py --help``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import machine  # noqa: E402

BENCHMARKS = {
    "tracing": ("tracing_overhead.py", []),
    "fidelity": ("scaling_fidelity.py", []),
    "latency": ("launch_latency.py", []),
    "analysis": ("analysis_scale.py", []),
    "memory": ("tracer_memory.py", []),
    "zoo": ("script_zoo.py", []),
}
#: What ``--smoke`` runs unless ``--only`` is given: the cheapest benchmark, to check the runner.
SMOKE_ONLY = "memory"


def run(name: str, quick: bool, tmp: Path) -> dict[str, Any]:
    """One benchmark in a fresh process; its JSON result (analysis_scale: parsed from stdout,
    since it is not ours to change)."""
    script, extra = BENCHMARKS[name]
    cmd = [sys.executable, str(HERE / script), *extra]
    out_json = tmp / f"{name}.json"
    if name == "analysis":
        cmd += ["--smoke"] if quick else ["--max-ranks", "64", "--report"]
    else:
        cmd += ["--json", str(out_json)] + (["--smoke"] if quick else [])
    start = time.perf_counter()
    print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
    # Stream the benchmark's progress (it takes minutes); stderr (torch's and kineto's chatter)
    # goes to a file, shown only if the benchmark fails.
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            print("   " + line.rstrip(), flush=True)
        returncode = proc.wait()
        err.seek(0)
        stderr = err.read()
    stdout = "".join(lines)
    if returncode != 0:
        print(stderr[-3000:], file=sys.stderr)
        return {"error": f"exit {returncode}", "seconds": time.perf_counter() - start}
    if name == "analysis":
        read = re.search(r"pyarrow read\s+([\d.]+) s", stdout)
        report = re.search(r"workbench report\s+([\d.]+) s", stdout)
        rows = re.search(r"^([\d,]+) step rows", stdout, re.M)
        result: dict[str, Any] = (
            {
                "pyarrow_s": float(read.group(1)),
                "workbench_s": float(report.group(1)),
                "rows": rows.group(1) if rows else "?",
            }
            if read and report
            else {"error": "could not parse the output of analysis_scale.py"}
        )
    else:
        result = json.loads(out_json.read_text())
    result["seconds"] = time.perf_counter() - start
    return result


def verdict(s: dict[str, float], limit: float, upper: bool) -> str:
    """Met only if the whole bootstrap CI of the median is on the right side of the target;
    "unresolved" when the CI straddles it (the noise is larger than the margin)."""
    lo, hi = s["ci95_lo"], s["ci95_hi"]
    good, bad = (hi <= limit, lo > limit) if upper else (lo >= limit, hi < limit)
    return "yes" if good else "no" if bad else "unresolved"


def table(results: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(figure, value with spread, target, met) rows."""
    rows: list[tuple[str, str, str, str]] = []

    def spread(s: dict[str, float]) -> str:
        return (
            f"{s['median']:.3f} (IQR {s['p25']:.3f}-{s['p75']:.3f}, "
            f"CI95 {s['ci95_lo']:.3f}-{s['ci95_hi']:.3f}, n={s['n']})"
        )

    r = results.get("tracing", {})
    for row in r.get("rows", []):
        label = f"tracing {row['model']} {row['world_size']}r"
        rows.append(
            (
                f"{label}: traced/untraced end to end",
                spread(row["traced"]),
                "<= 1.01",
                verdict(row["traced"], 1.01, upper=True),
            )
        )
        rows.append(
            (
                f"{label}: 1 + tracer calls / step (direct)",
                f"{row['direct_ratio']:.4f}",
                "<= 1.01",
                "yes" if row["direct_ratio"] <= 1.01 else "no",
            )
        )
        rows.append((f"{label}: trace_comm='hook' only/untraced", spread(row["hook_only"]), "", ""))
        rows.append(
            (f"{label}: torch.profiler/untraced", spread(row["profiler"]), "(contrast)", "")
        )
    if "direct" in r:
        d, h = r["direct"], r["hook"]
        rows.append(
            (
                "tracer calls (us): PhaseClock / Tracer.step / comm timer read / hook per bucket",
                f"{d['phaseclock_us_per_step']:.1f} / {d['tracer_step_us']:.1f} / "
                f"{h['sampler_read_us']:.1f} / {h['commmeter_extra_us_per_bucket']:.0f}",
                "",
                "",
            )
        )
    for row in results.get("fidelity", {}).get("rows", []):
        for key, label in (
            ("throughput_1", "throughput 1r"),
            ("throughput_2", "throughput 2r"),
            ("speedup", "speedup 2r/1r"),
        ):
            if key not in row:  # a smoke run measures 1 rank only
                continue
            s = row[key]
            rows.append(
                (
                    f"fidelity {row['model']}: workbench/torchrun {label}",
                    spread(s),
                    ">= 0.98",
                    verdict(s, 0.98, upper=False),
                )
            )
    r = results.get("latency", {})
    for key, label in (
        ("to_first_step_all_s", "first step on all ranks"),
        ("to_result_s", "result"),
    ):
        if key in r:
            s = r[key]
            rows.append(
                (
                    f"launch latency to {label}: workbench/torchrun",
                    f"{spread(s['ratio'])}; {s['workbench_median_s']:.1f} s vs "
                    f"{s['torchrun_median_s']:.1f} s",
                    "<= 1.5",
                    verdict(s["ratio"], 1.5, upper=True),
                )
            )
    r = results.get("analysis", {})
    if "pyarrow_s" in r:
        ratio = r["workbench_s"] / r["pyarrow_s"]
        rows.append(
            (
                f"workbench report of {r['rows']} rows / pyarrow read",
                f"{ratio:.2f}",
                "<= 1.0",
                "yes" if ratio <= 1.0 else "no",
            )
        )
    r = results.get("memory", {})
    for mode in ("rss", "tracemalloc"):
        if mode in r:
            s = r[mode]["samples"]
            rows.append(
                (
                    f"tracer memory ({mode}) growth, steps {s[1][0]:,}-{s[-1][0]:,}",
                    f"{r[mode]['growth_from_first_sample_bytes'] / 1024:+.0f} KiB",
                    "flat",
                    "",
                )
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="every benchmark at its --smoke size")
    parser.add_argument(
        "--smoke", action="store_true", help=f"as --quick, over {SMOKE_ONLY} alone by default"
    )
    parser.add_argument(
        "--only",
        help=f"comma-separated subset of {', '.join(BENCHMARKS)} (default: all)",
    )
    parser.add_argument("--out", help="write every result (JSON) here")
    a = parser.parse_args()
    a.quick = a.quick or a.smoke
    names = (a.only or (SMOKE_ONLY if a.smoke else ",".join(BENCHMARKS))).split(",")
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; valid: {', '.join(BENCHMARKS)}")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="wb-bench-all-") as tmp:
        for name in names:
            results[name] = run(name, a.quick, Path(tmp))
    m = machine()
    print(
        f"\n{m['cpu_model']}, {m['cores']} cores, torch {m['torch']}, Python {m['python']}, "
        f"load average now {m['loadavg'][0]:.1f}" + (" (--quick: smoke figures)" if a.quick else "")
    )
    rows = table(results)
    widths = [
        max(len(r[i]) for r in rows + [("figure", "value", "target", "met")]) for i in range(4)
    ]
    for r in [("figure", "value", "target", "met"), tuple("-" * w for w in widths)] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    for name, r in results.items():
        error = f"  ERROR {r['error']}" if "error" in r else ""
        print(f"{name}: {r.get('seconds', 0):.0f} s{error}")
    if a.out:
        Path(a.out).write_text(json.dumps({"machine": m, **results}, indent=2, default=float))
    failed = [name for name, r in results.items() if "error" in r]
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
