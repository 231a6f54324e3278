"""Communication figures from DDP's logging data, worked by hand: reset zeros are missing, exposed
communication is the span minus its overlap, a missing private call leaves bytes only with one
warning, a comm hook on CUDA never reports the enqueue, and the micro-benchmark's arithmetic."""

from __future__ import annotations

import time

import pytest
from torch import nn

from workbench.errors import MeasurementWarning
from workbench.rank.distributed import CommMeter
from workbench.rank.network import bucket_sizes, bus_factor
from workbench.run.failure import rank_measurements
from workbench.trace.comm_timing import CommFields, DDPCommSampler, ddp_timer_fields

MS = 1_000_000  # nanoseconds


def _data(iteration: int = 1, **changes: int) -> dict:
    """One sampled iteration as DDP's logger writes it (ns): backward compute 0..10 ms,
    communication from 2 ms (first bucket launched) to 13 ms (finalize_backward done)."""
    t0 = 1_700_000_000 * 10**9
    data = {
        "iteration": iteration,
        "bucket_sizes": "400, 600",
        "backward_compute_time": 10 * MS,
        "backward_comm_time": 11 * MS,
        "backward_compute_comm_overlap_time": 8 * MS,
        "backward_compute_time_start": t0,
        "backward_compute_time_end": t0 + 10 * MS,
        "backward_comm_time_start": t0 + 2 * MS,
        "backward_comm_time_end": t0 + 13 * MS,
    }
    data.update(changes)
    return data


def test_exposed_communication_is_the_span_after_the_last_gradient() -> None:
    comm, compute, exposed = ddp_timer_fields(_data())
    assert comm == pytest.approx(0.011) and compute == pytest.approx(0.010)
    # 11 ms span - 8 ms overlap = 3 ms = comm end (13) - compute end (10).
    assert exposed == pytest.approx(0.003)


@pytest.mark.parametrize(
    "reset",
    [
        {"backward_comm_time": 0},
        {"backward_comm_time_start": 0},
        {"backward_comm_time_end": 0},
    ],
)
def test_a_reset_communication_field_is_missing_not_zero(reset: dict) -> None:
    comm, compute, exposed = ddp_timer_fields(_data(**reset))
    assert comm is None and exposed is None and compute == pytest.approx(0.010)


def test_a_reset_compute_field_leaves_no_exposed_figure() -> None:
    comm, compute, exposed = ddp_timer_fields(_data(backward_compute_time_end=0))
    assert compute is None and exposed is None and comm == pytest.approx(0.011)


def test_a_zero_overlap_counts_only_when_its_timestamps_say_it_was_measured() -> None:
    # Communication launched as backward ended: overlap 0 is a measurement, all 11 ms exposed.
    assert ddp_timer_fields(_data(backward_compute_comm_overlap_time=0))[2] == pytest.approx(0.011)
    older = {
        k: v
        for k, v in _data(backward_compute_comm_overlap_time=0).items()
        if not k.endswith(("_start", "_end"))
    }
    assert ddp_timer_fields(older)[2] is None, "without timestamps a 0 may be a reset"


class _FakeLogger:
    def set_runtime_stats_and_log(self) -> None:
        pass


class _FakeDDP:
    """DDP's private surface as the sampler uses it, each piece removable."""

    def __init__(self, data: dict) -> None:
        self.data = data
        self.logger = _FakeLogger()
        self.rate: int | None = None

    def _set_ddp_runtime_logging_sample_rate(self, rate: int) -> None:
        self.rate = rate

    def _get_ddp_logging_data(self) -> dict:
        return self.data


def test_sampler_reads_the_three_figures_and_the_buckets() -> None:
    ddp = _FakeDDP(_data(iteration=1))
    sampler = DDPCommSampler(ddp, every_steps=4, gradient_bytes=999)
    assert ddp.rate == 4
    fields = sampler.take()
    assert fields.comm_bytes == 1000 and fields.comm_buckets == 2
    assert fields.comm_exposed_s == pytest.approx(0.003)
    assert sampler.method == "ddp_timer" and sampler.warnings == []


def test_with_a_compression_hook_bytes_are_the_hooks_and_times_ddps() -> None:
    meter = CommMeter(kind="fp16", timed=False)
    meter.active = True
    meter._record(time.perf_counter(), 500)  # what the fp16 hook sent: half of DDP's 1000
    sampler = DDPCommSampler(_FakeDDP(_data()), every_steps=4, gradient_bytes=999, hook_meter=meter)
    fields = sampler.take()
    assert (fields.comm_bytes, fields.comm_buckets) == (500, 1)
    assert fields.comm_s == pytest.approx(0.011) and fields.comm_exposed_s == pytest.approx(0.003)


def test_sampler_skips_a_stale_iteration() -> None:
    sampler = DDPCommSampler(_FakeDDP(_data(iteration=7)), every_steps=4, gradient_bytes=999)
    assert sampler.take() == CommFields(None, 1000, 2)


@pytest.mark.parametrize(
    "missing",
    [
        "_get_ddp_logging_data",
        "_set_ddp_runtime_logging_sample_rate",
        "logger.set_runtime_stats_and_log",
    ],
)
def test_a_missing_private_call_records_bytes_only_with_one_warning(missing: str) -> None:
    class Lost(_FakeDDP):
        pass

    class LostLogger(_FakeLogger):
        pass

    gone = property(lambda self: (_ for _ in ()).throw(AttributeError(missing)))
    setattr(LostLogger if missing.startswith("logger.") else Lost, missing.split(".")[-1], gone)
    ddp = Lost(_data())
    ddp.logger = LostLogger()
    with pytest.warns(MeasurementWarning, match=missing) as caught:
        sampler = DDPCommSampler(ddp, every_steps=1, gradient_bytes=999)
        rows = [sampler.take() for _ in range(5)]
    assert len(caught) == 1, "one warning, not one per step"
    assert rows == [CommFields(None, 999, None)] * 5
    assert sampler.method == "bytes_only" and len(sampler.warnings) == 1


def test_a_comm_hook_on_cuda_records_bytes_never_the_enqueue_time() -> None:
    """The hook's completion callback (``_record``) as NCCL would run it: on CUDA (the trainer
    passes ``timed=False`` for every CUDA device) the step has bytes and buckets, no time."""
    cuda, cpu = CommMeter(timed=False), CommMeter(timed=True)
    for meter in (cuda, cpu):
        meter.active = True
        meter._record(time.perf_counter() - 0.5, 4096)
    assert cuda.take() == CommFields(None, 4096, 1)
    timed = cpu.take()
    assert timed.comm_s is not None and timed.comm_s >= 0.5 and timed.comm_bytes == 4096


def test_bucket_sizes_follow_ddp_reverse_order_and_cap() -> None:
    # Parameters (fp32 bytes), registered: w 4000, b 40, w 2000, b 200; DDP fills buckets
    # last first: 200 + 2000 >= 2000 closes the first, 40 + 4000 the second.
    model = nn.Sequential(nn.Linear(100, 10), nn.Linear(10, 50))
    cap_mb = 2000 / 2**20
    assert bucket_sizes(model, cap_mb) == [2200, 4040]
    # fp16 compression: DDP forms the same buckets from the fp32 gradients, the hook sends
    # each at half its size.
    assert bucket_sizes(model, cap_mb, element_bytes=2) == [1100, 2020]
    assert bucket_sizes(model, 25.0) == [6240]


def test_bus_factor_is_nccl_tests_allreduce() -> None:
    assert bus_factor(2) == 1.0 and bus_factor(4) == 1.5 and bus_factor(8) == 1.75


def test_run_json_keeps_each_warning_once_with_its_ranks() -> None:
    said = {"comm_method": "bytes_only", "measurement_warnings": ["lost"], "network": {"x": 1}}
    states = {
        1: {"status": "completed", "summary": {**said, "network": {"x": 2}}},
        0: {"status": "completed", "summary": said},
        2: {"status": "failed"},
    }
    out = rank_measurements(states)
    assert out["measurement_warnings"] == [{"message": "lost", "ranks": [0, 1]}]
    assert out["comm_method"] == {"0": "bytes_only", "1": "bytes_only"}
    assert out["network"] == {"x": 1}, "rank 0's record"


def test_network_benchmark_switch_is_checked_by_name() -> None:
    from workbench.config.run_config import RunConfig
    from workbench.errors import ConfigError

    assert RunConfig(per_device_batch_size=8).network_benchmark is True
    with pytest.raises(ConfigError, match="network_benchmark='yes': must be true or false"):
        RunConfig(per_device_batch_size=8, network_benchmark="yes")


def test_runs_frame_carries_the_comm_method_warnings_and_network(tmp_path) -> None:
    from workbench.store.files import write_json
    from workbench.store.load import load_runs

    net = {"bytes": 1000, "time_s": 0.002, "algbw_bytes_per_s": 5e5, "busbw_bytes_per_s": 7.5e5}
    write_json(
        tmp_path / "s" / "a" / "run.json",
        {
            "comm_method": {"0": "bytes_only", "1": "ddp_timer"},
            "measurement_warnings": [{"message": "lost", "ranks": [0]}],
            "network": net,
        },
    )
    write_json(tmp_path / "s" / "b" / "run.json", {"comm_method": {"0": "ddp_timer"}})
    runs = load_runs(tmp_path).set_index("run_id")
    assert runs.loc["a", "comm_method"] == "bytes_only,ddp_timer"
    assert runs.loc["a", "measurement_warnings"] == "lost"
    assert runs.loc["a", "network_busbw_bytes_per_s"] == 7.5e5
    assert runs.loc["b", "comm_method"] == "ddp_timer"
    assert runs[["measurement_warnings", "network_busbw_bytes_per_s"]].loc["b"].isna().all()
