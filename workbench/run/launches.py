"""A study point launched again until its throughput is known across launches
(``RunConfig.until_known_launches``): each launch places its ranks and threads anew, and on
shared cores launches differ more than any one launch's steps can show. After each launch the
study loop asks :func:`next_launch` for the point's next config (a fresh launch under its own
run name) or None: known within ``until_known`` across the launches so far
(:func:`workbench.trace.known.another_launch`), at the cap, or the last launch failed."""

from __future__ import annotations

import re
from collections.abc import Sequence

from workbench import schema
from workbench.config.run_config import RunConfig
from workbench.run.handle import RunHandle
from workbench.store.files import read_json
from workbench.trace.known import another_launch, pooled

_LAUNCH = re.compile(r"-launch\d+$")


def launch_name(run_name: str | None, k: int) -> str | None:
    """The run name of a point's ``k``-th launch (from 2): ``<run_name>-launch<k>``; None
    (an id made at launch) where the point has no name."""
    return None if run_name is None else f"{run_name}-launch{k}"


def point_run_id(run_id: str) -> str:
    """The run id of the point a launch belongs to (its own where it is the first)."""
    return _LAUNCH.sub("", run_id)


def _measured(handle: RunHandle) -> tuple[float, float] | None:
    """A completed launch's training throughput and its half-width (run.json), or None."""
    if handle.status() != "completed":
        return None
    summary = read_json(handle.path / schema.RUN_FILE).get("summary") or {}
    rate, half = summary.get("train_samples_per_s"), summary.get("samples_per_s_half_width")
    return None if rate is None else (float(rate), float("nan") if half is None else float(half))


def known_to(done: Sequence[RunHandle]) -> float:
    """The 95 % half-width (a fraction) of a point's throughput over its completed launches
    ``done`` (:func:`workbench.trace.known.pooled`); NaN where none completed."""
    measured = [m for m in map(_measured, done) if m is not None]
    if not measured:
        return float("nan")
    return pooled([m[0] for m in measured], [m[1] for m in measured])[1]


def next_launch(config: RunConfig, done: Sequence[RunHandle]) -> RunConfig | None:
    """The config of the point's next launch after ``done`` (its launches so far, in order),
    or None when it has had enough."""
    if config.until_known is None or config.until_known_launches <= len(done) or not done:
        return None
    measured = [m for m in map(_measured, done) if m is not None]
    if _measured(done[-1]) is None:  # a failed launch is not tried again here
        return None
    rates, halves = [m[0] for m in measured], [m[1] for m in measured]
    if not another_launch(rates, halves, config.until_known, config.until_known_launches):
        return None
    return config.replace(run_name=launch_name(config.run_name, len(done) + 1))
