"""Achieved FLOP/s and model FLOPs utilisation (MFU) per run, and the devices' dense peaks.

A run's ``flops_per_sample`` is the FLOPs of one training step (forward + backward, every
gradient accumulation micro-batch; counted once on rank 0 before the measured window, see
``run.json``'s ``flops``) over the samples of that step. Then, over the measured window:

- ``tflops_per_device = flops_per_sample * samples_per_s / world_size / 1e12``
- ``mfu = tflops_per_device / peak``, ``peak`` the device's DENSE (no 2:4 sparsity) tensor peak
  for the run's math mode from :data:`DENSE_PEAKS`: bf16 and fp16 their own; in fp32 matmuls
  at the TF32 tensor peak where the run allowed TF32 matmuls
  (``torch.get_float32_matmul_precision()`` not ``highest``) and the device has it, else plain
  fp32, and convolutions at the TF32 peak where cuDNN allowed it (``cudnn.allow_tf32``, on by
  default), weighted by their share of the FLOPs.

An unknown device, a CPU or a precision the device has no peak for gives no MFU, and
``mfu_note`` says why; there is never a fallback peak. No torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

#: FLOP/s are reported in TFLOP/s (1e12).
TERA = 1e12

_H100_SHEET = (
    "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100), tensor figures "
    "given with sparsity, halved for dense"
)
_H200_SHEET = (
    "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200), H200 SXM, tensor "
    "figures given with sparsity, halved for dense"
)
_A100_SHEET = (
    "NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), "
    "dense figures (sparse ones are twice these)"
)
_V100_SHEET = (
    "NVIDIA Tesla V100 GPU datasheet (volta-v100-datasheet-update-us-1165301-r5.pdf); Volta has "
    "no bf16 or TF32 tensor cores"
)


@dataclass(frozen=True)
class DevicePeaks:
    """One device's dense peaks in TFLOP/s per math mode, and where they come from."""

    device: str
    pattern: str  # a regular expression over torch.cuda.get_device_name(), case-insensitive
    tflops: dict[str, float]  # "bf16", "fp16", "tf32", "fp32"
    source: str


#: Dense peaks (TFLOP/s) by device, first match wins; each entry names its datasheet.
DENSE_PEAKS: tuple[DevicePeaks, ...] = (
    DevicePeaks(
        "H100 PCIe",
        r"H100.*PCIe",
        {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0},
        _H100_SHEET,
    ),
    DevicePeaks(
        "H100 SXM",
        r"H100.*(SXM|HBM3)",
        {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0},
        _H100_SHEET,
    ),
    DevicePeaks(
        "H200 SXM",
        r"H200(?!.*NVL)",
        {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0},
        _H200_SHEET,
    ),
    DevicePeaks(
        "A100",
        r"A100",
        {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
        _A100_SHEET,
    ),
    DevicePeaks("V100 SXM2", r"V100.*SXM", {"fp16": 125.0, "fp32": 15.7}, _V100_SHEET),
    DevicePeaks("V100 PCIe", r"V100.*PCIE", {"fp16": 112.0, "fp32": 14.0}, _V100_SHEET),
)


@dataclass(frozen=True)
class Peak:
    """The dense peak a run's MFU divides by, or (``tflops`` None) why there is none."""

    tflops: float | None
    note: str


def math_mode(precision: str, matmul_precision: str | None) -> str:
    """The tensor math a run's matmuls use: its autocast dtype, or for fp32 ``tf32`` when the
    float32 matmul precision allowed it (``high`` or ``medium``), else ``fp32``."""
    if precision in ("bf16", "fp16"):
        return precision
    return "tf32" if matmul_precision in ("high", "medium") else "fp32"


def dense_peak(
    device_name: str | None,
    precision: str,
    matmul_precision: str | None,
    conv_share: float | None = None,
    cudnn_allow_tf32: bool | None = None,
) -> Peak:
    """The dense peak for ``device_name`` (as ``torch.cuda.get_device_name`` says it) at the
    run's ``precision``; no peak, with the reason, for a CPU, an unknown device or a mode the
    device has no figure for. fp32 with TF32 allowed on a device without TF32 uses its fp32.

    In fp32 the math mode of each part of the model is the one in force for it: matmuls follow
    ``matmul_precision``, convolutions cuDNN's ``allow_tf32`` (torch's default: on; ``None``
    reads as that default). With a ``conv_share`` of the FLOPs in convolutions the peak is the
    FLOP-weighted harmonic mean of the two modes' peaks (the time each part would take at its
    peak)."""
    share = float(conv_share) if conv_share is not None and np.isfinite(conv_share) else 0.0
    if precision not in ("bf16", "fp16") and share > 0:
        conv = dense_peak(device_name, precision, "high" if cudnn_allow_tf32 is not False else None)
        rest = dense_peak(device_name, precision, matmul_precision)
        if conv.tflops is None or rest.tflops is None:
            return conv if conv.tflops is None else rest
        if share >= 1 or conv.tflops == rest.tflops:
            return Peak(conv.tflops, f"{conv.note} (convolutions, cuDNN TF32)")
        mixed = 1 / (share / conv.tflops + (1 - share) / rest.tflops)
        return Peak(
            mixed,
            f"peak {mixed:.4g} TFLOP/s: {share:.0%} of the FLOPs in convolutions at "
            f"{conv.tflops:g} (cuDNN TF32 {'off' if cudnn_allow_tf32 is False else 'on'}), "
            f"the rest at {rest.tflops:g}; {rest.note.split(': ', 1)[1]}",
        )
    name = (device_name or "").strip()
    if not name:
        return Peak(None, "no MFU: the run did not record its device")
    if name == "cpu" or name.startswith("cpu"):
        return Peak(
            None, "no MFU on CPU: no dense peak is tabulated for CPUs (achieved FLOP/s only)"
        )
    entry = next((e for e in DENSE_PEAKS if re.search(e.pattern, name, re.IGNORECASE)), None)
    if entry is None:
        known = ", ".join(e.device for e in DENSE_PEAKS)
        return Peak(None, f"no MFU: no dense peak known for device {name!r} (known: {known})")
    mode = math_mode(precision, matmul_precision)
    if mode == "tf32" and "tf32" not in entry.tflops:
        mode = "fp32"  # the device has no TF32: its fp32 matmuls run in fp32
    peak = entry.tflops.get(mode)
    if peak is None:
        have = ", ".join(entry.tflops)
        return Peak(None, f"no MFU: {entry.device} has no {mode} peak (has: {have})")
    return Peak(peak, f"peak {peak:g} TFLOP/s: {entry.device} {mode} dense, {entry.source}")


def add_flops_columns(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (a run table: ``samples_per_s``, ``world_size``) with ``tflops_per_device``,
    ``mfu`` and ``mfu_note`` added from its ``flops_per_sample``, ``device_name``,
    ``precision`` and ``flops_matmul_precision`` (see the module's definitions). Without
    ``flops_per_sample`` (runs from before the count) the columns are empty and the note says
    so."""
    table = table.copy()
    n = len(table)
    per_sample = pd.to_numeric(table.get("flops_per_sample", pd.Series([np.nan] * n)), "coerce")
    per_sample = pd.Series(per_sample.to_numpy(dtype=float), index=table.index)
    achieved = per_sample * table["samples_per_s"] / table["world_size"] / TERA
    table["tflops_per_device"] = achieved
    mfu, notes = [], []
    for i, row in enumerate(table.itertuples(index=False)):
        facts = row._asdict()
        if not np.isfinite(per_sample.iloc[i]):
            error = facts.get("flops_error")
            why = f"FLOPs not counted: {error}" if isinstance(error, str) else "FLOPs not counted"
            mfu.append(np.nan)
            notes.append(f"no MFU: {why}")
            continue
        peak = dense_peak(
            _text(facts.get("device_name")),
            _text(facts.get("precision")) or "fp32",
            _text(facts.get("flops_matmul_precision")),
            _number(facts.get("flops_conv_share")),
            _flag(facts.get("flops_cudnn_allow_tf32")),
        )
        value = achieved.iloc[i]
        mfu.append(value / peak.tflops if peak.tflops and np.isfinite(value) else np.nan)
        notes.append(peak.note)
    table["mfu"] = mfu
    table["mfu_note"] = notes
    return table


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: object) -> float | None:
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return out if np.isfinite(out) else None


def _flag(value: object) -> bool | None:
    return bool(value) if isinstance(value, (bool, np.bool_)) else None
