"""The hooks' log of a script's steps, taken out as columns at the flush: the same phases as
``step_phases`` (the one-step definition) on generated event streams, bit for bit, whatever the
flushes cut; what each step consumed on hand-worked logs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.trace.comm_timing import CommFields
from workbench.trace.step_events import (
    BACKWARD,
    BACKWARD_END,
    FETCH,
    FETCH_END,
    FORWARD,
    OPTIMIZER,
    OPTIMIZER_END,
    step_phases,
)
from workbench.trace.step_log import (
    BACKWARD_LOSS,
    COMM,
    FETCH_BATCH,
    FORWARD_BATCH,
    LR,
    MEMORY,
    MODEL_LOSS,
    NO_COMM,
    StepLog,
)

PHASES = ("data_s", "forward_s", "backward_s", "optimizer_s")


@st.composite
def step_kinds(draw: Any) -> list[int]:
    """One step's events as hooks see them: micro-batches (a fetch, a DDP forward, a
    backward, each optional but the backward), then one or two optimizer steps."""
    kinds: list[int] = []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            kinds += [FETCH, FETCH_END]
        if draw(st.booleans()):
            kinds.append(FORWARD)
        kinds += [BACKWARD, BACKWARD_END]
    return kinds + [OPTIMIZER, OPTIMIZER_END] * draw(st.integers(1, 2))


def columns_of(log: StepLog, t0: float, cuts: list[int], kinds: list[int], times: list[float]):
    """Feed the events in, taking the closed steps out after each of ``cuts`` events and at
    the end; every taken column, concatenated."""
    out: dict[str, list[Any]] = {}
    fed = 0
    for cut in [*sorted(cuts), len(kinds)]:
        log.kinds += kinds[fed:cut]
        log.times += times[fed:cut]
        fed = cut
        taken = log.take(t0, final=cut == len(kinds))
        if taken is not None:
            for name, values in taken.columns.items():
                out.setdefault(name, []).extend(_plain(values))
    return out


def _plain(values: Any) -> list[Any]:
    if hasattr(values, "mask"):  # a masked array: masked is null
        mask = np.ma.getmaskarray(values).tolist()
        return [None if m else v for v, m in zip(values.data.tolist(), mask, strict=True)]
    return list(values.tolist() if hasattr(values, "tolist") else values)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(step_kinds(), min_size=1, max_size=8),
    gaps=st.lists(st.floats(1e-6, 0.5), min_size=60, max_size=60),
    cuts=st.lists(st.integers(0, 80), max_size=4),
)
def test_the_logs_phases_are_step_phases_of_each_step_whatever_the_flushes_cut(
    steps: list[list[int]], gaps: list[float], cuts: list[int]
) -> None:
    kinds = [k for step in steps for k in step]
    times, t = [], 1000.0
    for i in range(len(kinds)):
        t += gaps[i % len(gaps)]
        times.append(t)
    got = columns_of(StepLog(), 999.0, [c for c in cuts if c <= len(kinds)], kinds, times)

    at, previous_end, starts, ends = 0, None, [], []
    for i, step in enumerate(steps):
        events = list(zip(step, times[at : at + len(step)], strict=True))
        at += len(step)
        want = step_phases(events, previous_end)
        for j, name in enumerate(PHASES):
            assert got[name][i] == want[1 + j], (i, name)  # bit for bit, None for unseen
        assert got["step_s"][i] == want.step_s
        assert got["t_start_s"][i] == want.start - 999.0
        previous_end = events[-1][1]
        starts.append(want.start - 999.0)
        ends.append(want.step_s)
    for i in range(len(steps) - 1):
        assert got["gap_s"][i] == starts[i + 1] - starts[i] - ends[i]
    assert got["gap_s"][-1] is None  # the run's last step: no next one


class Feed:
    """A log fed by hand: events as kinds (1 s apart on their clock) and extras as (tag,
    value) pairs, in order."""

    def __init__(self) -> None:
        self.log = StepLog()
        self.clock = 0.0

    def __call__(self, *entries: Any) -> None:
        for entry in entries:
            if isinstance(entry, tuple):
                self.log.extras.append((len(self.log.kinds), *entry))
            else:
                self.log.kinds.append(entry)
                self.log.times.append(self.clock)
                self.clock += 1.0


def test_what_each_step_consumed_follows_the_rules_on_a_worked_log() -> None:
    ids = torch.zeros(4, 16, dtype=torch.long)  # 4 samples of 16 token ids
    images = torch.zeros(8, 3, 2, 2)  # 8 samples, not tokens
    loss = [torch.tensor(v) for v in (1.0, 2.0, 3.0, 4.0, 5.0)]
    comm = CommFields(0.5, 1000, 2, 0.25, 0.1)
    steady = CommFields(None, 1000, 2)
    feed = Feed()
    log = feed.log
    feed(
        (MEMORY, ("m0",)),
        # step 1: two micro-batches, DDP forwards counted, a backward root each; lr, timed comm
        FETCH,
        FETCH_END,
        (FETCH_BATCH, (ids.shape, ids.dtype)),
        FORWARD,
        (FORWARD_BATCH, (ids.shape, ids.dtype)),
        BACKWARD,
        (BACKWARD_LOSS, loss[0]),
        BACKWARD_END,
        FETCH,
        FETCH_END,
        (FETCH_BATCH, (ids.shape, ids.dtype)),
        FORWARD,
        (FORWARD_BATCH, (ids.shape, ids.dtype)),
        BACKWARD,
        (BACKWARD_LOSS, loss[1]),
        BACKWARD_END,
        OPTIMIZER,
        (COMM, comm),
        (LR, 0.1),
        OPTIMIZER_END,
        # step 2: no forward counted (fetches only), the model's loss wins over the root,
        # a note after the optimizer step adds to this step; untimed comm
        FETCH,
        FETCH_END,
        (FETCH_BATCH, (images.shape, images.dtype)),
        BACKWARD,
        (MODEL_LOSS, loss[2]),
        (BACKWARD_LOSS, loss[3]),
        BACKWARD_END,
        OPTIMIZER,
        (COMM, steady),
        OPTIMIZER_END,
        (4, (None, None, None)),  # NOTE: nothing noted
        # step 3: the script noted samples and its loss, which win; no comm (no DDP forward)
        FETCH,
        FETCH_END,
        (FETCH_BATCH, (images.shape, images.dtype)),
        (4, (32, None, 9.5)),
        BACKWARD,
        (BACKWARD_LOSS, loss[4]),
        BACKWARD_END,
        OPTIMIZER,
        (COMM, NO_COMM),
        (LR, 0.05),
        (MEMORY, ("m1",)),
        OPTIMIZER_END,
    )
    taken = log.take(0.0, final=True)
    assert taken is not None
    c = {k: _plain(v) for k, v in taken.columns.items()}
    assert c["samples"] == [8, 8, 32]  # 4 + 4 from the forwards; the fetch's; the note's
    assert c["tokens"] == [128, None, None]  # 64 + 64; images hold no token ids
    assert c["loss"][0].item() == 3.0  # the sum of the two roots
    assert c["loss"][1] is loss[2] and c["loss"][2] == 9.5
    assert c["lr"] == [0.1, 0.1, 0.05]  # carried on until the next one logged
    assert c["comm_s"] == [0.5, None, None] and c["comm_bytes"] == [1000, 1000, None]
    assert c["backward_compute_s"] == [0.25, None, None]
    assert c["comm_exposed_s"] == [0.1, None, None]
    assert taken.memory == [("m0",), ("m0",), ("m1",)]
    # 1 s an interval: two fetches, each then on to its forward, a backward's end to a fetch
    assert c["data_s"][0] == 5.0


def test_an_evaluation_forward_forgets_the_fetches_that_fed_it() -> None:
    x = torch.zeros(5, 2)
    feed = Feed()
    log = feed.log
    feed(FETCH, FETCH_END, BACKWARD, BACKWARD_END, OPTIMIZER, OPTIMIZER_END)
    feed(FETCH, FETCH_END, (FETCH_BATCH, (x.shape, x.dtype)))
    log.drop_fetches()  # the evaluation forward
    assert log.kinds[-1] == OPTIMIZER_END and len(log.extras) == 0
    feed(FETCH, FETCH_END, (FETCH_BATCH, (x.shape, x.dtype)), FORWARD)
    log.drop_fetches()  # a training forward came since: nothing dropped
    feed(BACKWARD, BACKWARD_END, OPTIMIZER, OPTIMIZER_END)
    taken = log.take(0.0, final=True)
    assert taken is not None
    assert _plain(taken.columns["samples"]) == [None, 5]
    # the second step starts at its own fetch, 3 s after the first step ended
    assert _plain(taken.columns["gap_s"])[0] == 3.0
    assert not math.isnan(_plain(taken.columns["step_s"])[1])
