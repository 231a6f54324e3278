"""Step x rank matrices scattered from batches of rows, with the ranks given or found as the rows
come, against the same matrices built from the rows at once (``rank_cells``: a bin count over
a dense index, an independent construction)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.analysis.measured.rank_cells import rank_cells, scattered_cells


@st.composite
def attempt_rows(draw: st.DrawFn) -> tuple[pd.DataFrame, list[int], int]:
    """One row per (step, rank) cell of a random subset, ranks anywhere in -3 .. 12 (so outside
    the first guess of ``0 .. world - 1`` below and above it), cut into random batches."""
    steps = draw(st.lists(st.integers(0, 40), min_size=1, max_size=12, unique=True))
    ranks = draw(st.lists(st.integers(-3, 12), min_size=1, max_size=8, unique=True))
    cells = [(s, r) for s in steps for r in ranks]
    keep = draw(st.lists(st.booleans(), min_size=len(cells), max_size=len(cells)))
    rows = [c for c, k in zip(cells, keep, strict=True) if k] or cells[:1]
    order = draw(st.permutations(range(len(rows))))
    rows = [rows[i] for i in order]
    frame = pd.DataFrame(rows, columns=["step", "rank"])
    frame["data_s"] = np.arange(len(frame), dtype="float64") * 0.5 + 1
    frame["step_s"] = np.where(np.arange(len(frame)) % 3 == 0, np.nan, 2.0 + frame["rank"])
    cuts = sorted(draw(st.lists(st.integers(0, len(frame)), max_size=4)))
    world = draw(st.integers(1, 6))
    return frame, cuts, world


def batches(frame: pd.DataFrame, cuts: list[int]) -> list[dict[str, np.ndarray]]:
    bounds = [0, *cuts, len(frame)]
    return [
        {c: frame[c].to_numpy()[a:b].copy() for c in frame.columns}
        for a, b in zip(bounds, bounds[1:], strict=False)
        if b > a
    ]


@settings(max_examples=200, deadline=None)
@given(attempt_rows())
def test_matrices_of_found_ranks_equal_those_built_at_once(case: tuple) -> None:
    frame, cuts, world = case
    steps = np.sort(frame["step"].unique())
    step_world = pd.Series(world, index=steps)
    expected = rank_cells(
        frame["step"].to_numpy(),
        frame["rank"].to_numpy(),
        {c: frame[c].to_numpy() for c in ("data_s", "step_s")},
        step_world,
        {},
    )
    for ranks in (None, np.sort(frame["rank"].unique())):
        got = scattered_cells(steps, ranks, batches(frame, cuts), step_world, {})
        np.testing.assert_array_equal(got.ranks, expected.ranks)
        np.testing.assert_array_equal(got.steps, expected.steps)
        np.testing.assert_array_equal(got.present, expected.present)
        for name in ("data_s", "step_s"):
            np.testing.assert_array_equal(got.values[name], expected.values[name])


def test_a_row_of_a_rank_not_given_is_left_out() -> None:
    frame = pd.DataFrame({"step": [1, 1, 2], "rank": [0, 5, 0], "data_s": [1.0, 9.0, 2.0]})
    steps = np.array([1, 2])
    got = scattered_cells(steps, np.array([0]), batches(frame, []), pd.Series(2, index=steps), {})
    assert got.ranks.tolist() == [0]
    assert got.values["data_s"][:, 0].tolist() == [1.0, 2.0]
    found = scattered_cells(steps, None, batches(frame, []), pd.Series(2, index=steps), {})
    assert found.ranks.tolist() == [0, 5]
    np.testing.assert_array_equal(found.values["data_s"], [[1.0, 9.0], [2.0, np.nan]])
