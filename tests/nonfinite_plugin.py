"""A plug-in model that plants a non-finite loss on one known rank at one known step."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from workbench.config.run_config import MODEL_OPTIONS
from workbench.rank.models import build_model

#: Where the NaN is planted: global rank and training step (from 1).
NAN_RANK, NAN_STEP = 1, 3


class _NanOnOneRank(nn.Module):
    task = "classification"

    def __init__(self) -> None:
        super().__init__()
        self.inner = build_model("mlp", dict(MODEL_OPTIONS["mlp"]))
        self.training_forwards = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.inner(x)
        if not self.training:
            return logits
        self.training_forwards += 1  # one per step: no gradient accumulation
        if dist.get_rank() == NAN_RANK and self.training_forwards == NAN_STEP:
            return logits * float("nan")
        return logits


def nan_on_one_rank() -> nn.Module:
    return _NanOnOneRank()
