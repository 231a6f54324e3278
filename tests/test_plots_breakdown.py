"""Where a step's time goes: exposed communication and the time between steps as their own
segments, in ms, with values worked out by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.analysis import phase_breakdown
from workbench.ui.catalogue import draw, figure_context
from workbench.ui.plots import phase_breakdown_figure

from .frames import make_runs, make_steps


def two_sizes(exposed: float | None = None, gap: float = 0.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One config at 1 and 2 ranks, 10 steps of 1 s (2 warm-up): data 0.1, forward 0.2,
    optimizer 0.1; backward 0.5 s alone and 0.6 s at 2 ranks, where the allreduce spans 0.3 s.
    ``exposed``: DDP's own exposed time on every step at 2 ranks; ``gap``: seconds between steps.
    """
    one = make_steps("b1", world_size=1, backward_s=0.5)
    two = make_steps("b2", world_size=2, backward_s=0.6)
    if exposed is not None:
        two["comm_exposed_s"] = exposed
    steps = pd.concat([one, two], ignore_index=True)
    if gap:
        steps["gap_s"] = np.where(steps["step"] < 10, gap, np.nan)
        steps["t_start_s"] = (steps["step"] - 1) * (1.0 + gap)
    runs = make_runs([{"run_id": "b1", "world_size": 1}, {"run_id": "b2", "world_size": 2}])
    return runs, steps


def bars(fig, name: str) -> list[float]:
    found = [t for t in fig.data if t.name == name]
    assert len(found) == 1, [t.name for t in fig.data]
    return list(found[0].y)


def test_exposed_communication_from_the_reference_run() -> None:
    # b2's backward is 0.6 s against b1's 0.5 s at 1 rank (same per-device batch): 0.1 s of
    # the 0.3 s allreduce is exposed, 0.2 s hidden behind 0.5 s of backward compute.
    runs, steps = two_sizes()
    fig = draw("phases_rank", figure_context(runs, steps, None, focus="b2"))
    names = [t.name for t in fig.data]
    assert names[:5] == [
        "data",
        "forward",
        "backward compute",
        "exposed communication",
        "optimizer",
    ]
    assert names[5:] == ["other", "between steps", "checkpoint", "evaluation"]
    assert bars(fig, "exposed communication") == pytest.approx([100.0, 100.0])
    assert bars(fig, "backward compute") == pytest.approx([500.0, 500.0])
    assert bars(fig, "other") == pytest.approx([0.0, 0.0])  # 1.0 - (0.1+0.2+0.6+0.1)
    exposed = next(t for t in fig.data if t.name == "exposed communication")
    assert [float(v) for v in exposed.customdata[:, 0]] == pytest.approx([10.0, 10.0])  # %
    assert list(exposed.customdata[:, 1]) == ["reference", "reference"]
    compute = next(t for t in fig.data if t.name == "backward compute")
    assert [float(v) for v in compute.customdata[:, 1]] == pytest.approx([200.0, 200.0])
    assert "ms" in compute.hovertemplate and "%" in compute.hovertemplate
    per_run = draw("phases", figure_context(runs, steps, None))
    assert list(next(t for t in per_run.data if t.name == "exposed communication").x) == [
        "b1",
        "b2",
    ]
    assert bars(per_run, "exposed communication") == pytest.approx([0.0, 100.0])
    assert bars(per_run, "backward compute") == pytest.approx([500.0, 500.0])


def test_exposed_communication_measured_by_ddp_wins() -> None:
    runs, steps = two_sizes(exposed=0.05)
    fig = draw("phases_rank", figure_context(runs, steps, None, focus="b2"))
    assert bars(fig, "exposed communication") == pytest.approx([50.0, 50.0])
    assert bars(fig, "backward compute") == pytest.approx([550.0, 550.0])
    exposed = next(t for t in fig.data if t.name == "exposed communication")
    assert list(exposed.customdata[:, 1]) == ["measured", "measured"]


def test_communication_not_traced_is_said_not_guessed() -> None:
    runs, steps = two_sizes()
    steps.loc[steps["run_id"] == "b2", "comm_s"] = np.nan  # trace_comm="off"
    fig = draw("phases_rank", figure_context(runs, steps, None, focus="b2"))
    assert bars(fig, "exposed communication") == pytest.approx([0.0, 0.0])
    assert bars(fig, "backward compute") == pytest.approx([600.0, 600.0])
    exposed = next(t for t in fig.data if t.name == "exposed communication")
    assert list(exposed.customdata[:, 1]) == ["not traced", "not traced"]


def test_time_between_steps_is_its_own_segment() -> None:
    # 0.2 s between steps, none after the last: over the 8 measured steps 7 x 0.2 / 8 = 0.175 s
    runs, steps = two_sizes(gap=0.2)
    fig = draw("phases_rank", figure_context(runs, steps, None, focus="b1"))
    assert bars(fig, "between steps") == pytest.approx([175.0])
    between = next(t for t in fig.data if t.name == "between steps")
    assert float(between.customdata[0, 0]) == pytest.approx(175 / 1175 * 100)  # of the wall step
    total = sum(t.y[0] for t in fig.data)
    assert total == pytest.approx(1175.0)  # the bar is the wall step: 1 s + 0.175 s


def test_without_communication_frame_backward_stays_whole() -> None:
    _, steps = two_sizes()
    fig = phase_breakdown_figure(phase_breakdown(steps), "b2")
    assert "exposed communication" not in [t.name for t in fig.data]
    assert bars(fig, "backward") == pytest.approx([600.0, 600.0])
    assert fig.layout.yaxis.title.text == "mean wall time per step (ms)"
