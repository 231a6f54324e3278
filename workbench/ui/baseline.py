"""Scaling groups without a 1-rank run: what their speedup can and cannot say.

The scaling table's speedup is over each group's smallest world size (``base_world_size``, see
:func:`workbench.analysis.scaling_table`). A group that never ran on one rank has no baseline:
its base point shows a speedup of 1 and an efficiency of 100 % by definition, which reads as
perfect scaling. These functions find such groups, say so, and take the empty claim out of what
is plotted and tabled. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from workbench.ui.plots import group_labels

#: What to tell the user about a group without a 1-rank run.
NO_BASELINE = "no 1-rank run in this group: speedup needs a baseline; add world_size=1 to the sweep"
#: The columns that mean nothing at a point that is its own baseline.
RELATIVE_COLUMNS = ("speedup", "speedup_std", "efficiency", "efficiency_std")


def without_baseline(table: pd.DataFrame) -> pd.Series:
    """Per row of a scaling table: whether its group's base is more than one rank."""
    if "base_world_size" not in table.columns:
        return pd.Series(False, index=table.index)
    return pd.to_numeric(table["base_world_size"], errors="coerce") > 1


def _group_ids(table: pd.DataFrame, group_by: Sequence[str]) -> pd.Series:
    keys = [k for k in group_by if k in table.columns]
    if not keys:
        return pd.Series(0, index=table.index)
    return table.groupby(keys, dropna=False, sort=False).ngroup()


def baseline_notes(table: pd.DataFrame, group_by: Sequence[str]) -> list[str]:
    """One line per group without a 1-rank run: :data:`NO_BASELINE`, prefixed by the group's
    label when the table has several groups, and, where the group has larger world sizes, what
    their speedup is relative to instead."""
    if not len(table):
        return []
    labels = group_labels(table, group_by)
    ids = _group_ids(table, group_by)
    several = ids.nunique() > 1
    notes = []
    for gid in pd.unique(ids[without_baseline(table)]):
        rows = table[ids == gid]
        base = int(rows["base_world_size"].iloc[0])
        note = f"{labels[rows.index[0]]}: {NO_BASELINE}" if several else NO_BASELINE
        if rows["world_size"].nunique() > 1:
            note += f" (its speedup and efficiency here are relative to {base} ranks)"
        notes.append(note)
    return notes


def honest_table(table: pd.DataFrame) -> pd.DataFrame:
    """The scaling table with speedup and efficiency left empty at a point that is its own
    baseline without being one rank (1 and 100 % by definition, not measured)."""
    own_base = without_baseline(table) & (table["world_size"] == table["base_world_size"])
    if not own_base.any():
        return table
    out = table.copy()
    for col in RELATIVE_COLUMNS:
        if col in out.columns:
            out[col] = out[col].astype("float64").mask(own_base)
    return out


def speedup_rows(table: pd.DataFrame, group_by: Sequence[str]) -> pd.DataFrame:
    """The rows a speedup figure can honestly draw: groups without a 1-rank run that have a
    single world size (a lone point at 1) are left out."""
    ids = _group_ids(table, group_by)
    sizes = table.groupby(ids)["world_size"].transform("nunique")
    return table[~(without_baseline(table) & (sizes < 2))]
