"""Warm-up detected from the data: the steps after the traced warm-up that are still much slower
than the steady state (:func:`workbench.trace.known.warmup_count`, the rule a run measuring
until known stops on), per run and attempt, from the per-step maxima of ``step_s``. Computed once
per frame inside :func:`warmup_once`. Pure pandas/numpy; no torch.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import pandas as pd

from workbench.trace.known import warmup_count

#: Inside :func:`warmup_once`: each frame's detected warm-up by the frame's id, beside a weak
#: reference that tells the same frame from a later one given the same id.
_WARMUP_SEEN: ContextVar[dict[int, tuple[weakref.ref[pd.DataFrame], pd.DataFrame]] | None] = (
    ContextVar("warmup_seen", default=None)
)


@contextmanager
def warmup_once() -> Iterator[None]:
    """Inside this block, :func:`detected_warmup` computes each frame's warm-up once: a report
    hands the same steps frame to a dozen tables and figures, each of which asks for it. The
    frames must not change in place inside the block (frames in, frames out: none here does);
    the result is shared between the callers, who must not change it either."""
    token = _WARMUP_SEEN.set({})
    try:
        yield
    finally:
        _WARMUP_SEEN.reset(token)


def detected_warmup(steps: pd.DataFrame) -> pd.DataFrame:
    """Per run and attempt, the steps after the traced warm-up that are warm-up still, by the
    rule a run measuring until known stops on (:func:`workbench.trace.known.warmup_count`) over
    each step's slowest rank's ``step_s``. Columns: ``run_id, attempt, last_warmup_step``
    (the last step dropped; absent attempts drop none) and ``dropped`` (how many). Inside
    :func:`warmup_once`, computed once per frame."""
    seen = _WARMUP_SEEN.get()
    if seen is None:
        return _detected_warmup(steps)
    ref, found = seen.get(id(steps), (None, None))
    if ref is None or found is None or ref() is not steps:
        found = _detected_warmup(steps)
        seen[id(steps)] = (weakref.ref(steps), found)
    return found


def _detected_warmup(steps: pd.DataFrame) -> pd.DataFrame:
    columns = ["run_id", "attempt", "last_warmup_step", "dropped"]
    if "step_s" not in steps.columns or steps.empty:
        return pd.DataFrame(columns=columns)
    keys = ["run_id", "attempt", "step"] if "attempt" in steps.columns else ["run_id", "step"]
    s = steps[[*keys, "step_s", "warmup"]]  # only what the rule reads: a wide frame copies slowly
    s = s if "attempt" in s.columns else s.assign(attempt=0)
    s = s[~s["warmup"].fillna(False).astype(bool).to_numpy()]
    slowest = s.groupby(["run_id", "attempt", "step"], sort=True)["step_s"].max()
    rows = []
    for (run_id, attempt), times in slowest.groupby(level=["run_id", "attempt"], sort=True):
        n = warmup_count(times.to_numpy(dtype="float64"))
        if n:
            step_numbers = times.index.get_level_values("step")
            rows.append((run_id, int(attempt), int(step_numbers[n - 1]), n))
    return pd.DataFrame(rows, columns=columns)
