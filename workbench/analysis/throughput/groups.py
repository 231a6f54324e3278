"""Scaling groups: which runs are repeats of one point, and which points make one curve.

Repeats: two runs are repeats of one scaling point only when every config field agrees except the
ones in :data:`NOT_GROUPING` (the scaling axis, the names that tell repeats apart, and bookkeeping
that changes neither the training's maths nor its speed). Every other config column of the runs
frame (the store flattens option dicts as ``model_options.d_model``) splits groups, so a field
added to RunConfig splits them too until it is listed here; a column that is the same on every run
is harmless.

Families: along a curve either the per-device batch stays fixed while the global batch grows with
the world size (``scaling="weak"``) or the global batch stays fixed while the per-device batch
shrinks (``"strong"``). The default grouping finds both families in the runs (see
:func:`assign_groups`): a run at their crossing (the same per-device and global batch) belongs to
both and is counted in each, and a study holding both warns (:class:`ScalingFamilyWarning`).

A caller resolves the grouping once with :func:`resolve_group_by` and passes the resulting list
to every table and figure; it never travels inside a frame (pandas drops ``DataFrame.attrs`` on
merge and concat).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import pandas as pd

from workbench.analysis.measured.windows import check_columns
from workbench.config.run_config import init_field_names

#: The scaling axis: never part of a group (the point adds them back).
AXIS_COLUMNS = ("world_size", "nodes")
#: Config fields that never split a group. The axis (``tasks_per_node`` is world_size / nodes);
#: what tells repeats apart (``seed``, ``run_name``) or only files them (``sweep``, ``output_dir``);
#: knobs that matter only when something goes wrong (timeouts, the preemption warning delay) or
#: that name a resource (``master_port``); and ``derived``, the record of which fields were filled
#: in. Tracing, profiling, checkpointing, evaluation and the tiny preemption-check allreduce all
#: cost time inside the measured window, so their knobs do split groups.
NOT_GROUPING = (
    *AXIS_COLUMNS,
    "tasks_per_node",
    "seed",
    "run_name",
    "sweep",
    "output_dir",
    "master_port",
    "timeout_min",
    "collective_timeout_s",
    "eval_timeout_s",
    "signal_delay_s",
    "derived",
    # How long a point is measured (until its throughput is known, a budget's cap), not what.
    "until_known",
    "until_known_max_s",
    "until_known_launches",
    # A script run's model is ``script:<its name>``: the path would only repeat it in every label.
    "script",
    "script_module",
)
BATCH_COLUMNS = ("per_device_batch_size", "global_batch_size")
#: Derived group columns: the family (``weak``, ``strong``; ``mixed`` for an explicit grouping
#: that puts both on one curve) and the batch it holds fixed (per-device for weak, global for
#: strong). The default grouping uses both instead of the two batch columns.
FAMILY_COLUMNS = ("scaling", "fixed_batch_size")
#: Each strategy in words, as a curve that differs from the others by it is named.
STRATEGY_WORDS = {"ddp": "DDP", "fsdp": "FSDP", "dp": "DataParallel", "single": "one device"}
#: Config columns shown first, in this order, when present.
LEADING_COLUMNS = ("model", "precision", "optimizer", "learning_rate", "train_samples")


class ScalingFamilyWarning(UserWarning):
    """Runs of a study hold both the per-device and the global batch fixed (or a grouping puts
    runs of different batches on one curve)."""


def curve_words(column: str, value: object) -> str:
    """What a curve's ``column`` says of it, for people: its strategy by name (``FSDP``), any
    other column as ``column=value``."""
    if column == "strategy" and isinstance(value, str) and value in STRATEGY_WORDS:
        return STRATEGY_WORDS[value]
    return f"{column}={value}"


def _is_config(name: object, fields: set[str]) -> bool:
    text = str(name)
    return text in fields or ("." in text and text.split(".", 1)[0] in fields)


def config_columns(frame: pd.DataFrame) -> list[str]:
    """The config columns of ``frame`` that split scaling groups: every RunConfig field (and
    flattened option, ``model_options.x``) that it has, minus :data:`NOT_GROUPING`, with
    :data:`LEADING_COLUMNS` first. The batch columns are among them."""
    fields = set(init_field_names())
    cols = [str(c) for c in frame.columns if _is_config(c, fields) and c not in NOT_GROUPING]
    lead = [c for c in LEADING_COLUMNS if c in cols]
    return lead + [c for c in cols if c not in lead]


def default_group_by(frame: pd.DataFrame) -> list[str]:
    """The grouping of ``frame`` (a runs frame, or a scaling table made with the default grouping):
    every config column of :func:`config_columns` but the two batch columns, then
    :data:`FAMILY_COLUMNS` (weak and strong families) when the frame has a batch column."""
    cols = [c for c in config_columns(frame) if c not in BATCH_COLUMNS]
    if "scaling" in frame.columns:  # a table: the family columns it was computed with
        return cols + [c for c in FAMILY_COLUMNS if c in frame.columns]
    if any(c in frame.columns for c in BATCH_COLUMNS):
        return cols + list(FAMILY_COLUMNS)
    return cols


def resolve_group_by(runs: pd.DataFrame, group_by: Sequence[str] | str | None = None) -> list[str]:
    """The grouping to pass on to every table and figure: ``group_by`` checked, or the default.

    ``None`` gives :func:`default_group_by` of ``runs``; a single name is a one-column grouping;
    ``[]`` puts every run in one group. Names must be columns of ``runs`` or
    :data:`FAMILY_COLUMNS` (either brings the other); others raise ``ValueError`` with the valid
    names, and so do ``world_size`` and ``nodes`` (the scaling axis). Resolving an already
    resolved list gives it back.
    """
    if group_by is None:
        return default_group_by(runs)
    names = [group_by] if isinstance(group_by, str) else list(group_by)
    check_columns(runs, [n for n in names if n not in FAMILY_COLUMNS], "runs group")
    if set(AXIS_COLUMNS) & set(names):
        raise ValueError("group_by must not contain world_size or nodes: they are the scaling axis")
    if set(FAMILY_COLUMNS) & set(names):
        names += [c for c in FAMILY_COLUMNS if c not in names]
    return names


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return str(sorted(value.items()))
    return value


def group_frame(
    runs: pd.DataFrame, group_by: Sequence[str], extra: Sequence[str] = ()
) -> pd.DataFrame:
    """``run_id``, the group columns of ``runs`` (not the derived family columns), the batch
    columns and ``extra`` (those present), with list values made tuples so that they group."""
    wanted = ["run_id", *(k for k in group_by if k not in FAMILY_COLUMNS), *BATCH_COLUMNS, *extra]
    wanted.append("derived")  # which batch the config gave: the family it asked for
    cols = [c for c in dict.fromkeys(wanted) if c in runs.columns]
    out = runs[cols].copy()
    for c in cols:
        if out[c].dtype == object:
            out[c] = out[c].map(_hashable)
    return out


def _constant(frame: pd.DataFrame, keys: list[str], col: str) -> pd.Series:
    """Per row: whether ``col`` has one value (NaN counts) across the row's group of ``keys``."""
    if col not in frame.columns:
        return pd.Series(False, index=frame.index)
    counts = frame.groupby(keys, dropna=False, sort=False)[col].transform("nunique", dropna=False)
    return counts == 1


def _labels(frame: pd.DataFrame, keys: list[str]) -> pd.Series:
    """``weak`` where the group's per-device batch is constant, else ``strong`` where its global
    batch is, else ``mixed``; None without batch columns."""
    if not any(c in frame.columns for c in BATCH_COLUMNS):
        return pd.Series(None, index=frame.index, dtype=object)
    keyed = frame.assign(_all=0)
    keys = keys or ["_all"]
    weak = _constant(keyed, keys, BATCH_COLUMNS[0])
    strong = _constant(keyed, keys, BATCH_COLUMNS[1])
    return pd.Series(
        ["weak" if w else "strong" if s else "mixed" for w, s in zip(weak, strong, strict=True)],
        index=frame.index,
        dtype=object,
    )


def _spans(
    keyed: pd.DataFrame, cluster: list[str], col: str | None, eligible: pd.Series
) -> pd.Series:
    """Per row: whether it is ``eligible`` and the eligible runs sharing its cluster and ``col``
    cover two or more world sizes."""
    if col is None or not eligible.any():
        return pd.Series(False, index=keyed.index)
    rows = keyed[eligible]
    sizes = rows.groupby([*cluster, col], dropna=False)["world_size"].transform("nunique")
    return (sizes >= 2).reindex(keyed.index, fill_value=False)


def _intent(frame: pd.DataFrame) -> pd.Series:
    """Per run, the family its config asked for, when the runs frame records which batch was
    derived (``derived``: given the per-device batch, the global one was derived: weak)."""
    if "derived" not in frame.columns:
        return pd.Series(None, index=frame.index, dtype=object)

    def one(derived: Any) -> str | None:
        names = set(derived) if isinstance(derived, (list, tuple)) else set()
        if "global_batch_size" in names:
            return "weak"
        return "strong" if "per_device_batch_size" in names else None

    return frame["derived"].map(one).astype(object)


def _members(keyed: pd.DataFrame, cluster: list[str]) -> tuple[pd.Series, pd.Series]:
    """Which runs are in a weak family and which in a strong one. A run whose config records its
    family joins only that one. Otherwise the per-device batch, the DDP default, comes first: a
    strong family is kept only where it holds a run that no weak family does (or one that asked
    for it), so a grid of world sizes x per-device batches makes no accidental strong curves."""
    pdb, gb = (c if c in keyed.columns else None for c in BATCH_COLUMNS)
    intent = _intent(keyed)
    weak = _spans(keyed, cluster, pdb, intent != "strong")
    strong = _spans(keyed, cluster, gb, intent != "weak")
    if strong.any():
        # a family id, not joined strings: None and NaN config values group as themselves
        family = keyed.loc[strong].groupby([*cluster, gb], dropna=False, sort=False).ngroup()
        needed = ~weak[strong] | (intent[strong] == "strong")
        kept = set(family[needed])
        strong = strong & keyed.index.to_series().map(family).isin(kept)
    return weak, strong


def _families(frame: pd.DataFrame, base: list[str]) -> pd.DataFrame:
    """One row per run and family it belongs to, with ``scaling`` and ``fixed_batch_size``."""
    pdb, gb = (c if c in frame.columns else None for c in BATCH_COLUMNS)
    if pdb is None and gb is None:
        return frame.assign(scaling=None, fixed_batch_size=float("nan"))
    keyed = frame.assign(_all=0)
    cluster = base or ["_all"]
    weak, strong = _members(keyed, cluster)
    rest = keyed[~weak & ~strong]  # one world size: both batches fixed
    as_strong = (_intent(rest) == "strong") | (pdb is None)
    parts = [
        keyed[weak].assign(scaling="weak", fixed_batch_size=keyed.loc[weak, pdb] if pdb else 0),
        keyed[strong].assign(scaling="strong", fixed_batch_size=keyed.loc[strong, gb] if gb else 0),
        rest.assign(
            scaling=as_strong.map({True: "strong", False: "weak"}),
            fixed_batch_size=rest[gb].where(as_strong, rest[pdb])
            if pdb and gb
            else rest[pdb or gb],
        ),
    ]
    out = pd.concat([p for p in parts if len(p)] or [parts[2]])
    return out.sort_index(kind="stable").drop(columns="_all")


def _warn_mixed(out: pd.DataFrame, keys: list[str]) -> None:
    """Warn when curves of both families, or a curve mixing batches, cover several world sizes."""
    if out.empty or out["scaling"].isna().all():
        return
    present = set(out["scaling"].dropna())
    if not ({"weak", "strong"} <= present or "mixed" in present):
        return  # nothing to warn of, whatever the curves span
    keyed = out.assign(_all=0)
    multi = keyed.groupby(keys or ["_all"], dropna=False)["world_size"].transform("nunique") > 1
    curves = out[multi]
    kinds = set(curves["scaling"])
    if {"weak", "strong"} <= kinds:
        held = {"weak": BATCH_COLUMNS[0], "strong": BATCH_COLUMNS[1]}
        fixed = {}
        for kind, batch in held.items():
            col = "fixed_batch_size" if "fixed_batch_size" in curves.columns else batch
            rows = curves.loc[curves["scaling"] == kind]
            fixed[kind] = sorted(set(rows[col])) if col in rows.columns else []
        warnings.warn(
            "these runs mix weak scaling (per-device batch held fixed: "
            f"{', '.join(map(str, fixed.get('weak', [])))}) and strong scaling (global batch held "
            f"fixed: {', '.join(map(str, fixed.get('strong', [])))}); both families are kept as "
            "separate scaling groups (column 'scaling'), a run in both is counted in each, and a "
            "speedup compares points of one family only",
            ScalingFamilyWarning,
            stacklevel=3,
        )
    if "mixed" in kinds:
        warnings.warn(
            f"the grouping {keys} puts runs of different per-device and global batches on one "
            "curve (scaling='mixed'); add a batch column to it, or use the default grouping",
            ScalingFamilyWarning,
            stacklevel=3,
        )


def assign_groups(per_run: pd.DataFrame, group_by: Sequence[str]) -> pd.DataFrame:
    """Label each run's group: ``per_run`` (one row per run with ``world_size``, the group
    columns and the batch columns, e.g. from :func:`group_frame` and the traces) with
    ``scaling`` added. With :data:`FAMILY_COLUMNS` in ``group_by`` the families are found (a run
    in both appears twice) and ``fixed_batch_size`` added; otherwise ``scaling`` labels each group
    of ``group_by`` (``weak``, ``strong``, or ``mixed`` when neither batch is constant). Warns
    (:class:`ScalingFamilyWarning`) when both families, or a mixed curve, span world sizes.

    Families: a weak family is the runs of one cluster (the other group columns) sharing a
    per-device batch over two or more world sizes; a strong family those sharing a global batch.
    A run whose ``derived`` column (when the runs frame has it) says which batch its config gave
    joins only that family. Otherwise weak comes first (the DDP default): a strong family is
    kept only if it holds a run no weak family holds, so a grid of world sizes x per-device
    batches (32 at N=2 has the global batch of 64 at N=1) makes no accidental strong curve. A
    run in no family (one world size) is its own weak group (strong if its config gave the
    global batch)."""
    check_columns(per_run, ("run_id", "world_size"), "per-run table")
    keys = list(group_by)
    base = [k for k in keys if k not in FAMILY_COLUMNS]
    if set(FAMILY_COLUMNS) & set(keys):
        out = _families(per_run, base)
    else:
        out = per_run.assign(scaling=_labels(per_run, keys))
    _warn_mixed(out, keys)
    return out.reset_index(drop=True)
