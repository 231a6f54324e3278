"""Fewer rows for a figure: binning long per-step frames for display only."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from workbench.analysis.measured.windows import check_columns


def downsample_for_display(
    frame: pd.DataFrame,
    max_points: int,
    x: str = "step",
    by: Sequence[str] = (),
) -> pd.DataFrame:
    """Fewer rows for a figure: average consecutive ``x`` values into bins, per ``by`` group.

    Each group keeps at most ``max_points / groups`` bins (at least one); numeric columns are
    averaged, others keep their first value, and ``x`` becomes the bin's first value. For display
    only: tables must be computed on the full frame. Returns ``frame`` itself when small enough.
    """
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    by = [by] if isinstance(by, str) else list(by)
    check_columns(frame, [x, *by], "frame")
    if len(frame) <= max_points:
        return frame
    groups = frame.groupby(by, sort=False).ngroups if by else 1
    values = np.sort(pd.unique(frame[x].dropna()))
    bins = max(1, max_points // max(groups, 1))
    per_bin = int(np.ceil(len(values) / bins))
    if per_bin <= 1:
        return frame
    bin_id = np.searchsorted(values, frame[x].to_numpy()) // per_bin
    numeric = [c for c in frame.columns if c not in by and pd.api.types.is_numeric_dtype(frame[c])]
    numeric = [c for c in numeric if not pd.api.types.is_bool_dtype(frame[c])]
    aggs = {c: ("mean" if c in numeric else "first") for c in frame.columns if c not in by}
    aggs[x] = "min"
    keys = [*(frame[c] for c in by), pd.Series(bin_id, index=frame.index, name="_bin")]
    out = frame.groupby(keys, sort=True).agg(aggs).reset_index(level="_bin", drop=True)
    return out.reset_index()[list(frame.columns)] if by else out.reset_index(drop=True)
