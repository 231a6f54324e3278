"""The network measured directly: a short allreduce micro-benchmark at the run's own gradient
bucket sizes (DDP), or all-gathers and reduce-scatters at its own sizes (FSDP2:
:func:`measure_fsdp`), run by every rank of a multi-rank run after its last step (outside the
throughput window, and off the path to the first step), reported in nccl-tests' definitions.

nccl-tests (``doc/PERFORMANCE.md``): algorithm bandwidth ``algbw = bytes / time``; bus bandwidth
for allreduce ``busbw = algbw x 2(n-1)/n`` with n ranks, the figure comparable with the
hardware's link bandwidth whatever the rank count. Time is the mean over the ranks of one
allreduce, from a barrier to the last of a loop of back-to-back allreduces completing, the
median of three such loops. Beside the bucket sizes, a one-element allreduce: its time over the
ring's 2(n-1) hops is ``latency_s``, the per-message cost that grows with the world size.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from workbench.rank import distributed, hook_cost

#: Wall-time budget of the whole benchmark (seconds), warm-up included; each bucket size
#: gets an equal share for its timed loops.
BUDGET_S = 0.3
#: Timed allreduces per loop, at least and at most.
MIN_ITERATIONS, MAX_ITERATIONS = 3, 1000
#: Timed loops per bucket size; the figure is their median.
LOOPS = 3
#: Single allreduces whose fastest sizes the timed loops.
SIZING_CALLS = 3
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def bucket_params(module: nn.Module, bucket_cap_mb: float) -> list[list[nn.Parameter]]:
    """The parameters of each gradient bucket as DDP forms them when ``bucket_cap_mb`` is given
    (the workbench always gives it, so DDP caps its first bucket at the same size): parameters
    that need a gradient, last registered first (DDP's order until it rebuilds the buckets in
    the order gradients became ready), a bucket closing once it holds at least the cap."""
    cap = bucket_cap_mb * 2**20
    buckets: list[list[nn.Parameter]] = []
    held, bucket = 0, []
    for p in reversed([p for p in module.parameters() if p.requires_grad]):
        bucket.append(p)
        held += p.numel() * p.element_size()
        if held >= cap:
            buckets.append(bucket)
            held, bucket = 0, []
    if bucket:
        buckets.append(bucket)
    return buckets


def bucket_sizes(module: nn.Module, bucket_cap_mb: float, element_bytes: int = 4) -> list[int]:
    """The bytes of each gradient bucket (:func:`bucket_params`) as sent at ``element_bytes``
    per gradient element (2 with fp16 or bf16 compression): DDP fills the buckets at the
    gradients' own size before any hook compresses them."""
    return [
        sum(p.numel() for p in bucket) * element_bytes
        for bucket in bucket_params(module, bucket_cap_mb)
    ]


def ddp_bucket_sizes(ddp: Any, element_bytes: int = 4) -> list[int]:
    """The bytes of each bucket of a DDP just built, as its reducer formed them (DDP's logging
    data; each sent at ``element_bytes`` per 4-byte gradient element); where that is not
    available, as :func:`bucket_sizes` forms them from DDP's own cap."""
    try:
        text = str(ddp._get_ddp_logging_data().get("bucket_sizes") or "")
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except Exception:  # a torch without the private call: DDP's rule instead
        sizes = []
    if sizes:
        return [max(1, size * element_bytes // 4) for size in sizes]
    return bucket_sizes(ddp.module, ddp_cap_mb(ddp), element_bytes)


def ddp_cap_mb(ddp: Any) -> float:
    """A DDP's bucket cap in MiB."""
    return float(ddp.bucket_bytes_cap) / 2**20


def bus_factor(world_size: int, collective: str = "allreduce") -> float:
    """nccl-tests' bus bandwidth factor: 2(n-1)/n for allreduce, (n-1)/n for all-gather and
    reduce-scatter (each rank sends, or receives, all but its own 1/n of the buffer)."""
    per_rank = (world_size - 1) / world_size
    return 2.0 * per_rank if collective == "allreduce" else per_rank


def _time_size(
    nbytes: int,
    dtype: torch.dtype,
    device: torch.device,
    budget_s: float,
    collective: str = "allreduce",
) -> dict[str, Any]:
    """One bucket size: a warm-up allreduce, the fastest of :data:`SIZING_CALLS` to size the
    loops (the same count on every rank: the time is agreed), then ``LOOPS`` timed loops, of
    which the median: a rank
    descheduled once (a shared host, a monitor waking) spoils one loop, not the figure."""
    element = torch.tensor([], dtype=dtype).element_size()
    n = distributed.world_size() if collective != "allreduce" else 1
    numel = max(nbytes // element // n, 1) * n  # a whole shard per rank
    tensor = torch.zeros(numel, dtype=dtype, device=device)

    def timed(iterations: int) -> float:
        return distributed.time_collective(collective, tensor, iterations)

    timed(1)  # connections and buffers for this size
    # the fastest of a few single calls sizes the loops: one slow first call (a rank
    # descheduled) would leave loops of a few calls, each as noisy as a single call
    once = min(timed(1) for _ in range(SIZING_CALLS))
    per_loop = budget_s / LOOPS
    iterations = int(min(max(per_loop / max(once, 1e-9), MIN_ITERATIONS), MAX_ITERATIONS))
    loops = [timed(iterations) / iterations for _ in range(LOOPS)]
    seconds = statistics.median(loops)
    sent = tensor.numel() * element
    return {
        "bytes": sent,
        "iterations": iterations,
        "time_s": seconds,
        "algbw_bytes_per_s": sent / seconds,
    }


def measure_allreduce(
    sizes: Sequence[int],
    device: torch.device,
    world_size: int,
    precision_hook: str = "allreduce",
    budget_s: float = BUDGET_S,
    hook_buckets: Sequence[hook_cost.Shapes] = (),
    powersgd_rank: int = 1,
) -> dict[str, Any]:
    """Time an allreduce of each distinct size in ``sizes`` (bytes, one step's buckets) on the
    default process group; every rank must call it. Returns the record ``run.json`` keeps:
    per size, and for one step's buckets together (``time_s``: the per-size times summed over
    ``sizes``; ``algbw`` and ``busbw`` from the total bytes over that time). Where the run
    sends plain allreduce and ``hook_buckets`` (the step's buckets' gradient shapes) are given,
    also what each comm hook costs on them (``hooks``: :mod:`workbench.rank.hook_cost`), what
    a prediction for another hook needs."""
    started = time.perf_counter()
    dtype = _DTYPES.get(precision_hook, torch.float32)
    # half the budget for the buckets' sizes, a quarter for the one-element allreduce
    record = _collective_record("allreduce", sizes, dtype, device, world_size, budget_s / 2)
    # one element: the time is the ring's hops, 2(n-1) of them, and no bytes to speak of
    tiny = _time_size(4, torch.float32, device, budget_s / 4)
    hop_s = tiny["time_s"] / (2 * (world_size - 1)) if world_size > 1 else None
    hooks = None
    if hook_buckets and precision_hook == "allreduce":
        hooks = hook_cost.measure_hooks(hook_buckets, device, powersgd_rank)
    return {
        "collective": "allreduce",
        "definition": "nccl-tests: algbw = bytes / time; busbw = algbw x 2(n-1)/n",
        "world_size": world_size,
        "device": str(device),
        "bucket_sizes_bytes": record.pop("call_sizes_bytes"),
        **record,  # dtype, bytes, time_s, algbw, busbw, sizes
        # seconds per ring hop: a one-element allreduce's time over its 2(n-1) hops
        "latency_s": hop_s,
        "one_element": tiny,  # the loops latency_s comes from
        **({"hooks": hooks} if hooks else {}),
        "duration_s": time.perf_counter() - started,
    }


def _collective_record(
    collective: str,
    sizes: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
    world_size: int,
    budget_s: float,
) -> dict[str, Any]:
    """One collective at each distinct size of ``sizes`` (one step's calls, bytes each), and
    the step's calls together: ``time_s`` the per-size times summed over ``sizes``, ``algbw``
    and ``busbw`` from the total bytes over it."""
    factor = bus_factor(world_size, collective)
    distinct = sorted(set(sizes))
    per_size = {}
    for nbytes in distinct:
        row = _time_size(nbytes, dtype, device, budget_s / len(distinct), collective)
        row["busbw_bytes_per_s"] = row["algbw_bytes_per_s"] * factor
        per_size[nbytes] = row
    total = sum(per_size[n]["bytes"] for n in sizes)
    time_s = sum(per_size[n]["time_s"] for n in sizes)
    algbw = total / time_s if time_s > 0 else None
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "call_sizes_bytes": list(sizes),
        "bytes": total,
        "time_s": time_s,
        "algbw_bytes_per_s": algbw,
        "busbw_bytes_per_s": algbw * factor if algbw is not None else None,
        "sizes": [per_size[n] for n in distinct],
    }


#: Replays of a step's FSDP calls (:func:`_paced_record`) timed, after one not counted (the
#: link and the ranks warmed, as nccl-tests' warm-up iterations); the figure is their mean.
PACED_PASSES = 8


def _spend_gap(gap_s: float, host_s: float) -> None:
    """A gap before a call as the step spent it: ``host_s`` of this thread's CPU (spun: on
    cores the ranks share, a collective competes with it as in the step), the rest slept."""
    started, busy = time.perf_counter(), time.thread_time()
    while time.thread_time() - busy < host_s:
        pass
    time.sleep(max(gap_s - (time.perf_counter() - started), 0.0))


def _paced_record(
    pattern: Sequence[tuple[int, int, float, float]],
    dtypes: Sequence[str | None],
    device: torch.device,
    world_size: int,
) -> dict[str, Any] | None:
    """One step's FSDP calls replayed as the step made them: in its order, each after the
    rank's own gap before it (its host work spun, the rest of its compute slept), one pass
    not counted, then :data:`PACED_PASSES`, each from a barrier. A call's time runs from its
    start to its return, on each rank, so it holds the wait for a rank that came later, as in
    the step; a pass's time is its calls' time, gaps left out, the mean over the ranks; the
    figure is the passes' mean, as a run's throughput is its steps'. A link that lets a burst
    through after an idle gap (a token bucket: a cloud VM's network, ``tc tbf``) moves a
    step's calls faster than back to back; elsewhere the two agree. None where the ranks made
    different calls."""
    lengths = distributed.over_ranks([len(pattern), -len(pattern)], device, "max")
    if not pattern or lengths[0] != -lengths[1]:
        return None
    buffers = {}
    for kind, nbytes, *_ in pattern:
        dtype = getattr(torch, dtypes[kind]) if dtypes[kind] else torch.float32
        element = torch.tensor([], dtype=dtype).element_size()
        numel = max(nbytes // element // world_size, 1) * world_size
        whole = torch.zeros(numel, dtype=dtype, device=device)
        buffers[kind, nbytes] = (whole, whole.new_zeros(numel // world_size))
    collectives = ("all_gather", "reduce_scatter")
    passes = []
    for _ in range(1 + PACED_PASSES):
        spent = [0.0, 0.0]
        distributed.barrier()
        for kind, nbytes, gap, host in pattern:
            _spend_gap(gap, host)
            spent[kind] += distributed.call_once(collectives[kind], *buffers[kind, nbytes])
        passes.append(distributed.over_ranks(spent, device))
    timed = passes[1:]
    mean = [sum(p[k] for p in timed) / len(timed) for k in range(2)]
    sent = [0, 0]
    for kind, nbytes, *_ in pattern:
        whole = buffers[kind, nbytes][0]
        sent[kind] += whole.numel() * whole.element_size()
    return {
        "definition": (
            "one step's calls in the step's order, each after the rank's gap before it in the "
            "step (its host work spun, the rest slept), one pass not counted, then the mean of "
            f"{PACED_PASSES} passes; time: the calls' alone, the mean over the ranks"
        ),
        "gaps_s": distributed.over_ranks([gap for _, _, gap, _ in pattern], device),
        "host_s": distributed.over_ranks([host for *_, host in pattern], device),
        "passes": len(timed),
        "passes_s": timed,
        **{f"{c}_bytes": sent[k] for k, c in enumerate(collectives)},
        **{f"{c}_s": mean[k] for k, c in enumerate(collectives)},
        "bytes": sum(sent),
        "time_s": sum(mean),
    }


def measure_fsdp(
    all_gather: Sequence[int],
    reduce_scatter: Sequence[int],
    device: torch.device,
    world_size: int,
    dtypes: Sequence[str | None] = (None, None),
    budget_s: float = BUDGET_S,
    pattern: Sequence[tuple[int, int, float, float]] = (),
) -> dict[str, Any]:
    """Time what FSDP2 sends in one step, on the default process group (every rank must call
    it): an all-gather of each size in ``all_gather`` and a reduce-scatter of each size in
    ``reduce_scatter`` (bytes of each call's whole buffer, as ``fsdp_comm`` counts them: the
    gathered output, the reduced input), at ``dtypes`` (each kind's, as ``torch.float32``
    names it without its prefix; None: float32). Returns the record ``run.json`` keeps: per
    collective as :func:`measure_allreduce` per size, back to back; both together (``bytes``,
    ``time_s``, ``algbw``, ``busbw``: both bus factors are (n-1)/n), the step's ``pattern``
    (``FSDPCommMeter.pattern``) replayed with its gaps where given (:func:`_paced_record`,
    kept as ``paced``; ``back_to_back`` beside it); ``latency_s`` as the allreduce's."""
    started = time.perf_counter()
    kinds = {"all_gather": all_gather, "reduce_scatter": reduce_scatter}
    records = {}
    for (name, sizes), dtype in zip(kinds.items(), dtypes, strict=True):
        if sizes:
            resolved = getattr(torch, dtype) if dtype else torch.float32
            records[name] = _collective_record(
                name, sizes, resolved, device, world_size, budget_s / (2 * len(kinds))
            )
    total = sum(r["bytes"] for r in records.values())
    time_s = sum(r["time_s"] for r in records.values())
    paced = _paced_record(pattern, dtypes, device, world_size) if pattern else None
    together = {"bytes": total, "time_s": time_s}
    if paced is not None and paced["time_s"] > 0:  # the step's own spacing, where replayed
        together = {"bytes": paced["bytes"], "time_s": paced["time_s"]}
    algbw = together["bytes"] / together["time_s"] if together["time_s"] > 0 else None
    tiny = _time_size(4, torch.float32, device, budget_s / 4)
    factor = bus_factor(world_size, "all_gather")
    return {
        "collective": "fsdp",
        "definition": (
            "nccl-tests: algbw = bytes / time (bytes: an all-gather's gathered output, a "
            "reduce-scatter's input); busbw = algbw x (n-1)/n for both"
            + ("; together: one step's calls replayed with its gaps (paced)" if paced else "")
        ),
        "world_size": world_size,
        "device": str(device),
        **records,
        **together,
        "algbw_bytes_per_s": algbw,
        "busbw_bytes_per_s": algbw * factor if algbw else None,
        **({"paced": paced} if paced else {}),
        "back_to_back": {
            "bytes": total,
            "time_s": time_s,
            "busbw_bytes_per_s": total / time_s * factor if time_s > 0 else None,
        },
        "latency_s": tiny["time_s"] / (2 * (world_size - 1)) if world_size > 1 else None,
        "one_element": tiny,
        "duration_s": time.perf_counter() - started,
    }


def fsdp_at_end(enabled: bool, world_size: int) -> Callable[[Any], dict[str, Any] | None] | None:
    """What a rank calls with its FSDP meter (``workbench.trace.fsdp_comm.FSDPCommMeter``) once
    its training is over: :func:`measure_fsdp` at the sizes of the last step's calls, on every
    rank of a multi-rank run where the benchmark is ``enabled``; None where it is not run."""
    if not (enabled and world_size > 1):
        return None

    def measure(meter: Any) -> dict[str, Any] | None:
        all_gather, reduce_scatter = meter.sizes
        if not (all_gather or reduce_scatter):
            return None  # no step communicated (the same on every rank: the same model)
        return measure_fsdp(
            all_gather,
            reduce_scatter,
            meter.device,
            world_size,
            meter.dtypes,
            pattern=meter.pattern,
        )

    return measure
