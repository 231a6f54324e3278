"""Evaluation rows: the ranks' samples add up to the evaluation set (the sampler's padding left
out) and the parts, the barrier waits included, add up to each rank's evaluation time."""

from __future__ import annotations

import pytest
from torch.utils.data import DistributedSampler

from workbench.rank.evaluation import real_samples


@pytest.mark.parametrize("n,world_size", [(200, 2), (201, 2), (5, 4), (3, 4), (10, 3), (7, 1)])
def test_real_samples_leave_out_the_samplers_padding(n: int, world_size: int) -> None:
    counts = [real_samples(n, r, world_size) for r in range(world_size)]
    assert sum(counts) == n
    for rank, count in enumerate(counts):
        dealt = list(DistributedSampler(range(n), world_size, rank, shuffle=False))
        # the padded positions are repeats of indices another rank (or this one) already has
        assert len(dealt) - count in (0, 1)
        assert dealt[:count] == list(range(rank, n, world_size))


def test_worked_counts() -> None:
    assert [real_samples(201, r, 2) for r in range(2)] == [101, 100]  # padded: 101 each
    assert [real_samples(5, r, 4) for r in range(4)] == [2, 1, 1, 1]  # padded: 2 each
    assert [real_samples(3, r, 4) for r in range(4)] == [1, 1, 1, 0]


@pytest.mark.slow
def test_a_real_runs_evaluation_rows_add_up(ddp2) -> None:
    evals = ddp2.traces("eval")
    config = ddp2.config
    per_eval = evals.groupby("step")["samples"].sum()
    assert (per_eval == config.eval_samples).all(), per_eval
    parts = evals[["predict_s", "wait_s", "gather_s", "metric_s", "broadcast_s"]]
    assert (parts >= 0).all().all()
    assert parts.sum(axis=1).to_numpy() == pytest.approx(evals["eval_s"].to_numpy(), abs=1e-6)
