"""Communication with known answers, through real gloo runs: exposed communication at one rank
with many buckets (almost nothing), at two ranks (more than nothing, less than the backward),
the allreduce micro-benchmark against a bare ``torch.distributed.all_reduce`` loop, each comm
hook timed on the run's buckets, and a torch
that lost a private DDP call (bytes only, one warning, the run completes)."""

from __future__ import annotations

import math
import statistics
import time

import pytest
import torch
import torch.distributed as dist

from workbench import schema
from workbench.config.choices import COMM_HOOKS
from workbench.rank.hook_cost import BUDGET_S, MAX_ROUNDS, MIN_ROUNDS, bucket_shapes, measure_hooks
from workbench.rank.models import build_model, gradient_bytes
from workbench.rank.network import LOOPS, bucket_params, measure_allreduce
from workbench.run.launch import launch
from workbench.store.files import read_json

from .conftest import base_config
from .gloo_pair import in_two_ranks
from .helpers import WARM

# timing: its claims are durations measured on this host; they run alone (tests/README.md)
pytestmark = [pytest.mark.slow, pytest.mark.timing]

#: An MLP of 8 hidden layers of 256 (each about 257 KiB of gradients) and buckets of 0.25 MiB:
#: DDP puts each layer in a bucket of its own, so 9 buckets.
WIDE = {"hidden_dim": 256, "num_layers": 8}
CAP_MB = 0.25


def _comm_config(store, world_size: int, name: str, **changes):
    return base_config(
        store,
        world_size=world_size,
        run_name=name,
        model_options=WIDE,
        bucket_cap_mb=CAP_MB,
        trace_comm_every_steps=1,
        **changes,
    )


@pytest.fixture(scope="module")
def comm_runs(store):
    """One rank and two ranks of the many-bucket model, one after the other: three ranks on two
    cores would deschedule the one-rank run between its last gradient and the end of its
    backward, which is exactly the exposed time measured (8 % of the step was seen so)."""
    handles = {}
    for key, world_size, name in (("one", 1, "comm-1rank"), ("two", 2, "comm-2rank")):
        handles[key] = launch(_comm_config(store, world_size, name), WARM)
        assert handles[key].wait(timeout_s=300) == "completed", handles[key].logs()
    return handles


def _measured(handle):
    steps = handle.traces()
    steps = steps[~steps["warmup"]]
    return steps, read_json(handle.path / schema.RUN_FILE)


def test_one_rank_many_buckets_exposes_almost_no_communication(comm_runs) -> None:
    steps, run = _measured(comm_runs["one"])
    assert (steps["comm_buckets"] >= 8).all(), steps["comm_buckets"].unique()
    assert steps[["comm_s", "backward_compute_s", "comm_exposed_s"]].notna().all().all()
    exposed_share = steps["comm_exposed_s"].sum() / steps["step_s"].sum()
    span_share = steps["comm_s"].sum() / steps["step_s"].sum()
    # a typical step: a step the host descheduled the rank in (a noisy 2-core machine) exposes
    # the time it waited, and a few such steps moved the sum's share from 2 % to 8 % once
    typical = (steps["comm_exposed_s"] / steps["step_s"]).median()
    typical_span = (steps["comm_s"] / steps["step_s"]).median()
    print(
        f"1 rank: exposed {exposed_share:.2%} of the step ({typical:.2%} in the median step), "
        f"DDP's span {span_share:.2%} ({typical_span:.2%})"
    )
    # Against DDP's own span in the same steps, not an absolute share: what one rank exposes is
    # the reducer's bookkeeping after its last bucket, 4.4-5.0 % of this model's step on a quiet
    # 2-core host (before and after the changes of 2026-12-01), against a span of about 40 %.
    assert typical < typical_span / 4
    # DDP's span covers most of the backward although one rank moves nothing.
    assert span_share > 4 * exposed_share
    assert (steps["comm_exposed_s"] <= steps["comm_s"]).all()
    assert run["comm_method"] == {"0": "ddp_timer"}
    assert run["measurement_warnings"] == []
    assert run["network"] is None, "one rank: no network to measure"


def test_two_ranks_expose_some_communication_within_the_backward(comm_runs) -> None:
    steps, run = _measured(comm_runs["two"])
    assert steps[["comm_s", "backward_compute_s", "comm_exposed_s"]].notna().all().all()
    assert (steps["comm_exposed_s"] > 0).all()
    assert (steps["comm_exposed_s"] <= steps["backward_s"]).all()
    assert (steps["comm_exposed_s"] <= steps["comm_s"]).all()
    assert (steps["backward_compute_s"] <= steps["step_s"]).all()
    assert run["comm_method"] == {"0": "ddp_timer", "1": "ddp_timer"}
    assert run["measurement_warnings"] == []


def test_network_benchmark_uses_the_run_buckets_and_nccl_tests_definitions(comm_runs) -> None:
    steps, run = _measured(comm_runs["two"])
    net = run["network"]
    assert net["collective"] == "allreduce" and net["world_size"] == 2
    # The benchmark's buckets are the run's: the same bytes and count DDP reports.
    assert net["bytes"] == sum(net["bucket_sizes_bytes"]) == steps["comm_bytes"].iloc[0]
    assert len(net["bucket_sizes_bytes"]) == steps["comm_buckets"].iloc[0]
    assert net["bytes"] == gradient_bytes(build_model("mlp", WIDE))
    assert net["algbw_bytes_per_s"] == pytest.approx(net["bytes"] / net["time_s"])
    # busbw = algbw x 2(n-1)/n: at n = 2 the factor is 1.
    assert net["busbw_bytes_per_s"] == pytest.approx(net["algbw_bytes_per_s"])
    for row in net["sizes"]:
        assert row["algbw_bytes_per_s"] == pytest.approx(row["bytes"] / row["time_s"])
        assert row["iterations"] >= 3
    # Its time goes to its timed loops (budgeted at 0.3 s from the fastest single allreduce:
    # 0.55-0.76 s here, where back-to-back allreduces run slower) and its one-element loop
    # (budgeted at 0.075 s, as slower), beside a few single calls that size them: 1.35 and 1.36
    # times the bucket sizes' loops in two clean runs, 2.3 once when the one-element loop, then
    # left out of the sum, was slow. (An absolute bound of 1 s failed at 1.03 s on a slower hour.)
    rows = [*net["sizes"], net["one_element"]]
    assert net["one_element"]["bytes"] == 4 and net["one_element"]["iterations"] >= 3
    assert net["latency_s"] == pytest.approx(net["one_element"]["time_s"] / 2)  # 2(n-1) hops
    loops_s = sum(LOOPS * row["iterations"] * row["time_s"] for row in rows)
    allreduce_s = net["duration_s"] - net["hooks"]["duration_s"]
    print(f"benchmark {allreduce_s:.3f} s, its timed loops {loops_s:.3f} s")
    assert allreduce_s < 2 * loops_s, (allreduce_s, loops_s)


def test_each_comm_hook_is_timed_on_the_run_buckets(comm_runs) -> None:
    _, run = _measured(comm_runs["two"])
    net = run["network"]
    hooks = net["hooks"]
    assert set(hooks["time_s"]) == set(COMM_HOOKS)
    # the run's buckets, timed once per distinct set of shapes: here the layers alike in size
    # are alike in shape (the head shares the last layer's bucket)
    sizes = net["bucket_sizes_bytes"]
    assert hooks["buckets"] == len(sizes) > hooks["distinct_buckets"] == len(set(sizes)) > 1
    # beside the benchmark's allreduce: another clock (single calls against back-to-back loops),
    # 0.35 to 2.03 times it on two shared cores; the known answer is the bare calls' test below
    ratio = hooks["time_s"]["allreduce"] / net["time_s"]
    print(f"hooks: {hooks['time_s']}; plain hook / benchmark's allreduce = {ratio:.2f}")
    # PowerSGD at rank 1 makes three allreduces of each bucket (its bias uncompressed, then the
    # factors P and Q) where the plain hook makes one, and computes between them
    assert hooks["time_s"]["powersgd"] > hooks["time_s"]["allreduce"]
    # The timed rounds are sized to the 0.4 s budget from a warm-up round (3 rounds warm up
    # first): the rounds at their faster quarter fit it. (Their wall time is the host's: 1.0 s
    # in all on a quiet hour, more where the hypervisor takes a quarter of the CPU.)
    round_s = sum(hooks["time_s"].values())
    print(f"hooks: {hooks['rounds']} rounds of {round_s * 1e3:.1f} ms, {hooks['duration_s']:.2f} s")
    assert hooks["rounds"] == MIN_ROUNDS or hooks["rounds"] * round_s <= 1.5 * BUDGET_S, hooks
    assert MIN_ROUNDS <= hooks["rounds"] <= MAX_ROUNDS, hooks


def _bare_beside_benchmark(nbytes: int, rounds: int) -> dict:
    """In turns, a bare loop of allreduces of ``nbytes`` of float32 (nothing of the workbench)
    and the workbench's micro-benchmark at that size, ``rounds`` times each."""
    tensor = torch.zeros(nbytes // 4)
    for _ in range(5):
        dist.all_reduce(tensor)
    bare, benchmark = [], []
    for _ in range(rounds):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(BARE_ITERATIONS):
            dist.all_reduce(tensor)
        bare.append((time.perf_counter() - start) / BARE_ITERATIONS)
        row = measure_allreduce([nbytes], torch.device("cpu"), 2)["sizes"][0]
        benchmark.append(row["busbw_bytes_per_s"])
    return {"bare_time_s": statistics.median(bare), "busbw": statistics.median(benchmark)}


#: Allreduces in one timed loop of the bare side.
BARE_ITERATIONS = 100


def test_network_busbw_within_2x_of_a_bare_allreduce_loop_in_turns(comm_runs) -> None:
    _, run = _measured(comm_runs["two"])
    nbytes = max(run["network"]["sizes"], key=lambda r: r["bytes"])["bytes"]  # the run's bucket
    out = in_two_ranks(_bare_beside_benchmark, nbytes, 5)
    bare_time, busbw = out["bare_time_s"], out["busbw"]
    # n = 2: busbw = algbw x 2(2-1)/2 = bytes / time.
    bare_busbw = nbytes / bare_time
    ratio = busbw / bare_busbw
    print(
        f"busbw at {nbytes} B: workbench {busbw / 1e9:.3f} GB/s, bare loop "
        f"{bare_busbw / 1e9:.3f} GB/s, ratio {ratio:.2f} (medians of 5 rounds, in turns)"
    )
    # What this guards: units (bytes, not bits: 8x), the bus factor, the time per allreduce (not
    # per loop: 10x or more), a factor of 2 anywhere. The two in turns in the same two processes
    # (1.03, 1.07, 1.27 seen): apart (the run's own figure against a loop minutes later) they
    # differed up to 5.7x, for a 2-rank allreduce on two shared cores runs at 0.1 or at 0.5 GB/s
    # as the ranks happen to be scheduled.
    assert 1 / 2 <= ratio <= 2.0


def _bare_beside_hooks(shapes: list, turns: int) -> dict:
    """In turns, rounds of bare single allreduces of every bucket of one step (each call timed,
    summed over the step; nothing of the workbench) and the workbench's hook timing on the same
    buckets, ``turns`` times each."""
    tensors = [torch.zeros(sum(math.prod(s) for s in bucket)) for bucket in shapes]
    for tensor in tensors:
        dist.all_reduce(tensor)
    bare, hooks = [], []
    for _ in range(turns):
        rounds = []
        for _ in range(BARE_ROUNDS):
            total = 0.0
            for tensor in tensors:
                start = time.perf_counter()
                dist.all_reduce(tensor)
                total += time.perf_counter() - start
            rounds.append(total)
        bare.append(statistics.quantiles(rounds, n=4)[0])
        hooks.append(measure_hooks(shapes, torch.device("cpu"))["time_s"]["allreduce"])
    return {"bare_s": statistics.median(bare), "hook_s": statistics.median(hooks)}


#: Timed rounds (one step's buckets each) in one turn of the bare side.
BARE_ROUNDS = 40


def test_the_plain_hook_costs_what_bare_single_allreduces_of_the_buckets_cost(comm_runs) -> None:
    _, run = _measured(comm_runs["two"])
    shapes = bucket_shapes(bucket_params(build_model("mlp", WIDE), CAP_MB))
    sizes = [4 * sum(math.prod(s) for s in bucket) for bucket in shapes]
    assert sizes == run["network"]["bucket_sizes_bytes"], "the run's own buckets"
    out = in_two_ranks(_bare_beside_hooks, shapes, 3)
    bare_s, hook_s = out["bare_s"], out["hook_s"]
    ratio = hook_s / bare_s
    print(
        f"one step's {len(shapes)} buckets: plain hook {hook_s * 1e3:.2f} ms, bare single calls "
        f"{bare_s * 1e3:.2f} ms (lower quartiles of rounds), ratio {ratio:.2f}, in turns"
    )
    # What this guards: seconds a step with each of the step's buckets counted (8 alike here,
    # timed once and weighted: one bucket of 8, or 8 of each, is 8x either way), per call (not
    # per round) and the hook's own cost (its division by the world size: small). The bounds
    # sit halfway, on a log scale, between 1 and that error (sqrt 8 = 2.83 either side)
    assert 1 / math.sqrt(8) <= ratio <= math.sqrt(8)


def test_network_benchmark_can_be_turned_off(store) -> None:
    handle = launch(
        base_config(store, world_size=2, run_name="no-net", network_benchmark=False, epochs=1),
        WARM,
    )
    assert handle.wait(timeout_s=180) == "completed"
    assert read_json(handle.path / schema.RUN_FILE)["network"] is None


def test_a_missing_private_ddp_call_falls_back_to_bytes_with_one_warning(store) -> None:
    handle = launch(
        base_config(
            store,
            world_size=1,
            run_name="no-ddp-logging",
            model="tests.plugins:mlp_in_a_torch_without_ddp_logging_data",
            dataset="tests.plugins:synthetic_like_mlp",
        ),
        WARM,
    )
    assert handle.wait(timeout_s=180) == "completed", handle.logs()
    steps = handle.traces()
    assert len(steps) == 16
    assert steps[["comm_s", "backward_compute_s", "comm_exposed_s"]].isna().all().all()
    assert (steps["comm_bytes"] == gradient_bytes(build_model("mlp", {}))).all()
    run = read_json(handle.path / schema.RUN_FILE)
    assert run["comm_method"] == {"0": "bytes_only"}
    [warning] = run["measurement_warnings"]
    assert "_get_ddp_logging_data" in warning["message"] and warning["ranks"] == [0]
    assert handle.logs(0).count("_get_ddp_logging_data failed") == 1
