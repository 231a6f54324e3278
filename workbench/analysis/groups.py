"""Scaling groups: which config columns make a curve over world sizes.

A caller resolves the grouping once with :func:`resolve_group_by` and passes the resulting list
to every table and figure; it never travels inside a frame (pandas drops ``DataFrame.attrs`` on
merge and concat).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from workbench.analysis.windows import check_columns

#: Config columns that may define a scaling group (a curve over world sizes), in display order.
CONFIG_COLUMNS = (
    "model",
    "precision",
    "optimizer",
    "learning_rate",
    "train_samples",
    "per_device_batch_size",
    "global_batch_size",
)
BATCH_COLUMNS = ("per_device_batch_size", "global_batch_size")
#: The scaling axis: never part of a group.
AXIS_COLUMNS = ("world_size", "nodes")


def default_group_by(runs: pd.DataFrame) -> list[str]:
    """The config columns of ``runs`` that define a scaling group (everything but world size).

    Of the two batch columns only one can stay fixed while world size changes: the per-device
    batch (weak scaling, the DDP default) or the global batch (strong scaling, as in Horovod's
    split). When both are present, the one that forms fewer groups is the one held fixed.
    """
    cols = [c for c in CONFIG_COLUMNS if c in runs.columns and c not in BATCH_COLUMNS]
    batch = [c for c in BATCH_COLUMNS if c in runs.columns]
    if len(batch) == 2 and len(runs):
        groups = {c: runs.groupby(cols + [c], dropna=False).ngroups for c in batch}
        batch = [min(batch, key=lambda c: (groups[c], BATCH_COLUMNS.index(c)))]
    return cols + batch


def resolve_group_by(runs: pd.DataFrame, group_by: Sequence[str] | str | None = None) -> list[str]:
    """The grouping to pass on to every table and figure: ``group_by`` checked, or the default.

    ``None`` gives :func:`default_group_by` of ``runs``; a single name is a one-column grouping;
    ``[]`` puts every run in one group. Names that are not columns of ``runs`` raise
    ``ValueError`` with the valid names, and so do ``world_size`` and ``nodes`` (the scaling
    axis). Resolving an already resolved list gives it back.
    """
    if group_by is None:
        return default_group_by(runs)
    if isinstance(group_by, str):
        group_by = [group_by]
    check_columns(runs, group_by, "runs group")
    if set(AXIS_COLUMNS) & set(group_by):
        raise ValueError("group_by must not contain world_size or nodes: they are the scaling axis")
    return list(group_by)
