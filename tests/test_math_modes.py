"""The math mode actually in force: fp32 convolutions run in TF32 under cuDNN's default, so
their MFU divides by the TF32 peak; a compression hook's buckets are formed at the gradients'
own size and sent at half of it."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn

from workbench.analysis.measured.flops import add_flops_columns
from workbench.rank.network import bucket_sizes


def _table(**facts: object) -> pd.DataFrame:
    """One run: 1e12 FLOPs per sample, 15.6 samples/s on one A100 in fp32: 15.6 TFLOP/s."""
    row = {
        "samples_per_s": 15.6,
        "world_size": 1,
        "flops_per_sample": 1e12,
        "device_name": "NVIDIA A100-SXM4-80GB",
        "precision": "fp32",
        "flops_matmul_precision": "highest",
        **facts,
    }
    return pd.DataFrame([row])


def test_fp32_convolutions_follow_cudnn_tf32() -> None:
    # A100 dense peaks: TF32 156, fp32 19.5 TFLOP/s. All FLOPs in convolutions with cuDNN's
    # TF32 on (torch's default): 15.6 / 156 = 0.1, not 15.6 / 19.5 = 0.8.
    conv = add_flops_columns(_table(flops_conv_share=1.0, flops_cudnn_allow_tf32=True))
    assert conv["mfu"].iloc[0] == pytest.approx(0.1)
    assert "TF32" in conv["mfu_note"].iloc[0]
    # Half the FLOPs in convolutions (TF32), half in fp32 matmuls: the time at each peak adds
    # up, 0.5/156 + 0.5/19.5 = 351/12168 s per TFLOP, so the peak is 12168/351 TFLOP/s.
    half = add_flops_columns(_table(flops_conv_share=0.5, flops_cudnn_allow_tf32=True))
    assert half["mfu"].iloc[0] == pytest.approx(15.6 / (12168 / 351))
    # cuDNN's TF32 switched off: plain fp32
    off = add_flops_columns(_table(flops_conv_share=1.0, flops_cudnn_allow_tf32=False))
    assert off["mfu"].iloc[0] == pytest.approx(0.8)
    # no convolution at all: the matmul precision alone, as before
    assert add_flops_columns(_table())["mfu"].iloc[0] == pytest.approx(0.8)


class _Four(nn.Module):
    """Four fp32 parameters of 1 MiB each (262,144 elements)."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = nn.ParameterList([nn.Parameter(torch.zeros(262_144)) for _ in range(4)])


def test_compressed_buckets_are_formed_at_the_gradients_size() -> None:
    # A 2 MiB cap holds two fp32 gradients of 1 MiB: two buckets, each sent as fp16 at half
    # its size (1 MiB). Sizing the buckets at 2 bytes per element would put all four in one.
    assert bucket_sizes(_Four(), bucket_cap_mb=2) == [2 * 2**20, 2 * 2**20]
    assert bucket_sizes(_Four(), bucket_cap_mb=2, element_bytes=2) == [2**20, 2**20]
