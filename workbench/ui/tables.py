"""Tables as HTML, the same in the report and the dashboard: the scaling table's chosen columns
and a renderer for any other frame, both for people (:mod:`workbench.ui.table_format`: units,
the columns that matter first, shared values in a caption). No torch."""

from __future__ import annotations

import html
from collections.abc import Sequence

import pandas as pd

from workbench.analysis.measured.units import percent
from workbench.analysis.throughput.groups import LEADING_COLUMNS
from workbench.ui.table_format import people_table, table_html

#: The scaling table's columns shown after the group columns, in order (only those present; a
#: ``_std`` column only when some point has one, i.e. two or more runs).
SCALING_COLUMNS = (
    "scaling",
    "per_device_batch_size",
    "global_batch_size",
    "world_size",
    "nodes",
    "link_class",
    "runs",
    "samples_per_s",
    "samples_per_s_std",
    "samples_per_s_half_width",
    "samples_per_s_per_device",
    "end_to_end_samples_per_s",
    "speedup",
    "speedup_std",
    "speedup_low",
    "speedup_high",
    "efficiency",
    "wall_step_s",
    "epoch_s",
    "final_loss",
    "final_metric",
    "time_to_quality_s",
    "tflops_per_device",
    "mfu",
    "mfu_note",
    "device_s",
    "incomplete",
)
#: The footnote under a scaling table that shows achieved FLOP/s: how they were computed.
FLOPS_NOTE = (
    '<p class="note"><b>tflops_per_device</b> = FLOPs of one training step (forward + backward '
    "over all its gradient accumulation micro-batches, counted once per run by PyTorch's "
    "FlopCounterMode on rank 0 before the measured window; run.json's <i>flops</i> says how) / "
    "the samples of that step &times; samples_per_s (training alone: the measured window less "
    "its evaluations and checkpoints) / world_size, in "
    "TFLOP/s (1e12; a CPU's 0.001 is 1 GFLOP/s). <b>mfu</b> = tflops_per_device / the device's "
    "dense peak (no sparsity) for the run's precision: bf16 and fp16 their tensor peak, fp32 "
    "the TF32 peak where TF32 matmuls were allowed, else plain fp32, and convolutions at the "
    "TF32 peak where cuDNN allowed it (its default), weighted by their share of the FLOPs. "
    "<b>mfu_note</b> names the "
    "peak used and its datasheet, or why there is no MFU (a CPU, a device not in the table): "
    "never a fallback peak.</p>"
)


def frame_html(frame: pd.DataFrame) -> str:
    """``frame`` as an HTML table for people (:func:`workbench.ui.table_format.table_html`:
    world size, batch, speedup and efficiency first, numbers in their units, empty columns left
    out, the values every row shares in a ``fixed:`` caption) in a box that scrolls sideways
    instead of overflowing."""
    return table_html(frame)


def group_columns(table: pd.DataFrame, group_by: Sequence[str]) -> list[str]:
    """The group columns worth showing: those that differ between the table's rows, and the
    leading config columns (model, precision, optimizer, learning rate, samples), which say what
    was measured (in the caption when every row shares them)."""
    keys = [c for c in group_by if c in table.columns]
    varying = [c for c in keys if table[c].map(str).nunique() > 1]
    lead = [c for c in LEADING_COLUMNS if c in table.columns and c not in varying]
    return varying + lead


def _candidates(table: pd.DataFrame, group_by: Sequence[str]) -> list[str]:
    shown = group_columns(table, group_by)
    rest = [c for c in SCALING_COLUMNS if c in table.columns and c not in shown]
    return shown + [c for c in rest if c != "incomplete" or _incomplete(table).any()]


def scaling_columns(table: pd.DataFrame, group_by: Sequence[str]) -> list[str]:
    """The columns shown of a scaling table: of :func:`group_columns` and
    :data:`SCALING_COLUMNS`, those with a value that differs between rows (a ``_std`` column
    only where some point has a spread), world size, batch, speedup and efficiency first."""
    return people_table(table[_candidates(table, group_by)]).columns


def _incomplete(table: pd.DataFrame) -> pd.Series:
    notes = table["incomplete"] if "incomplete" in table.columns else pd.Series(dtype="string")
    return notes.notna() & (notes.astype(str) != "")


def incomplete_html(table: pd.DataFrame) -> str:
    """A warning naming the runs whose traces miss some rank (empty when there is none): their
    throughput, speedup and efficiency are left empty rather than computed from part of the
    ranks."""
    notes = table.loc[_incomplete(table), "incomplete"] if len(table) else []
    if not len(notes):
        return ""
    items = "".join(f"<li>{html.escape(str(n))}</li>" for n in notes)
    return (
        '<div class="warning" style="border-left: 4px solid #c60; background: #fff4e5; '
        "padding: 0.4rem 1rem; margin: 0.8rem 0\"><b>Incomplete runs</b>: some rank's step "
        "trace is missing or unreadable, so their throughput, speedup and efficiency are left "
        "empty (a window over the other ranks would under-count the samples)."
        f"<ul>{items}</ul></div>"
    )


def scaling_table_html(table: pd.DataFrame, group_by: Sequence[str]) -> str:
    """The scaling table as HTML: the columns of :func:`scaling_columns`, one row per scaling
    point (the full table, every group column, is what the CSV summary keeps)."""
    columns = _candidates(table, group_by)
    note = FLOPS_NOTE if "tflops_per_device" in scaling_columns(table, group_by) else ""
    return incomplete_html(table) + frame_html(table[columns]) + note


def model_table_html(table: pd.DataFrame, group_by: Sequence[str]) -> str:
    """The scaling model's table
    (:func:`workbench.analysis.model.scaling_model.predicted_vs_measured`) as HTML:
    :func:`group_columns`, then every column that is not a group column."""
    shown = group_columns(table, group_by)
    rest = [c for c in table.columns if c not in group_by and c not in shown]
    return frame_html(table[shown + rest])


def fit_error_note(predicted: pd.DataFrame) -> str:
    """The model's stated error on its own fit, from
    :func:`~workbench.analysis.model.scaling_model.predicted_vs_measured`'s table: the RMS of
    ``relative_error`` over the measured points beyond each curve's base (at the base it agrees
    by construction), or that there is no such point to state one on."""
    if "relative_error" not in predicted.columns:
        return "The model's error: not known (no prediction)."
    at_base = predicted["world_size"] == predicted["base_world_size"]
    if {"nodes", "base_nodes"} <= set(predicted.columns):  # the base is a layout, not a size
        at_base &= predicted["nodes"] == predicted["base_nodes"]
    beyond = predicted[~at_base]
    errors = pd.to_numeric(beyond["relative_error"], errors="coerce").dropna()
    if errors.empty:
        return (
            "The model's error: not known; no measured world size beyond a curve's base to "
            "check it on (at the base it agrees by construction)."
        )
    rms = float((errors**2).mean() ** 0.5)
    worst = float(errors.abs().max())
    return (
        f"The model's error on this study's measured points beyond each curve's base: RMS "
        f"{percent(rms)}, worst {percent(worst)} ({len(errors)} point"
        f"{'s' if len(errors) != 1 else ''}; relative_error = predicted / measured - 1)."
    )
