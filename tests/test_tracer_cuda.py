"""The tracer's CUDA path on a pretend device: CUDA events, the allocator and synchronisation are
counting fakes, so the hot path's promises are checked on any machine (no events created per
step, no allocator query per step, no synchronisation per step) along with the numbers it
records. A real GPU runs the same code in tests/test_gpu.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from workbench.store.load import load_traces
from workbench.trace.phase_clock import PhaseClock
from workbench.trace.tracer import Tracer

#: Records the pretend GPU is behind the host: an event counts as done once this many more
#: were recorded after it (or after a synchronisation).
LAG = 8
MIB = 2**20


class FakeCuda:
    """Counting stand-ins for the torch.cuda calls the tracer could make."""

    def __init__(self) -> None:
        self.calls = {
            "Event": 0,
            "current_stream": 0,
            "record": 0,
            "event_synchronize": 0,
            "synchronize": 0,
            "memory_stats": 0,
            "memory_allocated": 0,
            "memory_reserved": 0,
            "max_memory_allocated": 0,
        }
        self.recorded = 0  # events recorded so far: the pretend GPU clock advances 1 ms each
        self.done_upto = 0  # events up to this count are complete
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                fake.calls["Event"] += 1
                self.seq = -1

            def record(self, stream: Any = None) -> None:
                fake.calls["record"] += 1
                fake.recorded += 1
                self.seq = fake.recorded

            def query(self) -> bool:
                return self.seq <= max(fake.done_upto, fake.recorded - LAG)

            def synchronize(self) -> None:
                fake.calls["event_synchronize"] += 1
                fake.done_upto = fake.recorded

            def elapsed_time(self, end: Event) -> float:
                assert self.query() and end.query(), "read before the events completed"
                return float(end.seq - self.seq)  # milliseconds

        self.Event = Event

    def counter(self, name: str, value: Any = None) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return value

        return call

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        stats = {
            "allocated_bytes.all.current": 100 * MIB,
            "reserved_bytes.all.current": 128 * MIB,
            "allocated_bytes.all.peak": 120 * MIB,
        }
        monkeypatch.setattr(torch.cuda, "Event", self.Event)
        monkeypatch.setattr(torch.cuda, "current_stream", self.counter("current_stream", "s0"))
        monkeypatch.setattr(torch.cuda, "memory_stats", self.counter("memory_stats", stats))
        for name in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
            monkeypatch.setattr(torch.cuda, name, self.counter(name, 0))
        monkeypatch.setattr(torch.cuda, "synchronize", self.counter("synchronize"))


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda()
    fake.install(monkeypatch)
    return fake


def _tracer(tmp_path: Path) -> Tracer:
    return Tracer(
        tmp_path / "traces",
        run_id="r",
        rank=0,
        local_rank=0,
        host="h",
        world_size=1,
        attempt=0,
        flush_s=3600.0,  # the time budgets cannot come due during the test
        memory_every_s=3600.0,
        device=torch.device("cuda", 0),
    )


def _run(tracer: Tracer, clock: PhaseClock, steps: int, micro: int = 1) -> None:
    for step in range(1, steps + 1):
        clock.start()
        for _ in range(micro):
            clock.mark()  # data
            clock.mark()  # forward
            clock.mark()  # backward
        clock.mark()  # optimizer
        tracer.step(
            epoch=0,
            step=step,
            warmup=False,
            t_start_s=tracer.since_t0(clock.started_at),
            phases=clock.stop(),
            comm_s=None,
            comm_bytes=0,
            comm_buckets=1,
            samples=8,
            loss=torch.tensor(1.0 / step),  # on CUDA the loop hands over the tensor
            lr=0.1,
        )


def test_two_hundred_cuda_steps_create_no_events_and_no_synchronisation(
    tmp_path: Path, fake_cuda: FakeCuda
) -> None:
    ring = 16
    with _tracer(tmp_path) as tracer:
        clock = PhaseClock(torch.device("cuda", 0), ring_size=ring)
        _run(tracer, clock, 200)
        during = dict(fake_cuda.calls)
    assert during["record"] == 200 * 5
    assert during["Event"] <= ring, "events come from the ring, not one per mark"
    assert during["current_stream"] == 1, "the stream is looked up once, not per mark"
    assert during["synchronize"] == 0 and during["event_synchronize"] == 0
    assert during["memory_stats"] == 1, "one allocator read: the time budget never came due"
    assert sum(during[k] for k in ("memory_allocated", "memory_reserved")) == 0
    assert during["max_memory_allocated"] == 0
    # Closing flushes: it waits once for the last step's events and reads the allocator once more.
    assert fake_cuda.calls["event_synchronize"] == 1 and fake_cuda.calls["synchronize"] == 0
    assert fake_cuda.calls["memory_stats"] == 2
    steps = load_traces(tmp_path)
    assert steps["step"].tolist() == list(range(1, 201))
    for column in ("data_s", "forward_s", "backward_s", "optimizer_s"):
        assert steps[column].tolist() == pytest.approx([0.001] * 200), column
    assert steps["step_s"].tolist() == pytest.approx([0.004] * 200)
    assert steps["loss"].tolist() == pytest.approx([1.0 / s for s in range(1, 201)])
    last = steps.iloc[-1]
    assert (last["mem_alloc_bytes"], last["mem_reserved_bytes"], last["mem_peak_bytes"]) == (
        100 * MIB,
        128 * MIB,
        120 * MIB,
    )


def test_a_step_with_more_marks_than_the_ring_grows_it(tmp_path: Path, fake_cuda: FakeCuda) -> None:
    with _tracer(tmp_path) as tracer:
        clock = PhaseClock(torch.device("cuda", 0), ring_size=4)
        _run(tracer, clock, 30, micro=3)  # 11 marks a step
    assert fake_cuda.calls["Event"] == 11
    steps = load_traces(tmp_path)
    assert steps["data_s"].tolist() == pytest.approx([0.003] * 30)
    assert steps["optimizer_s"].tolist() == pytest.approx([0.001] * 30)
    assert steps["step_s"].tolist() == pytest.approx([0.010] * 30)


def test_memory_is_read_on_its_time_budget(tmp_path: Path, fake_cuda: FakeCuda) -> None:
    tracer = _tracer(tmp_path)
    tracer.memory_every_s = 0.0  # every step is due: one memory_stats call per step, no more
    _run(tracer, PhaseClock(torch.device("cuda", 0)), 10)
    assert fake_cuda.calls["memory_stats"] == 10
    tracer.close()
    assert tracer.memory(fresh=True)["mem_peak_bytes"] == 120 * MIB


@pytest.mark.timing
def test_a_cuda_window_is_on_the_devices_clock_though_the_host_runs_ahead(
    tmp_path: Path, fake_cuda: FakeCuda
) -> None:
    """The host queues a step's five events in microseconds; the pretend device runs 1 ms per
    event, so each step's start is 5 ms after the previous one's on the device, its phases take
    4 ms and the device waits 1 ms between steps. Host starts with device durations would put
    the steps microseconds apart and every gap near -4 ms."""
    with _tracer(tmp_path) as tracer:
        clock = PhaseClock(torch.device("cuda", 0))
        tracer.set_t0()
        clock.anchor(tracer.t0)
        anchored = fake_cuda.calls["synchronize"]
        _run(tracer, clock, 20)
        assert fake_cuda.calls["synchronize"] == anchored, "no synchronisation per step"
    steps = load_traces(tmp_path)
    assert steps["step_s"].tolist() == pytest.approx([0.004] * 20)
    starts = steps["t_start_s"].to_numpy()
    assert list(starts[1:] - starts[:-1]) == pytest.approx([0.005] * 19, abs=1e-9)
    assert steps["gap_s"].iloc[:-1].tolist() == pytest.approx([0.001] * 19, abs=1e-9)
    # The first step's first event is the one after the reference: 1 ms from it on the device,
    # plus the host's microseconds between t0 and recording the reference.
    assert 0.001 <= starts[0] < 0.002
