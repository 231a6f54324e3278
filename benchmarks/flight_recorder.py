"""What the flight recorder and the trace's flush cost a training step, measured on the path
itself: a step's phase marks; the recorder's wrapper around a collective, measured around a
call that does nothing (its group's lookup, its sequence number read from the process group,
its entry written, its return stamped: a real collective costs tens of microseconds more,
the same with or without it); the tracer's flush of one flush interval's rows (a 5 ms step:
200 rows a second) divided by its rows; and PyTorch's own recorder (on by default) against it
off, per collective, in fresh processes.

Usage: ``python benchmarks/flight_recorder.py [--smoke] [--rounds N] [--out F]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import mean_stats, write_result

#: A step's phase marks, the most either path makes: a script's data, forward, backward, after
#: backward, optimizer, between steps (a built-in step makes five).
MARKS_PER_STEP = 6
STEP_S = 0.005  # the short step the budget is for (5 ms)


def _marks(recorder, steps: int) -> float:
    """Seconds per step of a built-in step's phase marks."""
    start = time.perf_counter()
    for k in range(steps):
        recorder.at(k, 1)
        recorder.phase(2)
        recorder.phase(3)
        recorder.phase(8)
        recorder.phase(4)
        recorder.phase(5)
    return (time.perf_counter() - start) / steps


def _collectives(calls: int, bare, wrapped, tensor) -> tuple[float, float]:
    """Seconds per call, bare then wrapped, each over ``calls`` calls."""
    out = []
    for fn in (bare, wrapped):
        start = time.perf_counter()
        for _ in range(calls):
            fn(tensor)
        out.append((time.perf_counter() - start) / calls)
    return out[0], out[1]


def _flush(folder: Path, rows: int, rounds: int) -> list[float]:
    """Seconds of each flush of ``rows`` built-in step rows."""
    import torch

    from workbench.trace.tracer import Tracer

    tracer = Tracer(folder, run_id="bench", rank=0, local_rank=0, host="h", world_size=1,
                    attempt=0, flush_s=1e9, device=torch.device("cpu"))  # fmt: skip
    times = []
    for r in range(rounds):
        for k in range(rows):
            t = time.perf_counter()
            stamps = (t, t + 1e-4, t + 2e-4, t + 3e-4, t + 4e-4)
            tracer.step(epoch=0, step=r * rows + k + 1, warmup=False, t_start_s=k * STEP_S,
                        phases=stamps, comm_s=None, comm_bytes=1024, comm_buckets=1,
                        samples=32, loss=0.5, lr=0.1)  # fmt: skip
        start = time.perf_counter()
        tracer.flush(hold_last=True)
        times.append(time.perf_counter() - start)
    tracer.close()
    return times


def _child(calls: int) -> None:
    """In a fresh process (the recorder's size is read when the group is made): seconds per
    1-rank all_reduce of 8 floats, printed."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    tensor = torch.ones(8)
    for _ in range(1000):
        dist.all_reduce(tensor)
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(tensor)
    print((time.perf_counter() - start) / calls)
    dist.destroy_process_group()


def _torch_recorder(pairs: int, calls: int) -> list[float]:
    """Per call, PyTorch's own recorder on (2,000 entries) minus off, interleaved pairs of
    fresh processes (the order swapped every pair)."""
    import subprocess

    def one(size: str) -> float:
        env = {**os.environ, "TORCH_FR_BUFFER_SIZE": size}
        argv = [sys.executable, __file__, "--child", str(calls)]
        return float(subprocess.run(argv, env=env, capture_output=True, text=True,
                                    check=True).stdout.split()[-1])  # fmt: skip

    out = []
    for k in range(pairs):
        if k % 2:
            off, on = one("0"), one("2000")
        else:
            on, off = one("2000"), one("0")
        out.append(on - off)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few rounds")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--flush-s", type=float, default=1.0, help="the flush interval (1 s)")
    parser.add_argument("--out", help="write the result as JSON here")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0
    rounds = 3 if args.smoke else args.rounds
    import torch
    import torch.distributed as dist

    from workbench.store.flight_file import flight_path
    from workbench.trace import flight

    folder = Path(tempfile.mkdtemp(prefix="wb-flight-"))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    recorder = flight.start(flight_path(folder, 0))

    def nothing(tensor, op=None, group=None, async_op=False):
        return None

    wrapped = recorder.wrapped("all_reduce", nothing)
    tensor = torch.ones(8)
    marks, extra = [], []
    for _ in range(rounds):
        marks.append(_marks(recorder, 20_000))
        b, w = _collectives(20_000, nothing, wrapped, tensor)
        extra.append(w - b)
    flight.stop()
    dist.destroy_process_group()
    rows = int(args.flush_s / STEP_S)
    flushes = _flush(folder, rows, rounds)
    per_step = [f / rows for f in flushes]
    # fresh processes, each importing torch: none at the smoke size (a check of the harness)
    torch_extra = [] if args.smoke else _torch_recorder(10, 20_000)
    m, c, f, t = (mean_stats([x * 1e6 for x in v]) for v in (marks, extra, per_step, torch_extra))
    total = m["mean"] + f["mean"]
    print(f"phase marks: {m['mean']:.2f} us a step ({m['ci95_lo']:.2f}-{m['ci95_hi']:.2f})")
    print(f"a collective through the recorder: +{c['mean']:.2f} us a call "
          f"({c['ci95_lo']:.2f}-{c['ci95_hi']:.2f})")  # fmt: skip
    print(f"the flush of {rows} rows every {args.flush_s:g} s: {f['mean']:.2f} us a step "
          f"({f['ci95_lo']:.2f}-{f['ci95_hi']:.2f}; {1e3 * sum(flushes) / len(flushes):.2f} ms "
          "a flush)")  # fmt: skip
    if not torch_extra:
        print("PyTorch's own recorder on gloo / off: not measured at the smoke size")
    else:
        print(f"PyTorch's own recorder on gloo (its default, on; 2,000 entries) / off: "
              f"{t['mean']:+.2f} us a collective "
              f"({t['ci95_lo']:+.2f} to {t['ci95_hi']:+.2f})")  # fmt: skip
    print(f"flight recorder and flushing: {total:.2f} us a 5 ms step (budget 5 us)")
    write_result(args.out, "flight_recorder", {"marks_us": m, "collective_us": c,
                 "flush_us_per_step": f, "rows_per_flush": rows, "total_us": total,
                 "torch_recorder_us": t})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
