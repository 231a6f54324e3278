"""Several runs' digests read into pandas at once (one Arrow table a frame, then one conversion)
give the frames each run's digest gives alone, concatenated in run order: hand-worked on two
small runs, then on the digests of a written sweep."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from workbench.analysis.run_digests import open_steps
from workbench.store.digests.on_disk import DigestFrames, read_digest
from workbench.store.digests.read_frames import (
    ReadDigest,
    concat_frames,
    joined_frames,
    table_frame,
)
from workbench.store.load import iter_run_dirs

from .frames import scaling_sweep, write_run, write_scaling_sweep

KEYS = ["run_id", "attempt", "step"]


def _run(run: str, steps: list[int], loss: list[float | None]) -> pa.Table:
    """A run's per-step digest table as written: ``all_end_s`` and ``loss`` null where they
    equal what they are derived from (the end; the loss sum over its count)."""
    n = len(steps)
    return pa.table(
        {
            "run_id": [run] * n,
            "attempt": pa.array([0] * n, pa.int64()),
            "step": pa.array(steps, pa.int64()),
            "end_s": [float(s) for s in steps],
            "all_end_s": pa.array([None] * n, pa.float64()),
            "loss_sum": [4.0] * n,
            "loss_n": pa.array([2] * n, pa.int64()),
            "loss": pa.array(loss, pa.float64()),
            "host": [f"{run}-host"] * n,
            "hosts": [[f"{run}-host"]] * n,
        }
    )


def test_runs_read_together_equal_the_hand_worked_frame() -> None:
    b = _run("b", [1, 2], [None, 9.0])  # listed first, its run id sorts last
    a = _run("a", [2, 1], [None, None])  # out of order: sorted like one pass over the rows
    empty = _run("c", [], [])
    got = joined_frames([b, a, empty], KEYS, "per_step")
    want = pd.DataFrame(
        {
            "run_id": np.array(["a", "a", "b", "b"], dtype=object),
            "attempt": np.zeros(4, dtype="int64"),
            "step": np.array([1, 2, 1, 2], dtype="int64"),
            "end_s": [1.0, 2.0, 1.0, 2.0],
            "all_end_s": [1.0, 2.0, 1.0, 2.0],  # filled from the end
            "loss_sum": [4.0] * 4,
            "loss_n": np.full(4, 2, dtype="int64"),
            "loss": [2.0, 2.0, 2.0, 9.0],  # filled from sum / count; 9.0 kept its own
            "host": np.array(["a-host", "a-host", "b-host", "b-host"], dtype=object),
            "hosts": [["a-host"], ["a-host"], ["b-host"], ["b-host"]],
        }
    )
    pd.testing.assert_frame_equal(got, want)
    alone = concat_frames([table_frame(t, "per_step") for t in (b, a, empty)], KEYS)
    pd.testing.assert_frame_equal(got, alone)
    assert got["run_id"].iloc[0] is got["run_id"].iloc[1]  # one str a run, not one a row


def test_a_sweeps_digests_read_together_equal_each_read_alone(tmp_path: Path) -> None:
    write_scaling_sweep(tmp_path)
    dirs = iter_run_dirs(tmp_path, ["weak"])
    with open_steps(dirs):  # builds the runs' digests
        pass
    read = [read_digest(d) for d in dirs]
    assert all(isinstance(r, ReadDigest) for r in read)
    together = DigestFrames(dirs, read)  # type: ignore[arg-type]
    alone = DigestFrames(dirs, [dict(r) for r in read if r is not None])  # a frame at a time
    for name in ("per_step", "cut", "attempt_hosts", "stragglers"):
        pd.testing.assert_frame_equal(getattr(together, name), getattr(alone, name), obj=name)
    pd.testing.assert_frame_equal(together.per_rank(), alone.per_rank())
    pd.testing.assert_frame_equal(together.byte_counts(), alone.byte_counts())
    for name, frame in together.comm.items():
        pd.testing.assert_frame_equal(frame, alone.comm[name], obj=name)
    assert len(together.per_step) and together.per_step["run_id"].is_monotonic_increasing
    runs = [d.name for d in dirs]
    pd.testing.assert_frame_equal(together.backward_of(runs), alone.backward_of(runs))
    for run in runs:
        got, want = read[runs.index(run)]["binned"], dict(read[runs.index(run)])["binned"]  # type: ignore[index]
        assert got is want and got.attrs["bins"] > 0  # made once, when asked for


def test_a_one_rank_bases_backward_time_is_kept_and_no_row_is_read(tmp_path: Path) -> None:
    """The scaling model's base at one rank takes the median backward time of its measured rows
    (no DDP timer runs at one rank): the run's digest keeps them, so a prediction from digests
    reads no row. Worked by hand: steps 1-2 are warm-up (9 s, left out), steps 3-10 take 0.1 to
    0.8 s in a shuffled order, so the median is (0.4 + 0.5) / 2. A multi-rank run's backward
    times are not kept: asked for, they come from its rows, as before."""
    runs, steps, evals = scaling_sweep(evals=False)
    one = (steps["run_id"] == "ws1").to_numpy()
    steps.loc[one, "backward_s"] = [9.0, 9.0, 0.3, 0.1, 0.7, 0.5, 0.2, 0.8, 0.4, 0.6]
    for run in runs.itertuples():
        mine = steps["run_id"] == run.run_id
        write_run(tmp_path, "weak", str(run.run_id), steps[mine], evals,
                  world_size=run.world_size, per_device_batch_size=8)  # fmt: skip
    dirs = iter_run_dirs(tmp_path, ["weak"])
    with open_steps(dirs):  # builds the runs' digests
        pass
    with open_steps(dirs) as stored:
        assert stored.source == "digests"
        assert stored.median("backward_s", ["ws1"]) == (0.4 + 0.5) / 2
        assert stored.digest.row_reads == 0
        assert stored.median("backward_s", ["ws2"]) == 0.5 + (1.25 - 1.0)  # SWEEP_STEP_S
        assert stored.digest.row_reads == 1
