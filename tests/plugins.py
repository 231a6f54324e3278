"""A user's own model and dataset, reached through 'tests.plugins:factory' strings."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset


def tiny_linear(in_features: int = 6, classes: int = 3) -> nn.Module:
    return nn.Linear(in_features, classes)


class _Items(Dataset):
    """A dataset without ``.tensors``: batches are collated item by item."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 6, generator=g)
        self.y = (self.x[:, 0] > 0).long() + (self.x[:, 1] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def two_features(train_samples: int, eval_samples: int, seed: int) -> tuple[Dataset, Dataset]:
    return _Items(train_samples, seed), _Items(eval_samples, seed + 1)


not_a_module = 42
