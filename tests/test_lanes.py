"""Which lane ``make test`` runs a test in (tests/lanes.py): worked examples."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from . import lanes
from .lanes import lane_of


def _item(*markers: str, fixtures: tuple[str, ...] = ()) -> pytest.Item:
    return SimpleNamespace(keywords=dict.fromkeys(markers, True), fixturenames=fixtures)  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("markers", "fixtures", "lane"),
    [
        ((), (), "in-process"),  # starts no process
        (("timing",), (), "timing"),  # a duration: beside the lowest-priority lane only
        (("slow", "timing", "waits"), (), "timing"),
        (("slow", "slurm", "timing"), ("slurm_cluster",), "timing"),
        (("slow",), (), "busy"),  # may keep both cores busy
        (("slow", "waits"), (), "waiting"),
        (("slow", "slurm"), (), "waiting"),  # starts a cluster of its own
        (("slow",), ("store", "slurm_cluster"), "waiting"),  # the session's cluster, started once
        ((), ("slurm_cluster",), "waiting"),  # even if not marked slow
        (("slurm",), (), "in-process"),  # a dry run: sbatch's script, nothing submitted
    ],
)
def test_each_test_has_one_lane(
    markers: tuple[str, ...], fixtures: tuple[str, ...], lane: str
) -> None:
    assert lane_of(_item(*markers, fixtures=fixtures)) == lane


def test_a_lanes_time_is_rounded_to_whole_seconds_before_minutes() -> None:
    assert lanes._minutes(479.6) == "8 min 0 s"  # once printed as "7 min 60 s"
    assert lanes._minutes(1052.4) == "17 min 32 s"
    assert lanes._minutes(59.4) == "0 min 59 s"
