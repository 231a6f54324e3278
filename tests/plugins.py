"""A user's own model and dataset, reached through 'tests.plugins:factory' strings."""

from __future__ import annotations

from itertools import pairwise

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


class _Sleepy(nn.Module):
    """An MLP whose forward also sleeps: a slow step without using the CPU. The sleep does not
    change the arithmetic, so runs with different ``sleep_s`` end with identical parameters."""

    task = "classification"

    def __init__(self, sleep_s: float, eval_sleep_s: float) -> None:
        super().__init__()
        from workbench.rank.models import MLP

        self.net = MLP(input_dim=32, hidden_dim=64, num_layers=2, num_classes=4)
        self.sleep_s = sleep_s
        self.eval_sleep_s = eval_sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        time.sleep(self.sleep_s if self.training else self.eval_sleep_s)
        return self.net(x)


def sleepy_mlp(sleep_s: float = 0.0, eval_sleep_s: float = 0.0) -> nn.Module:
    return _Sleepy(sleep_s, eval_sleep_s)


def synthetic_like_mlp(train_samples: int, eval_samples: int, seed: int) -> tuple[Dataset, Dataset]:
    """The built-in synthetic data of the default mlp, for plug-in models that mimic it."""
    from workbench.config.run_config import MODEL_OPTIONS
    from workbench.rank.data import synthetic_dataset

    opts = MODEL_OPTIONS["mlp"]
    return (
        synthetic_dataset("mlp", opts, train_samples, seed, 0),
        synthetic_dataset("mlp", opts, eval_samples, seed, 1),
    )


class _WithUnusedHead(nn.Module):
    task = "classification"

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(32, 4)
        self.unused_head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def with_unused_head() -> nn.Module:
    return _WithUnusedHead()


def mlp_in_a_torch_without_ddp_logging_data() -> nn.Module:
    """The default MLP, built in a rank whose torch has lost DDP's private
    ``_get_ddp_logging_data`` (as a future torch might): the model is built before DDP wraps
    it, so deleting the method here takes it away from this rank's DDP."""
    from torch.nn.parallel import DistributedDataParallel

    from workbench.rank.models import MLP

    if hasattr(DistributedDataParallel, "_get_ddp_logging_data"):
        delattr(DistributedDataParallel, "_get_ddp_logging_data")
    return MLP(input_dim=32, hidden_dim=64, num_layers=2, num_classes=4)


class _PlantedCosts(_Sleepy):
    """``_Sleepy`` whose ``state_dict`` (what a checkpoint saves, on rank 0) also sleeps
    ``save_sleep_s``: known costs in the forward pass, the evaluation and the checkpoint."""

    def __init__(self, sleep_s: float, eval_sleep_s: float, save_sleep_s: float) -> None:
        super().__init__(sleep_s, eval_sleep_s)
        self.save_sleep_s = save_sleep_s

    def state_dict(self, *args, **kwargs):  # type: ignore[override]
        import time

        time.sleep(self.save_sleep_s)
        return super().state_dict(*args, **kwargs)


class _BatchCost(_Sleepy):
    """``_Sleepy`` whose training forward sleeps ``step_sleep_s`` plus ``sample_sleep_s`` for
    each sample of its batch: a known per-step and per-sample compute."""

    def __init__(self, step_sleep_s: float, sample_sleep_s: float) -> None:
        super().__init__(step_sleep_s, 0.0)
        self.sample_sleep_s = sample_sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        if self.training:
            time.sleep(self.sleep_s + self.sample_sleep_s * x.shape[0])
        return self.net(x)


def batch_cost_mlp(step_sleep_s: float = 0.0, sample_sleep_s: float = 0.0) -> nn.Module:
    return _BatchCost(step_sleep_s, sample_sleep_s)


def planted_costs_mlp(
    sleep_s: float = 0.0, eval_sleep_s: float = 0.0, save_sleep_s: float = 0.0
) -> nn.Module:
    return _PlantedCosts(sleep_s, eval_sleep_s, save_sleep_s)


class _SlowItems(Dataset):
    """The built-in mlp's synthetic data, fetched item by item, each item sleeping
    ``item_sleep_s``: a known data-loading cost per sample."""

    def __init__(self, inner: Dataset, item_sleep_s: float) -> None:
        self.inner = inner
        self.item_sleep_s = item_sleep_s

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, i: int):
        import time

        if self.item_sleep_s:
            time.sleep(self.item_sleep_s)
        return self.inner[i]


def slow_items(
    train_samples: int, eval_samples: int, seed: int, item_sleep_s: float = 0.0
) -> tuple[Dataset, Dataset]:
    """``synthetic_like_mlp`` whose training items each sleep ``item_sleep_s`` (evaluation
    items do not: the evaluation's planted cost is the model's alone)."""
    train, evaluation = synthetic_like_mlp(train_samples, eval_samples, seed)
    return _SlowItems(train, item_sleep_s), _SlowItems(evaluation, 0.0)


def linear_stack(width: int = 64, layers: int = 2) -> nn.Module:
    """Linear layers without bias from the mlp data's 32 features to its 4 classes, ``layers``
    of them ``width`` wide before the last: each saves its input for its backward, so a
    forward's activations are known by hand (``tests/test_activations.py``)."""
    widths = [32, *([width] * layers), 4]
    return nn.Sequential(*(nn.Linear(a, b, bias=False) for a, b in pairwise(widths)))
